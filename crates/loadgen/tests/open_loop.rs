//! End-to-end tests against tiny in-test `line` servers: the generator's
//! latency must include server-side delay, and — the point of an open-loop
//! generator — time spent waiting to send while the server stalls.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use tailscope_loadgen::arrivals::Step;
use tailscope_loadgen::{run, Config, Load, ProtocolKind};

/// Decides, per request, how long the server waits before answering.
type DelayFn = dyn Fn(u64) -> Duration + Send + Sync;

/// A `line` server on a free loopback port; one thread per connection.
/// `delay(n)` gets the connection-local request number.
fn spawn_line_server(delay: Arc<DelayFn>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let delay = delay.clone();
            thread::spawn(move || serve(stream, &*delay));
        }
    });
    addr
}

fn serve(stream: TcpStream, delay: &DelayFn) {
    stream.set_nodelay(true).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let reader = BufReader::new(stream);
    for (n, line) in reader.lines().enumerate() {
        let Ok(line) = line else { return };
        let id = line.strip_prefix("REQ ").expect("REQ <id>");
        let wait = delay(n as u64 + 1);
        if !wait.is_zero() {
            thread::sleep(wait);
        }
        if writer.write_all(format!("OK {id}\n").as_bytes()).is_err() {
            return;
        }
    }
}

fn line_config(addr: &str, rate: f64, duration_s: f64) -> Config {
    let mut config = Config::new(
        addr,
        ProtocolKind::Line,
        Load::Open {
            steps: vec![Step { rate, duration_s }],
        },
    );
    config.connections = 4;
    config.warmup_s = 0.2;
    config
}

#[test]
fn every_tenth_reply_delayed_shows_in_p99_not_p50() {
    let delay = |n: u64| {
        if n.is_multiple_of(10) {
            Duration::from_millis(5)
        } else {
            Duration::ZERO
        }
    };
    let addr = spawn_line_server(Arc::new(delay));
    let mut config = line_config(&addr, 1000.0, 1.5);
    config.connections = 8;
    let s = run(&config).unwrap();
    eprintln!("{}", tailscope_loadgen::report::human(&s));
    assert_eq!(s.counts.errors, 0, "ids must match FIFO");
    assert_eq!(s.counts.timeouts, 0);
    assert_eq!(s.counts.completed, s.counts.scheduled);
    assert!(
        (1100..1900).contains(&s.counts.scheduled),
        "{}",
        s.counts.scheduled
    );
    assert!(
        s.latency_us.p99 >= 4900.0,
        "p99 {} should include the 5 ms delay",
        s.latency_us.p99
    );
    assert!(
        s.latency_us.p50 < 4000.0,
        "p50 {} should not",
        s.latency_us.p50
    );
    assert_eq!(s.timeseries.len(), 75);
}

/// The server stalls every connection for 50 ms once. With one request
/// allowed per connection, the generator cannot send during the stall;
/// arrivals scheduled then are sent late, and their latency must count
/// from when they were scheduled. A generator timing from the actual write
/// would report them as fast (coordinated omission).
#[test]
fn stall_raises_latency_of_requests_scheduled_during_it() {
    const STALL: Duration = Duration::from_millis(50);
    let count = Arc::new(AtomicU64::new(0));
    let stall_until: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let delay = {
        let (count, stall_until) = (count.clone(), stall_until.clone());
        move |_n: u64| {
            let seen = count.fetch_add(1, Ordering::SeqCst) + 1;
            let mut until = stall_until.lock().unwrap();
            if seen == 600 {
                *until = Some(Instant::now() + STALL);
            }
            until.map_or(Duration::ZERO, |t| {
                t.saturating_duration_since(Instant::now())
            })
        }
    };
    let addr = spawn_line_server(Arc::new(delay));
    let mut config = line_config(&addr, 1000.0, 1.0);
    config.connections = 2;
    config.max_outstanding_per_conn = Some(1);
    let s = run(&config).unwrap();
    eprintln!("{}", tailscope_loadgen::report::human(&s));
    assert_eq!(s.counts.errors + s.counts.timeouts, 0);
    assert!(
        s.max_send_lag_us >= 35_000.0,
        "sends waited out the stall: {}",
        s.max_send_lag_us
    );
    // ~50 arrivals land in the stall, latencies spread over 0..50 ms: about
    // 3% of the run is above 20 ms.
    assert!(s.latency_us.p99 >= 20_000.0, "p99 {}", s.latency_us.p99);
    assert!(s.latency_us.p50 < 5_000.0, "p50 {}", s.latency_us.p50);
    // The 20 ms bin where the stall began is dominated by it.
    let worst_bin_p50 = s.timeseries.iter().filter_map(|b| b.p50_us).max().unwrap();
    assert!(worst_bin_p50 >= 15_000, "worst bin p50 {worst_bin_p50} us");
}

#[test]
fn closed_loop_max_rate_reports_throughput() {
    let addr = spawn_line_server(Arc::new(|_| Duration::ZERO));
    let mut config = Config::new(
        &addr,
        ProtocolKind::Line,
        Load::Closed {
            depth: 4,
            duration_s: 0.5,
        },
    );
    config.connections = 2;
    config.warmup_s = 0.1;
    let s = run(&config).unwrap();
    assert!(s.counts.completed > 500, "{}", s.counts.completed);
    assert_eq!(s.counts.errors + s.counts.timeouts, 0);
    assert!(s.counts.achieved_rps > 1000.0);
    assert_eq!(s.max_send_lag_us, 0.0);
}

#[test]
fn unanswered_requests_are_timeouts() {
    let addr = spawn_line_server(Arc::new(|n| {
        if n >= 50 {
            Duration::from_secs(3)
        } else {
            Duration::ZERO
        }
    }));
    let mut config = line_config(&addr, 500.0, 0.3);
    config.connections = 1;
    config.warmup_s = 0.0;
    config.timeout_ms = 100;
    let s = run(&config).unwrap();
    assert!(s.counts.timeouts > 50, "{:?}", s.counts);
    assert_eq!(s.counts.completed + s.counts.timeouts, s.counts.scheduled);
}

#[test]
fn connection_refused_is_an_error_not_a_panic() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = line_config(&format!("127.0.0.1:{port}"), 100.0, 0.1);
    let err = run(&config).unwrap_err();
    assert!(
        err.contains("cannot connect") && !err.contains('\n'),
        "{err}"
    );
}

/// `--stall-us`: the generator spins, counts its stalls, and every successful
/// reply is either in the latencies or flagged as disturbed in the records,
/// whose layout (`--requests-out`) is magic, time zero, count, then three
/// little-endian u64 per reply.
#[test]
fn stall_detection_accounts_for_every_reply_and_records_them() {
    let addr = spawn_line_server(Arc::new(|_| Duration::ZERO));
    let mut config = line_config(&addr, 2000.0, 0.5);
    config.stall_us = Some(200);
    config.keep_requests = true;
    let s = run(&config).unwrap();
    let g = s.generator_stalls.clone().expect("stall detection was on");
    let ok = s.counts.completed - s.counts.errors;
    assert!(ok > 800, "{ok} replies");
    assert_eq!(s.requests.len() as u64, ok);
    let flagged = s.requests.iter().filter(|r| r.2 == 1).count() as u64;
    assert_eq!(flagged, g.disturbed);
    assert!(g.disturbed == 0 || g.count > 0);
    let bytes = tailscope_loadgen::report::requests_bytes(&s);
    assert_eq!(&bytes[..8], b"TSLGRQ01");
    assert_eq!(bytes.len(), 24 + 24 * s.requests.len());
    let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
    assert_eq!(word(8), s.start_monotonic_ns.unwrap());
    assert_eq!(word(16), ok);
    // the first record: intended time (after the 0.2-s warm-up) and its latency
    assert_eq!((word(24), word(32)), (s.requests[0].0, s.requests[0].1));
    assert!(word(24) >= 200_000_000);
}
