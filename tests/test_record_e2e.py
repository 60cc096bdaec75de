"""End-to-end recording against real servers, and the agent's bad-input paths.

Real parts only: Debian's redis-server, the real eBPF programs, the real
agent, the real load generator, Parquet read back with pyarrow. Needs root;
skips with the reason otherwise.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "target" / "release" / "tailscope-agent"
LOADGEN = ROOT / "target" / "release" / "tailscope-loadgen"
SERVER = ROOT / "tests" / "accuracy" / "build" / "server"
TAILSCOPE = [sys.executable, "-m", "tailscope"]

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="recording needs root for eBPF"),
    pytest.mark.skipif(not AGENT.exists(), reason="tailscope-agent not built (make build)"),
]

_port = [19000 + os.getpid() % 500]


def free_port() -> int:
    _port[0] += 1
    return _port[0]


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.3).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listening on {port}")


@pytest.fixture
def redis():
    port = free_port()
    p = subprocess.Popen(
        [
            "taskset",
            "-c",
            "0",
            shutil.which("redis-server"),
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            "/dev/null",
        ]
    )
    wait_port(port)
    yield p, port
    if p.poll() is None:
        p.terminate()
        p.wait(timeout=10)


def load(port: int, rate: int, seconds: float, protocol: str = "redis") -> dict:
    out = Path(f"/tmp/ts-load-{port}.json")
    subprocess.run(
        [
            str(LOADGEN),
            "--protocol",
            protocol,
            "--target",
            f"127.0.0.1:{port}",
            "--rate",
            str(rate),
            "--duration",
            str(seconds),
            "--cpu",
            "1",
            "--connections",
            "4",
            "--warmup",
            "0",
            "--json",
            str(out),
            "--quiet",
        ],
        check=True,
    )
    return json.loads(out.read_text())


def read_rec(rec: Path):
    meta = json.loads((rec / "meta.json").read_text())
    parts = sorted((rec / "requests").glob("*.parquet"))
    table = ds.dataset([str(p) for p in parts], format="parquet").to_table() if parts else None
    return meta, table


def wait_meta(rec: Path, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while not (rec / "meta.json").exists():
        assert proc.poll() is None, f"agent exited early: {proc.stderr.read().decode()}"
        assert time.time() < deadline, "agent did not start"
        time.sleep(0.05)
    time.sleep(0.5)


def one_line_error(res: subprocess.CompletedProcess) -> str:
    err = res.stderr.strip()
    assert res.returncode != 0, f"expected failure, got 0; stderr={err!r}"
    assert "Traceback" not in err and "panicked" not in err, err
    assert err, "no error message"
    assert len(err.splitlines()) == 1, f"error is not one line: {err!r}"
    return err


# --- zero-instrumentation recording of a real redis ------------------------


def test_zero_instrumentation_redis(tmp_path, redis):
    srv, port = redis
    rec = tmp_path / "rec"
    agent = subprocess.Popen(
        [*TAILSCOPE, "record", "-o", str(rec), "-p", str(srv.pid), "--sample", "100%", "--duration", "5", "--quiet"],
        stderr=subprocess.PIPE,
    )
    wait_meta(rec, agent)
    stats = load(port, 2000, 2.5)
    assert agent.wait(timeout=60) == 0, agent.stderr.read().decode()
    meta, t = read_rec(rec)
    assert meta["mode"] == "infer"
    assert meta["finalised_by"] == "duration"
    assert t is not None and t.num_rows > 0
    rows = t.num_rows
    completed = stats["completed"]
    # One inferred request per GET; allow slack for requests around the edges.
    assert 0.8 * completed <= rows <= 1.2 * completed + 50, (rows, completed)
    assert all(t.column("inferred").to_pylist())
    assert sum(t.column("counters_valid").to_pylist()) >= 0.95 * rows
    lat = sorted(t.column("latency_ns").to_pylist())
    assert 1_000 < lat[len(lat) // 2] < 5_000_000  # a redis GET takes µs, not ns or seconds
    assert meta["requests_recorded"] == rows


def test_sampling_rate_respected(tmp_path, redis):
    srv, port = redis
    rec = tmp_path / "rec"
    agent = subprocess.Popen(
        [*TAILSCOPE, "record", "-o", str(rec), "-p", str(srv.pid), "--sample", "10%", "--duration", "5", "--quiet"],
        stderr=subprocess.PIPE,
    )
    wait_meta(rec, agent)
    stats = load(port, 4000, 2.5)
    assert agent.wait(timeout=60) == 0
    _, t = read_rec(rec)
    frac = t.num_rows / stats["completed"]
    assert 0.07 < frac < 0.13, frac


# --- finalisation: SIGINT, SIGTERM, target exit -----------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_finalises_recording(tmp_path, redis, sig):
    srv, port = redis
    rec = tmp_path / "rec"
    agent = subprocess.Popen(
        [str(AGENT), "record", "-o", str(rec), "-p", str(srv.pid), "--sample", "100%", "--quiet"],
        stderr=subprocess.PIPE,
    )
    wait_meta(rec, agent)
    load(port, 2000, 1.5)
    agent.send_signal(sig)
    assert agent.wait(timeout=30) == 0, agent.stderr.read().decode()
    meta, t = read_rec(rec)
    assert meta["finalised_by"] == sig.name
    assert t is not None and t.num_rows > 1000  # nothing recorded was lost
    assert meta["requests_recorded"] == t.num_rows
    assert srv.poll() is None, "the agent must never signal a -p target"


def test_target_exit_finalises_recording(tmp_path):
    if not SERVER.exists():
        pytest.skip("test server not built")
    port = free_port()
    rec = tmp_path / "rec"
    agent = subprocess.Popen(
        [
            str(AGENT),
            "record",
            "-o",
            str(rec),
            "--sample",
            "100%",
            "--quiet",
            "--",
            str(SERVER),
            "--port",
            str(port),
            "--cpu",
            "0",
            "--work-us",
            "20",
            "--inject",
            "none",
            "--seed",
            "1",
        ],
        stderr=subprocess.PIPE,
    )
    wait_port(port)
    load(port, 1000, 1.0, protocol="line")
    # Kill the target; the agent must notice, finalise, and exit cleanly.
    out = subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True, text=True)
    children = [int(p) for p in out.stdout.split()]
    assert children, "the launched server is not a child of the agent"
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    assert agent.wait(timeout=30) == 0, agent.stderr.read().decode()
    meta, t = read_rec(rec)
    assert meta["finalised_by"] == "target-exit"
    assert meta["mode"] == "marker"
    assert t is not None and t.num_rows > 500


# --- several agents at once ---------------------------------------------------


def test_two_agents_record_at_once(tmp_path, redis):
    """Each agent has its own kernel-counter array: one records redis by
    inference while another records a marked server, both with counters;
    a third agent on the marked server is refused (one agent per process)."""
    if not SERVER.exists():
        pytest.skip("test server not built")
    srv, port = redis
    rec_a, rec_b = tmp_path / "a", tmp_path / "b"
    a = subprocess.Popen(
        [str(AGENT), "record", "-o", str(rec_a), "-p", str(srv.pid), "--sample", "100%", "--quiet"],
        stderr=subprocess.PIPE,
    )
    wait_meta(rec_a, a)
    mport = free_port()
    b = subprocess.Popen(
        [
            str(AGENT),
            "record",
            "-o",
            str(rec_b),
            "--sample",
            "100%",
            "--quiet",
            "--mode",
            "marker",
            "--",
            str(SERVER),
            "--port",
            str(mport),
            "--cpu",
            "0",
            "--work-us",
            "20",
            "--inject",
            "none",
            "--seed",
            "1",
        ],
        stderr=subprocess.PIPE,
    )
    wait_port(mport)
    wait_meta(rec_b, b)
    assert a.poll() is None, a.stderr.read().decode()
    load(port, 1000, 1.0)
    load(mport, 1000, 1.0, protocol="line")
    out = subprocess.run(["pgrep", "-P", str(b.pid)], capture_output=True, text=True)
    marked = int(out.stdout.split()[0])
    res = subprocess.run(
        [str(AGENT), "record", "-o", str(tmp_path / "c"), "-p", str(marked), "--mode", "marker"],
        capture_output=True,
        text=True,
    )
    err = one_line_error(res)
    assert f"pid {b.pid}" in err and "another tailscope agent" in err, err
    for p in (a, b):
        p.send_signal(signal.SIGINT)
    assert a.wait(timeout=30) == 0, a.stderr.read().decode()
    assert b.wait(timeout=30) == 0, b.stderr.read().decode()
    for rec, mode in ((rec_a, "infer"), (rec_b, "marker")):
        meta, t = read_rec(rec)
        assert meta["mode"] == mode
        assert t is not None and t.num_rows > 500, (mode, t and t.num_rows)
        valid = sum(t.column("counters_valid").to_pylist())
        assert valid >= 0.9 * t.num_rows, (mode, valid, t.num_rows)


# --- bad input ---------------------------------------------------------------


def test_no_such_pid(tmp_path):
    res = subprocess.run(
        [*TAILSCOPE, "record", "-o", str(tmp_path / "r"), "-p", "4999999"], capture_output=True, text=True
    )
    assert "4999999" in one_line_error(res)


def test_output_dir_exists_needs_force(tmp_path, redis):
    srv, _ = redis
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    res = subprocess.run([*TAILSCOPE, "record", "-o", str(out), "-p", str(srv.pid)], capture_output=True, text=True)
    assert "--force" in one_line_error(res)
    assert (out / "keep.txt").read_text() == "user data"


def test_not_root_says_what_is_missing(tmp_path, redis):
    srv, _ = redis
    if not shutil.which("setpriv"):
        pytest.skip("setpriv missing")
    res = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            str(AGENT),
            "record",
            "-o",
            str(tmp_path / "r"),
            "-p",
            str(srv.pid),
        ],
        capture_output=True,
        text=True,
    )
    err = one_line_error(res)
    assert any(w in err.lower() for w in ("root", "cap_bpf", "capabilit", "permission")), err


def test_bad_arguments(tmp_path):
    res = subprocess.run(
        [str(AGENT), "record", "-o", str(tmp_path / "r"), "--sample", "150%", "-p", "1"], capture_output=True, text=True
    )
    one_line_error(res)
