//! Burst sampling for zero-instrumentation mode (`--burst`).
//!
//! At a low sampling rate almost all of tailscope's cost is the fixed cost of
//! running a BPF program for every socket call and every interrupt on the
//! machine (about 7 ns each on this kind of VM), sampled or not. Burst
//! sampling samples in short windows instead: during a window every
//! per-request and per-interrupt program is attached and requests are
//! sampled at `in_window_ppm`; between windows those programs are detached
//! and cost nothing. The scheduler's programs stay attached throughout, so a
//! window's first requests have correct switch and wait state.
//!
//! The overall rate is unchanged: `rate = duty × in_window_ppm`, with
//! `duty = window / period`. Window starts are jittered (period × U(0.5,
//! 1.5)), so a periodic interference cannot hide between windows. What burst
//! sampling gives up: an event shorter than the gap between windows can be
//! missed entirely (at the default 1%, windows of 50 ms every second on
//! average).
//!
//! A window closes in two steps: the sampling gate closes (no new sampled
//! request), then, once the window's sampled requests have ended (at most
//! [`MAX_CLOSING`]; those still open are counted as cut), the programs are
//! detached. Waiting matters: the slow requests are the ones tailscope is
//! for, and a shorter wait would drop exactly them. Zero-instrumentation
//! mode's gate and per-window open-request counts are in BPF; marker mode's
//! gate is the region header's `burst_gate`, which the runtime reads when it
//! starts a sampled request and again when it ends one, and its open
//! requests are the slots with a sampled request in progress.
//!
//! Below [`AUTO_MAX_PPM`] only: at higher rates the windows would have to
//! follow each other so closely that the schedule could not keep the rate.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::tracer::TracerError;

/// `--burst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BurstArg {
    /// Windows when the rate is below [`AUTO_MAX_PPM`].
    Auto,
    Off,
    /// Explicit window and mean period.
    Window {
        window: Duration,
        period: Duration,
    },
}

/// `auto` turns bursts on below this rate (2.5%: mean periods of at least
/// eight windows, so that the schedule keeps its rate).
pub const AUTO_MAX_PPM: u32 = 25_000;
/// `auto`: windows sample at this rate (20%). The programs' cost while
/// attached falls on every request of a window, sampled or not, so at a
/// given rate a higher in-window rate (a lower duty) costs less: at 1% on
/// memcached-marked at 80k GET/s, BPF + agent per request (median of 3)
/// were 1.76% of the server's CPU with windows at 10% (every 500 ms) and
/// 1.19% at 20% (every second); the price is a gap between windows twice
/// as long (session 9, docs/zero-instrumentation.md).
pub const AUTO_IN_WINDOW_PPM: u32 = 200_000;
/// `auto`: the window length. Each window costs two switches of the
/// programs (each a burst of cross-CPU interrupts): 50 ms windows at 1%
/// mean two windows a second, few enough that the stalls stay far below 1%
/// of the time (20 ms windows, five a second, tripled the p99 at 80% load).
pub const AUTO_WINDOW: Duration = Duration::from_millis(50);
/// How long a closing window waits for its sampled requests to end. A
/// request still open then (longer than about this) is cut: dropped in
/// zero-instrumentation mode, kept without counters in marker mode.
pub const MAX_CLOSING: Duration = Duration::from_secs(1);

/// What a burst schedule switches. `window` numbers the windows from 1.
pub trait Windows {
    /// Stops new sampled requests.
    fn close_gate(&mut self, window: u32) -> Result<(), TracerError>;
    /// Sampled requests of the closing window still open, if known.
    fn still_open(&self) -> Option<i64>;
    /// Detaches the per-request and per-interrupt programs.
    fn detach(&mut self, window: u32) -> Result<(), TracerError>;
    /// Re-attaches them and opens window `window`.
    fn open(&mut self, window: u32) -> Result<(), TracerError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BurstPlan {
    #[serde(serialize_with = "ser_ms")]
    pub window: Duration,
    #[serde(serialize_with = "ser_ms")]
    pub period: Duration,
    /// The BPF sampling rate inside a window.
    pub in_window_ppm: u32,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// The windows for an overall rate, or `None` for continuous sampling. An
/// explicit plan that cannot keep the rate (it would need more than 100%
/// inside its windows) is an error.
pub fn plan(arg: BurstArg, rate_ppm: u32) -> Result<Option<BurstPlan>, String> {
    let (window, period) = match arg {
        BurstArg::Off => return Ok(None),
        BurstArg::Auto => {
            if rate_ppm == 0 || rate_ppm > AUTO_MAX_PPM {
                return Ok(None);
            }
            // duty = rate / 20%, so that windows sample at 20%.
            let period = AUTO_WINDOW.mul_f64(AUTO_IN_WINDOW_PPM as f64 / rate_ppm as f64);
            (AUTO_WINDOW, period)
        }
        BurstArg::Window { window, period } => (window, period),
    };
    if window.is_zero() || window >= period || rate_ppm == 0 {
        return Ok(None);
    }
    let duty = window.as_secs_f64() / period.as_secs_f64();
    let in_window = (rate_ppm as f64 / duty).round();
    if in_window > 1e6 {
        return Err(format!(
            "--burst {:.3}/{:.3}: windows open {:.1}% of the time cannot sample {:.3}% of requests; \
             use longer windows, a shorter period, or --burst off",
            window.as_secs_f64() * 1e3,
            period.as_secs_f64() * 1e3,
            duty * 100.0,
            rate_ppm as f64 / 1e4
        ));
    }
    Ok(Some(BurstPlan {
        window,
        period,
        in_window_ppm: (in_window as u32).max(1),
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    Closing { since: Instant },
    Closed,
}

/// What the recording's meta.json says about its windows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BurstStats {
    pub windows: u64,
    /// Time with the sampling gate open, in seconds.
    pub open_s: f64,
    /// Sampled requests still open when a window's programs were detached
    /// (they are dropped, counted in drops.abandoned when seen again).
    pub cut: u64,
    /// Agent time spent detaching and re-attaching programs, in seconds.
    pub switch_s: f64,
}

/// The window schedule; [`Burst::step`] is called from the poll loop.
pub struct Burst {
    pub plan: BurstPlan,
    phase: Phase,
    /// When the current phase ends (Open) or the next window starts (Closed).
    next: Instant,
    opened_at: Instant,
    rng: u64,
    window: u32,
    /// Not yet past the start-up detach: the first window then starts at a
    /// random phase of the period.
    starting: bool,
    pub stats: BurstStats,
}

impl Burst {
    /// Starts with the gate closed (the loader attached everything and the
    /// caller closed the gate): the first step detaches, and the first
    /// window opens at a uniformly random point of one period.
    pub fn new(plan: BurstPlan, now: Instant, seed: u64) -> Burst {
        Burst {
            plan,
            phase: Phase::Closing { since: now },
            next: now,
            opened_at: now,
            rng: seed | 1,
            window: 0,
            starting: true,
            stats: BurstStats::default(),
        }
    }

    fn uniform(&mut self) -> f64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Advances the schedule; returns how long until it next needs a call.
    pub fn step(&mut self, now: Instant, t: &mut dyn Windows) -> Result<Duration, TracerError> {
        match self.phase {
            Phase::Open if now >= self.next => {
                t.close_gate(self.window)?;
                self.stats.open_s += now.duration_since(self.opened_at).as_secs_f64();
                self.phase = Phase::Closing { since: now };
                Ok(Duration::from_millis(1))
            }
            Phase::Closing { since } => {
                let open = t.still_open();
                let waited = now.duration_since(since);
                let open = open.unwrap_or(0).max(0);
                if open > 0 && waited < MAX_CLOSING {
                    return Ok(Duration::from_millis(1));
                }
                self.stats.cut += open as u64;
                let t0 = Instant::now();
                t.detach(self.window)?;
                self.stats.switch_s += t0.elapsed().as_secs_f64();
                // Next start: a jittered period after this window's start
                // (the first: a random phase of one period).
                self.next = if std::mem::take(&mut self.starting) {
                    now + self.plan.period.mul_f64(self.uniform())
                } else {
                    let gap = self.plan.period.mul_f64(0.5 + self.uniform());
                    (self.opened_at + gap).max(now + Duration::from_millis(1))
                };
                self.phase = Phase::Closed;
                Ok(self.next.saturating_duration_since(now))
            }
            Phase::Closed if now >= self.next => {
                self.window = (self.window.wrapping_add(1) & (u32::MAX >> 2)).max(1);
                let t0 = Instant::now();
                t.open(self.window)?;
                self.stats.switch_s += t0.elapsed().as_secs_f64();
                self.stats.windows += 1;
                self.opened_at = now;
                self.next = now + self.plan.window;
                self.phase = Phase::Open;
                Ok(self.plan.window)
            }
            _ => Ok(self.next.saturating_duration_since(now)),
        }
    }

    /// Between windows: the gate is closed and the requests of the last
    /// window have ended, so nothing new reaches the rings until the next
    /// window opens.
    pub fn between_windows(&self) -> bool {
        matches!(self.phase, Phase::Closed)
    }

    /// At the end of the recording: count the open window's time.
    pub fn finish(&mut self, now: Instant) {
        if self.phase == Phase::Open {
            self.stats.open_s += now.duration_since(self.opened_at).as_secs_f64();
            self.phase = Phase::Closed;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_plan_keeps_the_rate() {
        let p = plan(BurstArg::Auto, 10_000).unwrap().unwrap();
        assert_eq!(p.window, Duration::from_millis(50));
        assert_eq!(p.period, Duration::from_millis(1000));
        assert_eq!(p.in_window_ppm, 200_000);
        let duty = p.window.as_secs_f64() / p.period.as_secs_f64();
        assert!((duty * p.in_window_ppm as f64 - 10_000.0).abs() < 1.0);
        // 0.1%: windows every 10 s
        assert_eq!(
            plan(BurstArg::Auto, 1_000).unwrap().unwrap().period,
            Duration::from_secs(10)
        );
        // 2.5%, the highest auto rate: a period of 8 windows
        assert_eq!(
            plan(BurstArg::Auto, AUTO_MAX_PPM).unwrap().unwrap().period,
            Duration::from_millis(400)
        );
    }

    #[test]
    fn no_bursts_at_high_rates_or_when_off() {
        assert_eq!(plan(BurstArg::Auto, 25_001), Ok(None));
        assert_eq!(plan(BurstArg::Auto, 1_000_000), Ok(None));
        assert_eq!(plan(BurstArg::Off, 10_000), Ok(None));
        let w = BurstArg::Window {
            window: Duration::from_millis(50),
            period: Duration::from_millis(50),
        };
        assert_eq!(plan(w, 10_000), Ok(None), "a window as long as the period");
    }

    #[test]
    fn explicit_window_that_cannot_keep_the_rate_is_refused() {
        let w = BurstArg::Window {
            window: Duration::from_millis(10),
            period: Duration::from_millis(100),
        };
        assert_eq!(plan(w, 10_000).unwrap().unwrap().in_window_ppm, 100_000);
        assert_eq!(plan(w, 100_000).unwrap().unwrap().in_window_ppm, 1_000_000);
        let e = plan(w, 500_000).unwrap_err();
        assert!(e.contains("cannot sample 50.000%"), "{e}");
    }

    #[derive(Default)]
    struct Fake {
        log: Vec<String>,
        open: Option<i64>,
    }

    impl Windows for Fake {
        fn close_gate(&mut self, w: u32) -> Result<(), TracerError> {
            self.log.push(format!("close {w}"));
            Ok(())
        }
        fn still_open(&self) -> Option<i64> {
            self.open
        }
        fn detach(&mut self, w: u32) -> Result<(), TracerError> {
            self.log.push(format!("detach {w}"));
            Ok(())
        }
        fn open(&mut self, w: u32) -> Result<(), TracerError> {
            self.log.push(format!("open {w}"));
            Ok(())
        }
    }

    #[test]
    fn schedule_closes_drains_detaches_and_reopens() {
        // 50 ms windows every 500 ms (jittered: 250-750 ms), at 10% inside
        let w = BurstArg::Window {
            window: Duration::from_millis(50),
            period: Duration::from_millis(500),
        };
        let p = plan(w, 10_000).unwrap().unwrap();
        let t0 = Instant::now();
        let mut b = Burst::new(p, t0, 7);
        let mut f = Fake {
            open: Some(0),
            ..Default::default()
        };
        // start-up: detach at once, first window at a random phase
        let first = b.step(t0, &mut f).unwrap();
        assert_eq!(f.log, ["detach 0"]);
        assert!(first < Duration::from_millis(500));
        assert_eq!(b.stats.windows, 0);
        let t1 = t0 + first;
        assert_eq!(b.step(t1, &mut f).unwrap(), Duration::from_millis(50));
        assert_eq!(f.log.last().unwrap(), "open 1");
        assert_eq!(b.stats.windows, 1);
        b.step(t1 + Duration::from_millis(5), &mut f).unwrap();
        assert_eq!(f.log.len(), 2, "still inside the window");
        b.step(t1 + Duration::from_millis(50), &mut f).unwrap();
        assert_eq!(f.log.last().unwrap(), "close 1");
        // a slow request keeps the window's programs attached
        f.open = Some(1);
        b.step(t1 + Duration::from_millis(1000), &mut f).unwrap();
        assert_eq!(
            f.log.last().unwrap(),
            "close 1",
            "waits for the slow request"
        );
        f.open = Some(0);
        let gap = b.step(t1 + Duration::from_millis(1001), &mut f).unwrap();
        assert_eq!(f.log.last().unwrap(), "detach 1");
        assert_eq!(b.stats.cut, 0);
        assert!((b.stats.open_s - 0.050).abs() < 1e-9);
        // the period had passed: the next window follows soon
        assert_eq!(gap, Duration::from_millis(1));
        let t2 = t1 + Duration::from_millis(1002);
        b.step(t2, &mut f).unwrap();
        assert_eq!(f.log.last().unwrap(), "open 2");
        // a request that outlives MAX_CLOSING is cut
        f.open = Some(3);
        b.step(t2 + Duration::from_millis(50), &mut f).unwrap();
        b.step(t2 + Duration::from_millis(1049), &mut f).unwrap();
        assert_eq!(f.log.last().unwrap(), "close 2");
        let gap = b.step(t2 + Duration::from_millis(1051), &mut f).unwrap();
        assert_eq!(f.log.last().unwrap(), "detach 2");
        assert_eq!(b.stats.cut, 3);
        assert!(gap <= Duration::from_millis(1));
    }

    #[test]
    fn jitter_is_uniform_in_half_to_three_halves() {
        let p = plan(BurstArg::Auto, 10_000).unwrap().unwrap();
        let mut b = Burst::new(p, Instant::now(), 42);
        let xs: Vec<f64> = (0..10_000).map(|_| b.uniform()).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }
}
