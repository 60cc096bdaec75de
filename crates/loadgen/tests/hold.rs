//! `--hold`: the binary stops itself at the measured run's two edges with
//! every reply in and its connections open, and the run between the stops
//! is exactly what it reports.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Counts {
    served: AtomicU64,
    accepted: AtomicU64,
    closed: AtomicU64,
}

/// A `line` server on a free loopback port that counts requests,
/// connections accepted and connections the client closed.
fn spawn_counting_server(counts: Arc<Counts>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            counts.accepted.fetch_add(1, Ordering::SeqCst);
            let counts = counts.clone();
            thread::spawn(move || serve(stream, &counts));
        }
    });
    addr
}

fn serve(stream: TcpStream, counts: &Counts) {
    stream.set_nodelay(true).unwrap();
    let mut writer = stream.try_clone().unwrap();
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        let id = line.strip_prefix("REQ ").expect("REQ <id>").to_string();
        counts.served.fetch_add(1, Ordering::SeqCst);
        if writer.write_all(format!("OK {id}\n").as_bytes()).is_err() {
            break;
        }
    }
    counts.closed.fetch_add(1, Ordering::SeqCst);
}

/// The process state letter from /proc/PID/stat ('T' when stopped).
fn state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, s)| s).unwrap_or("");
    after.trim_start().chars().next().unwrap_or('?')
}

fn await_stop(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while state(pid) != 'T' {
        assert!(Instant::now() < deadline, "the generator never stopped");
        thread::sleep(Duration::from_millis(10));
    }
}

fn resume(pid: u32) {
    // SAFETY: kill only sends a signal.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
}

#[test]
fn hold_stops_at_both_edges_drained_and_connected() {
    let counts = Arc::new(Counts::default());
    let addr = spawn_counting_server(counts.clone());
    let child = Command::new(env!("CARGO_BIN_EXE_tailscope-loadgen"))
        .args(["--target", &addr, "--protocol", "line", "--rate", "1000"])
        .args(["--duration", "0.4", "--warmup", "0.3", "--connections", "3"])
        .args(["--hold", "--quiet", "--json", "-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();

    await_stop(pid);
    let warm = counts.served.load(Ordering::SeqCst);
    thread::sleep(Duration::from_millis(150));
    // ~300 warm-up requests, all answered before the stop, none sent while held
    assert!(warm > 150, "{warm} warm-up requests");
    assert_eq!(counts.served.load(Ordering::SeqCst), warm);
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 3);
    assert_eq!(counts.closed.load(Ordering::SeqCst), 0);

    resume(pid);
    await_stop(pid);
    let end = counts.served.load(Ordering::SeqCst);
    thread::sleep(Duration::from_millis(150));
    assert_eq!(counts.served.load(Ordering::SeqCst), end);
    // the measured run set up and tore down nothing
    assert_eq!(counts.accepted.load(Ordering::SeqCst), 3);
    assert_eq!(counts.closed.load(Ordering::SeqCst), 0);

    resume(pid);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // what it reports is exactly the run between the stops
    assert_eq!(json["completed"].as_u64(), Some(end - warm));
    assert!(end - warm > 250, "{} measured requests", end - warm);
    let deadline = Instant::now() + Duration::from_secs(5);
    while counts.closed.load(Ordering::SeqCst) < 3 {
        assert!(Instant::now() < deadline, "connections left open at exit");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn hold_is_refused_for_a_closed_loop() {
    let out = Command::new(env!("CARGO_BIN_EXE_tailscope-loadgen"))
        .args(["--target", "127.0.0.1:9", "--rate", "max", "--hold"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--hold applies to open-loop runs"), "{err}");
}
