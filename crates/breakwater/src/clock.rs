//! The process's monotonic clock in nanoseconds, the `now` the layers hand
//! to the policies. Only ever compared with itself: nothing on the wire is a
//! timestamp.

use crate::policy::Nanos;
use std::sync::OnceLock;
use std::time::Instant;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since this process first asked.
pub fn now() -> Nanos {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as Nanos
}

/// The [`Instant`] a [`now`] value stands for.
pub fn instant(at: Nanos) -> Instant {
    *EPOCH.get_or_init(Instant::now) + std::time::Duration::from_nanos(at)
}
