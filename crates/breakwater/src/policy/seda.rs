//! SEDA (Welsh & Culler), as the thesis runs it: a client-side rate limiter
//! whose rate moves by AIMD on the observed 99th-percentile response time.
//! Every `window` responses or `timeout` (whichever first) a client compares
//! the window's p99 with the target: above it, `rate /= adj_d`; otherwise
//! `rate += adj_i`. A request that finds the token bucket empty is refused
//! at once, at the client, as SEDA's admission controller refuses what its
//! rate does not admit (queueing it instead would only add client-side
//! delay to an overloaded client). The server side does nothing: SEDA has
//! no AQM and no server drops.

use super::{
    fraction, positive_f64, positive_u64, Acquire, Arrival, ClientId, ClientPolicy, Completion,
    ConfigError, Feedback, Nanos, Policy, QueueView, Verdict,
};

/// The server half: admit everything (no AQM in SEDA).
#[derive(Debug, Clone, Default)]
pub struct SedaServer;

impl Policy for SedaServer {
    fn name(&self) -> &'static str {
        "seda"
    }
    fn on_arrival(&mut self, _now: Nanos, _msg: &Arrival, _queue: &QueueView) -> Verdict {
        Verdict::Admit
    }
    fn on_complete(&mut self, _now: Nanos, _done: &Completion, _queue: &QueueView) -> Feedback {
        Feedback::None
    }
    fn feedback(&mut self, _now: Nanos, _client: ClientId) -> Feedback {
        Feedback::None
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SedaConfig {
    /// The p99 response time to stay under (the SLO).
    pub target_ns: Nanos,
    /// Additive increase, requests/s per adjustment (thesis: 40 at 10 µs
    /// service with 1000 clients; scale with the per-client share).
    pub adj_i: f64,
    /// Multiplicative decrease factor (> 1; thesis 1.04).
    pub adj_d: f64,
    /// Responses per adjustment (100).
    pub window: usize,
    /// Longest time between adjustments (thesis: 1 ms).
    pub timeout_ns: Nanos,
    pub initial_rate: f64,
    pub min_rate: f64,
    pub max_rate: f64,
}

impl SedaConfig {
    pub fn new(target_ns: Nanos, adj_i: f64, initial_rate: f64) -> Self {
        SedaConfig {
            target_ns,
            adj_i,
            adj_d: 1.04,
            window: 100,
            timeout_ns: 1_000_000,
            initial_rate,
            min_rate: 0.1,
            max_rate: 1e9,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        positive_u64("target", self.target_ns)?;
        positive_f64("adj_i", self.adj_i)?;
        if !(self.adj_d > 1.0 && self.adj_d.is_finite()) {
            return Err(ConfigError(format!(
                "adj_d must be > 1, got {}",
                self.adj_d
            )));
        }
        positive_u64("window", self.window as u64)?;
        positive_u64("timeout", self.timeout_ns)?;
        positive_f64("min_rate", self.min_rate)?;
        positive_f64("initial_rate", self.initial_rate)?;
        if self.max_rate < self.min_rate {
            return Err(ConfigError("max_rate must be >= min_rate".into()));
        }
        let _ = fraction;
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct SedaClient {
    config: SedaConfig,
    rate: f64,
    tokens: f64,
    last_refill: Option<Nanos>,
    samples: Vec<Nanos>,
    window_start: Option<Nanos>,
}

impl SedaClient {
    pub fn new(config: SedaConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(SedaClient {
            rate: config.initial_rate,
            tokens: 1.0,
            config,
            last_refill: None,
            samples: Vec::with_capacity(128),
            window_start: None,
        })
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Bucket depth: one token, or 1 ms worth of rate.
    fn depth(&self) -> f64 {
        (self.rate * 1e-3).max(1.0)
    }

    fn refill(&mut self, now: Nanos) {
        let last = *self.last_refill.get_or_insert(now);
        let dt = now.saturating_sub(last) as f64 / 1e9;
        self.tokens = (self.tokens + dt * self.rate).min(self.depth());
        self.last_refill = Some(now);
    }

    fn adjust(&mut self) {
        self.samples.sort_unstable();
        let rank =
            ((0.99 * self.samples.len() as f64).ceil() as usize).clamp(1, self.samples.len());
        let p99 = self.samples[rank - 1];
        if p99 > self.config.target_ns {
            self.rate /= self.config.adj_d;
        } else {
            self.rate += self.config.adj_i;
        }
        self.rate = self.rate.clamp(self.config.min_rate, self.config.max_rate);
        self.samples.clear();
    }
}

impl ClientPolicy for SedaClient {
    fn name(&self) -> &'static str {
        "seda"
    }

    fn try_acquire(&mut self, now: Nanos, _priority: u8) -> Acquire {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Acquire::Send(super::Kind::Request)
        } else {
            Acquire::Drop
        }
    }

    fn release(&mut self) {
        self.tokens += 1.0;
    }

    fn on_response(&mut self, now: Nanos, latency_ns: Nanos, _ok: bool) {
        self.samples.push(latency_ns);
        let start = *self.window_start.get_or_insert(now);
        if self.samples.len() >= self.config.window
            || now.saturating_sub(start) >= self.config.timeout_ns
        {
            self.adjust();
            self.window_start = Some(now);
        }
    }
}
