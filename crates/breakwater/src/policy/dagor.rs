//! DAGOR (Zhou et al., WeChat): priority-threshold admission.
//!
//! Every request carries a priority (1 is the most important; the thesis
//! draws it uniformly from 1..=128). The server admits a request iff its
//! priority is at or below the admission threshold. Every `window` (1 ms) or
//! `window_requests` (2000) arrivals it compares the average queueing time
//! of the requests that started in the window with `DAGOR_q`: above it, the
//! threshold moves down until about `α` (5%) fewer of the window's arrivals
//! would have been admitted; otherwise up until about `β` (1%) more would
//! have. The threshold never goes below 1, so priority 1 is never dropped.
//! It is piggybacked on responses and clients drop locally what the server
//! would refuse.

use super::{
    fraction, positive_u64, Acquire, Arrival, ClientId, ClientPolicy, Completion, ConfigError,
    Feedback, Nanos, Policy, PolicyStats, QueueView, RejectReason, Verdict,
};

pub const LEVELS: u8 = 128;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DagorConfig {
    /// DAGOR_q: average queueing time that means "overloaded".
    pub queue_threshold_ns: Nanos,
    pub alpha: f64,
    pub beta: f64,
    pub window_ns: Nanos,
    pub window_requests: u64,
}

impl DagorConfig {
    /// Thesis defaults with `DAGOR_q` given (70 µs at 10 µs service and a
    /// 200 µs SLO, i.e. 35% of the SLO).
    pub fn new(queue_threshold_ns: Nanos) -> Self {
        DagorConfig {
            queue_threshold_ns,
            alpha: 0.05,
            beta: 0.01,
            window_ns: 1_000_000,
            window_requests: 2000,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        positive_u64("queue_threshold", self.queue_threshold_ns)?;
        fraction("alpha", self.alpha, true)?;
        fraction("beta", self.beta, true)?;
        positive_u64("window", self.window_ns)?;
        positive_u64("window_requests", self.window_requests)?;
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct Dagor {
    config: DagorConfig,
    threshold: u8,
    /// Arrivals per priority in the current window (index = priority).
    histogram: [u64; LEVELS as usize + 1],
    arrivals: u64,
    wait_sum_ns: u128,
    waits: u64,
    window_start: Option<Nanos>,
}

impl Dagor {
    pub fn new(config: DagorConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Dagor {
            config,
            threshold: LEVELS,
            histogram: [0; LEVELS as usize + 1],
            arrivals: 0,
            wait_sum_ns: 0,
            waits: 0,
            window_start: None,
        })
    }

    pub fn threshold(&self) -> u8 {
        self.threshold
    }

    fn admitted_below(&self, threshold: u8) -> u64 {
        self.histogram[1..=threshold as usize].iter().sum()
    }

    fn update(&mut self) {
        if self.waits > 0 {
            let avg = (self.wait_sum_ns / u128::from(self.waits)) as Nanos;
            let admitted = self.admitted_below(self.threshold) as f64;
            if avg > self.config.queue_threshold_ns {
                let target = admitted * (1.0 - self.config.alpha);
                while self.threshold > 1 && self.admitted_below(self.threshold) as f64 > target {
                    self.threshold -= 1;
                }
            } else {
                // Levels above the threshold are mostly filtered out by the
                // clients, so the histogram cannot see them: step up one
                // level at a time, and past levels with samples only while
                // they are needed to reach the target.
                let target = admitted * (1.0 + self.config.beta);
                while self.threshold < LEVELS {
                    self.threshold += 1;
                    let next = self.histogram[self.threshold as usize];
                    if next == 0 || self.admitted_below(self.threshold) as f64 >= target {
                        break;
                    }
                }
            }
        }
        self.histogram = [0; LEVELS as usize + 1];
        self.arrivals = 0;
        self.wait_sum_ns = 0;
        self.waits = 0;
    }
}

impl Policy for Dagor {
    fn name(&self) -> &'static str {
        "dagor"
    }

    fn on_arrival(&mut self, now: Nanos, msg: &Arrival, _queue: &QueueView) -> Verdict {
        let start = *self.window_start.get_or_insert(now);
        if now.saturating_sub(start) >= self.config.window_ns
            || self.arrivals >= self.config.window_requests
        {
            self.update();
            self.window_start = Some(now);
        }
        let p = msg.priority.clamp(1, LEVELS);
        self.histogram[p as usize] += 1;
        self.arrivals += 1;
        if p <= self.threshold {
            Verdict::Admit
        } else {
            Verdict::Reject(RejectReason::Priority {
                priority: p,
                threshold: self.threshold,
            })
        }
    }

    fn on_start(&mut self, _now: Nanos, queue_wait_ns: Nanos) {
        self.wait_sum_ns += u128::from(queue_wait_ns);
        self.waits += 1;
    }

    fn on_complete(&mut self, _now: Nanos, _done: &Completion, _queue: &QueueView) -> Feedback {
        Feedback::Threshold(self.threshold)
    }

    fn feedback(&mut self, _now: Nanos, _client: ClientId) -> Feedback {
        Feedback::Threshold(self.threshold)
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            control: f64::from(self.threshold),
            ..PolicyStats::default()
        }
    }
}

/// The client half: drop what the last advertised threshold would refuse.
#[derive(Debug, Clone)]
pub struct DagorClient {
    threshold: u8,
}

impl Default for DagorClient {
    fn default() -> Self {
        DagorClient { threshold: LEVELS }
    }
}

impl ClientPolicy for DagorClient {
    fn name(&self) -> &'static str {
        "dagor"
    }
    fn try_acquire(&mut self, _now: Nanos, priority: u8) -> Acquire {
        if priority > self.threshold {
            Acquire::Drop
        } else {
            Acquire::Send(super::Kind::Request)
        }
    }
    fn on_feedback(&mut self, _now: Nanos, feedback: Feedback) {
        if let Feedback::Threshold(t) = feedback {
            self.threshold = t.max(1);
        }
    }
}
