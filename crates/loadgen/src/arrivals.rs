//! The arrival schedule: when each request is *intended* to be sent.
//!
//! An open-loop generator decides send times up front, independent of how
//! the server responds. Arrivals are a Poisson process, so inter-arrival
//! gaps are exponential with mean `1/rate`; a load step changes the rate.
//! Latency is measured from these intended times, which is what keeps a
//! slow server (or a slow generator) from hiding its own queueing delay
//! ("coordinated omission", Tene).
//!
//! Times are nanoseconds since the run started. The warm-up phase runs at
//! the first step's rate and is just another step that the recorder ignores.

use crate::rng::SplitMix64;

/// One constant-rate stretch of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Step {
    pub rate: f64,
    pub duration_s: f64,
}

/// Iterator over intended send times, in nanoseconds from run start.
pub struct Schedule {
    rng: SplitMix64,
    /// `(end_ns, rate)` per step, ends increasing.
    steps: Vec<(u64, f64)>,
    step: usize,
    /// Continuous clock in f64 ns so rounding never accumulates.
    t_ns: f64,
}

impl Schedule {
    pub fn new(steps: &[Step], seed: u64) -> Self {
        let mut end = 0.0;
        let steps = steps
            .iter()
            .map(|s| {
                end += s.duration_s * 1e9;
                (end as u64, s.rate)
            })
            .collect();
        Schedule {
            rng: SplitMix64::new(seed),
            steps,
            step: 0,
            t_ns: 0.0,
        }
    }

    /// Nanosecond at which the last step ends.
    pub fn end_ns(&self) -> u64 {
        self.steps.last().map_or(0, |s| s.0)
    }

    /// Index of the step that contains `t_ns`, if any.
    pub fn step_at(&self, t_ns: u64) -> Option<usize> {
        self.steps.iter().position(|&(end, _)| t_ns < end)
    }
}

/// One exponential inter-arrival gap in nanoseconds: `-ln(U) / rate`.
pub fn exponential_gap_ns(rng: &mut SplitMix64, rate: f64) -> f64 {
    -rng.next_open01().ln() / rate * 1e9
}

impl Iterator for Schedule {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        loop {
            let &(end, rate) = self.steps.get(self.step)?;
            // A step boundary is memoryless for a Poisson process, so drawing
            // afresh from the boundary at the new rate is exact.
            let t = self.t_ns + exponential_gap_ns(&mut self.rng, rate);
            if t < end as f64 {
                self.t_ns = t;
                return Some(t as u64);
            }
            self.t_ns = end as f64;
            self.step += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(rate: f64, n: usize) -> Vec<f64> {
        let steps = [Step {
            rate,
            duration_s: 1e6,
        }];
        let times: Vec<u64> = Schedule::new(&steps, 42).take(n + 1).collect();
        times.windows(2).map(|w| (w[1] - w[0]) as f64).collect()
    }

    #[test]
    fn inter_arrivals_are_exponential() {
        // Exponential(rate): mean = 1/rate, variance = 1/rate^2 (CV = 1).
        let rate = 10_000.0;
        let g = gaps(rate, 200_000);
        let n = g.len() as f64;
        let mean = g.iter().sum::<f64>() / n;
        let var = g.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let want_mean = 1e9 / rate;
        assert!((mean / want_mean - 1.0).abs() < 0.01, "mean {mean}");
        assert!(
            (var / (want_mean * want_mean) - 1.0).abs() < 0.03,
            "var {var}"
        );
        // Memorylessness: P(gap > mean) = 1/e.
        let above = g.iter().filter(|&&x| x > want_mean).count() as f64 / n;
        assert!((above - (-1.0f64).exp()).abs() < 0.01, "tail {above}");
    }

    #[test]
    fn steps_change_rate_and_end() {
        let steps = [
            Step {
                rate: 1000.0,
                duration_s: 2.0,
            },
            Step {
                rate: 5000.0,
                duration_s: 2.0,
            },
        ];
        let s = Schedule::new(&steps, 1);
        assert_eq!(s.end_ns(), 4_000_000_000);
        assert_eq!(s.step_at(1_999_999_999), Some(0));
        assert_eq!(s.step_at(2_000_000_000), Some(1));
        assert_eq!(s.step_at(4_000_000_000), None);
        let times: Vec<u64> = s.collect();
        let first = times.iter().filter(|&&t| t < 2_000_000_000).count();
        let second = times.len() - first;
        assert!((1800..2200).contains(&first), "{first}");
        assert!((9500..10500).contains(&second), "{second}");
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        assert!(*times.last().unwrap() < 4_000_000_000);
    }

    #[test]
    fn seeded_schedule_is_reproducible() {
        let steps = [Step {
            rate: 100.0,
            duration_s: 1.0,
        }];
        let a: Vec<u64> = Schedule::new(&steps, 9).collect();
        let b: Vec<u64> = Schedule::new(&steps, 9).collect();
        let c: Vec<u64> = Schedule::new(&steps, 10).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
