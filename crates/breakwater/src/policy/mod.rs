//! The control policies: what every overload control (Breakwater and the
//! baselines it is measured against) decides, as pure state machines.
//!
//! A [`Policy`] is the server half: it sees each request arrive (before it is
//! queued), each request start and complete, and a periodic tick. It answers
//! admit / reject / park, and the [`Feedback`] to piggyback on the response.
//! A [`ClientPolicy`] is the client half: may a request be sent now, and what
//! to make of the feedback that comes back.
//!
//! Both are *pure*: no clocks, no threads, no I/O. Time comes in as a
//! parameter (`now`, nanoseconds on the caller's monotonic clock), so the
//! same code runs inside the tower layers, inside the discrete-event
//! simulator, and under the property tests, and a run is reproducible.
//! Times from different machines are never compared: a client sends a
//! *relative* budget, never a timestamp, so clock skew cannot matter.

pub mod breakwater;
pub mod dagor;
pub mod gradient;
pub mod none;
pub mod seda;

use std::fmt;

/// Nanoseconds on the local monotonic clock of whoever calls the policy.
pub type Nanos = u64;

/// Opaque client identity, chosen by the client (random by default).
pub type ClientId = u64;

/// What a message from a client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An RPC that spends a credit.
    Request,
    /// An RPC that also registers the client (its first), piggybacked as in
    /// the thesis §2.3: the server grants it a window and, if that window is
    /// at least one credit, admits the request on it.
    Register,
    /// No RPC: the client holds no credit, has queued demand and nothing in
    /// flight, so no response will carry a window to it. The server answers
    /// when it has credit to give (an explicit window update) — HTTP has no
    /// server push, so the client parks this request instead.
    CreditWait,
    /// An RPC sent *without* a credit by a client that holds none and has
    /// nothing in flight: a credit wait that carries its request. The
    /// server admits it at once if it has credit to give, else holds it
    /// (not in the FIFO, not counted as issued) and admits it the moment
    /// a credit frees up, or refuses it when it can no longer finish in
    /// time. It saves the credit wait's round trip and message, and the
    /// server never idles while such demand waits (see
    /// `docs/breakwater.md`, "credit waits that carry the request").
    Await,
    /// No RPC: the client leaves and returns its unused credits.
    Deregister,
}

/// The control metadata of one incoming message, already parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub client: ClientId,
    pub kind: Kind,
    /// Requests queued at the client behind this one (piggybacked demand).
    pub demand: u32,
    /// Remaining time the client will wait for an answer, if it said. Relative,
    /// so it means the same on the server's clock whatever the skew.
    pub budget_ns: Option<Nanos>,
    /// DAGOR business/user priority: 1 is the most important.
    pub priority: u8,
}

impl Arrival {
    pub fn request(client: ClientId) -> Self {
        Arrival {
            client,
            kind: Kind::Request,
            demand: 0,
            budget_ns: None,
            priority: 1,
        }
    }
}

/// The dispatcher's FIFO as seen at the moment of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueView {
    /// Enqueue time of the oldest queued request, if any.
    pub oldest_enqueue: Option<Nanos>,
    pub len: usize,
    /// Workers executing a request right now.
    pub busy: usize,
    pub workers: usize,
}

impl QueueView {
    /// Queueing delay: `now − oldest enqueue`, 0 for an empty queue or a
    /// clock that stepped back.
    pub fn delay(&self, now: Nanos) -> Nanos {
        self.oldest_enqueue.map_or(0, |t| now.saturating_sub(t))
    }
}

/// A request that finished (or was dropped) after admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub client: ClientId,
    /// False when the handler dropped it (ASQM) or failed.
    pub ok: bool,
    /// Time from arrival at the server to completion.
    pub sojourn_ns: Nanos,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    Reject(RejectReason),
    /// Hold the message and answer it from a later [`Policy::on_tick`]
    /// (a [`Kind::CreditWait`] that finds no credit to give), or, for a
    /// [`Kind::Await`], hold the request until [`Policy::release_parked`]
    /// admits or refuses it.
    Park,
    /// Answer at once with [`Policy::feedback`] (credit waits that can be
    /// satisfied now, deregistration).
    Answer,
}

/// Why a request was refused. Every reason maps to one HTTP status and one
/// `bw-reject` token (see `wire`), so a client can tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The client has no credit left (or never had one): 429.
    NoCredit,
    /// A credited request from a client the server does not know (it never
    /// registered, or was expired for idleness): 429; the client re-registers.
    Unregistered,
    /// AQM: the queue delay exceeds the request's remaining budget: 503.
    QueueDelay { delay_ns: Nanos, budget_ns: Nanos },
    /// DAGOR: priority below the admission threshold: 503.
    Priority { priority: u8, threshold: u8 },
    /// Concurrency limit reached (gradient, tower's LoadShed): 503.
    Limit,
    /// A request held for a credit ([`Kind::Await`]) whose time ran out
    /// before a credit freed for it: it was never run. Breakwater with
    /// `hold_expired` answers it only when it has credit for the client
    /// again (or after `max_hold`), so the client stays quiet meanwhile:
    /// 503 `expired`; the client layer reports it as expired.
    Expired,
}

/// What becomes of a request held by [`Verdict::Park`] (a [`Kind::Await`]):
/// see [`Policy::release_parked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Append it to the FIFO now (its credit is counted as issued).
    Admit,
    /// Answer it with this refusal (and [`Policy::feedback`]).
    Reject(RejectReason),
}

/// Control state piggybacked on a response (or sent alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feedback {
    None,
    /// Breakwater: the client may have sent this many credited requests in
    /// total (a cumulative edge like TCP's ack + window). Absolute, so a
    /// duplicated or reordered update is harmless.
    CreditLimit(u64),
    /// DAGOR: requests with a priority above this are dropped at the client.
    Threshold(u8),
}

/// Live numbers a policy exposes for reports and tests.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct PolicyStats {
    /// Breakwater's C_total, DAGOR's threshold, gradient's limit.
    pub control: f64,
    /// Breakwater's C_issued.
    pub issued: u64,
    pub clients: usize,
    /// Breakwater: credits granted and not yet spent (part of `issued`).
    pub unused: u64,
    /// Breakwater: requests held for a credit right now.
    pub held_now: usize,
    /// Breakwater: drained clients whose signalled demand waits for an
    /// explicit credit right now.
    pub wanting_now: usize,
    /// Breakwater: the AQM's service reserve now (adapted or configured).
    pub reserve_ns: u64,
    /// Breakwater with an adaptive reserve: completions it adapted on, and
    /// of those the ones the server saw finish late.
    pub budget_outcomes: u64,
    pub late_outcomes: u64,
}

/// The server half of an overload control. See the module docs.
///
/// Call order for one request: `on_arrival`; if admitted, `on_start` when a
/// worker takes it and `on_complete` when it finishes (the returned feedback
/// rides on its response); if rejected or answered, `feedback` gives what to
/// piggyback. `on_tick` runs periodically and returns explicit updates for
/// parked clients.
pub trait Policy: Send + 'static {
    fn name(&self) -> &'static str;
    /// Whether a message without client metadata is refused. Breakwater
    /// does not trust clients, so it requires a credit on every request.
    fn requires_metadata(&self) -> bool {
        false
    }
    fn on_arrival(&mut self, now: Nanos, msg: &Arrival, queue: &QueueView) -> Verdict;
    fn on_start(&mut self, _now: Nanos, _queue_wait_ns: Nanos) {}
    fn on_complete(&mut self, now: Nanos, done: &Completion, queue: &QueueView) -> Feedback;
    /// After `on_complete`, for a request that told its budget: it had
    /// `budget_ns` left when it arrived (its client's remaining time) and
    /// spent `sojourn_ns` at the server.
    fn on_budget_spent(&mut self, _now: Nanos, _budget_ns: Nanos, _sojourn_ns: Nanos) {}
    /// Feedback for a response that is not a completion (a reject, an
    /// answered credit wait).
    fn feedback(&mut self, now: Nanos, client: ClientId) -> Feedback;
    /// Periodic work; push `(client, feedback)` for parked clients to answer.
    fn on_tick(
        &mut self,
        _now: Nanos,
        _queue: &QueueView,
        _explicit: &mut Vec<(ClientId, Feedback)>,
    ) {
    }
    /// Decide held requests ([`Kind::Await`] answered with
    /// [`Verdict::Park`]): push `(client, Admit)` for each to append to the
    /// FIFO now, in that order, and `(client, Reject)` for each to refuse.
    /// Called after every completion and tick; `queue` is the FIFO before
    /// any of the pushed admissions.
    fn release_parked(
        &mut self,
        _now: Nanos,
        _queue: &QueueView,
        _out: &mut Vec<(ClientId, Release)>,
    ) {
    }
    /// Requests held for [`Self::release_parked`] (cheap; lets the layer skip
    /// the call).
    fn parked_requests(&self) -> usize {
        0
    }
    fn stats(&self) -> PolicyStats {
        PolicyStats::default()
    }
    /// The transport can push to `client` without a request to answer: it
    /// registered a credit stream, shared by the clients of `group` (one
    /// connection). Called after the arrival that registered it.
    fn set_pushable(&mut self, _client: ClientId, _group: u64) {}
    /// Explicit credits (thesis §2.3.2: "only generated when piggybacking
    /// a credit on a response is not possible"): grant the pool's spare
    /// credits to pushable clients and push `(client, feedback)` for the
    /// transport to deliver. With `via`, a response to that client is
    /// about to leave: grant only to clients of its group, so the credits
    /// ride on that response; without, to any group (the transport writes
    /// them to the credit streams). Called after completions (after the
    /// response's own lazy grant) and ticks.
    fn push_credits(
        &mut self,
        _now: Nanos,
        _via: Option<ClientId>,
        _out: &mut Vec<(ClientId, Feedback)>,
    ) {
    }
    /// `client` (pushable) signals its demand when drained: it sends a
    /// demand line ([`Self::on_demand`]) when it has requests waiting, no
    /// credit and nothing in flight, and otherwise has none. Called before
    /// [`Self::set_pushable`] on the arrival that registered it.
    fn set_signals_demand(&mut self, _client: ClientId) {}
    /// A demand line from `client`: it holds no credit, has nothing in
    /// flight and `demand` requests waiting, the newest of which will wait
    /// `budget_ns` more (relative, like `Arrival::budget_ns`).
    fn on_demand(
        &mut self,
        _now: Nanos,
        _client: ClientId,
        _demand: u32,
        _budget_ns: Option<Nanos>,
    ) {
    }
}

/// What the client half says about sending a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// Send it, with this kind (Request or Register).
    Send(Kind),
    /// Queue it locally until a permit frees up (or it expires).
    Wait,
    /// Drop it locally (DAGOR's client-side threshold).
    Drop,
}

/// The client half of an overload control.
pub trait ClientPolicy: Send + 'static {
    fn name(&self) -> &'static str;
    /// Take a permit for a request with this priority, if one is free.
    fn try_acquire(&mut self, now: Nanos, priority: u8) -> Acquire;
    /// Give back a permit that was taken but not used.
    fn release(&mut self) {}
    fn on_feedback(&mut self, _now: Nanos, _feedback: Feedback) {}
    /// An explicit credit pushed on a credit stream ([`crate::push`]). It
    /// travels apart from the responses, so it may overtake or trail them;
    /// by default it is applied like any feedback.
    fn on_pushed(&mut self, now: Nanos, feedback: Feedback) {
        self.on_feedback(now, feedback);
    }
    /// A response (success or failure) arrived `latency_ns` after sending.
    fn on_response(&mut self, _now: Nanos, _latency_ns: Nanos, _ok: bool) {}
    /// When a waiting request could next get a permit without feedback
    /// (rate limiters), so the caller can set a timer.
    fn next_permit_at(&self, _now: Nanos) -> Option<Nanos> {
        None
    }
    /// Breakwater: registered, no credit, nothing in flight to bring a
    /// window back — send a [`Kind::CreditWait`].
    fn needs_credit_wait(&self, _inflight: usize) -> bool {
        false
    }
    /// Whether the credit wait carries the oldest queued request
    /// ([`Kind::Await`]) rather than going alone ([`Kind::CreditWait`]).
    fn carries_requests(&self) -> bool {
        false
    }
    /// A registration was refused outright (e.g. unknown at the server):
    /// start over.
    fn reset(&mut self) {}
}

/// A configuration value that cannot work, caught at construction.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

pub(crate) fn positive_f64(name: &str, v: f64) -> Result<f64, ConfigError> {
    if v > 0.0 && v.is_finite() {
        Ok(v)
    } else {
        Err(ConfigError(format!("{name} must be > 0, got {v}")))
    }
}

pub(crate) fn positive_u64(name: &str, v: u64) -> Result<u64, ConfigError> {
    if v > 0 {
        Ok(v)
    } else {
        Err(ConfigError(format!("{name} must be > 0, got 0")))
    }
}

pub(crate) fn fraction(name: &str, v: f64, upper_inclusive: bool) -> Result<f64, ConfigError> {
    let ok = v > 0.0 && (v < 1.0 || (upper_inclusive && v == 1.0));
    if ok {
        Ok(v)
    } else {
        let hi = if upper_inclusive { "1]" } else { "1)" };
        Err(ConfigError(format!("{name} must be in (0, {hi}, got {v}")))
    }
}
