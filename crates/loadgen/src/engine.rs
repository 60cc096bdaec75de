//! The event loop: one thread that paces sends and reads replies.
//!
//! A single thread owns every connection. Each turn it (1) sends every
//! arrival whose intended time has passed, (2) flushes the connections it
//! wrote to, and (3) polls for replies: it blocks in epoll with a
//! [`Timer`] armed `--spin-us` before the next arrival, and spins (polls
//! without blocking) through that last stretch, so sends leave on time
//! without burning the core between arrivals. One thread means no locks
//! and no cross-thread hand-off between the pacer and the reply matcher,
//! and it leaves the other core of a two-core box to the server.
//!
//! If the loop falls behind, step (1) sends everything overdue at once:
//! arrivals are never dropped or delayed into the future, and the lag is
//! both inside each request's latency and reported as `max_send_lag_us`.
//! With `--max-outstanding-per-conn`, arrivals that find every connection
//! full wait in a backlog, and that wait is likewise part of their latency.

use crate::arrivals::{Schedule, Step};
use crate::config::{Config, Load, ProtocolKind};
use crate::conn::{Conn, InFlight};
use crate::protocol::{self, Outcome, Protocol};
use crate::stats::{Recorder, Summary};
use crate::timer::Timer;
use crate::workload::{Op, Workload};
use mio::{Events, Interest, Poll, Token};
use std::collections::VecDeque;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Token of the pacing timer; connection `i` has token `i`.
const TIMER: Token = Token(usize::MAX);
/// Upper bound on one epoll sleep, in case a wake-up is ever lost.
const MAX_SLEEP: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Pipelining window per connection while preloading keys.
const PRELOAD_WINDOW: usize = 256;

/// Run one load test as configured and summarise it.
pub fn run(config: &Config) -> Result<Summary, String> {
    if config.protocol == ProtocolKind::Breakwater {
        return crate::h2engine::run(config);
    }
    if let Some(cpu) = config.cpu {
        crate::affinity::pin_current_thread(cpu)?;
    }
    let mut engine = Engine::connect(config)?;
    if config.preload {
        engine.preload(config.keys, config.timeout_ms)?;
    }
    let mut warmup_s = config.warmup_s;
    if config.hold {
        if warmup_s > 0.0 {
            engine.warm(config)?;
        }
        warmup_s = 0.0;
        stop_self();
    }
    let warmup_ns = (warmup_s * 1e9) as u64;
    engine.recorder = Recorder::new(warmup_ns, &config.measured_steps(), config.bin_ms);
    if config.keep_requests {
        engine.recorder.keep_requests();
    }
    if let Some(us) = config.stall_us {
        engine.recorder.detect_stalls();
        engine.stall_ns = Some(us * 1000);
    }
    engine.recording = true;
    engine.start = Instant::now();
    let start_monotonic_ns = monotonic_ns();
    match &config.load {
        Load::Open { steps } => engine.run_open(steps, warmup_s, config.seed, config.timeout_ms)?,
        Load::Closed { depth, duration_s } => {
            engine.run_closed(*depth, warmup_ns, *duration_s, config.timeout_ms)?
        }
    }
    if config.hold {
        stop_self();
    }
    let mut summary =
        std::mem::replace(&mut engine.recorder, Recorder::new(0, &[], 1)).finish(config);
    summary.start_monotonic_ns = Some(start_monotonic_ns);
    Ok(summary)
}

/// `--hold`: stop this process until a SIGCONT, as job control does. The
/// caller has every reply in, so the server is idle meanwhile.
fn stop_self() {
    // SAFETY: raise only sends a signal to the calling thread.
    unsafe { libc::raise(libc::SIGSTOP) };
}

/// CLOCK_MONOTONIC in ns (the clock `Instant` and eBPF's `bpf_ktime_get_ns` read).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn resolve(target: &str) -> Result<SocketAddr, String> {
    target
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve --target {target:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("--target {target:?} resolves to no address"))
}

fn make_protocol(config: &Config) -> Box<dyn Protocol> {
    match config.protocol {
        ProtocolKind::Redis => Box::new(protocol::Redis::new(config.value_size)),
        ProtocolKind::Memcached => Box::new(protocol::Memcached::new(config.value_size)),
        ProtocolKind::Line => Box::new(protocol::Line),
        ProtocolKind::Http => Box::new(protocol::Http::new(&config.target, &config.path)),
        ProtocolKind::Breakwater => unreachable!("run() hands breakwater to h2engine"),
    }
}

/// A reply read this turn, handled after the read borrow ends.
struct Completion {
    conn: usize,
    request: InFlight,
    outcome: Outcome,
    now_ns: u64,
}

struct Engine {
    target: String,
    poll: Poll,
    events: Events,
    conns: Vec<Conn>,
    /// Connections with queued output; `queued[i]` mirrors membership.
    dirty: Vec<usize>,
    queued: Vec<bool>,
    protocol: Box<dyn Protocol>,
    workload: Workload,
    recorder: Recorder,
    /// False while preloading, so preload traffic is not measured.
    recording: bool,
    start: Instant,
    next_conn: usize,
    max_per_conn: usize,
    /// Intended times of arrivals that found every connection full.
    backlog: VecDeque<u64>,
    outstanding: usize,
    completions: Vec<Completion>,
    /// Closed loop: replace each reply with a new request until this time.
    refill_until_ns: Option<u64>,
    timer: Timer,
    /// Run-clock time the timer is armed for, if armed.
    timer_target_ns: Option<u64>,
    spin_ns: u64,
    /// `--stall-us` in ns: spin always and record longer turns as stalls.
    stall_ns: Option<u64>,
    preload_errors: u64,
    /// Replies framed so far, for stall detection.
    replies: u64,
}

impl Engine {
    fn connect(config: &Config) -> Result<Engine, String> {
        let addr = resolve(&config.target)?;
        let poll = Poll::new().map_err(|e| format!("cannot create epoll instance: {e}"))?;
        let mut conns = Vec::with_capacity(config.connections);
        for i in 0..config.connections {
            let mut conn = Conn::connect(addr, CONNECT_TIMEOUT)
                .map_err(|e| format!("cannot connect to {}: {e}", config.target))?;
            poll.registry()
                .register(
                    &mut conn.stream,
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .map_err(|e| format!("cannot register connection {i}: {e}"))?;
            conns.push(conn);
        }
        let max_per_conn = match config.load {
            Load::Closed { .. } => usize::MAX,
            Load::Open { .. } => config.max_outstanding_per_conn.unwrap_or(usize::MAX),
        };
        let timer = Timer::new(poll.registry(), TIMER)
            .map_err(|e| format!("cannot create timerfd: {e}"))?;
        Ok(Engine {
            timer,
            timer_target_ns: None,
            spin_ns: config.spin_us * 1000,
            stall_ns: None,
            target: config.target.clone(),
            poll,
            events: Events::with_capacity(1024),
            queued: vec![false; conns.len()],
            dirty: Vec::with_capacity(conns.len()),
            conns,
            protocol: make_protocol(config),
            workload: Workload::new(config.seed, config.keys, config.set_ratio),
            recorder: Recorder::new(0, &[], 1),
            recording: false,
            start: Instant::now(),
            next_conn: 0,
            max_per_conn,
            backlog: VecDeque::new(),
            outstanding: 0,
            completions: Vec::new(),
            refill_until_ns: None,
            preload_errors: 0,
            replies: 0,
        })
    }

    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Open loop: Poisson arrivals over warm-up plus steps.
    fn run_open(
        &mut self,
        steps: &[Step],
        warmup_s: f64,
        seed: u64,
        timeout_ms: u64,
    ) -> Result<(), String> {
        let mut all = Vec::with_capacity(steps.len() + 1);
        if warmup_s > 0.0 {
            all.push(Step {
                rate: steps[0].rate,
                duration_s: warmup_s,
            });
        }
        all.extend_from_slice(steps);
        let mut schedule = Schedule::new(&all, seed);
        let deadline_ns = schedule.end_ns() + timeout_ms * 1_000_000;
        let mut next = schedule.next();
        let mut last_turn_ns = self.now_ns();
        loop {
            let now = self.now_ns();
            if let Some(stall_ns) = self.stall_ns {
                // spinning, a turn takes microseconds: a longer one is time off the CPU
                if now - last_turn_ns > stall_ns {
                    self.recorder.on_stall(last_turn_ns, now);
                }
                last_turn_ns = now;
            }
            while let Some(intended) = next.filter(|&t| t <= now) {
                if self.recording {
                    self.recorder.on_scheduled(intended);
                }
                match self.pick_conn() {
                    Some(c) => self.send_on(c, intended, now),
                    None => self.backlog.push_back(intended),
                }
                next = schedule.next();
            }
            self.flush_dirty()?;
            if next.is_none() && (self.is_drained() || now >= deadline_ns) {
                break;
            }
            let timeout = match next {
                Some(t) => self.wait_budget(t, now)?,
                None if self.stall_ns.is_some() => Duration::ZERO,
                None => Duration::from_millis(1),
            };
            self.poll_once(timeout)?;
        }
        self.count_timeouts();
        Ok(())
    }

    /// `--hold`'s warm-up: an unmeasured open-loop run of its own at the
    /// first step's rate, on the connections the measured run will use,
    /// drained before it returns (a reply still due would land in the
    /// measured run).
    fn warm(&mut self, config: &Config) -> Result<(), String> {
        let Load::Open { steps } = &config.load else {
            return Err("--hold applies to open-loop runs".into());
        };
        let step = Step {
            rate: steps[0].rate,
            duration_s: config.warmup_s,
        };
        self.recording = false;
        self.start = Instant::now();
        self.timer_target_ns = None;
        let seed = config.seed ^ 0x9e37_79b9_7f4a_7c15;
        self.run_open(&[step], 0.0, seed, config.timeout_ms)?;
        self.timer_target_ns = None;
        if !self.is_drained() {
            return Err(format!(
                "warm-up: {} requests to {} unanswered {} ms after the last send",
                self.outstanding + self.backlog.len(),
                self.target,
                config.timeout_ms
            ));
        }
        Ok(())
    }

    /// Closed loop: `depth` outstanding per connection, each reply
    /// immediately replaced, for warm-up plus `duration_s`.
    fn run_closed(
        &mut self,
        depth: usize,
        warmup_ns: u64,
        duration_s: f64,
        timeout_ms: u64,
    ) -> Result<(), String> {
        let end_ns = warmup_ns + (duration_s * 1e9) as u64;
        self.refill_until_ns = Some(end_ns);
        let now = self.now_ns();
        for c in 0..self.conns.len() {
            for _ in 0..depth {
                self.recorder.on_scheduled(now);
                self.send_on(c, now, now);
            }
        }
        let deadline_ns = end_ns + timeout_ms * 1_000_000;
        loop {
            self.flush_dirty()?;
            let now = self.now_ns();
            if now >= end_ns && (self.is_drained() || now >= deadline_ns) {
                break;
            }
            self.poll_once(Duration::from_millis(1))?;
        }
        self.count_timeouts();
        Ok(())
    }

    /// SET every key once, pipelined, before the clock starts.
    fn preload(&mut self, keys: u64, timeout_ms: u64) -> Result<(), String> {
        let stall_limit = Duration::from_millis(timeout_ms.max(5000));
        let mut next_key = 0;
        let mut last_progress = Instant::now();
        let mut last_replies = self.replies;
        self.max_per_conn = self.max_per_conn.min(PRELOAD_WINDOW);
        loop {
            while next_key < keys {
                let Some(c) = self.pick_conn() else { break };
                let req = self.workload.request(Op::Set, next_key);
                self.queue_request(c, &req, 0);
                next_key += 1;
            }
            self.flush_dirty()?;
            if next_key == keys && self.outstanding == 0 {
                break;
            }
            self.poll_once(Duration::from_millis(10))?;
            if self.replies != last_replies {
                last_replies = self.replies;
                last_progress = Instant::now();
            } else if last_progress.elapsed() > stall_limit {
                return Err(format!(
                    "preload: no reply from {} for {stall_limit:?}",
                    self.target
                ));
            }
        }
        if self.preload_errors > 0 {
            return Err(format!(
                "preload: {} of {keys} SETs failed",
                self.preload_errors
            ));
        }
        self.max_per_conn = usize::MAX;
        Ok(())
    }

    /// How long epoll may block before the arrival at `next_ns`: zero
    /// (spin) within `spin_ns` of it, otherwise until the timer, armed for
    /// `spin_ns` early, fires.
    fn wait_budget(&mut self, next_ns: u64, now_ns: u64) -> Result<Duration, String> {
        let gap = next_ns - now_ns;
        if gap <= self.spin_ns || self.stall_ns.is_some() {
            return Ok(Duration::ZERO);
        }
        let wake_ns = next_ns - self.spin_ns;
        if self.timer_target_ns != Some(wake_ns) {
            self.timer
                .arm(Duration::from_nanos(wake_ns - now_ns))
                .map_err(|e| format!("timerfd_settime failed: {e}"))?;
            self.timer_target_ns = Some(wake_ns);
        }
        Ok(MAX_SLEEP)
    }

    /// Round-robin over connections with room under `max_per_conn`.
    fn pick_conn(&mut self) -> Option<usize> {
        let n = self.conns.len();
        for i in 0..n {
            let c = (self.next_conn + i) % n;
            if self.conns[c].inflight.len() < self.max_per_conn {
                self.next_conn = (c + 1) % n;
                return Some(c);
            }
        }
        None
    }

    fn send_on(&mut self, c: usize, intended_ns: u64, now_ns: u64) {
        let req = self.workload.next_request();
        self.queue_request(c, &req, intended_ns);
        if self.recording {
            self.recorder.on_send(intended_ns, now_ns);
        }
    }

    fn queue_request(&mut self, c: usize, req: &crate::workload::Request, intended_ns: u64) {
        self.conns[c].queue(self.protocol.as_ref(), req, intended_ns);
        self.outstanding += 1;
        if !self.queued[c] {
            self.queued[c] = true;
            self.dirty.push(c);
        }
    }

    fn flush_dirty(&mut self) -> Result<(), String> {
        for c in self.dirty.drain(..) {
            self.queued[c] = false;
            self.conns[c]
                .flush()
                .map_err(|e| format!("write to {} failed (connection {c}): {e}", self.target))?;
        }
        Ok(())
    }

    fn is_drained(&self) -> bool {
        self.outstanding == 0 && self.backlog.is_empty()
    }

    /// Wait up to `timeout` for socket events, frame replies, account for
    /// them, then give waiting arrivals any freed pipeline slots.
    fn poll_once(&mut self, timeout: Duration) -> Result<(), String> {
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(format!("epoll_wait failed: {e}")),
        }
        let start = self.start;
        for event in self.events.iter() {
            if event.token() == TIMER {
                self.timer.acknowledge();
                self.timer_target_ns = None;
                continue;
            }
            let c = event.token().0;
            let conn = &mut self.conns[c];
            if event.is_writable() && conn.has_unsent() {
                conn.flush().map_err(|e| {
                    format!("write to {} failed (connection {c}): {e}", self.target)
                })?;
            }
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                let completions = &mut self.completions;
                conn.read_replies(
                    self.protocol.as_ref(),
                    || start.elapsed().as_nanos() as u64,
                    |request, outcome, now_ns| {
                        completions.push(Completion {
                            conn: c,
                            request,
                            outcome,
                            now_ns,
                        });
                    },
                )
                .map_err(|e| format!("{} (connection {c}): {e}", self.target))?;
            }
        }
        let mut completions = std::mem::take(&mut self.completions);
        for done in completions.drain(..) {
            self.on_completion(&done);
        }
        self.completions = completions;
        if !self.backlog.is_empty() {
            let now = self.now_ns();
            while let Some(&intended) = self.backlog.front() {
                let Some(c) = self.pick_conn() else { break };
                self.backlog.pop_front();
                self.send_on(c, intended, now);
            }
        }
        Ok(())
    }

    fn on_completion(&mut self, done: &Completion) {
        self.outstanding -= 1;
        self.replies += 1;
        if !self.recording {
            if done.outcome == Outcome::Error {
                self.preload_errors += 1;
            }
            return;
        }
        self.recorder
            .on_reply(done.request.intended_ns, done.now_ns, done.outcome);
        if let Some(end) = self.refill_until_ns {
            if done.now_ns < end {
                self.recorder.on_scheduled(done.now_ns);
                self.send_on(done.conn, done.now_ns, done.now_ns);
            }
        }
    }

    /// Everything still unanswered (or never sent) at the end is a timeout.
    fn count_timeouts(&mut self) {
        for conn in &self.conns {
            for request in &conn.inflight {
                self.recorder.on_timeout(request.intended_ns);
            }
        }
        for &intended in &self.backlog {
            self.recorder.on_timeout(intended);
        }
    }
}
