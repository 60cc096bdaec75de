//! The live progress line on stderr: rewritten in place every 0.5 s on a
//! terminal, a new line every 5 s otherwise (logs), nothing with --quiet.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::meta::Drops;

pub struct Progress {
    enabled: bool,
    tty: bool,
    every: Duration,
    last: Instant,
    last_rows: u64,
    printed: bool,
}

pub struct Snapshot {
    pub elapsed: Duration,
    pub requests: u64,
    pub drops: Drops,
    pub bytes: u64,
}

/// One line. Any drop is shown, by kind.
pub fn format_line(s: &Snapshot, rate_per_s: f64) -> String {
    let mut line = format!(
        "tailscope: {:.1} s, {} requests ({:.0}/s), {:.2} MB",
        s.elapsed.as_secs_f64(),
        s.requests,
        rate_per_s,
        s.bytes as f64 / 1e6
    );
    line += &drops_text(&s.drops);
    line
}

/// ", drops: 3 ring-full, 1 corrupt" or "" when nothing was lost.
pub fn drops_text(d: &Drops) -> String {
    let parts: Vec<String> = [
        (d.ring_full, "ring-full"),
        (d.bpf_ringbuf, "bpf-ringbuf"),
        (d.corrupt_records, "corrupt"),
        (d.ring_resyncs, "ring-resyncs"),
        (d.slots_exhausted, "threads-without-slot"),
        (d.kc_collisions, "kcounter-collisions"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(", drops: {}", parts.join(", "))
    }
}

impl Progress {
    pub fn new(quiet: bool) -> Self {
        let tty = crate::sys::stderr_is_tty();
        Progress {
            enabled: !quiet,
            tty,
            every: if tty {
                Duration::from_millis(500)
            } else {
                Duration::from_secs(5)
            },
            last: Instant::now(),
            last_rows: 0,
            printed: false,
        }
    }

    pub fn maybe_print(&mut self, now: Instant, s: &Snapshot) {
        if !self.enabled || now.duration_since(self.last) < self.every {
            return;
        }
        let dt = now.duration_since(self.last).as_secs_f64();
        let rate = (s.requests - self.last_rows.min(s.requests)) as f64 / dt;
        self.last = now;
        self.last_rows = s.requests;
        let line = format_line(s, rate);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[K{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
        self.printed = true;
    }

    /// Ends an in-place line before the summary is printed.
    pub fn finish(&mut self) {
        if self.enabled && self.tty && self.printed {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_never_silent() {
        let s = Snapshot {
            elapsed: Duration::from_secs(2),
            requests: 10,
            drops: Drops::default(),
            bytes: 2_000_000,
        };
        assert_eq!(
            format_line(&s, 5.0),
            "tailscope: 2.0 s, 10 requests (5/s), 2.00 MB"
        );
        let s = Snapshot {
            drops: Drops {
                ring_full: 3,
                corrupt_records: 1,
                ..Default::default()
            },
            ..s
        };
        assert!(format_line(&s, 5.0).ends_with(", drops: 3 ring-full, 1 corrupt"));
    }
}
