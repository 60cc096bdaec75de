//! `meta.json`: what was recorded, how, and what was lost.
//!
//! Written atomically (temp file + rename) at start — so that a recording
//! killed with SIGKILL still says what it was — and again at the end. The
//! required keys come from `schema/recording.json` (`meta_required`); a test
//! checks that every one is present.

use std::io::Write;
use std::path::Path;

use serde::Serialize;
use serde_json::{json, Value};

use crate::error::{exit, AgentError, Result};

#[derive(Debug, Clone, Serialize, Default)]
pub struct TargetInfo {
    pub pid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
    pub launched: bool,
    /// Exit code, or `"signal N"`; `null` while running or when not our child.
    pub exit_status: Option<Value>,
}

/// Every way a request can be lost or damaged; all are reported.
#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq, Eq)]
pub struct Drops {
    /// Records the runtime could not put in a full ring (slots' `dropped_ring_full` deltas).
    pub ring_full: u64,
    /// Inferred records lost because the BPF ringbuf was full.
    pub bpf_ringbuf: u64,
    /// Threads that found no free kcounters entry (their requests lack counters).
    pub kc_collisions: u64,
    /// Records that failed validation and were not written.
    pub corrupt_records: u64,
    /// Rings whose head/tail were impossible; the agent skipped to head.
    pub ring_resyncs: u64,
    /// Threads that found no free slot in the region (their requests are not recorded).
    pub slots_exhausted: u64,
    /// Sampled inferred requests not recorded because their end was not
    /// seen: the connection closed before the server replied, or (burst
    /// sampling) the reply went out after its window's programs were
    /// detached (`sampling.burst.cut_at_window_end`).
    pub abandoned: u64,
}

impl Drops {
    /// Requests lost outright (as opposed to recorded without counters).
    pub fn requests_lost(&self) -> u64 {
        self.ring_full + self.bpf_ringbuf + self.corrupt_records
    }
    pub fn any(&self) -> bool {
        *self != Drops::default()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Sampling {
    pub rate_ppm: u32,
    /// "runtime" | "agent" | "bpf"
    pub decided_by: &'static str,
    /// Zero-instrumentation burst sampling: the windows and what they did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct AgentCost {
    pub pid: u32,
    pub cpu_seconds: f64,
    /// CPU use as a percentage of one core, over the recording.
    pub cpu_percent_of_one_core: f64,
    pub max_rss_kib: u64,
    pub poll_us: u64,
}

#[derive(Debug, Clone)]
pub struct Meta {
    pub host: String,
    pub kernel: String,
    pub target: TargetInfo,
    /// "marker" | "infer"; "pending" only in the initial file of a launch in auto mode.
    pub mode: &'static str,
    pub sampling: Sampling,
    pub drops: Drops,
    pub start_unix_ns: u64,
    pub duration_s: f64,
    pub requests_recorded: u64,
    pub monotonic_to_unix_ns: i64,
    /// "SIGINT" | "SIGTERM" | "target-exit" | "duration"; `null` while recording.
    pub finalised_by: Option<&'static str>,
    pub bytes_written: u64,
    pub files: Vec<String>,
    pub agent: AgentCost,
    /// Free-form facts worth keeping (e.g. records before the recording started).
    pub notes: Value,
    /// `--functions` recordings: the observer's configuration and achieved
    /// granularity, the tables it wrote, the target's executable mappings.
    pub ldb: Option<Value>,
}

impl Meta {
    pub fn to_json(&self) -> Value {
        json!({
            "schema_version": crate::schema::schema_version(),
            "tailscope_version": env!("CARGO_PKG_VERSION"),
            "host": self.host,
            "kernel": self.kernel,
            "target": self.target,
            "mode": self.mode,
            "sampling": self.sampling,
            "drops": self.drops,
            "start_unix_ns": self.start_unix_ns,
            "duration_s": self.duration_s,
            "requests_recorded": self.requests_recorded,
            "clock": { "monotonic_to_unix_ns": self.monotonic_to_unix_ns },
            "finalised_by": self.finalised_by,
            "bytes_written": self.bytes_written,
            "files": self.files,
            "agent": self.agent,
            "notes": self.notes,
            "ldb": self.ldb,
        })
    }

    /// Writes `dir/meta.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_atomic(
            &dir.join("meta.json"),
            &serde_json::to_vec_pretty(&self.to_json()).expect("plain JSON values"),
        )
    }
}

/// Write `tmp`, fsync, rename over `path`: readers see old or new, never half.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let fail = |e: std::io::Error| {
        AgentError::new(
            exit::INTERNAL,
            format!("cannot write {}: {e}", path.display()),
        )
    };
    let mut f = std::fs::File::create(&tmp).map_err(fail)?;
    f.write_all(bytes).map_err(fail)?;
    f.write_all(b"\n").map_err(fail)?;
    f.sync_all().map_err(fail)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(fail)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn example() -> Meta {
        Meta {
            host: "h".into(),
            kernel: "6.18.0".into(),
            target: TargetInfo {
                pid: 42,
                comm: "redis-server".into(),
                cmdline: vec!["redis-server".into()],
                launched: true,
                exit_status: Some(json!(0)),
            },
            mode: "marker",
            sampling: Sampling {
                rate_ppm: 10_000,
                decided_by: "runtime",
                burst: None,
            },
            drops: Drops {
                ring_full: 3,
                ..Default::default()
            },
            start_unix_ns: 1,
            duration_s: 2.0,
            requests_recorded: 10,
            monotonic_to_unix_ns: 5,
            finalised_by: Some("SIGINT"),
            bytes_written: 100,
            files: vec!["requests/part-00000.parquet".into()],
            agent: AgentCost::default(),
            notes: json!({}),
            ldb: None,
        }
    }

    #[test]
    fn has_every_required_key() {
        let v = example().to_json();
        for key in crate::schema::recording().meta_required {
            assert!(v.get(&key).is_some(), "meta.json lacks required key {key}");
        }
        assert_eq!(v["schema_version"], json!(crate::schema::schema_version()));
        assert_eq!(v["clock"]["monotonic_to_unix_ns"], json!(5));
        assert_eq!(v["drops"]["ring_full"], json!(3));
        assert_eq!(v["target"]["launched"], json!(true));
        assert_eq!(v["sampling"]["decided_by"], json!("runtime"));
        for k in [
            "ring_full",
            "bpf_ringbuf",
            "kc_collisions",
            "corrupt_records",
            "ring_resyncs",
            "slots_exhausted",
        ] {
            assert!(v["drops"].get(k).is_some(), "drops.{k}");
        }
    }

    #[test]
    fn atomic_write_round_trips() {
        let dir = crate::writer::tests::tempdir("meta");
        example().write(&dir).unwrap();
        let v: Value =
            serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
        assert_eq!(v, example().to_json());
        assert!(!dir.join("meta.json.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
