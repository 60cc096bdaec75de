//! The server layer: admission control in front of an explicit FIFO
//! dispatcher and a fixed pool of worker threads.
//!
//! Why a dispatcher: the overload signal is the queueing delay, `now −
//! enqueue time of the oldest queued request`. It is only exact if the
//! queue is ours. So `call` never runs the inner service: it parses the
//! control metadata, asks the [`Policy`], and either answers at once (a
//! reject, a malformed request, a credit wait) or appends the request to the
//! FIFO with its timestamp. `workers` OS threads pop the FIFO in order and
//! run the inner service to completion (each on its own single-threaded
//! tokio runtime, so handlers may still `.await`). A request is therefore
//! always in exactly one place: the FIFO (queued, timestamped) or a worker
//! (running).
//!
//! Invariants, in tower's style:
//! - The policy lock is taken before the FIFO lock, never the other way.
//! - Every admitted request reaches `on_complete` exactly once, whether the
//!   inner service answers, fails or the pool shuts down, so credits and
//!   concurrency slots always come back.
//! - A reject is answered from `call` itself, without touching the FIFO or
//!   a worker: failures are immediate.
//! - `poll_ready` is always ready: this layer sheds, it never back-pressures.
//!
//! The feedback (the credit window) is written into the response headers
//! by the worker that completes the request, at that moment (lazy credit
//! distribution). Parked credit waits are answered by a ticker thread that
//! runs [`Policy::on_tick`] every `tick`. Clients that registered with a
//! credit stream ([`crate::push`]) instead get the pool's spare credits
//! pushed ([`Policy::push_credits`], after every completion and tick).

use crate::asqm::QueueBudget;
use crate::clock;
use crate::policy::{
    Completion, Feedback, Nanos, Policy, PolicyStats, QueueView, Release, Verdict,
};
use crate::wire;
use http::{HeaderValue, Request, Response, StatusCode};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tower::{Layer, Service, ServiceExt};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Pool settings. Policy settings live in the policy.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Worker threads (the `k` of M/G/k). At least 1.
    pub workers: usize,
    /// Period of the ticker that answers parked credit waits. With nothing
    /// parked or held the ticker sleeps 8 ticks (a park wakes it at once).
    pub tick: Duration,
    /// How the kernel schedules the worker threads against the threads that
    /// run `call` (receive, admit, refuse, reply).
    pub worker_priority: WorkerPriority,
}

/// Scheduling class of the worker threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkerPriority {
    /// Same class as every other thread.
    #[default]
    Normal,
    /// `SCHED_IDLE`: a worker yields the core the moment another thread
    /// (the I/O thread with a request, a reject, a reply to write) wakes on
    /// it. On a core shared by the I/O thread and the workers, the kernel's
    /// fair scheduler otherwise lets a busy worker finish its slice (up to
    /// ~1.5 ms) before the woken I/O thread runs, and every reject and
    /// admission decision waits behind it. Workers then only run when no
    /// normal thread wants the core: give the server cores of its own, and
    /// beware of refusal storms (clients that resend every refusal at
    /// once): the I/O thread answering them starves the workers and the
    /// server livelocks (docs/breakwater.md, session 5).
    Idle,
    /// No worker thread: the one worker runs as a task on the runtime that
    /// runs `call` (the I/O thread), run to completion like a Shenango
    /// core. It pops the FIFO head, runs the handler, writes the response,
    /// then yields until the runtime has polled its sockets once, so every
    /// reject, admission and reply waits at most one handler run and no
    /// thread switch; the I/O thread and a worker never share a core
    /// through the kernel's scheduler (no run-to-parity wait, no eventfd
    /// or futex wake per request). Unlike `Idle` it cannot livelock: the
    /// worker gets its turn after every poll of the sockets, however many
    /// requests arrive. Needs `workers == 1` and a single-threaded (or any)
    /// tokio runtime running `call`; the handler is polled to completion
    /// on that thread without the runtime, so it must not await the
    /// runtime's timers or sockets (CPU-bound handlers; an awaiting one
    /// needs the worker threads). docs/breakwater.md, session 9.
    Inline,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: 1,
            tick: Duration::from_millis(1),
            worker_priority: WorkerPriority::Normal,
        }
    }
}

/// Put the calling thread in `SCHED_IDLE` (Linux); elsewhere a no-op.
fn set_idle_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: plain syscall on the calling thread with a valid param.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    }
}

/// Ask the kernel for a time slice of `slice` for the calling thread
/// (`None`: the kernel's default). On Linux ≥ 6.12 (EEVDF) this is
/// `sched_setattr(SCHED_OTHER, sched_runtime = slice)`; the kernel clamps
/// it to 0.1–100 ms. A waking thread whose slice is shorter than the
/// running thread's preempts it at once when it is owed CPU time, instead
/// of waiting for the running thread to finish its slice (run-to-parity);
/// the threads' long-run shares stay fair, so unlike `SCHED_IDLE` workers
/// (see [`WorkerPriority::Idle`]) neither side can starve the other.
///
/// Meant for the thread that runs `call` (the I/O thread: receive, admit,
/// refuse, reply) on a core it shares with the workers, so rejects and
/// admissions do not wait out a busy worker's slice. Call it after the
/// workers are spawned (a thread may pass its slice on to threads it
/// spawns). Returns the slice the kernel reports afterwards (kernels
/// without custom slices report none: `None`), or the error if the kernel
/// refuses. Elsewhere than Linux: `Ok(None)`, nothing changes.
pub fn set_thread_slice(slice: Option<Duration>) -> std::io::Result<Option<Duration>> {
    #[cfg(target_os = "linux")]
    {
        #[repr(C)]
        #[derive(Default)]
        struct SchedAttr {
            size: u32,
            sched_policy: u32,
            sched_flags: u64,
            sched_nice: i32,
            sched_priority: u32,
            sched_runtime: u64,
            sched_deadline: u64,
            sched_period: u64,
            sched_util_min: u32,
            sched_util_max: u32,
        }
        // Keep the thread's nice value: sched_setattr sets it too.
        // SAFETY: plain syscalls on the calling thread (tid 0 / who 0)
        // with a valid, correctly sized struct we own.
        unsafe {
            *libc::__errno_location() = 0;
            let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
            if nice == -1 && *libc::__errno_location() != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let attr = SchedAttr {
                size: std::mem::size_of::<SchedAttr>() as u32,
                sched_policy: libc::SCHED_OTHER as u32,
                sched_nice: nice,
                sched_runtime: slice.map_or(0, |s| s.as_nanos() as u64),
                ..SchedAttr::default()
            };
            if libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut got = SchedAttr::default();
            let size = std::mem::size_of::<SchedAttr>() as u32;
            if libc::syscall(
                libc::SYS_sched_getattr,
                0,
                &mut got as *mut SchedAttr,
                size,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok((got.sched_runtime > 0).then(|| Duration::from_nanos(got.sched_runtime)))
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = slice;
        Ok(None)
    }
}

/// Counters of what the layer did; read with [`Server::stats`].
#[derive(Debug, Default)]
struct Counters {
    arrivals: AtomicU64,
    admitted: AtomicU64,
    completed_ok: AtomicU64,
    completed_failed: AtomicU64,
    rejected: AtomicU64,
    malformed: AtomicU64,
    credit_waits: AtomicU64,
    explicit_updates: AtomicU64,
    deregisters: AtomicU64,
    held: AtomicU64,
    registers: AtomicU64,
    credit_waits_parked: AtomicU64,
    rejected_no_credit: AtomicU64,
    rejected_queue_delay: AtomicU64,
    held_expired: AtomicU64,
    pushed_credits: AtomicU64,
    push_chunks: AtomicU64,
    demand_lines: AtomicU64,
    /// Admitted requests' time in the FIFO, and arrival to completion.
    queue_wait: Buckets,
    sojourn: Buckets,
    /// AQM refusals' budgets (the client's remaining time minus the
    /// service reserve, or the server's own queue budget if smaller).
    aqm_budget: Buckets,
}

/// A lock-free latency histogram: [`Buckets::WIDTH_NS`]-wide buckets up to
/// [`Buckets::N`] × that; longer values land in the last bucket.
struct Buckets([AtomicU64; Buckets::N]);

impl Default for Buckets {
    fn default() -> Self {
        Buckets(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Buckets")
    }
}

impl Buckets {
    const WIDTH_NS: u64 = 20_000;
    const N: usize = 500;

    fn record(&self, ns: Nanos) {
        let i = ((ns / Self::WIDTH_NS) as usize).min(Self::N - 1);
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Quantiles (upper bucket edges, µs) and the share above `over_ns`.
    fn summary(&self, over_ns: Nanos) -> LatencyBuckets {
        let counts: Vec<u64> = self.0.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let n: u64 = counts.iter().sum();
        let q = |f: f64| -> f64 {
            if n == 0 {
                return 0.0;
            }
            let rank = ((f * n as f64).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return ((i as u64 + 1) * Self::WIDTH_NS) as f64 / 1e3;
                }
            }
            (Self::N as u64 * Self::WIDTH_NS) as f64 / 1e3
        };
        let first_over = (over_ns / Self::WIDTH_NS) as usize;
        let over: u64 = counts.iter().skip(first_over).sum();
        LatencyBuckets {
            count: n,
            p50_us: q(0.5),
            p90_us: q(0.9),
            p99_us: q(0.99),
            over_1ms: over,
            at_range_end: counts[Self::N - 1],
        }
    }
}

/// A server-side latency distribution (20 µs buckets: quantiles are the
/// bucket's upper edge).
#[derive(Debug, Clone, serde::Serialize)]
pub struct LatencyBuckets {
    pub count: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    /// Values of 1 ms or more.
    pub over_1ms: u64,
    /// Values in the last bucket, at or past 9.98 ms: the histogram ends
    /// there, so a quantile of 10,000 µs says "at least that" (review L11).
    pub at_range_end: u64,
}

impl Counters {
    fn count_reject(&self, reason: &crate::policy::RejectReason) {
        use crate::policy::RejectReason as R;
        self.rejected.fetch_add(1, Ordering::Relaxed);
        let by = match reason {
            R::NoCredit | R::Unregistered => &self.rejected_no_credit,
            R::QueueDelay { budget_ns, .. } => {
                self.aqm_budget.record(*budget_ns);
                &self.rejected_queue_delay
            }
            R::Expired => &self.held_expired,
            R::Priority { .. } | R::Limit => return,
        };
        by.fetch_add(1, Ordering::Relaxed);
    }
}

/// A snapshot of the counters and the policy's state.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerStats {
    pub policy: &'static str,
    pub arrivals: u64,
    pub admitted: u64,
    pub completed_ok: u64,
    pub completed_failed: u64,
    /// Refused by the policy (no credit, AQM, threshold, limit).
    pub rejected: u64,
    /// Refused for missing or malformed metadata.
    pub malformed: u64,
    pub credit_waits: u64,
    pub explicit_updates: u64,
    pub deregisters: u64,
    /// Requests sent without credit that waited at the server for one.
    pub held: u64,
    /// Arrivals that registered a client (their request is also counted
    /// as admitted or rejected).
    pub registers: u64,
    /// Credit waits parked for an explicit update (the rest of
    /// `credit_waits` were answered at once).
    pub credit_waits_parked: u64,
    /// Of `rejected`: no credit / unregistered (429), and AQM (503
    /// `queue-delay`); the rest are thresholds and limits.
    pub rejected_no_credit: u64,
    pub rejected_queue_delay: u64,
    /// Of `rejected`: held requests answered `expired` (`hold_expired`).
    pub held_expired: u64,
    /// Explicit credits pushed (in `bw-push` on a response to another
    /// client of the same connection, or on its credit stream), and the
    /// credit-stream chunks (HTTP/2 DATA frames at most) that carried some.
    pub pushed_credits: u64,
    pub push_chunks: u64,
    /// Demand lines received on credit streams ([`crate::push`]).
    pub demand_lines: u64,
    /// Admitted requests' wait in the FIFO, and their sojourn (arrival,
    /// or release from hold, to completion), as the server measured them.
    pub queue_wait: LatencyBuckets,
    pub sojourn: LatencyBuckets,
    /// The budgets the AQM refused requests on.
    pub aqm_budget: LatencyBuckets,
    pub queue_len: usize,
    #[serde(flatten)]
    pub control: PolicyStats,
}

type Reply<RB> = oneshot::Sender<Result<Response<RB>, BoxError>>;

struct Job<B, RB> {
    request: Request<B>,
    client: u64,
    arrived: Nanos,
    enqueued: Nanos,
    budget_ns: Nanos,
    reply: Reply<RB>,
}

struct Fifo<B, RB> {
    jobs: VecDeque<Job<B, RB>>,
    /// Requests the policy holds for a credit (`Verdict::Park` of an
    /// `Await`), by client: not queued, not timestamped as queued.
    held: HashMap<u64, Job<B, RB>>,
    closed: bool,
    /// Workers blocked on `work`. A producer signals the condvar only when
    /// one is: std's `notify_one` is a futex syscall even with no waiter,
    /// and at 2x the worker is busy (not waiting) for most admissions, so
    /// this saves the I/O thread a syscall per admitted request.
    waiting: usize,
}

struct Shared<B, RB> {
    policy: Mutex<Box<dyn Policy>>,
    fifo: Mutex<Fifo<B, RB>>,
    work: Condvar,
    busy: AtomicUsize,
    workers: usize,
    parked: Mutex<HashMap<u64, Vec<oneshot::Sender<Feedback>>>>,
    has_parked: std::sync::atomic::AtomicBool,
    /// The ticker thread, unparked when a credit wait or request parks.
    ticker: std::sync::OnceLock<std::thread::Thread>,
    /// The ticker is in a long (nothing parked) sleep.
    ticker_dozing: std::sync::atomic::AtomicBool,
    counters: Counters,
    name: &'static str,
    requires_metadata: bool,
    /// Credit streams of the clients that subscribed one.
    push: Arc<crate::push::PushHub>,
    /// `WorkerPriority::Inline`: wakes the inline worker task, and the
    /// task's start, deferred to the first `call` (inside the runtime).
    inline: Option<tokio::sync::Notify>,
    launch: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl<B, RB> Shared<B, RB> {
    fn view(&self, fifo: &Fifo<B, RB>) -> QueueView {
        QueueView {
            oldest_enqueue: fifo.jobs.front().map(|j| j.enqueued),
            len: fifo.jobs.len(),
            busy: self.busy.load(Ordering::Relaxed),
            workers: self.workers,
        }
    }

    fn lock_policy(&self) -> std::sync::MutexGuard<'_, Box<dyn Policy>> {
        self.policy.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_fifo(&self) -> std::sync::MutexGuard<'_, Fifo<B, RB>> {
        self.fifo.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Closes the FIFO (so workers exit) when the last [`Server`] clone goes.
struct PoolGuard<B, RB>(Arc<Shared<B, RB>>);

impl<B, RB> Drop for PoolGuard<B, RB> {
    fn drop(&mut self) {
        self.0.lock_fifo().closed = true;
        self.0.work.notify_all();
        if let Some(n) = &self.0.inline {
            n.notify_one();
        }
        // Credit streams end with the layer (their clients fall back to
        // credit waits), so their connections can close.
        self.0.push.close();
    }
}

/// Adds Breakwater (or a baseline) in front of a service. See the module
/// docs. `B` and `RB` are the request and response body types (usually
/// inferred). [`Layer::layer`] starts the worker pool and takes the policy
/// out of the layer, so build one layer per service.
pub struct ServerLayer<B, RB> {
    policy: Mutex<Option<Box<dyn Policy>>>,
    config: ServerConfig,
    _bodies: std::marker::PhantomData<fn(B) -> RB>,
}

impl<B, RB> ServerLayer<B, RB> {
    /// Refuses a zero worker count or tick.
    pub fn new(policy: Box<dyn Policy>, config: ServerConfig) -> Result<Self, crate::ConfigError> {
        if config.workers == 0 {
            return Err(crate::ConfigError("workers must be > 0".into()));
        }
        if config.tick.is_zero() {
            return Err(crate::ConfigError("tick must be > 0".into()));
        }
        if config.worker_priority == WorkerPriority::Inline && config.workers != 1 {
            return Err(crate::ConfigError(
                "an inline worker needs workers = 1".into(),
            ));
        }
        Ok(ServerLayer {
            policy: Mutex::new(Some(policy)),
            config,
            _bodies: std::marker::PhantomData,
        })
    }
}

impl<S, B, RB> Layer<S> for ServerLayer<B, RB>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: 'static,
    B: Send + 'static,
    RB: Default + Send + 'static,
{
    type Service = Server<B, RB>;

    fn layer(&self, inner: S) -> Server<B, RB> {
        let policy = self
            .policy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("ServerLayer::layer called twice: build one layer per service");
        Server::start(inner, policy, self.config.clone())
    }
}

/// The running layer: a cheap-to-clone handle on the dispatcher.
pub struct Server<B, RB> {
    shared: Arc<Shared<B, RB>>,
    _guard: Arc<PoolGuard<B, RB>>,
}

impl<B, RB> Clone for Server<B, RB> {
    fn clone(&self) -> Self {
        Server {
            shared: self.shared.clone(),
            _guard: self._guard.clone(),
        }
    }
}

impl<B: Send + 'static, RB: Default + Send + 'static> Server<B, RB> {
    /// Wrap `inner` directly (the layer does this). Spawns `workers` worker
    /// threads and one ticker thread; with `WorkerPriority::Inline`, no
    /// worker thread and one inline worker whatever `workers` says
    /// (`ServerLayer::new` refuses any other count).
    pub fn start<S>(inner: S, policy: Box<dyn Policy>, config: ServerConfig) -> Self
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
        S::Error: Into<BoxError>,
        S::Future: 'static,
    {
        let inline = config.worker_priority == WorkerPriority::Inline;
        let workers = if inline { 1 } else { config.workers.max(1) };
        let shared = Arc::new(Shared {
            name: policy.name(),
            requires_metadata: policy.requires_metadata(),
            policy: Mutex::new(policy),
            fifo: Mutex::new(Fifo {
                jobs: VecDeque::new(),
                held: HashMap::new(),
                closed: false,
                waiting: 0,
            }),
            work: Condvar::new(),
            busy: AtomicUsize::new(0),
            workers,
            parked: Mutex::new(HashMap::new()),
            has_parked: std::sync::atomic::AtomicBool::new(false),
            ticker: std::sync::OnceLock::new(),
            ticker_dozing: std::sync::atomic::AtomicBool::new(false),
            counters: Counters::default(),
            push: crate::push::PushHub::new(),
            inline: inline.then(tokio::sync::Notify::new),
            launch: Mutex::new(None),
        });
        if inline {
            let weak = Arc::downgrade(&shared);
            let svc = inner.clone();
            *shared.launch.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(move || {
                tokio::spawn(inline_worker(weak, svc));
            }));
        }
        for i in 0..if inline { 0 } else { workers } {
            let shared = shared.clone();
            let svc = inner.clone();
            let idle = config.worker_priority == WorkerPriority::Idle;
            std::thread::Builder::new()
                .name(format!("bw-worker-{i}"))
                .spawn(move || {
                    if idle {
                        set_idle_priority();
                    }
                    worker(shared, svc)
                })
                .expect("spawn worker thread");
        }
        let weak = Arc::downgrade(&shared);
        shared.push.set_demand_sink(Box::new(move |lines| {
            if let Some(shared) = weak.upgrade() {
                shared.on_demand_lines(lines);
            }
        }));
        let weak = Arc::downgrade(&shared);
        let handle = std::thread::Builder::new()
            .name("bw-ticker".into())
            .spawn(move || ticker(weak, config.tick))
            .expect("spawn ticker thread");
        let _ = shared.ticker.set(handle.thread().clone());
        Server {
            _guard: Arc::new(PoolGuard(shared.clone())),
            shared,
        }
    }

    /// The hub of this server's credit streams: hand it to
    /// [`crate::http::serve_with_push`] so clients can subscribe one, and
    /// the policy's explicit credits are pushed to them.
    pub fn push_hub(&self) -> Arc<crate::push::PushHub> {
        self.shared.push.clone()
    }

    pub fn stats(&self) -> ServerStats {
        let c = &self.shared.counters;
        let control = self.shared.lock_policy().stats();
        let queue_len = self.shared.lock_fifo().jobs.len();
        ServerStats {
            policy: self.shared.name,
            arrivals: c.arrivals.load(Ordering::Relaxed),
            admitted: c.admitted.load(Ordering::Relaxed),
            completed_ok: c.completed_ok.load(Ordering::Relaxed),
            completed_failed: c.completed_failed.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            malformed: c.malformed.load(Ordering::Relaxed),
            credit_waits: c.credit_waits.load(Ordering::Relaxed),
            explicit_updates: c.explicit_updates.load(Ordering::Relaxed),
            deregisters: c.deregisters.load(Ordering::Relaxed),
            held: c.held.load(Ordering::Relaxed),
            registers: c.registers.load(Ordering::Relaxed),
            credit_waits_parked: c.credit_waits_parked.load(Ordering::Relaxed),
            rejected_no_credit: c.rejected_no_credit.load(Ordering::Relaxed),
            rejected_queue_delay: c.rejected_queue_delay.load(Ordering::Relaxed),
            held_expired: c.held_expired.load(Ordering::Relaxed),
            pushed_credits: c.pushed_credits.load(Ordering::Relaxed),
            push_chunks: c.push_chunks.load(Ordering::Relaxed),
            demand_lines: c.demand_lines.load(Ordering::Relaxed),
            queue_wait: c.queue_wait.summary(1_000_000),
            sojourn: c.sojourn.summary(1_000_000),
            aqm_budget: c.aqm_budget.summary(1_000_000),
            queue_len,
            control,
        }
    }
}

fn respond<RB: Default>(status: StatusCode, reject: Option<&str>, fb: Feedback) -> Response<RB> {
    let mut r = Response::new(RB::default());
    *r.status_mut() = status;
    if let Some(token) = reject {
        if let Ok(v) = HeaderValue::from_str(token) {
            r.headers_mut().insert(wire::REJECT, v);
        }
    }
    wire::write_feedback(r.headers_mut(), fb);
    r
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<B, RB> Service<Request<B>> for Server<B, RB>
where
    B: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<RB>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let shared = &self.shared;
        if shared.inline.is_some() {
            shared.launch_inline();
        }
        let now = clock::now();
        shared.counters.arrivals.fetch_add(1, Ordering::Relaxed);
        let arrival = match wire::parse_arrival(request.headers()) {
            Ok(Some(a)) => a,
            Ok(None) if !shared.requires_metadata => crate::policy::Arrival::request(0),
            Ok(None) => return ready_err(shared, wire::WireError::Missing),
            Err(e) => return ready_err(shared, e),
        };
        let mut stream = None;
        if arrival.kind == crate::Kind::Register {
            shared.counters.registers.fetch_add(1, Ordering::Relaxed);
            match wire::parse_stream(request.headers(), wire::STREAM) {
                Ok(s) => stream = s,
                Err(e) => return ready_err(shared, e),
            }
        }
        let mut policy = shared.lock_policy();
        let mut fifo = shared.lock_fifo();
        let view = shared.view(&fifo);
        let verdict = policy.on_arrival(now, &arrival, &view);
        if let Some(s) = stream {
            // Registered with a credit stream of its own connection:
            // explicit credits may go to it (the stream's key is the push
            // group, so pushes ride on responses to that connection).
            let conn = request
                .extensions()
                .get::<crate::push::ConnId>()
                .copied()
                .unwrap_or_default();
            if let Some(group) = shared.push.route(arrival.client, conn, s) {
                if shared.push.signals_demand(group) {
                    policy.set_signals_demand(arrival.client);
                }
                policy.set_pushable(arrival.client, group);
            }
        } else if arrival.kind == crate::Kind::Deregister {
            shared.push.unroute(arrival.client);
        }
        match verdict {
            Verdict::Admit => {
                let budget_ns = arrival.budget_ns.unwrap_or(u64::MAX);
                let (tx, rx) = oneshot::channel();
                fifo.jobs.push_back(Job {
                    request,
                    client: arrival.client,
                    arrived: now,
                    enqueued: now,
                    budget_ns,
                    reply: tx,
                });
                let wake = fifo.waiting > 0;
                drop(fifo);
                drop(policy);
                if wake {
                    shared.wake_worker();
                }
                shared.counters.admitted.fetch_add(1, Ordering::Relaxed);
                Box::pin(async move {
                    rx.await
                        .unwrap_or_else(|_| Err("breakwater worker pool shut down".into()))
                })
            }
            Verdict::Reject(reason) => {
                drop(fifo);
                let fb = policy.feedback(now, arrival.client);
                drop(policy);
                shared.counters.count_reject(&reason);
                let (status, token) = wire::reject_status(&reason);
                ready(respond(status, Some(token), fb))
            }
            Verdict::Answer => {
                drop(fifo);
                let fb = policy.feedback(now, arrival.client);
                drop(policy);
                let counter = match arrival.kind {
                    crate::Kind::Deregister => &shared.counters.deregisters,
                    _ => &shared.counters.credit_waits,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                ready(respond(StatusCode::NO_CONTENT, None, fb))
            }
            Verdict::Park if arrival.kind == crate::Kind::Await => {
                let (tx, rx) = oneshot::channel();
                let budget_ns = arrival.budget_ns.unwrap_or(u64::MAX);
                let old = fifo.held.insert(
                    arrival.client,
                    Job {
                        request,
                        client: arrival.client,
                        arrived: now,
                        enqueued: now,
                        budget_ns,
                        reply: tx,
                    },
                );
                drop(fifo);
                drop(policy);
                if let Some(old) = old {
                    // The policy holds one per client; never lose a reply.
                    let _ = old.reply.send(Err("held request replaced".into()));
                }
                shared.counters.held.fetch_add(1, Ordering::Relaxed);
                shared.wake_ticker();
                Box::pin(async move {
                    rx.await
                        .unwrap_or_else(|_| Err("breakwater worker pool shut down".into()))
                })
            }
            Verdict::Park => {
                drop(fifo);
                let (tx, rx) = oneshot::channel();
                shared
                    .parked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(arrival.client)
                    .or_default()
                    .push(tx);
                shared.has_parked.store(true, Ordering::Relaxed);
                drop(policy);
                shared.counters.credit_waits.fetch_add(1, Ordering::Relaxed);
                shared
                    .counters
                    .credit_waits_parked
                    .fetch_add(1, Ordering::Relaxed);
                shared.wake_ticker();
                Box::pin(async move {
                    let fb = rx.await.unwrap_or(Feedback::None);
                    Ok(respond(StatusCode::NO_CONTENT, None, fb))
                })
            }
        }
    }
}

fn ready<RB: Send + 'static>(r: Response<RB>) -> BoxFuture<Result<Response<RB>, BoxError>> {
    Box::pin(std::future::ready(Ok(r)))
}

fn ready_err<B, RB: Default + Send + 'static>(
    shared: &Shared<B, RB>,
    e: wire::WireError,
) -> BoxFuture<Result<Response<RB>, BoxError>> {
    shared.counters.malformed.fetch_add(1, Ordering::Relaxed);
    ready(respond(e.status(), Some(&e.token()), Feedback::None))
}

/// One worker: pop, run to completion, report, repeat.
fn worker<B, RB, S>(shared: Arc<Shared<B, RB>>, mut svc: S)
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Default,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("worker runtime");
    let mut scratch = Scratch::default();
    loop {
        let job = {
            let mut fifo = shared.lock_fifo();
            loop {
                if let Some(job) = fifo.jobs.pop_front() {
                    shared.busy.fetch_add(1, Ordering::Relaxed);
                    break job;
                }
                if fifo.closed {
                    return;
                }
                fifo.waiting += 1;
                fifo = shared.work.wait(fifo).unwrap_or_else(|p| p.into_inner());
                fifo.waiting -= 1;
            }
        };
        run_job(&shared, job, &mut scratch, |request| {
            rt.block_on(async {
                let ready = svc.ready().await.map_err(Into::into)?;
                ready.call(request).await.map_err(Into::into)
            })
        });
    }
}

/// The inline worker (`WorkerPriority::Inline`): a task on the runtime
/// that runs `call`. One job per turn, then two yields that let the runtime
/// poll its sockets and answer what arrived before the next job.
async fn inline_worker<B, RB, S>(shared: Weak<Shared<B, RB>>, mut svc: S)
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Default,
{
    let mut scratch = Scratch::default();
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let job = {
            let mut fifo = shared.lock_fifo();
            match fifo.jobs.pop_front() {
                Some(job) => {
                    shared.busy.fetch_add(1, Ordering::Relaxed);
                    fifo.waiting = 0;
                    Some(job)
                }
                None if fifo.closed => return,
                None => {
                    // Producers notify while we wait (Notify keeps one
                    // permit, so a wake between here and the await counts).
                    fifo.waiting = 1;
                    None
                }
            }
        };
        match job {
            Some(job) => {
                run_job(&shared, job, &mut scratch, |request| {
                    poll_to_completion(async {
                        let ready = svc.ready().await.map_err(Into::into)?;
                        ready.call(request).await.map_err(Into::into)
                    })
                });
                drop(shared);
                // Two yields: the first lets the replies this job woke go
                // out and the runtime poll its sockets; the connections
                // that poll wakes read their requests (admitting or
                // refusing them) and spawn the streams' tasks that send
                // the refusals, which tokio queues behind this task. The
                // second lets those run before the next job, so a refusal
                // waits for at most the job running when it arrived.
                tokio::task::yield_now().await;
                tokio::task::yield_now().await;
            }
            None => {
                // Hold only the Notify (via a clone of the Arc) while
                // waiting; the pool guard notifies on shutdown.
                let notified = async {
                    if let Some(n) = &shared.inline {
                        n.notified().await;
                    }
                };
                notified.await;
            }
        }
    }
}

/// Poll a future to completion on this thread, parking it while the future
/// is pending (its waker unparks it). For the inline worker's handler,
/// which must not need the runtime it runs on.
fn poll_to_completion<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let mut fut = std::pin::pin!(fut);
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// A worker's reusable buffers.
#[derive(Default)]
struct Scratch {
    explicit: Vec<(u64, Feedback)>,
    releases: Vec<(u64, Release)>,
    pushes: Vec<(u64, Feedback)>,
    stream_pushes: Vec<(u64, Feedback)>,
}

/// Run one admitted job (`serve` calls the inner service), report its
/// completion to the policy and send its response with the feedback.
fn run_job<B, RB: Default>(
    shared: &Shared<B, RB>,
    mut job: Job<B, RB>,
    scratch: &mut Scratch,
    serve: impl FnOnce(Request<B>) -> Result<Response<RB>, BoxError>,
) {
    let Scratch {
        explicit,
        releases,
        pushes,
        stream_pushes,
    } = scratch;
    pushes.clear();
    stream_pushes.clear();
    let start = clock::now();
    let waited = start.saturating_sub(job.enqueued);
    shared.lock_policy().on_start(start, waited);
    job.request.extensions_mut().insert(QueueBudget {
        remaining_ns: job.budget_ns.saturating_sub(waited),
    });
    // A handler that panics fails its request, not the worker: an inline
    // worker that died would leave the server admitting requests that
    // nobody answers (a thread worker would stop answering too).
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(job.request)))
        .unwrap_or_else(|_| Err("the request handler panicked".into()));
    let now = clock::now();
    let ok = matches!(&result, Ok(r) if !r.status().is_server_error());
    let done = Completion {
        client: job.client,
        ok,
        sojourn_ns: now.saturating_sub(job.arrived),
    };
    shared.counters.queue_wait.record(waited);
    shared.counters.sojourn.record(done.sojourn_ns);
    let fb = {
        let mut policy = shared.lock_policy();
        let view = shared.view(&shared.lock_fifo());
        let fb = policy.on_complete(now, &done, &view);
        if job.budget_ns != u64::MAX {
            policy.on_budget_spent(now, job.budget_ns, done.sojourn_ns);
        }
        // A completion may have freed credit that a parked client is
        // waiting for: answer it now rather than at the next tick.
        if shared.has_parked.load(Ordering::Relaxed) {
            policy.on_tick(now, &view, explicit);
        }
        shared.release_held(&mut **policy, now, releases);
        // Spare credits the response's own grant left go to drained
        // clients of the responder's connection, riding on its response;
        // what is left after them goes out on the other connections'
        // credit streams: to drained clients with known demand first when
        // they are served first, otherwise speculatively round the rings
        // (since session 10 every completion does this, not only the
        // ticker; the session-10 A/Bs in docs/breakwater.md include it in
        // both arms, so their "before" column is not session 9's code).
        if shared.push.active() {
            policy.push_credits(now, Some(job.client), pushes);
            policy.push_credits(now, None, stream_pushes);
        }
        fb
    };
    if !explicit.is_empty() {
        shared.answer_parked(explicit);
    }
    if !stream_pushes.is_empty() {
        shared.deliver_pushes(stream_pushes);
    }
    shared.busy.fetch_sub(1, Ordering::Relaxed);
    let counter = if ok {
        &shared.counters.completed_ok
    } else {
        &shared.counters.completed_failed
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let result = match result {
        Ok(mut r) => {
            wire::write_feedback(r.headers_mut(), fb);
            if !pushes.is_empty() {
                let n = wire::write_pushes(r.headers_mut(), pushes);
                shared
                    .counters
                    .pushed_credits
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
            Ok(r)
        }
        Err(e) => Err(e),
    };
    // What did not fit in `bw-push` (wire::MAX_PUSH_PER_RESPONSE), or
    // rode on a failed response that carries none, goes on the credit
    // stream: a granted credit the client never hears of stays issued.
    if !pushes.is_empty() {
        shared.deliver_pushes(pushes);
    }
    if let Err(Ok(r)) = job.reply.send(result) {
        // The caller is gone (its stream was reset, its connection
        // closed): the explicit credits for the other clients that rode
        // on this response go on the credit stream instead.
        let mut lost = Vec::new();
        wire::parse_pushes(r.headers(), &mut lost);
        if !lost.is_empty() {
            shared
                .counters
                .pushed_credits
                .fetch_sub(lost.len() as u64, Ordering::Relaxed);
            pushes.extend(lost.into_iter().map(|(c, l)| (c, Feedback::CreditLimit(l))));
            shared.deliver_pushes(pushes);
        }
    }
}

/// Periodic policy work: pool updates on an idle server, idle clients, and
/// explicit window updates for parked credit waits.
fn ticker<B, RB: Default>(shared: Weak<Shared<B, RB>>, tick: Duration) {
    let mut explicit = Vec::new();
    let mut releases = Vec::new();
    let mut pushes = Vec::new();
    let mut doze = false;
    loop {
        if doze {
            // Nothing parked: every wake-up costs the server core ~10 µs on
            // a VM, so sleep 8 ticks unless a park wakes us.
            std::thread::park_timeout(tick * 8);
        } else {
            std::thread::sleep(tick);
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.ticker_dozing.store(false, Ordering::SeqCst);
        if shared.lock_fifo().closed {
            return;
        }
        let now = clock::now();
        {
            let mut policy = shared.lock_policy();
            let view = shared.view(&shared.lock_fifo());
            policy.on_tick(now, &view, &mut explicit);
            shared.release_held(&mut **policy, now, &mut releases);
            if shared.push.active() {
                policy.push_credits(now, None, &mut pushes);
            }
            doze = policy.parked_requests() == 0
                && !shared.has_parked.load(Ordering::SeqCst)
                && pushes.is_empty();
            if doze {
                shared.ticker_dozing.store(true, Ordering::SeqCst);
            }
        }
        if !explicit.is_empty() {
            shared.answer_parked(&mut explicit);
        }
        if !pushes.is_empty() {
            shared.deliver_pushes(&mut pushes);
        }
    }
}

impl<B, RB: Default> Shared<B, RB> {
    /// Let the policy admit (to the FIFO, timestamped now) or refuse the
    /// requests it holds for a credit. Called with the policy lock held.
    fn release_held(&self, policy: &mut dyn Policy, now: Nanos, out: &mut Vec<(u64, Release)>) {
        if policy.parked_requests() == 0 {
            return;
        }
        let mut fifo = self.lock_fifo();
        let view = self.view(&fifo);
        policy.release_parked(now, &view, out);
        let mut admitted = 0;
        let mut refused = Vec::new();
        for (client, what) in out.drain(..) {
            let Some(mut job) = fifo.held.remove(&client) else {
                continue;
            };
            match what {
                Release::Admit => {
                    // Its wait for a credit is not queueing delay: the
                    // FIFO clock starts now, and its budget shrinks.
                    job.budget_ns = job.budget_ns.saturating_sub(now - job.arrived);
                    job.arrived = now;
                    job.enqueued = now;
                    fifo.jobs.push_back(job);
                    admitted += 1;
                }
                Release::Reject(reason) => {
                    let fb = policy.feedback(now, client);
                    refused.push((job.reply, reason, fb));
                }
            }
        }
        let wake = fifo.waiting.min(admitted as usize);
        drop(fifo);
        for _ in 0..wake {
            self.wake_worker();
        }
        self.counters
            .admitted
            .fetch_add(admitted, Ordering::Relaxed);
        for (reply, reason, fb) in refused {
            self.counters.count_reject(&reason);
            let (status, token) = wire::reject_status(&reason);
            let _ = reply.send(Ok(respond(status, Some(token), fb)));
        }
    }
}

impl<B, RB> Shared<B, RB> {
    /// Wake a waiting worker (thread or inline task).
    fn wake_worker(&self) {
        match &self.inline {
            Some(n) => n.notify_one(),
            None => self.work.notify_one(),
        }
    }

    /// Start the inline worker task on the current runtime (first call).
    fn launch_inline(&self) {
        let mut launch = self.launch.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = launch.take() {
            drop(launch);
            f();
        }
    }

    /// A credit wait or request was parked: a dozing ticker must run at
    /// the next tick, not 8 ticks later.
    fn wake_ticker(&self) {
        if self.ticker_dozing.swap(false, Ordering::SeqCst) {
            if let Some(t) = self.ticker.get() {
                t.unpark();
            }
        }
    }

    /// Demand lines from a credit stream (the hub's sink): tell the policy,
    /// then push what spare credits there are to the clients that want one.
    fn on_demand_lines(&self, lines: &mut Vec<(u64, u32, u64)>) {
        let now = clock::now();
        let mut pushes = Vec::new();
        self.counters
            .demand_lines
            .fetch_add(lines.len() as u64, Ordering::Relaxed);
        {
            let mut policy = self.lock_policy();
            for (client, demand, budget_us) in lines.drain(..) {
                policy.on_demand(now, client, demand, Some(budget_us.saturating_mul(1000)));
            }
            policy.push_credits(now, None, &mut pushes);
        }
        if !pushes.is_empty() {
            self.deliver_pushes(&mut pushes);
        }
    }

    /// Write explicit credits to their clients' credit streams.
    fn deliver_pushes(&self, pushes: &mut Vec<(u64, Feedback)>) {
        let d = self.push.deliver(pushes);
        self.counters
            .pushed_credits
            .fetch_add(d.credits, Ordering::Relaxed);
        self.counters
            .push_chunks
            .fetch_add(d.chunks, Ordering::Relaxed);
    }

    /// Send explicit window updates to parked credit waits.
    fn answer_parked(&self, explicit: &mut Vec<(u64, Feedback)>) {
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        for (client, fb) in explicit.drain(..) {
            if let Some(waiters) = parked.remove(&client) {
                self.counters
                    .explicit_updates
                    .fetch_add(1, Ordering::Relaxed);
                for w in waiters {
                    let _ = w.send(fb);
                }
            }
        }
        self.has_parked.store(!parked.is_empty(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::Buckets;

    #[test]
    fn buckets_give_upper_edge_quantiles_and_the_share_over_a_bound() {
        let b = Buckets::default();
        let empty = b.summary(1_000_000);
        assert_eq!((empty.count, empty.p99_us, empty.over_1ms), (0, 0.0, 0));
        // 98 values of 10 us (bucket 0: 0-20 us), one of 1.5 ms, one
        // past the last bucket (clamped into it).
        for _ in 0..98 {
            b.record(10_000);
        }
        b.record(1_500_000);
        b.record(60_000_000_000);
        let s = b.summary(1_000_000);
        assert_eq!(s.count, 100);
        assert_eq!(s.p50_us, 20.0);
        assert_eq!(s.p90_us, 20.0);
        assert_eq!(s.p99_us, 1520.0, "the 99th value is the 1.5 ms one");
        assert_eq!(s.over_1ms, 2);
        assert_eq!(b.summary(2_000_000).over_1ms, 1);
        // the clamped value is counted as such: a quantile there is a floor
        assert_eq!((s.at_range_end, empty.at_range_end), (1, 0));
    }
}
