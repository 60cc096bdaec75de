//! An HTTP/2 (h2c) service behind the Breakwater server layer — or behind a
//! baseline, for comparison. The credit window travels in the `bw-*`
//! response headers.
//!
//! ```text
//! bw-server --listen 127.0.0.1:8080 --control breakwater --workers 1 \
//!     --service exponential --mean-us 100 --slo-us 2000 [--stats stats.json]
//! ```
//!
//! `--control tower` puts tower's stock `LoadShed` + `ConcurrencyLimit` in
//! front of the same dispatcher (with no policy). `--service lock` is the
//! lock-bound microbenchmark: a request takes mutex A with probability
//! `--lock-p`, else mutex B, and holds it for an exponential time (a sleep,
//! so locks, not the CPU, are the bottleneck); `--asqm` acquires with
//! `lock_unless_congested`. On SIGTERM or SIGINT the server writes
//! `--stats` (JSON) and exits.

use breakwater::asqm::{AsqmMutex, QueueBudget};
use breakwater::control::{ControlKind, ControlSpec};
use breakwater::http::{serve, serve_with_push};
use breakwater::policy::none::NoControl;
use breakwater::rng::SplitMix64;
use breakwater::server::{BoxError, Server, ServerConfig, ServerLayer, WorkerPriority};
use breakwater::sim::ServiceDist;
use bytes::Bytes;
use clap::Parser;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use std::cell::RefCell;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, ServiceBuilder};

#[derive(Debug, Parser)]
#[command(
    name = "bw-server",
    about = "HTTP/2 service behind Breakwater or a baseline"
)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// none, breakwater, breakwater-efficiency, seda, dagor, gradient, tower
    #[arg(long, default_value = "breakwater")]
    control: String,
    #[arg(long, default_value = "1")]
    workers: usize,
    /// exponential, bimodal, constant, lock
    #[arg(long, default_value = "exponential")]
    service: String,
    #[arg(long, default_value = "100")]
    mean_us: u64,
    #[arg(long, default_value = "2000")]
    slo_us: u64,
    /// Breakwater's update period (the network RTT).
    #[arg(long, default_value = "100")]
    rtt_us: u64,
    /// Ablation: no overcommitment (C_oc = 0).
    #[arg(long)]
    no_overcommit: bool,
    /// Ablation: no AQM.
    #[arg(long)]
    no_aqm: bool,
    /// AQM against the oldest queued request's age only (the thesis's
    /// signal), not the forecast wait.
    #[arg(long)]
    aqm_age: bool,
    /// Breakwater: the AQM forecast counts the service time alone, not the
    /// gap between jobs too (the I/O work an inline worker waits for;
    /// counted by default since session 11).
    #[arg(long)]
    no_forecast_gap: bool,
    /// Breakwater: keep the service reserve fixed at --reserve-us (sessions
    /// 1-10) instead of adapting it (session 11's default).
    #[arg(long)]
    fixed_reserve: bool,
    /// Breakwater: the adaptive reserve's target share of admitted requests
    /// that finish late as the server sees it (default 0.003); it starts at
    /// --reserve-us (default 30% of the SLO).
    #[arg(long)]
    late_target: Option<f64>,
    /// The adaptive reserve's ceiling in µs (default: 70% of the SLO).
    #[arg(long)]
    max_reserve_us: Option<u64>,
    /// Breakwater's service reserve in µs (AQM budget = SLO − reserve);
    /// default 30% of the SLO.
    #[arg(long)]
    reserve_us: Option<u64>,
    /// Breakwater: clients send their request as the credit wait (loadgen
    /// --bw-carry), so drop Eq. 2.4's overcommit floor to 0.
    #[arg(long)]
    carry: bool,
    /// Breakwater with --carry: a held request whose time runs out stays
    /// as its client's credit wait, answered `expired` when the pool can
    /// spare the client a credit (the client stays quiet meanwhile).
    #[arg(long)]
    hold_expired: bool,
    /// Do not read demand lines on credit streams (docs/breakwater.md,
    /// session 10): pushed clients are then pushed speculatively, round
    /// each connection's ring, as before demand lines existed.
    #[arg(long)]
    no_demand: bool,
    /// Breakwater: push explicit credits only on known demand (session
    /// 10's first try; see BreakwaterConfig::demand_only).
    #[arg(long)]
    demand_only: bool,
    /// Clients send a demand line for 1 in N of their idle-to-busy
    /// transitions (the server tells them N when it echoes bw-signals).
    /// Ignored with --demand-only, which needs every line (N = 1).
    #[arg(long, default_value_t = breakwater::push::DEFAULT_DEMAND_SAMPLE)]
    demand_sample: u32,
    /// Breakwater: Eq. 2.4's floor, C_oc >= this (default 1; 0 with --carry).
    #[arg(long)]
    overcommit_floor: Option<u64>,
    /// Breakwater's target queueing delay d_t in µs (default: 40% of the
    /// SLO, the thesis's).
    #[arg(long)]
    target_us: Option<u64>,
    /// Breakwater: requests sent without credit held for one at most
    /// (default 64 × workers); more are refused at once.
    #[arg(long)]
    max_held: Option<u64>,
    /// tower's ConcurrencyLimit for --control tower.
    #[arg(long, default_value = "8")]
    tower_limit: usize,
    #[arg(long, default_value = "0.2")]
    lock_p: f64,
    #[arg(long)]
    asqm: bool,
    /// Write server stats (JSON) here on SIGTERM/SIGINT.
    #[arg(long)]
    stats: Option<String>,
    #[arg(long, default_value = "1")]
    seed: u64,
    /// Worker threads' scheduling class: `normal`, or `idle` (SCHED_IDLE:
    /// the I/O thread preempts a busy worker at once, so admission, rejects
    /// and replies do not wait for the worker's time slice); `inline`: no
    /// worker thread, the worker runs on the I/O thread between socket polls
    /// (run to completion; needs --workers 1).
    #[arg(long, default_value = "normal")]
    worker_priority: String,
    /// Time slice in µs for the I/O thread (the one that receives, admits,
    /// refuses and replies), set with sched_setattr after the workers start
    /// (0: the kernel's default). Shorter than the workers' slice, it lets
    /// the woken I/O thread preempt a busy worker (Linux ≥ 6.12, EEVDF).
    #[arg(long, default_value = "0")]
    io_slice_us: u64,
    /// Print the stats as a JSON line on stderr every this many ms (0: never).
    #[arg(long, default_value = "0")]
    trace_ms: u64,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

thread_local! {
    static RNG: RefCell<SplitMix64> = RefCell::new(SplitMix64::new(breakwater::rng::entropy()));
}

/// Burn `ns` of this thread's CPU time (not wall time: preemption by the
/// dispatcher does not shorten the work).
fn spin_cpu(ns: u64) {
    let cpu = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid pointer to a timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    let end = cpu() + ns;
    while cpu() < end {
        std::hint::spin_loop();
    }
}

fn ok() -> Response<Full<Bytes>> {
    Response::new(Full::new(Bytes::from_static(b"ok")))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bw-server: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    if args.mean_us == 0 || args.slo_us == 0 || args.rtt_us == 0 {
        return Err("--mean-us, --slo-us and --rtt-us must be > 0".into());
    }
    if !(args.lock_p > 0.0 && args.lock_p < 1.0) {
        return Err(format!("--lock-p must be in (0, 1), got {}", args.lock_p));
    }
    let tower_stock = args.control == "tower";
    let kind: ControlKind = if tower_stock {
        ControlKind::None
    } else {
        args.control.parse()?
    };
    let mut spec = ControlSpec::new(kind, args.slo_us * 1000, args.workers.max(1) as u64);
    spec.rtt_ns = args.rtt_us * 1000;
    spec.overcommit = !args.no_overcommit;
    spec.aqm = !args.no_aqm;
    spec.aqm_forecast = !args.aqm_age;
    spec.forecast_gap = !args.no_forecast_gap;
    spec.fixed_reserve = args.fixed_reserve;
    spec.late_target = args.late_target;
    spec.max_reserve_ns = args.max_reserve_us.map(|us| us * 1000);
    spec.max_held = args.max_held;
    if let Some(t) = args.target_us {
        if t == 0 || t >= args.slo_us {
            return Err(format!("--target-us must be in (0, --slo-us), got {t}"));
        }
        spec.target_delay_ns = Some(t * 1000);
    }
    spec.carry = args.carry;
    spec.hold_expired = args.hold_expired;
    spec.demand_only = args.demand_only;
    spec.overcommit_floor = args.overcommit_floor;
    if let Some(r) = args.reserve_us {
        if r == 0 || r >= args.slo_us {
            return Err(format!("--reserve-us must be in (0, --slo-us), got {r}"));
        }
        spec.service_reserve_ns = Some(r * 1000);
    }
    let policy = spec.server().map_err(|e| e.to_string())?;
    let worker_priority = match args.worker_priority.as_str() {
        "normal" => WorkerPriority::Normal,
        "idle" => WorkerPriority::Idle,
        "inline" => WorkerPriority::Inline,
        other => {
            return Err(format!(
                "--worker-priority must be normal, idle or inline, got {other:?}"
            ))
        }
    };
    let config = ServerConfig {
        workers: args.workers,
        worker_priority,
        ..ServerConfig::default()
    };
    let mean_ns = args.mean_us as f64 * 1000.0;
    let lock_mode = args.service == "lock";
    let dist: Option<ServiceDist> = if lock_mode {
        None
    } else {
        Some(args.service.parse()?)
    };
    let locks = Arc::new([AsqmMutex::new(()), AsqmMutex::new(())]);
    let (p, asqm) = (args.lock_p, args.asqm);
    // The handler: CPU work drawn from the distribution, or a lock path.
    let handler = tower::service_fn(move |req: Request<Incoming>| {
        let locks = locks.clone();
        async move {
            if let Some(dist) = dist {
                let ns = RNG.with(|r| dist.sample(&mut r.borrow_mut(), mean_ns));
                spin_cpu(ns);
                return Ok::<_, BoxError>(ok());
            }
            let (first, hold) = RNG.with(|r| {
                let mut r = r.borrow_mut();
                (r.next_open01() <= p, r.exponential(mean_ns) as u64)
            });
            let lock = &locks[usize::from(!first)];
            let guard = if asqm {
                let mut budget =
                    req.extensions()
                        .get::<QueueBudget>()
                        .copied()
                        .unwrap_or(QueueBudget {
                            remaining_ns: u64::MAX,
                        });
                lock.lock_unless_congested(&mut budget)
            } else {
                Some(lock.lock())
            };
            let Some(_guard) = guard else {
                let mut r = Response::new(Full::new(Bytes::new()));
                *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                r.headers_mut().insert(
                    breakwater::wire::REJECT,
                    http::HeaderValue::from_static(breakwater::wire::REJECT_LOCK),
                );
                return Ok(r);
            };
            std::thread::sleep(Duration::from_nanos(hold));
            Ok(ok())
        }
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    // SAFETY: installing an async-signal-safe handler (one atomic store).
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
        let name = if tower_stock { "tower" } else { kind.name() };
        println!(
            "bw-server listening on {} control={name} workers={}",
            args.listen, args.workers
        );
        let server: Server<Incoming, Full<Bytes>> = if tower_stock {
            Server::start(handler, Box::new(NoControl), config)
        } else {
            ServerLayer::new(policy, config)
                .map_err(|e| e.to_string())?
                .layer(handler)
        };
        if args.io_slice_us > 0 {
            // After Server::start, so the workers keep the default slice.
            let got =
                breakwater::server::set_thread_slice(Some(Duration::from_micros(args.io_slice_us)))
                    .map_err(|e| format!("--io-slice-us: sched_setattr failed: {e}"))?;
            eprintln!("bw-server: I/O thread slice {got:?}");
        }
        let stats_handle = server.clone();
        let serving = if tower_stock {
            let svc = ServiceBuilder::new()
                .load_shed()
                .concurrency_limit(args.tower_limit)
                .service(server);
            tokio::spawn(serve(listener, svc, 4096))
        } else {
            // Credit streams are always served: clients that subscribe one
            // get explicit credits pushed; the others are unaffected.
            let hub = server.push_hub();
            hub.set_accept_demand(!args.no_demand);
            // Strict mode pushes only on known demand: a client that skips
            // its line (sampling) would wait for a credit that never comes.
            hub.set_demand_sample(if args.demand_only {
                1
            } else {
                args.demand_sample.max(1)
            });
            tokio::spawn(serve_with_push(listener, server, hub, 4096))
        };
        let period = if args.trace_ms > 0 { args.trace_ms } else { 50 };
        while !STOP.load(Ordering::SeqCst) && !serving.is_finished() {
            tokio::time::sleep(Duration::from_millis(period)).await;
            if args.trace_ms > 0 {
                let mut v = serde_json::to_value(stats_handle.stats()).expect("serialisable");
                v["t_ms"] = serde_json::json!(breakwater::clock::now() / 1_000_000);
                eprintln!("{v}");
            }
        }
        // End the credit streams (clients fall back to credit waits).
        stats_handle.push_hub().close();
        if serving.is_finished() {
            return Err(match serving.await {
                Ok(Err(e)) => format!("accept failed: {e}"),
                _ => "server stopped".into(),
            });
        }
        if let Some(path) = &args.stats {
            let mut stats = serde_json::to_value(stats_handle.stats()).expect("serialisable");
            stats["control_name"] = serde_json::json!(name);
            std::fs::write(path, stats.to_string() + "\n")
                .map_err(|e| format!("cannot write {path}: {e}"))?;
        }
        Ok(())
    })
}
