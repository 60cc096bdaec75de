//! A gradient concurrency limiter, after Netflix concurrency-limits'
//! `Gradient2Limit`: a server-side cap on requests in the system (queued or
//! running), moved by the ratio of a long-term average latency to the
//! latest sample:
//!
//! ```text
//! gradient = clamp(tolerance · long / short, 0.5, 1)
//! new      = limit · gradient + sqrt(limit)           (queue allowance)
//! limit    = (1 − smoothing) · limit + smoothing · new
//! ```
//!
//! `long` is an exponential average over `long_window` samples that decays
//! faster when it exceeds twice the sample (so it recovers after overload).
//! The limit does not grow while less than half of it is in use. Requests
//! over the limit are refused at once.

use super::{
    fraction, positive_f64, positive_u64, Arrival, ClientId, Completion, ConfigError, Feedback,
    Nanos, Policy, PolicyStats, QueueView, RejectReason, Verdict,
};

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GradientConfig {
    pub initial_limit: f64,
    pub min_limit: f64,
    pub max_limit: f64,
    pub smoothing: f64,
    pub tolerance: f64,
    pub long_window: u64,
}

impl GradientConfig {
    /// Netflix's Gradient2 defaults (initial 20, smoothing 0.2, tolerance
    /// 1.5, long window 600), with `min_limit` = the worker count.
    pub fn new(min_limit: f64) -> Self {
        GradientConfig {
            initial_limit: 20f64.max(min_limit),
            min_limit,
            max_limit: 1000f64.max(min_limit),
            smoothing: 0.2,
            tolerance: 1.5,
            long_window: 600,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        positive_f64("min_limit", self.min_limit)?;
        positive_f64("initial_limit", self.initial_limit)?;
        positive_f64("max_limit", self.max_limit)?;
        if self.max_limit < self.min_limit {
            return Err(ConfigError("max_limit must be >= min_limit".into()));
        }
        fraction("smoothing", self.smoothing, true)?;
        positive_f64("tolerance", self.tolerance)?;
        positive_u64("long_window", self.long_window)?;
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct Gradient {
    config: GradientConfig,
    limit: f64,
    inflight: u64,
    long_ns: f64,
}

impl Gradient {
    pub fn new(config: GradientConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Gradient {
            limit: config
                .initial_limit
                .clamp(config.min_limit, config.max_limit),
            config,
            inflight: 0,
            long_ns: 0.0,
        })
    }

    pub fn limit(&self) -> f64 {
        self.limit
    }

    fn sample(&mut self, short_ns: f64) {
        let short = short_ns.max(1.0);
        let w = 1.0 / self.config.long_window as f64;
        self.long_ns = if self.long_ns == 0.0 {
            short
        } else {
            (1.0 - w) * self.long_ns + w * short
        };
        if self.long_ns / short > 2.0 {
            self.long_ns *= 0.95;
        }
        if (self.inflight as f64) < self.limit / 2.0 {
            return;
        }
        let gradient = (self.config.tolerance * self.long_ns / short).clamp(0.5, 1.0);
        let new = self.limit * gradient + self.limit.sqrt();
        let s = self.config.smoothing;
        self.limit =
            ((1.0 - s) * self.limit + s * new).clamp(self.config.min_limit, self.config.max_limit);
    }
}

impl Policy for Gradient {
    fn name(&self) -> &'static str {
        "gradient"
    }

    fn on_arrival(&mut self, _now: Nanos, _msg: &Arrival, _queue: &QueueView) -> Verdict {
        if self.inflight as f64 >= self.limit.floor() {
            return Verdict::Reject(RejectReason::Limit);
        }
        self.inflight += 1;
        Verdict::Admit
    }

    fn on_complete(&mut self, _now: Nanos, done: &Completion, _queue: &QueueView) -> Feedback {
        if done.ok {
            self.sample(done.sojourn_ns as f64);
        }
        self.inflight = self.inflight.saturating_sub(1);
        Feedback::None
    }

    fn feedback(&mut self, _now: Nanos, _client: ClientId) -> Feedback {
        Feedback::None
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            control: self.limit,
            ..PolicyStats::default()
        }
    }
}
