//! The agent's one error type: a one-line message and the exit code that
//! goes with it. Every failure the user can cause or meet ends here, so
//! `main` prints one line and exits; nothing panics as interface.

use std::fmt;

/// Exit codes, documented in `--help`.
pub mod exit {
    pub const OK: i32 = 0;
    /// Unexpected failure while recording (I/O on the output, …).
    pub const INTERNAL: i32 = 1;
    /// Bad command line.
    pub const USAGE: i32 = 2;
    /// The target: no such PID, or the command could not be started.
    pub const TARGET: i32 = 3;
    /// The output directory exists (without --force) or cannot be written.
    pub const OUTPUT: i32 = 4;
    /// Not root, or a capability (CAP_BPF, CAP_PERFMON, …) is missing.
    pub const PERMISSION: i32 = 5;
    /// The kernel rejected or could not attach a BPF program.
    pub const BPF: i32 = 6;
    /// Marker mode: no usable /dev/shm/tailscope.<pid> region.
    pub const REGION: i32 = 7;
}

#[derive(Debug)]
pub struct AgentError {
    pub code: i32,
    pub message: String,
}

impl AgentError {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        AgentError {
            code,
            message: message.into(),
        }
    }
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(exit::USAGE, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(exit::INTERNAL, message)
    }
}

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Always one line, whatever a lower layer put in the message.
        let one_line = self.message.replace(['\n', '\r'], " ");
        f.write_str(one_line.trim())
    }
}

impl std::error::Error for AgentError {}

pub type Result<T> = std::result::Result<T, AgentError>;
