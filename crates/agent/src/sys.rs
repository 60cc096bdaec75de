//! Small, safe wrappers over the OS facts the agent records: clocks, host
//! and kernel names, its own CPU use, and whether a process is alive.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC in ns (the clock of every `start_ns`).
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in ns since the Unix epoch.
pub fn unix_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// `unix = monotonic + offset`, from the tightest of a few bracketed reads.
pub fn monotonic_to_unix_offset_ns() -> i64 {
    let mut best = (u64::MAX, 0i64);
    for _ in 0..5 {
        let m0 = monotonic_ns();
        let u = unix_ns();
        let m1 = monotonic_ns();
        let width = m1 - m0;
        if width < best.0 {
            best = (width, u as i64 - (m0 + width / 2) as i64);
        }
    }
    best.1
}

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let n = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// `uname -r`.
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    let bytes: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// User + system CPU seconds this process has used.
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Peak resident set size of this process in KiB.
pub fn self_max_rss_kib() -> u64 {
    // SAFETY: as above.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss as u64
}

pub fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// `/proc/PID/comm`, trimmed.
pub fn process_comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// `/proc/PID/cmdline` split at NULs.
pub fn process_cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    // Each argument ends with a NUL; empty arguments ("") are kept.
    let raw = raw.strip_suffix(&[0]).unwrap_or(&raw);
    if raw.is_empty() {
        return Some(vec![]);
    }
    let mut args: Vec<String> = raw
        .split(|&c| c == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    // Servers that rewrite their process title (redis, nginx, postgres) pad
    // argv with NULs: drop the trailing empty arguments that leaves.
    while args.len() > 1 && args.last().is_some_and(|a| a.is_empty()) {
        args.pop();
    }
    Some(args)
}

/// A handle that says when a process (not our child) has exited: a pidfd
/// where the kernel has them, else polling `kill(pid, 0)`.
pub struct ProcessWatch {
    pid: u32,
    pidfd: Option<OwnedFd>,
}

impl ProcessWatch {
    pub fn new(pid: u32) -> Self {
        // SAFETY: pidfd_open takes a pid and flags; returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
        let pidfd = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) });
        ProcessWatch { pid, pidfd }
    }

    /// The pidfd, readable once the process has exited (None: no pidfd).
    pub fn raw_fd(&self) -> Option<RawFd> {
        self.pidfd.as_ref().map(|f| f.as_raw_fd())
    }

    pub fn has_exited(&self) -> bool {
        match &self.pidfd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, zero timeout.
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                n > 0 && p.revents & libc::POLLIN != 0
            }
            None => {
                // SAFETY: signal 0 only checks existence.
                let rc = unsafe { libc::kill(self.pid as libc::pid_t, 0) };
                rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
            }
        }
    }
}

/// Sleeps up to `timeout` until `fd` is readable; a signal ends the sleep
/// early too (poll is never restarted after a handler). Returns whether
/// the fd is readable.
pub fn wait_readable(fd: RawFd, timeout: Duration) -> bool {
    wait_readable_or(fd, None, timeout)
}

/// Like [`wait_readable`], but `also` (when given) ends the wait too when
/// it becomes readable (a signal's self-pipe); says whether `fd` is.
pub fn wait_readable_or(fd: RawFd, also: Option<RawFd>, timeout: Duration) -> bool {
    let p = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [p(fd), p(also.unwrap_or(-1))]; // a negative fd is ignored
                                                  // rounded up: a sub-millisecond wait must not become a busy loop
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: two valid pollfds.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    n > 0 && fds[0].revents & libc::POLLIN != 0
}

pub fn stderr_is_tty() -> bool {
    // SAFETY: isatty on a fd number is always safe.
    unsafe { libc::isatty(2) == 1 }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// What marker mode sleeps on between burst windows: a pidfd that
    /// becomes readable when the process exits, ending the sleep early.
    #[test]
    fn a_process_exit_ends_the_wait_on_its_pidfd() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.3")
            .spawn()
            .unwrap();
        let w = ProcessWatch::new(child.id());
        let Some(fd) = w.raw_fd() else {
            eprintln!("SKIP: no pidfd_open on this kernel");
            child.wait().unwrap();
            return;
        };
        // Still running: the wait times out, not readable.
        assert!(!wait_readable(fd, Duration::from_millis(20)));
        assert!(!w.has_exited());
        let t0 = Instant::now();
        // Readable once it exits, long before the 20 s timeout.
        assert!(wait_readable(fd, Duration::from_secs(20)));
        let waited = t0.elapsed();
        assert!(waited < Duration::from_secs(15), "waited {waited:?}");
        assert!(w.has_exited());
        child.wait().unwrap();
    }

    /// The second fd (a signal's self-pipe) ends the wait as well, and the
    /// result still speaks of the first.
    #[test]
    fn the_other_fd_ends_the_wait_too() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let (first, _keep) = std::os::unix::net::UnixStream::pair().unwrap();
        let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let t0 = Instant::now();
        assert!(!wait_readable_or(
            first.as_raw_fd(),
            Some(rx.as_raw_fd()),
            Duration::from_millis(20)
        ));
        assert!(t0.elapsed() >= Duration::from_millis(15), "it waited");
        tx.write_all(b"x").unwrap();
        let t0 = Instant::now();
        assert!(!wait_readable_or(
            first.as_raw_fd(),
            Some(rx.as_raw_fd()),
            Duration::from_secs(20)
        ));
        let waited = t0.elapsed();
        assert!(waited < Duration::from_secs(15), "waited {waited:?}");
    }
}
