//! The client layer: one logical client of one server.
//!
//! Each [`Client`] holds a [`ClientPolicy`] (for Breakwater: the credit
//! pool it was granted by this server) and a local FIFO of requests waiting
//! for a permit. A request is sent at once if the policy gives a permit;
//! otherwise it waits in the queue until a response brings credit (or a rate
//! limiter's timer fires) and fails with [`ClientError::Expired`] if its
//! SLO passes first, without ever reaching the server. Each sent request
//! carries the client id, its demand (the queue behind it), its remaining
//! budget and its priority; each response's feedback goes back into the
//! policy and releases waiters in FIFO order.
//!
//! The first request registers the client (piggybacked). A client with
//! queued demand, no credit and nothing in flight sends a credit wait, which
//! the server answers when it has credit for it (an explicit window update).
//! [`Client::deregister`] returns unused credits when the client leaves.
//! With a carrying policy the credit wait is the client's oldest queued
//! request itself ([`Kind::Await`]); its caller waits at most until its
//! deadline plus one SLO, and a server answer `expired` (a held request
//! that never ran) is reported as [`ClientError::Expired`].
//!
//! With a credit stream ([`PushLink`], [`ClientLayer::layer_pushed`]) the
//! client names its connection's stream when it registers, and while the
//! stream is up a drained client sends no credit wait: its requests wait
//! locally for a credit the server pushes ([`crate::push`]), or expire.
//! If the server reads demand lines on the stream, a drained client sends
//! one when its first request starts waiting (its demand goes from none to
//! some while it holds no credit and has nothing in flight; not again
//! until the queue empties or a request of it is sent), so the server
//! pushes credits to clients that want one.
//!
//! Invariants: a permit taken for a waiter that has meanwhile expired is
//! given back; at most one credit wait per client is outstanding; a
//! client's id never changes (re-registration resets the credit count).

use crate::clock;
use crate::policy::{Acquire, Arrival, ClientPolicy, Feedback, Kind, Nanos};
use crate::rng::SplitMix64;
use crate::server::BoxError;
use crate::wire;
use http::{Request, Response};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use tokio::sync::oneshot;
use tower::{Layer, Service, ServiceExt};

/// Why the client layer failed a request itself.
#[derive(Debug)]
pub enum ClientError {
    /// It waited for a permit longer than its SLO and was never sent.
    Expired,
    /// The policy dropped it locally (DAGOR's threshold).
    Dropped,
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Expired => {
                f.write_str("request expired in the client queue (no credit within its SLO)")
            }
            ClientError::Dropped => f.write_str("request dropped by the client's overload control"),
        }
    }
}

impl std::error::Error for ClientError {}

/// Put in a request's extensions to choose its priority (1..=128); without
/// it the client draws one uniformly, as the thesis's DAGOR setup does.
#[derive(Debug, Clone, Copy)]
pub struct Priority(pub u8);

/// Put in a request's extensions to give it its own deadline (on the
/// [`clock`]), e.g. when the request was issued before it reached this
/// layer: it waits locally at most until then (never longer than the
/// layer's SLO from now), and the budget it sends is the time left to it.
/// A request whose deadline has passed fails at once with
/// [`ClientError::Expired`], unsent. Without it the deadline is now + SLO.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub Nanos);

/// In every response's extensions: when the request left this client
/// (after any local queueing), on the [`clock`].
#[derive(Debug, Clone, Copy)]
pub struct SentAt(pub Nanos);

/// Message counters shared by every client made from one layer.
#[derive(Debug, Default)]
pub struct ClientStats {
    pub requests_sent: AtomicU64,
    pub credit_waits_sent: AtomicU64,
    pub expired: AtomicU64,
    pub dropped: AtomicU64,
    pub deregisters_sent: AtomicU64,
    /// Explicit credits received on credit streams.
    pub pushed_received: AtomicU64,
    /// Demand lines sent on credit streams.
    pub demand_sent: AtomicU64,
}

pub type PolicyFactory = Arc<dyn Fn() -> Box<dyn ClientPolicy> + Send + Sync>;

/// Makes [`Client`]s; every [`Layer::layer`] call is a new logical client
/// with its own id and policy state.
#[derive(Clone)]
pub struct ClientLayer {
    factory: PolicyFactory,
    slo_ns: Nanos,
    stats: Arc<ClientStats>,
}

impl ClientLayer {
    /// `slo` is how long a request may wait for a permit locally (and the
    /// budget it advertises). Zero is refused.
    pub fn new(
        factory: PolicyFactory,
        slo: std::time::Duration,
    ) -> Result<Self, crate::ConfigError> {
        if slo.is_zero() {
            return Err(crate::ConfigError("client slo must be > 0".into()));
        }
        Ok(ClientLayer {
            factory,
            slo_ns: slo.as_nanos() as Nanos,
            stats: Arc::new(ClientStats::default()),
        })
    }

    pub fn stats(&self) -> Arc<ClientStats> {
        self.stats.clone()
    }
}

impl ClientLayer {
    /// A new logical client on `inner` whose explicit credits come on
    /// `link`, its connection's credit stream
    /// ([`crate::http::H2Transport::open_credit_stream`]).
    pub fn layer_pushed<S>(&self, inner: S, link: &Arc<PushLink>) -> Client<S> {
        let client = self.make(inner, Some(link.clone()));
        link.clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(client.shared.id, Arc::downgrade(&client.shared));
        client
    }

    fn make<S>(&self, inner: S, push: Option<Arc<PushLink>>) -> Client<S> {
        let id = crate::rng::entropy() >> 1;
        Client {
            inner,
            shared: Arc::new(Shared {
                id,
                slo_ns: self.slo_ns,
                stats: self.stats.clone(),
                push,
                state: Mutex::new(State {
                    policy: (self.factory)(),
                    queue: VecDeque::new(),
                    inflight: 0,
                    credit_wait: false,
                    demand_told: false,
                    timer: false,
                    rng: SplitMix64::new(id),
                }),
            }),
        }
    }
}

impl<S> Layer<S> for ClientLayer {
    type Service = Client<S>;
    fn layer(&self, inner: S) -> Client<S> {
        self.make(inner, None)
    }
}

/// The client end of one connection's credit stream: routes each pushed
/// explicit credit to its logical client. Made and started by
/// [`crate::http::H2Transport::open_credit_stream`] (or [`Self::new`] +
/// [`Self::run`] on any streaming body).
pub struct PushLink {
    stream: u64,
    live: AtomicBool,
    clients: Mutex<HashMap<u64, Weak<Shared>>>,
    /// Notified when the stream ends: requests waiting for a pushed credit
    /// then make their client send a credit wait instead.
    ended: tokio::sync::Notify,
    /// The subscription's request body, when the server reads demand
    /// lines on it ([`Self::enable_demand`]).
    demand: Mutex<Option<tokio::sync::mpsc::UnboundedSender<bytes::Bytes>>>,
    /// A line for 1 in this many idle-to-busy transitions (the server's).
    demand_sample: std::sync::atomic::AtomicU32,
}

impl PushLink {
    pub fn new() -> Arc<Self> {
        Arc::new(PushLink {
            stream: crate::rng::entropy() >> 1,
            live: AtomicBool::new(false),
            clients: Mutex::new(HashMap::new()),
            ended: tokio::sync::Notify::new(),
            demand: Mutex::new(None),
            demand_sample: std::sync::atomic::AtomicU32::new(1),
        })
    }

    /// The server reads demand lines sent into `tx` (the subscription's
    /// request body): drained clients of this link send them, for 1 in
    /// `sample` of their idle-to-busy transitions.
    pub fn enable_demand(&self, tx: tokio::sync::mpsc::UnboundedSender<bytes::Bytes>, sample: u32) {
        self.demand_sample.store(sample.max(1), Ordering::Relaxed);
        *self.demand.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    }

    /// Whether drained clients of this link send demand lines.
    pub fn signals_demand(&self) -> bool {
        self.is_live()
            && self
                .demand
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(|tx| !tx.is_closed())
    }

    /// Queue a demand line (see [`crate::push`]); false if the link sends
    /// none (then the client must not count on the server knowing).
    fn signal_demand(&self, client: u64, demand: u32, budget_us: u64) -> bool {
        if !self.is_live() {
            return false;
        }
        let guard = self.demand.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = guard.as_ref() else {
            return false;
        };
        let mut line = Vec::with_capacity(48);
        wire::encode_demand(&mut line, client, demand, budget_us);
        tx.send(bytes::Bytes::from(line)).is_ok()
    }

    /// The id clients name in `bw-stream` when they register.
    pub fn stream_id(&self) -> u64 {
        self.stream
    }

    /// Whether the stream is up (the server accepted it and it has not
    /// ended). While it is not, clients fall back to credit waits.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::SeqCst)
    }

    /// Mark the stream up or down. Down wakes the requests waiting for a
    /// pushed credit, whose clients then send credit waits.
    pub fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::SeqCst);
        if !live {
            // No more demand lines: the request body ends.
            self.demand.lock().unwrap_or_else(|p| p.into_inner()).take();
            self.ended.notify_waiters();
        }
    }

    /// Read the credit stream's body until it ends, applying each explicit
    /// credit to its client and handing the credit to its waiting requests.
    pub async fn run<Bd>(self: Arc<Self>, body: Bd)
    where
        Bd: http_body::Body<Data = bytes::Bytes> + Send,
    {
        use http_body_util::BodyExt;
        let mut body = std::pin::pin!(body);
        let mut buf = Vec::new();
        let mut grants = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            wire::decode_pushes(&mut buf, &mut grants);
            self.apply(&mut grants);
        }
        self.set_live(false);
    }

    /// Hand explicit credits `(client, limit)` (drained) to their clients
    /// and their waiting requests. Takes each client's lock in turn: call
    /// it holding none.
    fn apply(&self, grants: &mut Vec<(u64, u64)>) {
        if grants.is_empty() {
            return;
        }
        let now = clock::now();
        let clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        for (id, limit) in grants.drain(..) {
            let Some(shared) = clients.get(&id).and_then(Weak::upgrade) else {
                continue;
            };
            shared.stats.pushed_received.fetch_add(1, Ordering::Relaxed);
            let mut st = shared.lock();
            st.policy.on_pushed(now, Feedback::CreditLimit(limit));
            st.release(now);
        }
    }
}

struct Waiter {
    tx: oneshot::Sender<Result<Kind, ClientError>>,
    priority: u8,
    expiry: Nanos,
}

struct State {
    policy: Box<dyn ClientPolicy>,
    queue: VecDeque<Waiter>,
    inflight: usize,
    credit_wait: bool,
    /// The server knows this client has demand (a demand line, or demand
    /// piggybacked on its last request): no demand line until the queue
    /// empties or a request is sent.
    demand_told: bool,
    timer: bool,
    rng: SplitMix64,
}

impl State {
    /// Waiting requests that are still alive (the demand we report).
    fn demand(&mut self, now: Nanos) -> u32 {
        self.queue.retain(|w| !w.tx.is_closed() && w.expiry > now);
        if self.queue.is_empty() {
            self.demand_told = false;
        }
        self.queue.len() as u32
    }

    /// Hand permits to waiters, oldest first, while the policy gives them.
    fn release(&mut self, now: Nanos) {
        while let Some(front) = self.queue.front() {
            if front.tx.is_closed() || front.expiry <= now {
                self.queue.pop_front();
                continue;
            }
            match self.policy.try_acquire(now, front.priority) {
                Acquire::Wait => break,
                Acquire::Send(kind) => {
                    let w = self.queue.pop_front().expect("front");
                    if w.tx.send(Ok(kind)).is_err() {
                        self.policy.release();
                    }
                }
                Acquire::Drop => {
                    let w = self.queue.pop_front().expect("front");
                    let _ = w.tx.send(Err(ClientError::Dropped));
                }
            }
        }
    }
}

struct Shared {
    id: u64,
    slo_ns: Nanos,
    stats: Arc<ClientStats>,
    /// The connection's credit stream, if the client registers with one.
    push: Option<Arc<PushLink>>,
    state: Mutex<State>,
}

impl Shared {
    /// Explicit credits come pushed: no credit waits.
    fn pushed(&self) -> bool {
        self.push.as_ref().is_some_and(|l| l.is_live())
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One logical client; see the module docs. Cheap to clone (clones share
/// the client's identity and credits).
pub struct Client<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: Clone> Clone for Client<S> {
    fn clone(&self) -> Self {
        Client {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Client<S> {
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Tell the server this client is leaving and hand back its credits.
    pub fn deregister<B, RB>(&self) -> BoxFuture<Result<(), BoxError>>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send,
        B: Default + Send + 'static,
        RB: Send + 'static,
    {
        let shared = self.shared.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            let mut req = Request::new(B::default());
            wire::write_arrival(
                req.headers_mut(),
                &Arrival {
                    client: shared.id,
                    kind: Kind::Deregister,
                    demand: 0,
                    budget_ns: None,
                    priority: 1,
                },
            );
            shared
                .stats
                .deregisters_sent
                .fetch_add(1, Ordering::Relaxed);
            inner.oneshot(req).await.map_err(Into::into)?;
            shared.lock().policy.reset();
            Ok(())
        })
    }
}

/// After a state change: if requests wait, make sure something will wake
/// them (a credit wait for Breakwater, a timer for a rate limiter).
fn kick<S, B, RB>(shared: &Arc<Shared>, inner: &S, st: &mut State, now: Nanos)
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: Default + Send + 'static,
    RB: Send + 'static,
{
    if st.demand(now) == 0 {
        return;
    }
    let pushed = shared.pushed();
    if pushed && !st.demand_told && st.policy.needs_credit_wait(st.inflight) {
        // Drained with a request waiting and the server not told: one
        // demand line (the server pushes credits only on known demand).
        if let Some(link) = &shared.push {
            let budget = st.queue.back().map_or(0, |w| w.expiry.saturating_sub(now));
            let n = u64::from(link.demand_sample.load(Ordering::Relaxed));
            if n > 1 && st.rng.below(n) != 0 {
                // Not sampled this time: stay quiet until the queue empties.
                st.demand_told = link.signals_demand();
            } else if link.signal_demand(shared.id, st.queue.len() as u32, budget / 1000) {
                st.demand_told = true;
                shared.stats.demand_sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if !pushed
        && !st.credit_wait
        && st.policy.needs_credit_wait(st.inflight)
        && st.policy.carries_requests()
    {
        // The credit wait carries the oldest live request: hand it the
        // `Await` kind; its response (or its drop) ends the wait.
        while let Some(w) = st.queue.pop_front() {
            if w.tx.is_closed() || w.expiry <= now {
                continue;
            }
            if w.tx.send(Ok(Kind::Await)).is_ok() {
                st.credit_wait = true;
                shared
                    .stats
                    .credit_waits_sent
                    .fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
    }
    if !pushed
        && !st.credit_wait
        && st.policy.needs_credit_wait(st.inflight)
        && !st.policy.carries_requests()
    {
        st.credit_wait = true;
        let demand = st.queue.len() as u32;
        let shared = shared.clone();
        let inner = inner.clone();
        tokio::spawn(async move {
            let mut req = Request::new(B::default());
            wire::write_arrival(
                req.headers_mut(),
                &Arrival {
                    client: shared.id,
                    kind: Kind::CreditWait,
                    demand,
                    budget_ns: None,
                    priority: 1,
                },
            );
            shared
                .stats
                .credit_waits_sent
                .fetch_add(1, Ordering::Relaxed);
            let result = inner.clone().oneshot(req).await.map_err(Into::into);
            if result.is_err() {
                // Do not spin on a broken connection.
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            let now = clock::now();
            let mut st = shared.lock();
            st.credit_wait = false;
            if let Ok(resp) = &result {
                feedback(&mut st, now, resp);
            }
            st.release(now);
            kick(&shared, &inner, &mut st, now);
        });
    }
    if !st.timer {
        if let Some(at) = st.policy.next_permit_at(now) {
            st.timer = true;
            let shared = shared.clone();
            let inner = inner.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(clock::instant(at).into()).await;
                let now = clock::now();
                let mut st = shared.lock();
                st.timer = false;
                st.release(now);
                kick(&shared, &inner, &mut st, now);
            });
        }
    }
}

/// Clears a client's credit-wait flag if its `Await` request is dropped
/// before its response comes back (so the client is never stuck).
struct AwaitGuard(Option<Arc<Shared>>);

impl Drop for AwaitGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            shared.lock().credit_wait = false;
        }
    }
}

fn feedback<RB>(st: &mut State, now: Nanos, resp: &Response<RB>) {
    let fb = wire::parse_feedback(resp.headers());
    if fb != Feedback::None {
        st.policy.on_feedback(now, fb);
    }
    let unregistered = resp
        .headers()
        .get(wire::REJECT)
        .is_some_and(|v| v.as_bytes() == b"unregistered");
    if unregistered {
        st.policy.reset();
    }
}

impl<S, B, RB> Service<Request<B>> for Client<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: Default + Send + 'static,
    RB: Send + 'static,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<RB>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness of the connection is checked per request (oneshot):
        // this layer queues, so it is always ready to accept.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let shared = self.shared.clone();
        let inner = self.inner.clone();
        let now = clock::now();
        let own = now + shared.slo_ns;
        let expiry = req
            .extensions()
            .get::<Deadline>()
            .map_or(own, |d| d.0.min(own));
        if expiry <= now {
            shared.stats.expired.fetch_add(1, Ordering::Relaxed);
            return Box::pin(std::future::ready(Err(ClientError::Expired.into())));
        }
        let (priority, decision) = {
            let mut st = shared.lock();
            let priority = match req.extensions().get::<Priority>() {
                Some(p) => p.0.clamp(1, 128),
                None => 1 + st.rng.below(128) as u8,
            };
            // Drop dead waiters first: they must not hold a live request
            // back behind them.
            let queued = st.demand(now);
            let decision = if queued == 0 {
                st.policy.try_acquire(now, priority)
            } else {
                Acquire::Wait // FIFO: do not overtake waiters
            };
            let decision = match decision {
                Acquire::Send(kind) => Ok(kind),
                Acquire::Drop => Err(None),
                Acquire::Wait => {
                    let (tx, rx) = oneshot::channel();
                    st.queue.push_back(Waiter {
                        tx,
                        priority,
                        expiry,
                    });
                    st.release(now);
                    kick(&shared, &inner, &mut st, now);
                    Err(Some(rx))
                }
            };
            (priority, decision)
        };
        Box::pin(async move {
            // Set when this request is the client's credit wait: clears the
            // flag even if the request is dropped on the way.
            let mut wait_guard = None;
            let kind = match decision {
                Ok(kind) => kind,
                Err(None) => {
                    shared.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    return Err(ClientError::Dropped.into());
                }
                Err(Some(mut rx)) => {
                    let deadline = clock::instant(expiry).into();
                    let waited = 'wait: {
                        if let Some(link) = shared.push.clone() {
                            // Waiting for a pushed credit: if the credit
                            // stream ends meanwhile, nothing will push one,
                            // so kick the client into a credit wait (once
                            // the link is down it sends them), then wait on.
                            let ended = link.ended.notified();
                            tokio::pin!(ended);
                            ended.as_mut().enable();
                            if link.is_live() {
                                let early = tokio::select! {
                                    r = &mut rx => Some(Some(r)),
                                    _ = tokio::time::sleep_until(deadline) => Some(None),
                                    _ = ended => None,
                                };
                                if let Some(r) = early {
                                    break 'wait r;
                                }
                                let now = clock::now();
                                let mut st = shared.lock();
                                st.release(now);
                                kick(&shared, &inner, &mut st, now);
                            }
                        }
                        tokio::time::timeout_at(deadline, rx).await.ok()
                    };
                    match waited {
                        Some(Ok(Ok(kind))) => {
                            if kind == Kind::Await {
                                wait_guard = Some(AwaitGuard(Some(shared.clone())));
                            }
                            kind
                        }
                        Some(Ok(Err(e))) => {
                            shared.stats.dropped.fetch_add(1, Ordering::Relaxed);
                            return Err(e.into());
                        }
                        _ => {
                            shared.stats.expired.fetch_add(1, Ordering::Relaxed);
                            return Err(ClientError::Expired.into());
                        }
                    }
                }
            };
            let sent_at = clock::now();
            let demand = {
                let mut st = shared.lock();
                st.inflight += 1;
                let d = st.demand(sent_at);
                // Piggybacked: the server knows what waits behind it.
                st.demand_told = d > 0;
                d
            };
            wire::write_arrival(
                req.headers_mut(),
                &Arrival {
                    client: shared.id,
                    kind,
                    demand,
                    budget_ns: Some(expiry.saturating_sub(sent_at)),
                    priority,
                },
            );
            if kind == Kind::Register {
                if let Some(link) = &shared.push {
                    req.headers_mut()
                        .insert(wire::STREAM, http::HeaderValue::from(link.stream_id()));
                }
            }
            shared.stats.requests_sent.fetch_add(1, Ordering::Relaxed);
            if kind != Kind::Await {
                return send(shared, inner, req, kind, sent_at, None).await;
            }
            // The credit wait carries this request. A server that keeps a
            // held request whose time ran out as the client's credit wait
            // (`hold_expired`) answers it only when it has credit for us
            // again: the request itself has expired by then. So the send
            // runs on as its own task (it keeps this client quiet until the
            // answer, and applies the window it brings), and the caller
            // waits until its deadline plus one SLO of grace (an admitted
            // request that runs late still comes back with its latency).
            let grace = clock::instant(expiry + shared.slo_ns).into();
            let task = tokio::spawn(send(shared.clone(), inner, req, kind, sent_at, wait_guard));
            let expired = || -> Result<Response<RB>, BoxError> {
                shared.stats.expired.fetch_add(1, Ordering::Relaxed);
                Err(ClientError::Expired.into())
            };
            match tokio::time::timeout_at(grace, task).await {
                Ok(Ok(Ok(resp))) if is_expired(&resp) => expired(),
                Ok(Ok(result)) => result,
                Ok(Err(join)) => Err(join.into()),
                Err(_) => expired(),
            }
        })
    }
}

/// A held request the server answered `expired`: it never ran.
fn is_expired<RB>(resp: &Response<RB>) -> bool {
    resp.headers()
        .get(wire::REJECT)
        .is_some_and(|v| v.as_bytes() == wire::REJECT_EXPIRED.as_bytes())
}

/// Send a request that holds a permit, apply the response's feedback, hand
/// permits to waiters, and return the response (stamped with [`SentAt`]).
async fn send<S, B, RB>(
    shared: Arc<Shared>,
    inner: S,
    req: Request<B>,
    kind: Kind,
    sent_at: Nanos,
    mut wait_guard: Option<AwaitGuard>,
) -> Result<Response<RB>, BoxError>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: Default + Send + 'static,
    RB: Send + 'static,
{
    let result = inner.clone().oneshot(req).await.map_err(Into::into);
    let now = clock::now();
    // Explicit credits for other clients of this connection that rode on
    // our response: hand them over outside our own lock.
    let mut pushed = Vec::new();
    let mut own_push = None;
    if let (Some(link), Ok(resp)) = (&shared.push, &result) {
        wire::parse_pushes(resp.headers(), &mut pushed);
        // A push to us on our own response is newer than the response's own
        // credit limit (the server grants it after the completion's grant
        // or revoke): applied after that limit below, or it would be lost.
        pushed.retain(|&(id, limit)| {
            if id == shared.id {
                own_push = own_push.max(Some(limit));
            }
            id != shared.id
        });
        link.apply(&mut pushed);
    }
    {
        let mut st = shared.lock();
        st.inflight -= 1;
        if let Some(mut g) = wait_guard.take() {
            g.0 = None;
            st.credit_wait = false;
        }
        match &result {
            Ok(resp) => {
                feedback(&mut st, now, resp);
                if let Some(limit) = own_push {
                    shared.stats.pushed_received.fetch_add(1, Ordering::Relaxed);
                    st.policy.on_pushed(now, Feedback::CreditLimit(limit));
                }
                let ok = resp.status().is_success();
                st.policy.on_response(now, now - sent_at, ok);
            }
            Err(_) => {
                if kind == Kind::Register {
                    st.policy.reset();
                }
                st.policy.on_response(now, now - sent_at, false);
            }
        }
        st.release(now);
        kick(&shared, &inner, &mut st, now);
    }
    let mut resp = result?;
    resp.extensions_mut().insert(SentAt(sent_at));
    Ok(resp)
}
