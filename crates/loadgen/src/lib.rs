//! tailscope-loadgen: an open-loop load generator.
//!
//! Requests arrive as a Poisson process ([`arrivals`]), independent of how
//! fast the server answers, and each request's latency is measured from its
//! *intended* send time. A generator that waits for replies before sending
//! more (closed loop), or that times from the actual write, under-reports
//! tail latency exactly when the server stalls; this one does not.
//!
//! Layout: [`cli`] turns flags into a [`config::Config`]; [`engine`] runs
//! the single-threaded event loop over [`conn`]ections speaking a
//! [`protocol`]; [`stats`] turns what it saw into a [`stats::Summary`];
//! [`report`] renders that.

pub mod affinity;
pub mod arrivals;
pub mod cli;
pub mod config;
pub mod conn;
pub mod engine;
pub mod h2engine;
pub mod protocol;
pub mod report;
pub mod rng;
pub mod stats;
pub mod timer;
pub mod workload;

pub use config::{Config, Load, ProtocolKind};
pub use engine::run;
pub use stats::Summary;
