//! End-to-end tests against real redis-server and memcached processes on
//! free loopback ports. Each test skips, saying why, if the server binary
//! is not installed.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use tailscope_loadgen::arrivals::Step;
use tailscope_loadgen::{run, Config, Load, ProtocolKind};

/// A server process killed when the test ends, pass or fail.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start `program args` and wait until it accepts on `port`; `None` (with
/// a printed reason) if the program is not installed.
fn start(program: &str, args: &[String], port: u16) -> Option<Server> {
    let child = match Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skipping: cannot start {program}: {e}");
            return None;
        }
    };
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{program} did not listen on {port}"
        );
        thread::sleep(Duration::from_millis(20));
    }
    Some(server)
}

fn config(port: u16, protocol: ProtocolKind) -> Config {
    let mut c = Config::new(
        &format!("127.0.0.1:{port}"),
        protocol,
        Load::Open {
            steps: vec![Step {
                rate: 3000.0,
                duration_s: 1.0,
            }],
        },
    );
    c.warmup_s = 0.2;
    c.connections = 4;
    c.keys = 1000;
    c.preload = true;
    c
}

fn check_clean_run(c: &Config) {
    let s = run(c).unwrap();
    eprintln!("{}", tailscope_loadgen::report::human(&s));
    assert_eq!(s.counts.errors, 0);
    assert_eq!(s.counts.timeouts, 0);
    assert_eq!(s.counts.completed, s.counts.scheduled);
    assert!(
        (2400..3600).contains(&s.counts.completed),
        "{}",
        s.counts.completed
    );
    assert!(
        s.latency_us.p50 > 0.0 && s.latency_us.p50 < 5_000.0,
        "p50 {}",
        s.latency_us.p50
    );
}

#[test]
fn redis_get_set_mix() {
    let port = free_port();
    let args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let Some(_server) = start("redis-server", &args, port) else {
        return;
    };
    check_clean_run(&config(port, ProtocolKind::Redis));
}

#[test]
fn memcached_get_set_mix() {
    let port = free_port();
    let args: Vec<String> = [
        "-p",
        &port.to_string(),
        "-l",
        "127.0.0.1",
        "-U",
        "0",
        "-t",
        "1",
        "-u",
        "nobody",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let Some(_server) = start("memcached", &args, port) else {
        return;
    };
    check_clean_run(&config(port, ProtocolKind::Memcached));
}
