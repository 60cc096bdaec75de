//! Breakwater overload control for Rust RPC services (tower, hyper).
//!
//! A server under more load than it can serve should not queue the excess
//! until every request misses its SLO. Breakwater (Cho et al., OSDI '20;
//! thesis ch. 2) lets the server decide who may send: it grants *credits*,
//! sizes the pool by AIMD on its measured queueing delay, speculates on
//! demand and overcommits so that credits do not sit idle, and drops a
//! request early (AQM) when its remaining budget is smaller than the queue
//! in front of it.
//!
//! Layout:
//! - [`policy`]: the pure decision logic behind one trait, [`Policy`]
//!   (server half) and [`ClientPolicy`] (client half): Breakwater and the
//!   baselines it is measured against (none, SEDA, DAGOR, a gradient
//!   limiter). Time is a parameter; nothing here reads a clock.
//! - [`server`]: the tower [`ServerLayer`]: metadata parsing, an explicit
//!   FIFO dispatcher and a worker pool, so the queueing delay is exact.
//! - [`client`]: the tower [`ClientLayer`]: credits, a local queue whose
//!   entries expire with the SLO, demand piggybacking, registration.
//! - [`wire`]: the HTTP/2 headers that carry demand and credits.
//! - [`asqm`]: a mutex with `lock_unless_congested` (Protego's ASQM).
//! - [`sim`]: a discrete-event simulator driving the same policy code.
//! - [`control`]: build a control's two halves by name.
//! - [`http`]: hyper 1.x glue (serve / connect over HTTP/2).
//! - [`push`]: server-pushed explicit credits over a per-connection
//!   credit stream (the client half is [`client::PushLink`]).

pub mod asqm;
pub mod client;
pub mod clock;
pub mod control;
pub mod http;
pub mod policy;
pub mod push;
pub mod rng;
pub mod server;
pub mod sim;
pub mod wire;

pub use client::{ClientError, ClientLayer};
pub use control::{ControlKind, ControlSpec};
pub use policy::{
    Acquire, Arrival, ClientPolicy, Completion, ConfigError, Feedback, Kind, Nanos, Policy,
    QueueView, RejectReason, Release, Verdict,
};
pub use server::{ServerConfig, ServerLayer, WorkerPriority};
