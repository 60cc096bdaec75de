//! Command-line flags and their translation into a [`Config`].
//!
//! Validation lives here so the engine can assume sane values, and so a bad
//! flag is a one-line error before any connection is opened.

use crate::arrivals::Step;
use crate::config::{Config, Load, ProtocolKind};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "tailscope-loadgen",
    version,
    about = "Open-loop load generator: Poisson arrivals, latency from intended send time"
)]
pub struct Args {
    /// Server address, host:port.
    #[arg(long)]
    pub target: String,
    #[arg(long, value_enum, default_value = "redis")]
    pub protocol: ProtocolKind,
    /// Requests per second (Poisson), or `max` for closed-loop capacity search.
    #[arg(long, default_value = "1000")]
    pub rate: String,
    /// Measured seconds (after warm-up). Ignored with --steps.
    #[arg(long, default_value = "10")]
    pub duration: f64,
    /// Seconds run before measuring, at the first rate; excluded from stats.
    #[arg(long, default_value = "1")]
    pub warmup: f64,
    /// Load steps `RATE:SECS,...`; RATE may be absolute or `0.5x` of --rate.
    #[arg(long)]
    pub steps: Option<String>,
    #[arg(long, default_value = "16")]
    pub connections: usize,
    /// Cap on pipelined requests per connection; arrivals beyond it wait
    /// (their latency still counts from the intended time). With --rate max,
    /// the closed-loop depth (default 1).
    #[arg(long)]
    pub max_outstanding_per_conn: Option<usize>,
    #[arg(long, default_value = "1")]
    pub seed: u64,
    /// Fraction of SETs (redis, memcached).
    #[arg(long, default_value = "0.1")]
    pub set_ratio: f64,
    /// Key space size: keys are key:0 .. key:<N-1>, chosen uniformly.
    #[arg(long, default_value = "10000")]
    pub keys: u64,
    #[arg(long, default_value = "32")]
    pub value_size: usize,
    /// SET every key once before the run (redis, memcached).
    #[arg(long)]
    pub preload: bool,
    /// HTTP request path.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// Write every successful reply's intended send time and latency here,
    /// binary (docs/loadgen.md, "Per-request records").
    #[arg(long)]
    pub requests_out: Option<String>,
    /// Spin instead of sleeping between arrivals, and treat a turn of the
    /// loop longer than this many microseconds as the generator's own stall
    /// (preempted, or its vCPU descheduled): the requests in flight or due
    /// during a stall, or within its length after it, are counted
    /// (`generator_stalls`) and kept out of the latency statistics. Open
    /// loop only; costs the generator's whole CPU.
    #[arg(long)]
    pub stall_us: Option<u64>,
    /// Stop (SIGSTOP) at the measured run's two edges, with every reply in
    /// and the connections open: once after the preload and the warm-up,
    /// once after the run. Whoever started the generator acts on the quiet
    /// server meanwhile (e.g. zeroes a profiler's counters, then dumps them)
    /// and resumes it with SIGCONT. The warm-up is then a run of its own on
    /// the same connections, drained before the stop, so the measured run
    /// holds no connection set-up or tear-down. Open loop only.
    #[arg(long)]
    pub hold: bool,
    /// Time-series bin width in milliseconds.
    #[arg(long, default_value = "20")]
    pub bin_ms: u64,
    /// How long to wait for replies after the last send before counting
    /// the rest as timeouts.
    #[arg(long, default_value = "1000")]
    pub timeout_ms: u64,
    /// Pin the generator (a single thread) to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Busy-poll this many microseconds before each arrival rather than
    /// sleeping; more is more punctual but burns more CPU.
    #[arg(long, default_value = "50")]
    pub spin_us: u64,
    /// Write the JSON report here (`-` for stdout).
    #[arg(long)]
    pub json: Option<String>,
    /// Write the time series as CSV here (`-` for stdout).
    #[arg(long)]
    pub csv: Option<String>,
    /// Do not print the human summary on stderr (errors still are).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Logical clients over the connections (--protocol breakwater).
    #[arg(long, default_value = "1000")]
    pub clients: usize,
    /// Client half of the overload control (--protocol breakwater): none,
    /// breakwater, breakwater-efficiency, seda, dagor, gradient.
    #[arg(long, default_value = "breakwater")]
    pub control: String,
    /// SLO in microseconds: goodput counts replies within it; with
    /// --protocol breakwater, requests waiting for credit expire after it.
    #[arg(long)]
    pub slo_us: Option<u64>,
    /// SEDA additive increase, req/s per adjustment (default: 0.5% of the
    /// per-client share of --rate).
    #[arg(long)]
    pub seda_adj_i: Option<f64>,
    /// SEDA initial per-client rate (default: the per-client share of --rate).
    #[arg(long)]
    pub seda_initial_rate: Option<f64>,
    /// Breakwater: a drained client sends its oldest queued request as its
    /// credit wait (`bw-kind: await`) instead of a bare credit wait; use
    /// with `bw-server --carry`.
    #[arg(long)]
    pub bw_carry: bool,
    /// Breakwater: each connection subscribes a credit stream and its
    /// clients wait for credits the server pushes on it instead of sending
    /// credit waits (server push; bw-server serves it always).
    #[arg(long)]
    pub bw_push: bool,
    /// Client-layer protocols: each request's deadline is its intended send
    /// time plus --slo-us (a `breakwater::client::Deadline`), so the client
    /// layer's local wait and the budget it sends count the generator's own
    /// lag; without it the client layer counts its SLO from the hand-off.
    /// Latency is measured from the intended time either way.
    #[arg(long)]
    pub bw_intended_deadline: bool,
}

impl Args {
    pub fn to_config(&self) -> Result<Config, String> {
        let load = if self.rate == "max" {
            if self.steps.is_some() {
                return Err("--steps cannot be combined with --rate max".into());
            }
            positive("--duration", self.duration)?;
            Load::Closed {
                depth: self.max_outstanding_per_conn.unwrap_or(1),
                duration_s: self.duration,
            }
        } else {
            let rate = parse_rate(&self.rate, None)?;
            let steps = match &self.steps {
                Some(spec) => parse_steps(spec, rate)?,
                None => {
                    positive("--duration", self.duration)?;
                    vec![Step {
                        rate,
                        duration_s: self.duration,
                    }]
                }
            };
            Load::Open { steps }
        };
        if !(self.warmup >= 0.0 && self.warmup.is_finite()) {
            return Err(format!(
                "--warmup must be >= 0 seconds, got {}",
                self.warmup
            ));
        }
        if self.connections == 0 {
            return Err("--connections must be at least 1".into());
        }
        if self.max_outstanding_per_conn == Some(0) {
            return Err("--max-outstanding-per-conn must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.set_ratio) {
            return Err(format!(
                "--set-ratio must be in [0, 1], got {}",
                self.set_ratio
            ));
        }
        if self.keys == 0 {
            return Err("--keys must be at least 1".into());
        }
        if self.bin_ms == 0 {
            return Err("--bin-ms must be at least 1".into());
        }
        if !self.path.starts_with('/') {
            return Err(format!("--path must start with '/', got {:?}", self.path));
        }
        if self.clients == 0 {
            return Err("--clients must be at least 1".into());
        }
        if self.slo_us == Some(0) {
            return Err("--slo-us must be at least 1".into());
        }
        for (flag, v) in [
            ("--seda-adj-i", self.seda_adj_i),
            ("--seda-initial-rate", self.seda_initial_rate),
        ] {
            if let Some(v) = v {
                positive(flag, v)?;
            }
        }
        if self.protocol == ProtocolKind::Breakwater {
            self.control
                .parse::<breakwater::ControlKind>()
                .map_err(|e| format!("--control: {e}"))?;
        }
        if let Some(us) = self.stall_us {
            if us < 10 {
                return Err(format!("--stall-us must be at least 10, got {us}"));
            }
            if self.protocol == ProtocolKind::Breakwater || !matches!(load, Load::Open { .. }) {
                return Err(
                    "--stall-us applies to open-loop runs (--rate N or --steps) \
                            of redis, memcached, http or line"
                        .into(),
                );
            }
        }
        if self.hold
            && (self.protocol == ProtocolKind::Breakwater || !matches!(load, Load::Open { .. }))
        {
            return Err("--hold applies to open-loop runs (--rate N or --steps) \
                        of redis, memcached, http or line"
                .into());
        }
        if self.requests_out.is_some() && self.protocol == ProtocolKind::Breakwater {
            return Err("--requests-out does not apply to --protocol breakwater".into());
        }
        if self.preload && !matches!(self.protocol, ProtocolKind::Redis | ProtocolKind::Memcached) {
            return Err("--preload only applies to --protocol redis or memcached".into());
        }
        Ok(Config {
            target: self.target.clone(),
            protocol: self.protocol,
            load,
            warmup_s: self.warmup,
            connections: self.connections,
            max_outstanding_per_conn: self.max_outstanding_per_conn,
            seed: self.seed,
            set_ratio: self.set_ratio,
            keys: self.keys,
            value_size: self.value_size,
            preload: self.preload,
            path: self.path.clone(),
            bin_ms: self.bin_ms,
            timeout_ms: self.timeout_ms,
            cpu: self.cpu,
            spin_us: self.spin_us,
            clients: self.clients,
            control: self.control.clone(),
            slo_us: self.slo_us,
            seda_adj_i: self.seda_adj_i,
            seda_initial_rate: self.seda_initial_rate,
            bw_carry: self.bw_carry,
            bw_push: self.bw_push,
            bw_intended_deadline: self.bw_intended_deadline,
            keep_requests: self.requests_out.is_some(),
            stall_us: self.stall_us,
            hold: self.hold,
        })
    }
}

fn positive(flag: &str, v: f64) -> Result<f64, String> {
    if v > 0.0 && v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{flag} must be a positive number, got {v}"))
    }
}

/// `20000` or, relative to `base`, `0.5x`.
fn parse_rate(s: &str, base: Option<f64>) -> Result<f64, String> {
    let bad = || format!("bad rate {s:?}: expected requests/s like 20000 or a multiple like 0.5x");
    let rate = match (s.strip_suffix('x'), base) {
        (Some(mult), Some(base)) => mult.parse::<f64>().map_err(|_| bad())? * base,
        (Some(_), None) => return Err(bad()),
        (None, _) => s.parse::<f64>().map_err(|_| bad())?,
    };
    positive("rate", rate)
}

/// `RATE:SECS,RATE:SECS,...`
pub fn parse_steps(spec: &str, base_rate: f64) -> Result<Vec<Step>, String> {
    spec.split(',')
        .map(|part| {
            let (rate, secs) = part
                .trim()
                .split_once(':')
                .ok_or_else(|| format!("bad step {part:?}: expected RATE:SECS"))?;
            let duration_s = secs
                .parse::<f64>()
                .map_err(|_| format!("bad step {part:?}: SECS is not a number"))?;
            Ok(Step {
                rate: parse_rate(rate, Some(base_rate))?,
                duration_s: positive("step duration", duration_s)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["tailscope-loadgen", "--target", "127.0.0.1:1"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .to_config()
    }

    #[test]
    fn steps_absolute_and_relative() {
        let steps = parse_steps("20000:5, 0.5x:2.5", 1000.0).unwrap();
        assert_eq!(
            steps,
            [
                Step {
                    rate: 20000.0,
                    duration_s: 5.0
                },
                Step {
                    rate: 500.0,
                    duration_s: 2.5
                }
            ]
        );
        assert!(parse_steps("20000", 1.0).is_err());
        assert!(parse_steps("abc:1", 1.0).is_err());
        assert!(parse_steps("100:0", 1.0).is_err());
    }

    #[test]
    fn stall_us_is_open_loop_only_and_at_least_10() {
        let c = args(&["--rate", "1000", "--stall-us", "200"]).unwrap();
        assert_eq!(c.stall_us, Some(200));
        assert!(args(&["--rate", "1000", "--stall-us", "5"])
            .unwrap_err()
            .contains("at least 10"));
        assert!(args(&["--rate", "max", "--stall-us", "200"])
            .unwrap_err()
            .contains("open-loop"));
        assert!(!args(&["--rate", "1000"]).unwrap().keep_requests);
        assert!(
            args(&["--rate", "1000", "--requests-out", "/tmp/x"])
                .unwrap()
                .keep_requests
        );
    }

    #[test]
    fn rate_max_is_closed_loop() {
        let c = args(&[
            "--rate",
            "max",
            "--max-outstanding-per-conn",
            "4",
            "--duration",
            "2",
        ])
        .unwrap();
        assert_eq!(
            c.load,
            Load::Closed {
                depth: 4,
                duration_s: 2.0
            }
        );
        assert!(args(&["--rate", "max", "--steps", "1:1"]).is_err());
    }

    #[test]
    fn bad_values_are_one_line_errors() {
        for bad in [
            &["--rate", "fast"][..],
            &["--rate=-5"],
            &["--connections", "0"],
            &["--set-ratio", "2"],
            &["--duration", "0"],
            &["--protocol", "line", "--preload"],
            &["--protocol", "breakwater", "--control", "magic"],
            &["--clients", "0"],
            &["--slo-us", "0"],
            &["--seda-adj-i=-1"],
        ] {
            let err = args(bad).unwrap_err();
            assert!(!err.trim().contains('\n'), "{bad:?}: {err}");
        }
    }
}
