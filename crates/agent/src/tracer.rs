//! The eBPF side, from `tailscope-bpf`, and how its errors read to a user.
//!
//! Built without the `bpf` feature (for developing the rest on a machine
//! without clang/libbpf), `Tracer::load` fails with a clear message; the
//! shipped binary is built with the default features.

use crate::error::{exit, AgentError};

#[cfg(feature = "bpf")]
pub use tailscope_bpf::{BpfStats, Tracer, TracerError, TracerOptions};

#[cfg(not(feature = "bpf"))]
pub use stub::{BpfStats, Tracer, TracerError, TracerOptions};

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

#[cfg(not(feature = "bpf"))]
mod stub {
    use std::time::Duration;
    use tailscope_abi::{ts_kcounters, ts_request_record};

    pub struct TracerOptions {
        pub infer: bool,
        pub infer_sample_ppm: u32,
        pub ringbuf_bytes: usize,
        pub agent_pid: u32,
    }
    #[derive(Debug, Default, Clone, Copy)]
    pub struct BpfStats {
        pub ringbuf_drops: u64,
        pub kc_collisions: u64,
        pub inferred_requests_seen: u64,
        pub inferred_requests_sampled: u64,
    }
    #[derive(Debug)]
    pub enum TracerError {
        NotRoot(String),
        MissingCapability(String),
        LoadFailed {
            program: String,
            reason: String,
            hint: String,
        },
        Attach(String),
        Io(String),
    }
    pub struct Tracer(());
    impl Tracer {
        pub fn load(_: &TracerOptions) -> Result<Tracer, TracerError> {
            Err(TracerError::LoadFailed {
                program: "(all)".into(),
                reason: "this tailscope-agent was built without the bpf feature".into(),
                hint: "rebuild with default features".into(),
            })
        }
        pub fn add_target(&mut self, _: u32) -> Result<(), TracerError> {
            Ok(())
        }
        pub fn poll_records(
            &mut self,
            _: Duration,
            _: &mut Vec<ts_request_record>,
        ) -> Result<usize, TracerError> {
            Ok(0)
        }
        pub fn stats(&self) -> BpfStats {
            BpfStats::default()
        }
        pub fn kcounters(&self, _: u32) -> Option<ts_kcounters> {
            None
        }
        pub fn gc_dead_threads(&mut self) -> usize {
            0
        }
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
