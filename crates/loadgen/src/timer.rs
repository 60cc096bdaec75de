//! A sub-millisecond wake-up for the event loop: a `timerfd` in the same
//! epoll set as the sockets.
//!
//! epoll's own timeout has millisecond granularity, far too coarse to send
//! at Poisson arrival times microseconds apart. Spinning is precise but
//! burns the core, and on a shared core (or under real-time throttling) a
//! spinning thread is preempted for whole time slices, which shows up as
//! send lag. So the loop arms this timer for shortly before the next
//! arrival, blocks in epoll (waking early for replies), and spins only the
//! last `--spin-us`.

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

pub struct Timer {
    fd: OwnedFd,
}

impl Timer {
    pub fn new(registry: &Registry, token: Token) -> io::Result<Timer> {
        // SAFETY: plain syscall; a non-negative result is a fresh fd we own.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is valid and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        registry.register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)?;
        // Timer slack (50 us by default) would delay every wake-up; ask for
        // none. Failure only costs precision, so it is ignored.
        // SAFETY: PR_SET_TIMERSLACK takes an integer and touches no memory.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        Ok(Timer { fd })
    }

    /// Fire once, `after` from now (a zero duration would disarm, so it is
    /// rounded up to 1 ns).
    pub fn arm(&self, after: Duration) -> io::Result<()> {
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: spec is a valid itimerspec; old_value may be null.
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Consume an expiry so the edge-triggered registration fires again.
    pub fn acknowledge(&self) {
        let mut expirations = 0u64;
        // SAFETY: reads 8 bytes into a u64 we own; EAGAIN is fine.
        unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut expirations as *mut u64).cast(),
                8,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll};
    use std::time::Instant;

    #[test]
    fn wakes_epoll_after_a_sub_millisecond_delay() {
        let mut poll = Poll::new().unwrap();
        let timer = Timer::new(poll.registry(), Token(7)).unwrap();
        let mut events = Events::with_capacity(4);
        for _ in 0..3 {
            let start = Instant::now();
            timer.arm(Duration::from_micros(300)).unwrap();
            poll.poll(&mut events, Some(Duration::from_secs(1)))
                .unwrap();
            let waited = start.elapsed();
            assert!(events.iter().any(|e| e.token() == Token(7)));
            assert!(waited >= Duration::from_micros(300), "{waited:?}");
            assert!(waited < Duration::from_millis(500), "{waited:?}");
            timer.acknowledge();
        }
    }
}
