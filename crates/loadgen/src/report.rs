//! Rendering a [`Summary`]: a human summary, the JSON report, the CSV time
//! series. Nothing here computes a statistic.

use crate::stats::Summary;
use std::fmt::Write as _;
use std::io::Write;

/// The human summary printed on stderr.
pub fn human(s: &Summary) -> String {
    let c = &s.counts;
    let l = &s.latency_us;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "target {} ({:?}), {} connections, {:.1} s measured",
        s.config.target, s.config.protocol, s.config.connections, s.duration_s
    );
    let _ = writeln!(
        out,
        "requests: {} scheduled, {} sent, {} completed, {} errors, {} timeouts; achieved {:.0} req/s",
        c.scheduled, c.sent, c.completed, c.errors, c.timeouts, c.achieved_rps
    );
    let _ = writeln!(
        out,
        "latency (us, from intended send): p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}  mean {:.1}",
        l.p50, l.p90, l.p99, l.p999, l.max, l.mean
    );
    let _ = writeln!(out, "max send lag: {:.1} us", s.max_send_lag_us);
    if let Some(g) = &s.generator_stalls {
        let _ = writeln!(
            out,
            "generator stalls: {} ({:.1} ms in all, longest {:.0} us); {} replies they disturbed are kept out of the latencies",
            g.count, g.total_ms, g.max_us, g.disturbed
        );
    }
    if let Some(slo) = s.slo_us {
        let _ = writeln!(
            out,
            "goodput (within {slo:.0} us SLO): {:.0} req/s; rejected {} (reject latency p50 {:.1} us, p99 {:.1} us), expired at client {}, dropped at client {}",
            c.goodput_rps, c.rejected, s.reject_latency_us.p50, s.reject_latency_us.p99, c.expired, c.client_dropped
        );
    }
    if s.steps.len() > 1 {
        for step in &s.steps {
            let _ = writeln!(
                out,
                "  step {:>10} req/s x {:.1} s: achieved {:.0} req/s, p50 {:.1} us, p99 {:.1} us, errors {}, timeouts {}",
                step.rate.map_or("max".to_string(), |r| format!("{r:.0}")),
                step.duration_s,
                step.counts.achieved_rps,
                step.latency_us.p50,
                step.latency_us.p99,
                step.counts.errors,
                step.counts.timeouts
            );
        }
    }
    if s.max_send_lag_us > 1000.0 {
        let _ = writeln!(
            out,
            "warning: sends fell up to {:.1} ms behind schedule; the generator or the outstanding cap was a bottleneck",
            s.max_send_lag_us / 1000.0
        );
    }
    out
}

pub fn json(s: &Summary) -> String {
    serde_json::to_string_pretty(s).expect("summary is always serialisable") + "\n"
}

/// `t_ms,sent,completed,errors,p50_us,p99_us,good,rejected,reject_mean_us`,
/// empty cells for empty bins (columns only ever added at the end).
pub fn csv(s: &Summary) -> String {
    let mut out =
        String::from("t_ms,sent,completed,errors,p50_us,p99_us,good,rejected,reject_mean_us\n");
    let cell = |v: Option<u32>| v.map_or(String::new(), |v| v.to_string());
    for b in &s.timeseries {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{}",
            b.t_ms,
            b.sent,
            b.completed,
            b.errors,
            cell(b.p50_us),
            cell(b.p99_us),
            b.good,
            b.rejected,
            b.reject_mean_us
                .map_or(String::new(), |v| format!("{v:.1}"))
        );
    }
    out
}

/// Magic of a `--requests-out` file (docs/loadgen.md, "Per-request records").
pub const REQUESTS_MAGIC: &[u8; 8] = b"TSLGRQ01";

/// The `--requests-out` file: magic, CLOCK_MONOTONIC of time zero, the
/// record count, then per successful reply its intended time (ns after time
/// zero), latency (ns) and flags (`stats::REQUEST_DISTURBED`), all
/// little-endian u64.
pub fn requests_bytes(s: &Summary) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + 24 * s.requests.len());
    out.extend_from_slice(REQUESTS_MAGIC);
    out.extend_from_slice(&s.start_monotonic_ns.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&(s.requests.len() as u64).to_le_bytes());
    for &(intended, latency, flags) in &s.requests {
        for v in [intended, latency, flags] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Write `text` to `path`, or to stdout for `-`.
pub fn write_to(path: &str, text: &str) -> Result<(), String> {
    let result = if path == "-" {
        std::io::stdout().lock().write_all(text.as_bytes())
    } else {
        std::fs::write(path, text)
    };
    result.map_err(|e| format!("cannot write {path}: {e}"))
}
