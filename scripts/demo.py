#!/usr/bin/env python3
"""`make demo`: tailscope end to end on a real, unmodified redis-server.

1. Start Debian's redis-server pinned to CPU 0.
2. Record it with `tailscope record -p PID` (zero-instrumentation mode: no
   restart, no code change; requests are inferred from socket syscalls).
3. Drive open-loop Poisson load from CPU 1 with tailscope-loadgen, which times
   each request from its intended send time.
4. For part of the run, inject a known interference: a CPU hog on redis's core
   (real-time priority, 2 ms bursts every 10 ms).
5. Rank the causes and write the HTML report; check that the injected cause
   (runnable wait) ranks first, and print where the report is.

Everything lands in demo-out/. Exit status is non-zero if any step fails or
the injected cause does not rank first.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "demo-out"
REC = OUT / "rec"
PORT = 6399
RATE = int(os.environ.get("DEMO_RATE", "12000"))
DURATION = int(os.environ.get("DEMO_SECONDS", "20"))
HOG_AT, HOG_FOR = 7, 6
SAMPLE = os.environ.get("DEMO_SAMPLE", "25%")
AGENT = ROOT / "target" / "release" / "tailscope-agent"
LOADGEN = ROOT / "target" / "release" / "tailscope-loadgen"
TAILSCOPE = [sys.executable, "-m", "tailscope"]


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def fail(msg: str) -> None:
    print(f"demo: error: {msg}", file=sys.stderr)
    sys.exit(1)


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            time.sleep(0.1)
    fail(f"redis-server did not answer on port {port} within {timeout:.0f} s")


def start_hog(cpu: int) -> subprocess.Popen:
    """The interference we inject: a CPU burner pinned to `cpu` that runs at
    real-time priority in 2 ms bursts every 10 ms (a noisy neighbour such as
    a batch job or a kernel thread). redis cannot preempt it, so every request
    that arrives during a burst waits, runnable, for up to 2 ms. A plain
    SCHED_OTHER burner is a weaker, less reproducible injection: the
    scheduler lets a mostly-sleeping redis preempt it, and how often it does
    depends on how much CPU everything else (tracing included) takes."""
    code = (
        "import time\n"
        "while True:\n"
        "    end = time.perf_counter() + 0.002\n"
        "    while time.perf_counter() < end: pass\n"
        "    time.sleep(0.008)\n"
    )
    return subprocess.Popen(["chrt", "-f", "10", "taskset", "-c", str(cpu), sys.executable, "-c", code])


def main() -> None:
    for exe in (AGENT, LOADGEN):
        if not exe.exists():
            fail(f"{exe.relative_to(ROOT)} is not built; run `make build` first")
    redis = shutil.which("redis-server") or fail("redis-server not installed")
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    procs: list[subprocess.Popen] = []
    try:
        step(f"starting redis-server on CPU 0, port {PORT}")
        srv = subprocess.Popen(
            [
                "taskset",
                "-c",
                "0",
                redis,
                "--port",
                str(PORT),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--logfile",
                str(OUT / "redis.log"),
            ],
        )
        procs.append(srv)
        wait_port(PORT)
        subprocess.run(
            [
                str(LOADGEN),
                "--protocol",
                "redis",
                "--target",
                f"127.0.0.1:{PORT}",
                "--preload",
                "--rate",
                "1000",
                "--duration",
                "0.5",
                "--quiet",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )

        step(f"recording PID {srv.pid} with tailscope (zero-instrumentation, {SAMPLE} sampling)")
        agent = subprocess.Popen(
            [
                *TAILSCOPE,
                "record",
                "-o",
                str(REC),
                "--force",
                "-p",
                str(srv.pid),
                "--sample",
                SAMPLE,
                "--duration",
                str(DURATION + 3),
            ],
        )
        procs.append(agent)
        deadline = time.time() + 30
        while not (REC / "meta.json").exists():
            if agent.poll() is not None:
                fail(f"tailscope record exited early with status {agent.returncode}")
            if time.time() > deadline:
                fail("tailscope record did not start within 30 s")
            time.sleep(0.1)
        time.sleep(1.0)

        step(
            f"driving {RATE} req/s open-loop GET load from CPU 1 for {DURATION} s; "
            f"CPU hog on redis's core from t={HOG_AT}s for {HOG_FOR}s"
        )
        load = subprocess.Popen(
            [
                str(LOADGEN),
                "--protocol",
                "redis",
                "--target",
                f"127.0.0.1:{PORT}",
                "--rate",
                str(RATE),
                "--duration",
                str(DURATION),
                "--cpu",
                "1",
                "--connections",
                "8",
                "--json",
                str(OUT / "load.json"),
                "--quiet",
            ],
        )
        procs.append(load)
        time.sleep(HOG_AT)
        hog = start_hog(0)
        procs.append(hog)
        time.sleep(HOG_FOR)
        hog.kill()
        hog.wait()
        if load.wait() != 0:
            fail("load generator failed")
        if agent.wait(timeout=60) != 0:
            fail(f"tailscope record exited with status {agent.returncode}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()

    load_stats = json.loads((OUT / "load.json").read_text())
    lat = load_stats.get("latency_us", {})
    print(
        f"\nclient view: {load_stats.get('completed')} requests, "
        f"p50 {lat.get('p50')} µs, p99 {lat.get('p99')} µs (timed from intended send)"
    )
    print(
        "  (tailscope's percentiles below are the server side of each request, per connection; "
        "requests that queue\n   together on one connection during a stall are read at once and "
        "count as one, so its p99\n   is lower than the clients'. See docs/zero-instrumentation.md.)"
    )

    step("ranking the causes of tail latency")
    rep = subprocess.run([*TAILSCOPE, "report", str(REC)], check=False)
    if rep.returncode != 0:
        fail("tailscope report failed")
    js = subprocess.run([*TAILSCOPE, "report", str(REC), "--json"], check=True, capture_output=True, text=True)
    ranked = json.loads(js.stdout)
    causes = ranked.get("causes", [])
    top = causes[0]["event"] if causes else None
    print(f"\ninjected: CPU hog on redis's core (expected cause: runnable wait); ranked first: {top}")
    print(f"report: {REC / 'report.html'}")
    if top != "runnable_wait_ns":
        fail("the injected cause did not rank first")


if __name__ == "__main__":
    main()
