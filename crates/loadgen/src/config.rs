//! A validated run configuration: what the engine consumes and what the
//! JSON report echoes back, so every result file says how it was made.

use crate::arrivals::Step;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ProtocolKind {
    Redis,
    Memcached,
    Line,
    Http,
    /// HTTP/2 to a service behind the Breakwater server layer (or a
    /// baseline), each logical client running the client layer.
    Breakwater,
}

/// How requests are paced.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Load {
    /// Poisson arrivals at each step's rate; the measured window is the sum
    /// of the steps (warm-up runs before it at the first step's rate).
    Open { steps: Vec<Step> },
    /// `--rate max`: keep `depth` requests outstanding on every connection
    /// and report what the server sustains. Not open loop: use it to find
    /// capacity, never to measure latency under load.
    Closed { depth: usize, duration_s: f64 },
}

#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub target: String,
    pub protocol: ProtocolKind,
    pub load: Load,
    pub warmup_s: f64,
    pub connections: usize,
    pub max_outstanding_per_conn: Option<usize>,
    pub seed: u64,
    pub set_ratio: f64,
    pub keys: u64,
    pub value_size: usize,
    pub preload: bool,
    pub path: String,
    pub bin_ms: u64,
    pub timeout_ms: u64,
    pub cpu: Option<usize>,
    /// Busy-poll this long before each arrival instead of sleeping.
    pub spin_us: u64,
    /// Logical clients sharing the connections (`--protocol breakwater`):
    /// each arrival goes to one uniformly at random, so N clients are N
    /// Poisson processes whose sum is the configured rate.
    pub clients: usize,
    /// The overload control's client half (`--protocol breakwater`).
    pub control: String,
    /// SLO in µs: goodput counts replies within it; with `--protocol
    /// breakwater` a request waiting for credit expires after it.
    pub slo_us: Option<u64>,
    /// SEDA's additive increase (req/s) and initial per-client rate.
    pub seda_adj_i: Option<f64>,
    pub seda_initial_rate: Option<f64>,
    /// Breakwater: a drained client's credit wait carries its oldest
    /// request (`await`) instead of going alone (`wait`, the default).
    pub bw_carry: bool,
    /// Breakwater: explicit credits pushed on a per-connection credit
    /// stream; drained clients send no credit waits.
    pub bw_push: bool,
    /// Client-layer protocols: requests carry their deadline (intended time
    /// + SLO) to the client layer.
    pub bw_intended_deadline: bool,
    /// Keep every successful reply's intended time and latency for
    /// `--requests-out` (16 bytes a request).
    pub keep_requests: bool,
    /// `--stall-us`: spin instead of sleeping, count every turn of the loop
    /// longer than this (the generator off its CPU) as a stall, and keep the
    /// requests it disturbed out of the latency statistics.
    pub stall_us: Option<u64>,
    /// `--hold`: stop the process (SIGSTOP) before and after the measured
    /// run, drained and connected, until a SIGCONT.
    pub hold: bool,
}

impl Config {
    /// Defaults matching the CLI's, for tests and library callers.
    pub fn new(target: &str, protocol: ProtocolKind, load: Load) -> Self {
        Config {
            target: target.to_string(),
            protocol,
            load,
            warmup_s: 0.0,
            connections: 16,
            max_outstanding_per_conn: None,
            seed: 1,
            set_ratio: 0.1,
            keys: 10_000,
            value_size: 32,
            preload: false,
            path: "/".to_string(),
            bin_ms: 20,
            timeout_ms: 1000,
            cpu: None,
            spin_us: 50,
            clients: 1,
            control: "breakwater".to_string(),
            slo_us: None,
            seda_adj_i: None,
            seda_initial_rate: None,
            bw_carry: false,
            bw_push: false,
            bw_intended_deadline: false,
            keep_requests: false,
            stall_us: None,
            hold: false,
        }
    }

    /// The steps of the measured window, warm-up excluded.
    pub fn measured_steps(&self) -> Vec<Step> {
        match &self.load {
            Load::Open { steps } => steps.clone(),
            Load::Closed { duration_s, .. } => vec![Step {
                rate: f64::INFINITY,
                duration_s: *duration_s,
            }],
        }
    }

    pub fn measured_duration_s(&self) -> f64 {
        self.measured_steps().iter().map(|s| s.duration_s).sum()
    }
}
