//! The eBPF side, from `tailscope-bpf`, and how its errors read to a user.

use crate::error::{exit, AgentError};

pub use tailscope_bpf::{BpfStats, Tracer, TracerError, TracerOptions};

/// Maps a loader error to the agent's one-line error and exit code.
pub fn agent_error(e: TracerError) -> AgentError {
    match e {
        TracerError::NotRoot(m) => AgentError::new(exit::PERMISSION, m),
        TracerError::MissingCapability(m) => AgentError::new(exit::PERMISSION, m),
        TracerError::LoadFailed {
            program,
            reason,
            hint,
        } => AgentError::new(
            exit::BPF,
            format!("BPF program {program} rejected: {reason}; hint: {hint}"),
        ),
        TracerError::Attach(m) => AgentError::new(exit::BPF, format!("BPF attach failed: {m}")),
        TracerError::Io(m) => AgentError::new(exit::INTERNAL, format!("BPF: {m}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_failure_reads_as_one_line() {
        let e = agent_error(TracerError::LoadFailed {
            program: "kc_sched_switch".into(),
            reason: "invalid mem access".into(),
            hint: "kernel lacks BTF".into(),
        });
        assert_eq!(e.code, exit::BPF);
        assert_eq!(
            e.to_string(),
            "BPF program kc_sched_switch rejected: invalid mem access; hint: kernel lacks BTF"
        );
        assert_eq!(
            agent_error(TracerError::NotRoot("must run as root".into())).code,
            exit::PERMISSION
        );
    }
}
