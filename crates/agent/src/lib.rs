//! tailscope-agent: attaches to a latency-critical service, drains its
//! per-request records (from libtailscope's shared-memory rings, or inferred
//! by eBPF from socket syscalls) and writes them as a Parquet recording.
//!
//! The binary (`main.rs`) is thin glue over these modules:
//! - [`cli`]: argument parsing, sampling-rate syntax, exit codes;
//! - [`region`]: marker mode, the mapped `/dev/shm/tailscope.<pid>` region,
//!   drained through the hostile-input parsers of `tailscope_abi::region`;
//! - [`tracer`]: the eBPF side (`tailscope-bpf`);
//! - [`launch`]: running `-- CMD` with the BPF already watching it;
//! - [`writer`]: the `requests` Parquet table, pinned to
//!   `schema/recording.json`; [`meta`]: `meta.json`;
//! - [`recorder`]: the poll loop that ties them together and finalises.

pub mod burst;
pub mod cli;
pub mod error;
pub mod launch;
pub mod meta;
pub mod observer;
pub mod progress;
pub mod recorder;
pub mod region;
pub mod schema;
pub mod shmguard;
pub mod sys;
pub mod table;
pub mod tracer;
pub mod writer;
