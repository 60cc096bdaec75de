//! `--protocol breakwater`: many logical clients over a few HTTP/2
//! connections, each client running the Breakwater client layer (or a
//! baseline's client half) from `tailscope-breakwater`.
//!
//! The pacing is the same open-loop Poisson schedule as the main engine:
//! arrivals are decided up front, each goes to a uniformly chosen logical
//! client, and latency runs from the *intended* time, so time a request
//! spends queued at its client waiting for credit is part of its latency.
//! One thread runs a single-threaded tokio runtime (pinned with `--cpu`);
//! it sleeps on a timerfd until `--spin-us` before each arrival, then
//! yields in a loop to the runtime (which keeps serving replies) until the
//! arrival is due.
//!
//! Outcomes: a 2xx reply is a completion (and goodput if within
//! `--slo-us`); a reply carrying `bw-reject` is an overload rejection
//! (error, with its reject latency measured from the actual send); a
//! request that expired waiting for credit, or that the client's control
//! dropped, never reached the server. With `--rate max`, every connection
//! keeps `--max-outstanding-per-conn` requests outstanding (closed loop,
//! for capacity search).

use crate::arrivals::{Schedule, Step};
use crate::config::{Config, Load};
use crate::rng::SplitMix64;
use crate::stats::{Recorder, Summary};
use breakwater::client::{Client, ClientError, ClientLayer, Deadline, SentAt};
use breakwater::control::{ControlKind, ControlSpec};
use breakwater::http::H2Transport;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tower::{Layer, Service};

type Logical = Client<H2Transport>;

struct Shared {
    recorder: RefCell<Recorder>,
    /// Intended times of requests still in the air, by sequence number.
    outstanding: RefCell<HashMap<u64, u64>>,
    start: Instant,
    /// Offset from the breakwater clock to this run's clock.
    clock_offset: u64,
    /// `--bw-intended-deadline`: the SLO to add to each intended time.
    deadline_ns: Option<u64>,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
}

pub fn run(config: &Config) -> Result<Summary, String> {
    if let Some(cpu) = config.cpu {
        crate::affinity::pin_current_thread(cpu)?;
    }
    let addr: SocketAddr = config
        .target
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve --target {:?}: {e}", config.target))?
        .next()
        .ok_or_else(|| format!("--target {:?} resolves to no address", config.target))?;
    let kind: ControlKind = config.control.parse()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, drive(config, addr, kind))
}

fn spec(config: &Config, kind: ControlKind) -> Result<ControlSpec, String> {
    let slo_ns = config.slo_us.unwrap_or(10_000) * 1000;
    let mut spec = ControlSpec::new(kind, slo_ns, 1);
    let first_rate = config.measured_steps()[0].rate;
    let share = if first_rate.is_finite() {
        first_rate / config.clients as f64
    } else {
        100.0
    };
    spec.seda_initial_rate = config.seda_initial_rate.unwrap_or(share);
    spec.seda_adj_i = config.seda_adj_i.unwrap_or(share * 0.005);
    spec.carry = config.bw_carry;
    spec.client()
        .map_err(|e| format!("--control {}: {e}", kind.name()))?;
    Ok(spec)
}

async fn drive(config: &Config, addr: SocketAddr, kind: ControlKind) -> Result<Summary, String> {
    let spec = spec(config, kind)?;
    let mut transports = Vec::with_capacity(config.connections);
    for _ in 0..config.connections {
        transports.push(
            H2Transport::connect(addr)
                .await
                .map_err(|e| format!("cannot connect to {} (HTTP/2): {e}", config.target))?,
        );
    }
    let slo = Duration::from_micros(config.slo_us.unwrap_or(10_000));
    let factory_spec = spec.clone();
    let layer = ClientLayer::new(
        Arc::new(move || factory_spec.client().expect("validated above")),
        slo,
    )
    .map_err(|e| e.to_string())?;
    let mut links = Vec::new();
    if config.bw_push {
        for t in &transports {
            links.push(
                t.open_credit_stream()
                    .await
                    .map_err(|e| format!("--bw-push: {e}"))?,
            );
        }
    }
    let clients: Vec<Logical> = (0..config.clients)
        .map(|i| {
            let t = transports[i % transports.len()].clone();
            match links.get(i % transports.len()) {
                Some(link) => layer.layer_pushed(t, link),
                None => layer.layer(t),
            }
        })
        .collect();
    let warmup_ns = (config.warmup_s * 1e9) as u64;
    let mut recorder = Recorder::new(warmup_ns, &config.measured_steps(), config.bin_ms);
    recorder.set_slo(config.slo_us.map(|us| us * 1000));
    let start = Instant::now();
    let shared = Rc::new(Shared {
        recorder: RefCell::new(recorder),
        outstanding: RefCell::new(HashMap::new()),
        clock_offset: breakwater::clock::now(),
        deadline_ns: config
            .bw_intended_deadline
            .then(|| config.slo_us.unwrap_or(10_000) * 1000),
        start,
    });
    let clients = Rc::new(clients);
    match &config.load {
        Load::Open { steps } => open_loop(config, steps, &shared, &clients).await?,
        Load::Closed { depth, duration_s } => {
            closed_loop(config, *depth, warmup_ns, *duration_s, &shared, &clients).await
        }
    }
    // Wait for the stragglers, then count what is left as timeouts.
    let deadline = shared.now_ns() + config.timeout_ms * 1_000_000;
    while !shared.outstanding.borrow().is_empty() && shared.now_ns() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for (_, intended) in shared.outstanding.borrow_mut().drain() {
        shared.recorder.borrow_mut().on_timeout(intended);
    }
    for c in clients.iter() {
        let _ = tokio::time::timeout(
            Duration::from_millis(200),
            c.deregister::<Full<Bytes>, Bytes>(),
        )
        .await;
    }
    let recorder = std::mem::replace(&mut *shared.recorder.borrow_mut(), Recorder::new(0, &[], 1));
    Ok(recorder.finish(config))
}

/// Send one request for `intended` through `client` and record its fate.
fn launch(shared: &Rc<Shared>, clients: &Rc<Vec<Logical>>, idx: usize, seq: u64, intended: u64) {
    let now = shared.now_ns();
    let launched = now;
    {
        let mut r = shared.recorder.borrow_mut();
        r.on_send(intended, now);
    }
    shared.outstanding.borrow_mut().insert(seq, intended);
    let mut client = clients[idx].clone();
    let shared = shared.clone();
    let mut req = Request::new(Full::new(Bytes::new()));
    if let Some(slo) = shared.deadline_ns {
        req.extensions_mut()
            .insert(Deadline(intended + shared.clock_offset + slo));
    }
    tokio::task::spawn_local(async move {
        let result = client.call(req).await;
        let now = shared.now_ns();
        if shared.outstanding.borrow_mut().remove(&seq).is_none() {
            return; // already counted as a timeout
        }
        let mut r = shared.recorder.borrow_mut();
        match result {
            Ok(resp) if resp.status().is_success() => {
                r.on_reply(intended, now, crate::protocol::Outcome::Ok);
                if let Some(s) = resp.extensions().get::<SentAt>() {
                    let sent = s.0.saturating_sub(shared.clock_offset);
                    r.on_split(intended, launched, sent, now);
                }
            }
            Ok(resp) if resp.headers().contains_key(breakwater::wire::REJECT) => {
                let sent = resp
                    .extensions()
                    .get::<SentAt>()
                    .map_or(now, |s| s.0.saturating_sub(shared.clock_offset));
                r.on_reject(intended, sent, now);
            }
            Ok(_) => r.on_reply(intended, now, crate::protocol::Outcome::Error),
            Err(e) => match e.downcast_ref::<ClientError>() {
                Some(ClientError::Expired) => r.on_client_failure(intended, true),
                Some(ClientError::Dropped) => r.on_client_failure(intended, false),
                None => r.on_reply(intended, now, crate::protocol::Outcome::Error),
            },
        }
    });
}

async fn open_loop(
    config: &Config,
    steps: &[Step],
    shared: &Rc<Shared>,
    clients: &Rc<Vec<Logical>>,
) -> Result<(), String> {
    let mut all = Vec::with_capacity(steps.len() + 1);
    if config.warmup_s > 0.0 {
        all.push(Step {
            rate: steps[0].rate,
            duration_s: config.warmup_s,
        });
    }
    all.extend_from_slice(steps);
    let schedule = Schedule::new(&all, config.seed);
    let mut pick = SplitMix64::new(config.seed ^ 0x2545_f491_4f6c_dd1d);
    let timer = PacingTimer::new().map_err(|e| format!("cannot create timerfd: {e}"))?;
    let spin_ns = config.spin_us * 1000;
    for (seq, intended) in schedule.enumerate() {
        let now = shared.now_ns();
        if intended > now + spin_ns {
            timer
                .sleep(Duration::from_nanos(intended - spin_ns - now))
                .await?;
        }
        while shared.now_ns() < intended {
            tokio::task::yield_now().await;
        }
        shared.recorder.borrow_mut().on_scheduled(intended);
        let idx = pick.below(clients.len() as u64) as usize;
        launch(shared, clients, idx, seq as u64, intended);
    }
    Ok(())
}

async fn closed_loop(
    config: &Config,
    depth: usize,
    warmup_ns: u64,
    duration_s: f64,
    shared: &Rc<Shared>,
    clients: &Rc<Vec<Logical>>,
) {
    let end = warmup_ns + (duration_s * 1e9) as u64;
    let loops = config.connections * depth.max(1);
    let mut handles = Vec::new();
    for l in 0..loops {
        let shared = shared.clone();
        let clients = clients.clone();
        handles.push(tokio::task::spawn_local(async move {
            let mut seq = (l as u64) << 40;
            loop {
                let now = shared.now_ns();
                if now >= end {
                    return;
                }
                shared.recorder.borrow_mut().on_scheduled(now);
                launch(&shared, &clients, l % clients.len(), seq, now);
                seq += 1;
                while shared.outstanding.borrow().contains_key(&(seq - 1)) {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
}

/// A one-shot timerfd the runtime can await: sub-millisecond sleeps
/// (tokio's own timer has millisecond granularity).
struct PacingTimer {
    fd: AsyncFd<OwnedFd>,
}

impl PacingTimer {
    fn new() -> std::io::Result<Self> {
        // SAFETY: plain syscall; a non-negative result is a fresh fd we own.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is valid and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: PR_SET_TIMERSLACK takes an integer and touches no memory.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        // SAFETY: the timerfd is owned by the AsyncFd and closed only when
        // it is dropped, after deregistration.
        let fd =
            unsafe { AsyncFd::register(fd) }.map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(PacingTimer { fd })
    }

    async fn sleep(&self, after: Duration) -> Result<(), String> {
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        let raw = self.fd.get_ref().as_raw_fd();
        // SAFETY: spec is a valid itimerspec; old_value may be null.
        let rc = unsafe { libc::timerfd_settime(raw, 0, &spec, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(format!(
                "timerfd_settime failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        loop {
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|e| format!("timerfd wait failed: {e}"))?;
            let mut expirations = 0u64;
            // SAFETY: reads 8 bytes into a u64 we own.
            let n = unsafe { libc::read(raw, (&mut expirations as *mut u64).cast(), 8) };
            if n == 8 {
                return Ok(());
            }
            guard.clear_ready();
        }
    }
}
