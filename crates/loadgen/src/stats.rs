//! What a run measured, and the summary computed from it.
//!
//! Every request is attributed to the moment it was *scheduled*: its
//! latency is `reply time - intended time`, it falls in the time-series bin
//! and load step of its intended time, and it is excluded if that time is in
//! the warm-up. Requests that go unanswered past `--timeout-ms` after the
//! last send are timeouts. Error replies are counted but kept out of the
//! latency histograms, so latency describes successful work.
//!
//! Per-bin percentiles come from the raw per-request latencies (4 bytes per
//! request, microseconds) rather than from one histogram per bin, which
//! would cost far more for short bins at low rates.

use crate::arrivals::Step;
use crate::config::Config;
use crate::protocol::Outcome;
use hdrhistogram::Histogram;
use serde::Serialize;

/// Longest latency the histograms resolve; longer values are clamped.
const MAX_LATENCY_NS: u64 = 3_600 * 1_000_000_000;

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("static bounds are valid")
}

#[derive(Default)]
struct Counts {
    scheduled: u64,
    sent: u64,
    completed: u64,
    errors: u64,
    timeouts: u64,
    /// Successful replies within the SLO (when one is set).
    good: u64,
    /// Error replies that were overload rejections (a subset of errors).
    rejected: u64,
    /// Failed at the client without being sent: expired waiting for
    /// credit, or dropped by the client's control.
    expired: u64,
    client_dropped: u64,
}

struct StepStats {
    end_ns: u64,
    counts: Counts,
    histogram: Histogram<u64>,
}

#[derive(Default)]
struct Bin {
    sent: u64,
    completed: u64,
    errors: u64,
    latencies_us: Vec<u32>,
    good: u64,
    rejected: u64,
    reject_sum_ns: u64,
}

pub struct Recorder {
    measure_start_ns: u64,
    measure_end_ns: u64,
    bin_ns: u64,
    totals: Counts,
    overall: Histogram<u64>,
    steps: Vec<StepStats>,
    bins: Vec<Bin>,
    max_send_lag_ns: u64,
    slo_ns: Option<u64>,
    /// Reject latency: from the actual send to the rejection's arrival.
    rejects: Histogram<u64>,
    /// Where successful replies' latency went (client-layer protocols).
    split: Option<Split>,
    /// (intended time, latency, flags) of every successful measured reply,
    /// in ns, when `--requests-out` asked for them (flags: REQUEST_DISTURBED).
    requests: Option<Vec<(u64, u64, u64)>>,
    /// The generator's own stalls (`--stall-us`): (start, end) in ns. While
    /// they are kept, successful replies wait in `pending` until `finish`
    /// (a stall is seen only on the loop turn after it).
    stalls: Option<Vec<(u64, u64)>>,
    pending: Vec<(u64, u64)>,
}

/// `--requests-out` flag: the reply was disturbed by a generator stall and
/// kept out of the latency statistics.
pub const REQUEST_DISTURBED: u64 = 1;

/// Windows of time that a stall disturbs, merged and sorted: each stall from
/// its start to as long again after its end (the burst of late sends it
/// leaves drains within that below saturation).
fn stall_windows(stalls: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut w: Vec<(u64, u64)> = stalls.iter().map(|&(a, b)| (a, b + (b - a))).collect();
    w.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(w.len());
    for (a, b) in w {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// Whether a request in flight over `[from, to]` overlaps a window.
fn disturbed(windows: &[(u64, u64)], from: u64, to: u64) -> bool {
    let i = windows.partition_point(|w| w.0 <= to);
    i > 0 && windows[i - 1].1 > from
}

/// A successful reply's latency in three parts: the generator's own lag
/// (intended time to the hand-off to the client layer), the wait at the
/// client layer (hand-off to the actual send: credit, rate limit), and the
/// rest (actual send to the reply's arrival: network, server, the
/// generator reading the reply). The parts add up to the latency.
struct Split {
    lag: Histogram<u64>,
    wait: Histogram<u64>,
    server: Histogram<u64>,
    /// Replies later than the SLO, and the sums of their parts.
    late: u64,
    late_ns: [u64; 3],
}

impl Recorder {
    /// `measure_start_ns` is the warm-up length; `steps` the measured steps.
    pub fn new(measure_start_ns: u64, steps: &[Step], bin_ms: u64) -> Self {
        let mut end = measure_start_ns as f64;
        let steps: Vec<StepStats> = steps
            .iter()
            .map(|s| {
                end += s.duration_s * 1e9;
                StepStats {
                    end_ns: end as u64,
                    counts: Counts::default(),
                    histogram: new_histogram(),
                }
            })
            .collect();
        let measure_end_ns = steps.last().map_or(measure_start_ns, |s| s.end_ns);
        let bin_ns = bin_ms * 1_000_000;
        let n_bins = (measure_end_ns - measure_start_ns).div_ceil(bin_ns) as usize;
        Recorder {
            measure_start_ns,
            measure_end_ns,
            bin_ns,
            totals: Counts::default(),
            overall: new_histogram(),
            steps,
            bins: (0..n_bins).map(|_| Bin::default()).collect(),
            max_send_lag_ns: 0,
            slo_ns: None,
            rejects: new_histogram(),
            split: None,
            requests: None,
            stalls: None,
            pending: Vec::new(),
        }
    }

    /// A successful reply's latency split (see [`SplitSummary`]): handed to
    /// the client layer at `launched_ns`, sent at `sent_ns`, answered at
    /// `now_ns`. Times before `intended_ns` (or out of order) count as 0.
    pub fn on_split(&mut self, intended_ns: u64, launched_ns: u64, sent_ns: u64, now_ns: u64) {
        if self.locate(intended_ns).is_none() {
            return;
        }
        // clamp() panics when min > max: a reply stamped before its
        // intended time (clock steps) counts every part as 0.
        let now_ns = now_ns.max(intended_ns);
        let launched = launched_ns.clamp(intended_ns, now_ns);
        let sent = sent_ns.clamp(launched, now_ns);
        let parts = [launched - intended_ns, sent - launched, now_ns - sent];
        let late = self.slo_ns.is_some_and(|slo| now_ns - intended_ns > slo);
        let split = self.split.get_or_insert_with(|| Split {
            lag: new_histogram(),
            wait: new_histogram(),
            server: new_histogram(),
            late: 0,
            late_ns: [0; 3],
        });
        for (h, v) in [&mut split.lag, &mut split.wait, &mut split.server]
            .into_iter()
            .zip(parts)
        {
            h.saturating_record(v.clamp(1, MAX_LATENCY_NS));
        }
        if late {
            split.late += 1;
            for (sum, v) in split.late_ns.iter_mut().zip(parts) {
                *sum += v;
            }
        }
    }

    /// Count successful replies within `slo_ns` as goodput.
    pub fn set_slo(&mut self, slo_ns: Option<u64>) {
        self.slo_ns = slo_ns;
    }

    /// An overload rejection: an error reply, whose latency from the
    /// actual send (`sent_ns`) is the reject latency.
    pub fn on_reject(&mut self, intended_ns: u64, sent_ns: u64, now_ns: u64) {
        let Some((step, bin)) = self.locate(intended_ns) else {
            return;
        };
        self.on_reply(intended_ns, now_ns, Outcome::Error);
        let lat = now_ns.saturating_sub(sent_ns).clamp(1, MAX_LATENCY_NS);
        self.totals.rejected += 1;
        self.steps[step].counts.rejected += 1;
        self.bins[bin].rejected += 1;
        self.bins[bin].reject_sum_ns += lat;
        self.rejects.saturating_record(lat);
    }

    /// A request the client itself gave up on (never sent, or dropped).
    pub fn on_client_failure(&mut self, intended_ns: u64, expired: bool) {
        if let Some((step, _)) = self.locate(intended_ns) {
            for c in [&mut self.totals, &mut self.steps[step].counts] {
                if expired {
                    c.expired += 1;
                } else {
                    c.client_dropped += 1;
                }
            }
        }
    }

    /// Step and bin of a measured intended time; `None` outside the window.
    fn locate(&self, intended_ns: u64) -> Option<(usize, usize)> {
        if intended_ns < self.measure_start_ns || intended_ns >= self.measure_end_ns {
            return None;
        }
        let step = self.steps.iter().position(|s| intended_ns < s.end_ns)?;
        let bin = ((intended_ns - self.measure_start_ns) / self.bin_ns) as usize;
        Some((step, bin))
    }

    /// Keep each successful reply's intended time and latency (`--requests-out`).
    pub fn keep_requests(&mut self) {
        self.requests = Some(Vec::new());
    }

    /// Record the generator's stalls and keep the replies they disturb out of
    /// the latency statistics (`--stall-us`).
    pub fn detect_stalls(&mut self) {
        self.stalls = Some(Vec::new());
    }

    /// The generator was off its CPU from `from_ns` to `to_ns`.
    pub fn on_stall(&mut self, from_ns: u64, to_ns: u64) {
        if let Some(s) = self.stalls.as_mut() {
            s.push((from_ns, to_ns));
        }
    }

    pub fn on_scheduled(&mut self, intended_ns: u64) {
        if let Some((step, _)) = self.locate(intended_ns) {
            self.totals.scheduled += 1;
            self.steps[step].counts.scheduled += 1;
        }
    }

    pub fn on_send(&mut self, intended_ns: u64, now_ns: u64) {
        if let Some((step, bin)) = self.locate(intended_ns) {
            self.totals.sent += 1;
            self.steps[step].counts.sent += 1;
            self.bins[bin].sent += 1;
            self.max_send_lag_ns = self.max_send_lag_ns.max(now_ns.saturating_sub(intended_ns));
        }
    }

    pub fn on_reply(&mut self, intended_ns: u64, now_ns: u64, outcome: Outcome) {
        let Some((step, bin)) = self.locate(intended_ns) else {
            return;
        };
        self.totals.completed += 1;
        self.steps[step].counts.completed += 1;
        self.bins[bin].completed += 1;
        if outcome == Outcome::Error {
            self.totals.errors += 1;
            self.steps[step].counts.errors += 1;
            self.bins[bin].errors += 1;
            return;
        }
        if self.stalls.is_some() {
            self.pending.push((intended_ns, now_ns));
            return;
        }
        self.record_ok(step, bin, intended_ns, now_ns);
    }

    /// A successful reply's latency into the histograms, bins and records.
    fn record_ok(&mut self, step: usize, bin: usize, intended_ns: u64, now_ns: u64) {
        let latency_ns = now_ns.saturating_sub(intended_ns).clamp(1, MAX_LATENCY_NS);
        if self.slo_ns.is_some_and(|slo| latency_ns <= slo) {
            self.totals.good += 1;
            self.steps[step].counts.good += 1;
            self.bins[bin].good += 1;
        }
        self.overall.saturating_record(latency_ns);
        self.steps[step].histogram.saturating_record(latency_ns);
        let us = (latency_ns / 1000).min(u64::from(u32::MAX)) as u32;
        self.bins[bin].latencies_us.push(us);
        if let Some(r) = self.requests.as_mut() {
            r.push((intended_ns, latency_ns, 0));
        }
    }

    /// Sort the replies held back while stalls were detected: a reply in
    /// flight during a stall's window is counted as disturbed, the rest
    /// recorded. Returns the stalls' summary.
    fn settle_stalls(&mut self) -> Option<StallSummary> {
        let stalls = self.stalls.take()?;
        let windows = stall_windows(&stalls);
        let mut n_disturbed = 0;
        for (intended_ns, now_ns) in std::mem::take(&mut self.pending) {
            let Some((step, bin)) = self.locate(intended_ns) else {
                continue;
            };
            if disturbed(&windows, intended_ns, now_ns) {
                n_disturbed += 1;
                if let Some(r) = self.requests.as_mut() {
                    r.push((intended_ns, now_ns - intended_ns, REQUEST_DISTURBED));
                }
            } else {
                self.record_ok(step, bin, intended_ns, now_ns);
            }
        }
        let measured =
            |&&(a, b): &&(u64, u64)| b > self.measure_start_ns && a < self.measure_end_ns;
        let inside: Vec<&(u64, u64)> = stalls.iter().filter(measured).collect();
        Some(StallSummary {
            count: inside.len() as u64,
            total_ms: inside.iter().map(|(a, b)| b - a).sum::<u64>() as f64 / 1e6,
            max_us: inside.iter().map(|(a, b)| b - a).max().unwrap_or(0) as f64 / 1e3,
            disturbed: n_disturbed,
        })
    }

    /// A request (sent or still waiting to be sent) that never got a reply.
    pub fn on_timeout(&mut self, intended_ns: u64) {
        if let Some((step, _)) = self.locate(intended_ns) {
            self.totals.timeouts += 1;
            self.steps[step].counts.timeouts += 1;
        }
    }

    pub fn finish(mut self, config: &Config) -> Summary {
        let generator_stalls = self.settle_stalls();
        let duration_s = config.measured_duration_s();
        let steps = config
            .measured_steps()
            .iter()
            .zip(&self.steps)
            .map(|(step, stats)| StepSummary {
                rate: step.rate.is_finite().then_some(step.rate),
                duration_s: step.duration_s,
                counts: CountSummary::new(&stats.counts, step.duration_s),
                latency_us: LatencySummary::from_histogram(&stats.histogram),
            })
            .collect();
        let bin_ms = self.bin_ns as f64 / 1e6;
        let timeseries = self
            .bins
            .into_iter()
            .enumerate()
            .map(|(i, mut bin)| {
                bin.latencies_us.sort_unstable();
                BinSummary {
                    t_ms: i as f64 * bin_ms,
                    sent: bin.sent,
                    completed: bin.completed,
                    errors: bin.errors,
                    p50_us: quantile_sorted(&bin.latencies_us, 0.5),
                    p99_us: quantile_sorted(&bin.latencies_us, 0.99),
                    good: bin.good,
                    rejected: bin.rejected,
                    reject_mean_us: (bin.rejected > 0)
                        .then(|| bin.reject_sum_ns as f64 / bin.rejected as f64 / 1e3),
                }
            })
            .collect();
        Summary {
            generator_stalls,
            start_monotonic_ns: None,
            requests: self.requests.unwrap_or_default(),
            config: config.clone(),
            duration_s,
            counts: CountSummary::new(&self.totals, duration_s),
            latency_us: LatencySummary::from_histogram(&self.overall),
            max_send_lag_us: self.max_send_lag_ns as f64 / 1e3,
            steps,
            timeseries,
            slo_us: self.slo_ns.map(|ns| ns as f64 / 1e3),
            reject_latency_us: LatencySummary::from_histogram(&self.rejects),
            admitted_split_us: self.split.map(|sp| {
                let mean =
                    |i: usize| (sp.late > 0).then(|| sp.late_ns[i] as f64 / sp.late as f64 / 1e3);
                SplitSummary {
                    lag: LatencySummary::from_histogram(&sp.lag),
                    client_wait: LatencySummary::from_histogram(&sp.wait),
                    server: LatencySummary::from_histogram(&sp.server),
                    late: sp.late,
                    late_mean_lag: mean(0),
                    late_mean_client_wait: mean(1),
                    late_mean_server: mean(2),
                }
            }),
        }
    }
}

/// Where successful replies' latency (from the intended time) went, in
/// microseconds: `lag` from the intended time to the hand-off to the
/// client layer (the generator running behind its schedule), `client_wait`
/// from there to the actual send (waiting for credit), `server` from the
/// send to the reply's arrival (network, server queue and service, and the
/// generator reading the reply). `late`: replies after the SLO, with the
/// mean of each part over them.
#[derive(Debug, Clone, Serialize)]
pub struct SplitSummary {
    pub lag: LatencySummary,
    pub client_wait: LatencySummary,
    pub server: LatencySummary,
    pub late: u64,
    pub late_mean_lag: Option<f64>,
    pub late_mean_client_wait: Option<f64>,
    pub late_mean_server: Option<f64>,
}

/// Nearest-rank quantile of sorted values: the smallest value with at least
/// `q * n` values at or below it. `None` for an empty bin.
pub fn quantile_sorted(sorted: &[u32], q: f64) -> Option<u32> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub config: Config,
    pub duration_s: f64,
    #[serde(flatten)]
    pub counts: CountSummary,
    pub latency_us: LatencySummary,
    /// Worst gap between a request's intended and actual send time. If this
    /// is large the generator (or `--max-outstanding-per-conn`) was the
    /// bottleneck, and latency includes that wait.
    pub max_send_lag_us: f64,
    pub steps: Vec<StepSummary>,
    pub timeseries: Vec<BinSummary>,
    /// The SLO goodput was counted against, if any.
    pub slo_us: Option<f64>,
    /// From the actual send to the arrival of an overload rejection.
    pub reject_latency_us: LatencySummary,
    /// Where successful replies' latency went (`--protocol breakwater`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admitted_split_us: Option<SplitSummary>,
    /// CLOCK_MONOTONIC (ns) of the run's time zero, the origin of the
    /// intended times (`--requests-out`), so that other tracers' timestamps
    /// (eBPF's `bpf_ktime_get_ns`) can be lined up with the requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_monotonic_ns: Option<u64>,
    /// (intended time, latency, flags) of each successful measured reply in
    /// ns, when kept (`Config::keep_requests`); written by `--requests-out`.
    #[serde(skip)]
    pub requests: Vec<(u64, u64, u64)>,
    /// The generator's own stalls, when detected (`--stall-us`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generator_stalls: Option<StallSummary>,
}

/// The generator's own stalls (`--stall-us`): turns of its loop longer than
/// the limit, within the measured window, and the successful replies they
/// disturbed (counted in `completed`, kept out of every latency figure).
#[derive(Debug, Clone, Serialize)]
pub struct StallSummary {
    pub count: u64,
    pub total_ms: f64,
    pub max_us: f64,
    pub disturbed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CountSummary {
    pub scheduled: u64,
    pub sent: u64,
    /// Replies received, error replies included.
    pub completed: u64,
    pub errors: u64,
    pub timeouts: u64,
    /// `completed / duration`.
    pub achieved_rps: f64,
    /// Successful replies within the SLO, and their rate (0 without an SLO).
    pub good: u64,
    pub goodput_rps: f64,
    /// Overload rejections (part of `errors`).
    pub rejected: u64,
    /// Never sent: expired waiting for credit at the client.
    pub expired: u64,
    /// Dropped by the client's own control (DAGOR threshold, SEDA rate).
    pub client_dropped: u64,
}

impl CountSummary {
    fn new(c: &Counts, duration_s: f64) -> Self {
        CountSummary {
            scheduled: c.scheduled,
            sent: c.sent,
            completed: c.completed,
            errors: c.errors,
            timeouts: c.timeouts,
            achieved_rps: if duration_s > 0.0 {
                c.completed as f64 / duration_s
            } else {
                0.0
            },
            good: c.good,
            goodput_rps: if duration_s > 0.0 {
                c.good as f64 / duration_s
            } else {
                0.0
            },
            rejected: c.rejected,
            expired: c.expired,
            client_dropped: c.client_dropped,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StepSummary {
    /// Target rate; `null` for closed loop.
    pub rate: Option<f64>,
    pub duration_s: f64,
    #[serde(flatten)]
    pub counts: CountSummary,
    pub latency_us: LatencySummary,
}

/// Latency of successful replies, microseconds, from an HdrHistogram with 3
/// significant digits. All zero when nothing succeeded.
#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl LatencySummary {
    fn from_histogram(h: &Histogram<u64>) -> Self {
        let us = |ns: u64| ns as f64 / 1e3;
        if h.is_empty() {
            return LatencySummary {
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                p999: 0.0,
                max: 0.0,
                mean: 0.0,
            };
        }
        LatencySummary {
            p50: us(h.value_at_quantile(0.5)),
            p90: us(h.value_at_quantile(0.9)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
            mean: h.mean() / 1e3,
        }
    }
}

/// One `--bin-ms` slice of the measured window, by intended send time.
#[derive(Debug, Clone, Serialize)]
pub struct BinSummary {
    /// Bin start, milliseconds after the warm-up ended.
    pub t_ms: f64,
    pub sent: u64,
    pub completed: u64,
    pub errors: u64,
    pub p50_us: Option<u32>,
    pub p99_us: Option<u32>,
    /// Successful replies within the SLO.
    pub good: u64,
    pub rejected: u64,
    /// Mean reject latency of the bin's rejections.
    pub reject_mean_us: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Load, ProtocolKind};

    #[test]
    fn nearest_rank_quantiles() {
        assert_eq!(quantile_sorted(&[], 0.5), None);
        assert_eq!(quantile_sorted(&[7], 0.99), Some(7));
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile_sorted(&v, 0.5), Some(50));
        assert_eq!(quantile_sorted(&v, 0.99), Some(99));
    }

    /// One measured step of 1 s at 100 req/s, and a line-protocol config for it.
    fn one_second_at_100() -> ([Step; 1], Config) {
        let steps = [Step {
            rate: 100.0,
            duration_s: 1.0,
        }];
        let load = Load::Open {
            steps: steps.to_vec(),
        };
        (steps, Config::new("x:1", ProtocolKind::Line, load))
    }

    #[test]
    fn leaves_replies_a_generator_stall_disturbed_out_of_the_latencies() {
        let (steps, config) = one_second_at_100();
        let mut r = Recorder::new(0, &steps, 100);
        r.detect_stalls();
        r.keep_requests();
        let ms = 1_000_000;
        // in flight from 10 to 10.03 ms: clean
        r.on_reply(10 * ms, 10 * ms + 30_000, Outcome::Ok);
        // in flight over the stall (100-108 ms): disturbed
        r.on_reply(99 * ms, 108 * ms + 10_000, Outcome::Ok);
        // due during it, sent late: disturbed
        r.on_reply(104 * ms, 108 * ms + 20_000, Outcome::Ok);
        // due within the stall's length after it (108-116 ms): disturbed
        r.on_reply(115 * ms, 115 * ms + 30_000, Outcome::Ok);
        // after that window: clean
        r.on_reply(117 * ms, 117 * ms + 50_000, Outcome::Ok);
        // the stall is seen on the loop turn after it, after some replies
        r.on_stall(100 * ms, 108 * ms);
        r.on_reply(200 * ms, 200 * ms + 40_000, Outcome::Error);
        let s = r.finish(&config);
        let g = s.generator_stalls.expect("stalls were detected");
        assert_eq!((g.count, g.disturbed), (1, 3));
        assert_eq!(g.total_ms, 8.0);
        assert_eq!(s.counts.completed, 6);
        assert_eq!(s.counts.errors, 1);
        // only the two clean replies are in the latencies: 30 and 50 µs
        assert_eq!(s.latency_us.max.round(), 50.0);
        assert!((s.latency_us.mean - 40.0).abs() < 0.1);
        let flagged: Vec<u64> = s.requests.iter().map(|r| r.2).collect();
        assert_eq!(
            flagged.iter().filter(|&&f| f == REQUEST_DISTURBED).count(),
            3
        );
        assert_eq!(s.requests.len(), 5);
    }

    #[test]
    fn stall_windows_merge_and_bound_each_request() {
        let w = stall_windows(&[(100, 110), (105, 125), (300, 301)]);
        assert_eq!(w, vec![(100, 145), (300, 302)]);
        assert!(disturbed(&w, 90, 100));
        assert!(disturbed(&w, 144, 200));
        assert!(!disturbed(&w, 145, 299));
        assert!(!disturbed(&w, 0, 99));
        assert!(disturbed(&w, 301, 400));
        assert!(!disturbed(&[], 0, u64::MAX));
    }

    #[test]
    fn attributes_by_intended_time_and_skips_warmup() {
        let steps = [
            Step {
                rate: 100.0,
                duration_s: 0.1,
            },
            Step {
                rate: 200.0,
                duration_s: 0.1,
            },
        ];
        let config = Config::new(
            "x:1",
            ProtocolKind::Line,
            Load::Open {
                steps: steps.to_vec(),
            },
        );
        let warmup = 50_000_000;
        let mut r = Recorder::new(warmup, &steps, 20);
        // Warm-up request: ignored.
        r.on_send(10_000_000, 10_000_000);
        r.on_reply(10_000_000, 11_000_000, Outcome::Ok);
        // Scheduled in the first bin, sent 5 ms late, answered 30 ms after
        // its intended time: counts 30 ms, in bin 0 and step 0.
        r.on_send(60_000_000, 65_000_000);
        r.on_reply(60_000_000, 90_000_000, Outcome::Ok);
        // An error in step 1.
        r.on_send(200_000_000, 200_000_000);
        r.on_reply(200_000_000, 201_000_000, Outcome::Error);
        r.on_timeout(240_000_000);
        let s = r.finish(&config);
        assert_eq!(
            (
                s.counts.sent,
                s.counts.completed,
                s.counts.errors,
                s.counts.timeouts
            ),
            (2, 2, 1, 1)
        );
        assert_eq!(s.max_send_lag_us, 5000.0);
        assert!((s.latency_us.p50 - 30_000.0).abs() < 30.0);
        assert_eq!(s.timeseries.len(), 10);
        assert_eq!(s.timeseries[0].p50_us, Some(30_000));
        assert_eq!(s.timeseries[7].errors, 1);
        assert_eq!(s.steps[0].counts.completed, 1);
        assert_eq!(s.steps[1].counts.errors, 1);
    }

    #[test]
    fn splits_admitted_latency_into_lag_wait_and_server() {
        let (steps, config) = one_second_at_100();
        let mut r = Recorder::new(0, &steps, 20);
        r.set_slo(Some(2_000_000));
        // In time: 100 us lag, 300 us at the client, 600 us at the server.
        r.on_split(1_000_000, 1_100_000, 1_400_000, 2_000_000);
        // Late (2.5 ms): 500 us lag, 1.5 ms waiting, 500 us at the server.
        r.on_split(10_000_000, 10_500_000, 12_000_000, 12_500_000);
        // Out-of-order stamps are clamped, never negative.
        r.on_split(20_000_000, 19_000_000, 25_000_000, 20_100_000);
        // Outside the measured window: ignored.
        r.on_split(5_000_000_000, 5_000_000_000, 5_000_000_000, 5_000_000_001);
        let s = r.finish(&config);
        // A reply stamped before its intended time: no panic, all parts 0.
        let mut r2 = Recorder::new(0, &steps, 20);
        r2.on_split(30_000_000, 30_000_000, 30_000_000, 29_000_000);
        let sp2 = r2.finish(&config).admitted_split_us.expect("recorded");
        assert!(sp2.lag.max <= 0.01 && sp2.server.max <= 0.01, "{sp2:?}");
        let sp = s.admitted_split_us.expect("split recorded");
        assert_eq!(sp.late, 1);
        assert_eq!(sp.late_mean_lag, Some(500.0));
        assert_eq!(sp.late_mean_client_wait, Some(1500.0));
        assert_eq!(sp.late_mean_server, Some(500.0));
        assert!((sp.lag.max - 500.0).abs() < 1.0, "{:?}", sp.lag);
        assert!(
            (sp.client_wait.max - 1500.0).abs() < 2.0,
            "{:?}",
            sp.client_wait
        );
        assert!((sp.server.max - 600.0).abs() < 1.0, "{:?}", sp.server);
        // The clamped one counts 0 lag, 100 us waiting, 0 at the server:
        // medians 100 / 300 / 500 us of {100, 500, 0}, {300, 1500, 100},
        // {600, 500, 0}.
        assert!((sp.lag.p50 - 100.0).abs() < 1.0, "{:?}", sp.lag);
        assert!(
            (sp.client_wait.p50 - 300.0).abs() < 1.0,
            "{:?}",
            sp.client_wait
        );
        assert!((sp.server.p50 - 500.0).abs() < 1.0, "{:?}", sp.server);
        // Without any split recorded the field is absent.
        let r = Recorder::new(0, &steps, 20);
        assert!(r.finish(&config).admitted_split_us.is_none());
    }
}
