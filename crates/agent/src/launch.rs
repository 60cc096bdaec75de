//! Launching `-- CMD` so that no early request is missed.
//!
//! The child is forked and parked on a pipe before `exec`; the parent adds
//! its pid to the BPF targets, then opens the gate. A second (close-on-exec)
//! pipe reports a failed `exec` back as an errno, so "no such command" is an
//! error of the agent, not a silent empty recording.
//!
//! The child gets its own process group, so a terminal's Ctrl-C reaches only
//! the agent, which finalises the recording first and then stops the child
//! (SIGTERM, SIGKILL after a grace period). `PR_SET_PDEATHSIG` stops it if
//! the agent dies without that chance.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::{exit, AgentError, Result};

pub struct Launched {
    pub pid: u32,
    gate: Option<OwnedFd>,
    exec_status: Option<OwnedFd>,
    exit: Option<Value>,
}

fn pipe_cloexec() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two fresh fds we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Forks `argv`, parked before exec until [`Launched::release`].
pub fn spawn_gated(argv: &[String]) -> Result<Launched> {
    let launch_err = |m: String| AgentError::new(exit::TARGET, m);
    let cargs: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| launch_err(format!("cannot run {:?}: argument contains a NUL", argv[0])))?;
    let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let (gate_r, gate_w) = pipe_cloexec().map_err(|e| launch_err(format!("pipe: {e}")))?;
    let (status_r, status_w) = pipe_cloexec().map_err(|e| launch_err(format!("pipe: {e}")))?;
    // SAFETY: getpid cannot fail.
    let parent = unsafe { libc::getpid() };
    // SAFETY: after fork the child only calls async-signal-safe functions
    // (prctl, setpgid, getppid, read, execvp, write, _exit) on data prepared
    // before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(launch_err(format!(
            "fork: {}",
            std::io::Error::last_os_error()
        )));
    }
    if pid == 0 {
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            if libc::getppid() != parent {
                libc::_exit(127);
            }
            libc::setpgid(0, 0);
            let mut b = 0u8;
            let n = libc::read(gate_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
            if n != 1 {
                // The agent gave up before opening the gate.
                libc::_exit(127);
            }
            libc::execvp(ptrs[0], ptrs.as_ptr());
            let errno = *libc::__errno_location();
            let bytes = errno.to_ne_bytes();
            libc::write(status_w.as_raw_fd(), bytes.as_ptr().cast(), 4);
            libc::_exit(127);
        }
    }
    drop(gate_r);
    drop(status_w);
    Ok(Launched {
        pid: pid as u32,
        gate: Some(gate_w),
        exec_status: Some(status_r),
        exit: None,
    })
}

impl Launched {
    /// Lets the child exec; returns once exec has succeeded or failed.
    pub fn release(&mut self, argv0: &str) -> Result<()> {
        if let Some(gate) = self.gate.take() {
            let b = 1u8;
            // SAFETY: writing one byte from a valid buffer to our pipe.
            unsafe { libc::write(gate.as_raw_fd(), (&b as *const u8).cast(), 1) };
        }
        let Some(status) = self.exec_status.take() else {
            return Ok(());
        };
        let mut errno = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            // SAFETY: reading into the remaining part of a valid buffer.
            let n = unsafe {
                libc::read(
                    status.as_raw_fd(),
                    errno[got..].as_mut_ptr().cast(),
                    4 - got,
                )
            };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        if got == 4 {
            let e = std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno));
            self.wait_blocking();
            return Err(AgentError::new(
                exit::TARGET,
                format!("cannot run {argv0:?}: {e}"),
            ));
        }
        Ok(())
    }

    fn decode(status: libc::c_int) -> Value {
        if libc::WIFEXITED(status) {
            json!(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            json!(format!("signal {}", libc::WTERMSIG(status)))
        } else {
            json!(format!("status {status}"))
        }
    }

    /// Reaps the child if it has exited; `Some(status)` once it has.
    pub fn try_wait(&mut self) -> Option<Value> {
        if self.exit.is_none() {
            let mut st = 0;
            // SAFETY: waiting for our own child, non-blocking.
            let r = unsafe { libc::waitpid(self.pid as libc::pid_t, &mut st, libc::WNOHANG) };
            if r == self.pid as libc::pid_t {
                self.exit = Some(Self::decode(st));
            }
        }
        self.exit.clone()
    }

    fn wait_blocking(&mut self) {
        let mut st = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(self.pid as libc::pid_t, &mut st, 0) };
        if r == self.pid as libc::pid_t {
            self.exit = Some(Self::decode(st));
        }
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL. Returns the exit status.
    pub fn terminate(&mut self, grace: Duration) -> Option<Value> {
        if self.try_wait().is_some() {
            return self.exit.clone();
        }
        // SAFETY: signalling our own, not yet reaped, child.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.try_wait().is_some() {
                return self.exit.clone();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: as above.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
        self.wait_blocking();
        self.exit.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_after_release_and_reports_status() {
        let mut l = spawn_gated(&["sh".into(), "-c".into(), "exit 3".into()]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(l.try_wait(), None, "parked until released");
        l.release("sh").unwrap();
        let t0 = Instant::now();
        while l.try_wait().is_none() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(l.try_wait(), Some(json!(3)));
    }

    #[test]
    fn missing_command_is_an_error() {
        let mut l = spawn_gated(&["/nonexistent/tailscope-test".into()]).unwrap();
        let e = l.release("/nonexistent/tailscope-test").unwrap_err();
        assert_eq!(e.code, exit::TARGET);
        assert!(e.to_string().contains("No such file"), "{e}");
    }

    #[test]
    fn terminate_stops_a_sleeper() {
        let mut l = spawn_gated(&["sleep".into(), "30".into()]).unwrap();
        l.release("sleep").unwrap();
        let st = l.terminate(Duration::from_secs(2));
        assert_eq!(st, Some(json!(format!("signal {}", libc::SIGTERM))));
    }
}
