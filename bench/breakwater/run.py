#!/usr/bin/env python3
"""Bench part `breakwater`: overload control measured against its baselines.

Real runs on loopback: `bw-server` (hyper HTTP/2, one FIFO dispatcher and one
worker, a busy loop of exponential or bimodal service with mean 100 µs)
pinned to CPU 0; `tailscope-loadgen --protocol breakwater` (1000 logical
clients over 8 HTTP/2 connections, each running the client layer) pinned to
CPU 1. Capacity is measured first (closed loop, no control); every demand is
a multiple of it. SLO = 2 ms (10 x (service + RTT), the thesis's rule, with
a ~100 µs loopback HTTP/2 RTT).

Experiments: demand sweep 0.1x..2x for none / breakwater / SEDA / DAGOR /
gradient / tower's ConcurrencyLimit+LoadShed (2x repeated, medians); bimodal
at 2x; a load shift 0.5 -> 0.9 -> 1.4 -> 0.9 -> 0.5x in 20 ms bins; the
ablation (credits, + speculation, + AQM); message counts; the lock-bound
microbenchmark (two mutex paths, p = 20%) comparing the efficiency signal
(+ASQM), the delay signal and SEDA. Then the discrete-event simulator (10 µs
service, 10 cores, 1000 clients, 10 µs RTT) for the shapes of the thesis's
Fig. 2.7/2.8/2.11/2.12/2.13.

Writes bench/results/breakwater.{md,json,html}; prints the comparison table
as ratios. `--quick` shortens everything (for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "target" / "release"
SERVER = TARGET / "examples" / "bw-server"
LOADGEN = TARGET / "tailscope-loadgen"
SIM = TARGET / "bw-sim"
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))

SLO_US = 2000
MEAN_US = 100
CLIENTS = 1000
CONNECTIONS = 8
CONTROLS = ["none", "breakwater", "seda", "dagor", "gradient", "tower"]
TOWER_LIMIT = 8
# Where the one worker runs (bw-server --worker-priority), the same for
# every control. `inline` (session 9, the default): no worker thread; the
# worker runs each job on the I/O thread between socket polls (run to
# completion, as on a Shenango core), so replies, admissions and rejects
# never wait out a worker's time slice and no request costs a cross-thread
# wake-up. Interleaved A/B at 2x: Breakwater 0.70 -> 0.85 of a 7500 req/s
# capacity; no control's closed loop 7476 -> 8024 req/s
# (docs/breakwater.md, session 9). `normal`: a worker thread sharing CPU 0
# with the I/O thread (sessions 1-8). `idle` (SCHED_IDLE workers) livelocks
# a closed loop (session 5). Runs with more than one worker (the lock part)
# use `normal` threads when `inline` is asked for.
WORKER_PRIORITY = os.environ.get("BW_WORKER_PRIORITY", "inline")
if WORKER_PRIORITY not in ("inline", "normal", "idle"):
    print(
        f"bench breakwater: error: BW_WORKER_PRIORITY must be inline, normal or idle, got {WORKER_PRIORITY!r}",
        file=sys.stderr,
    )
    sys.exit(1)
# The I/O thread's EEVDF time slice in µs (bw-server --io-slice-us; 0: the
# kernel's default), the same for every control.
IO_SLICE_US = int(os.environ.get("BW_IO_SLICE_US", "0"))
PARTS = ["overhead", "sweep", "openloop", "bimodal", "shift", "ablation", "lock", "sim"]
# Open-loop capacity scan (part `openloop`): no control at these multiples of
# the closed-loop capacity, with the sweep's own Poisson clients (1000 over 8
# connections); see docs/breakwater.md, session 8.
OPENLOOP_DEMANDS = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5]
# Breakwater's client protocol for a drained client (no credit, nothing in
# flight): `push` (session 7; loadgen --bw-push: it waits for an explicit
# credit the server pushes, riding on a response to another client of its
# connection or on the connection's credit stream) or `wait` (the thesis
# protocol over HTTP: it sends a credit wait and the server answers it).
# The ablation part always runs both (docs/breakwater.md, session 7).
PROTOCOL = os.environ.get("BW_PROTOCOL", "push")
if PROTOCOL not in ("push", "wait"):
    print(f"bench breakwater: error: BW_PROTOCOL must be push or wait, got {PROTOCOL!r}", file=sys.stderr)
    sys.exit(1)


def push_flags(client_control: str, lg_extra: list[str], push: bool | None) -> list[str]:
    """`--bw-push` for a Breakwater client unless told otherwise (or carrying)."""
    push = PROTOCOL == "push" if push is None else push
    if push and client_control == "breakwater" and "--bw-carry" not in lg_extra:
        return ["--bw-push"]
    return []


def die(msg: str) -> None:
    print(f"bench breakwater: error: {msg}", file=sys.stderr)
    sys.exit(1)


def build() -> None:
    cmd = [
        "cargo",
        "build",
        "--release",
        "-q",
        "-p",
        "tailscope-breakwater",
        "--examples",
        "--bins",
        "-p",
        "tailscope-loadgen",
    ]
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        die("cargo build failed")


def have_two_cpus() -> bool:
    return len(os.sched_getaffinity(0)) >= 2


class Server:
    """bw-server pinned to CPU 0, stopped with SIGTERM (it writes its stats)."""

    def __init__(
        self, port: int, control: str, service: str, extra: list[str], slo_us: int, mean_us: int, workers: int = 1
    ):
        self.stats_path = Path(tempfile.mkstemp(prefix="bw-stats-", suffix=".json")[1])
        # Inline means one worker on the I/O thread: more workers get threads.
        prio = "normal" if WORKER_PRIORITY == "inline" and workers != 1 else WORKER_PRIORITY
        args = [
            str(SERVER),
            "--listen",
            f"127.0.0.1:{port}",
            "--control",
            control,
            "--service",
            service,
            "--mean-us",
            str(mean_us),
            "--slo-us",
            str(slo_us),
            "--workers",
            str(workers),
            "--tower-limit",
            str(TOWER_LIMIT),
            *([] if "--worker-priority" in extra else ["--worker-priority", prio]),
            *([] if "--io-slice-us" in extra else ["--io-slice-us", str(IO_SLICE_US)]),
            "--stats",
            str(self.stats_path),
            *extra,
        ]
        self.proc = subprocess.Popen(
            ["taskset", "-c", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        line = self.proc.stdout.readline()
        if "listening" not in line:
            err = self.proc.stderr.read()
            die(f"bw-server did not start: {line.strip()} {err.strip()}")

    def cpu_s(self) -> float:
        """CPU time (user + system) the server has used so far."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return 0.0

    def thread_cpu_s(self) -> dict[str, float]:
        """CPU time per thread name (bw-server = the I/O thread, bw-worker-N,
        bw-ticker), summed over threads of the same name."""
        out: dict[str, float] = {}
        tick = os.sysconf("SC_CLK_TCK")
        try:
            tasks = list(Path(f"/proc/{self.proc.pid}/task").iterdir())
        except OSError:
            return out
        for t in tasks:
            try:
                head, rest = (t / "stat").read_text().rsplit(")", 1)
                name = head.split("(", 1)[1]
                f = rest.split()
                out[name] = out.get(name, 0.0) + (int(f[11]) + int(f[12])) / tick
            except (OSError, ValueError, IndexError):
                continue
        return out

    def stop(self) -> dict:
        cpu = self.cpu_s()
        threads = self.thread_cpu_s()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            stats = json.loads(self.stats_path.read_text())
            stats["cpu_s"] = cpu
            stats["threads_cpu_s"] = threads
            return stats
        except (OSError, ValueError):
            return {}
        finally:
            self.stats_path.unlink(missing_ok=True)


PORT = [18600]


def loadgen(
    port: int, control: str, rate: str, duration: float, warmup: float, extra: list[str], slo_us: int = SLO_US
) -> dict:
    out = Path(tempfile.mkstemp(prefix="bw-lg-", suffix=".json")[1])
    cmd = [
        "taskset",
        "-c",
        "1",
        str(LOADGEN),
        "--target",
        f"127.0.0.1:{port}",
        "--protocol",
        "breakwater",
        "--control",
        control,
        "--clients",
        str(CLIENTS),
        "--connections",
        str(CONNECTIONS),
        "--rate",
        rate,
        "--duration",
        str(duration),
        "--warmup",
        str(warmup),
        "--slo-us",
        str(slo_us),
        "--cpu",
        "1",
        "--timeout-ms",
        "500",
        "--json",
        str(out),
        "-q",
        *extra,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"loadgen failed: {r.stderr.strip()} ({shlex.join(cmd)})")
    data = json.loads(out.read_text())
    out.unlink(missing_ok=True)
    return data


def run_one(
    control: str,
    rate: float,
    *,
    service: str = "exponential",
    duration: float = 2.0,
    warmup: float = 0.5,
    steps: str | None = None,
    server_extra: list[str] | None = None,
    capacity: float = 1.0,
    slo_us: int = SLO_US,
    mean_us: int = MEAN_US,
    workers: int = 1,
    lg_extra: list[str] | None = None,
    push: bool | None = None,
) -> dict:
    """One server + one loadgen run; returns the merged summary. `push`:
    Breakwater's protocol (None: `PROTOCOL`)."""
    PORT[0] += 1
    port = PORT[0]
    server_control = control
    client_control = {"tower": "none", "gradient": "gradient"}.get(control, control)
    if control == "breakwater-efficiency":
        client_control = "breakwater"
    srv = Server(port, server_control, service, server_extra or [], slo_us, mean_us, workers)
    share = capacity / CLIENTS
    extra = ["--seda-initial-rate", f"{share:.4f}", "--seda-adj-i", f"{0.005 * share:.6f}"]
    if steps:
        extra += ["--steps", steps]
    extra += lg_extra or []
    extra += push_flags(client_control, extra, push)
    try:
        lg = loadgen(port, client_control, f"{rate:.0f}", duration, warmup, extra, slo_us)
    finally:
        stats = srv.stop()
    return summarize(lg, stats, rate)


def summarize(lg: dict, stats: dict, rate: float) -> dict:
    srv_req = stats.get("admitted", 0) + stats.get("rejected", 0)
    done = stats.get("completed_ok", 0)
    return {
        # Server CPU (whole run, warm-up included) per request it completed.
        "cpu_us_per_completed": (stats.get("cpu_s", 0.0) * 1e6 / done) if done else 0.0,
        "demand_rps": rate,
        "goodput_rps": lg["goodput_rps"],
        "throughput_rps": lg["achieved_rps"] - lg["rejected"] / lg["duration_s"],
        "p99_us": lg["latency_us"]["p99"],
        "p50_us": lg["latency_us"]["p50"],
        "rejected": lg["rejected"],
        "expired": lg["expired"],
        "client_dropped": lg["client_dropped"],
        "scheduled": lg["scheduled"],
        "reject_p50_us": lg["reject_latency_us"]["p50"],
        "reject_p99_us": lg["reject_latency_us"]["p99"],
        "reject_mean_us": lg["reject_latency_us"]["mean"],
        "server_drop_rate": (stats.get("rejected", 0) / srv_req) if srv_req else 0.0,
        "server": stats,
        "max_send_lag_us": lg["max_send_lag_us"],
        # Where admitted requests' latency went (loadgen: lag, client wait, send to reply).
        "split": lg.get("admitted_split_us"),
        "timeseries": lg["timeseries"],
        "duration_s": lg["duration_s"],
    }


def capacity(
    service: str,
    control: str = "none",
    depth: int = 4,
    server_extra: list[str] | None = None,
    lg_extra: list[str] | None = None,
    push: bool | None = None,
) -> float:
    """Closed-loop maximum throughput (8 connections x `depth` outstanding,
    i.e. 8 x depth logical clients each with one request in flight) through
    `control`, refused requests not counted."""
    PORT[0] += 1
    srv = Server(PORT[0], control, service, server_extra or [], SLO_US, MEAN_US)
    try:
        extra = ["--max-outstanding-per-conn", str(depth), *(lg_extra or [])]
        extra += push_flags(control, extra, push)
        lg = loadgen(PORT[0], control, "max", 2.0, 0.5, extra)
    finally:
        srv.stop()
    return lg["achieved_rps"] - lg["rejected"] / lg["duration_s"]


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def settle_ms(bins: list[dict], step_ms: float, phase_ms: float, slo_us: float, bin_ms: float = 20.0):
    """Time from the step to the first 3-bin window whose mean goodput is
    within 5% of the phase's converged goodput (median of its second half)
    and whose bins all have p99 <= 2 x SLO. None if never."""
    inside = [b for b in bins if step_ms <= b["t_ms"] < step_ms + phase_ms]
    if len(inside) < 6:
        return None
    good = [b["good"] / (bin_ms / 1e3) for b in inside]
    converged = statistics.median(good[len(good) // 2 :])
    for k in range(len(inside) - 2):
        window = inside[k : k + 3]
        g = sum(good[k : k + 3]) / 3
        p99_ok = all((b["p99_us"] or 0) <= 2 * slo_us for b in window)
        if converged > 0 and abs(g - converged) <= 0.05 * converged and p99_ok:
            return inside[k]["t_ms"] - step_ms
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    ap.add_argument("--runs", type=int, default=None, help="repeats of the 2x headline runs (default 3; quick 1)")
    ap.add_argument("--skip-real", action="store_true", help="simulator only")
    ap.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="comma-separated subset of " + ",".join(PARTS) + " (default: all). With a subset, the other parts "
        "are kept from the existing bench/results/breakwater.json, so a long bench can run in several "
        "short exclusive-lock pieces; each part records when it ran and the capacity it was measured against",
    )
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        die(f"--parts: unknown part(s) {', '.join(bad) or '(none)'}; choose from {', '.join(PARTS)}")
    runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    if runs < 1:
        die("--runs must be at least 1")
    for tool in ("cargo", "taskset"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            die(f"{tool} not found")
    t0 = time.time()
    build()
    dur = 1.0 if args.quick else 2.0
    warm = 0.3 if args.quick else 0.5
    subset = set(parts) != set(PARTS)
    previous: dict = {}
    if subset and (RESULTS / "breakwater.json").exists():
        try:
            previous = json.loads((RESULTS / "breakwater.json").read_text())
        except ValueError:
            previous = {}
    result: dict = {
        "command": "make bench BENCH=breakwater  (or: .venv/bin/python bench/breakwater/run.py"
        + (" --quick" if args.quick else "")
        + ")",
        "setup": {
            "slo_us": SLO_US,
            "mean_service_us": MEAN_US,
            "clients": CLIENTS,
            "connections": CONNECTIONS,
            "server_cpu": 0,
            "load_cpu": 1,
            "workers": 1,
            "run_s": dur,
            "warmup_s": warm,
            "headline_runs": runs,
            "tower_limit": TOWER_LIMIT,
            "load": os.getloadavg(),
            "worker_priority": WORKER_PRIORITY,
            "io_slice_us": IO_SLICE_US,
            "protocol": PROTOCOL,
            # Free text about the box for this run (BW_NOTE), printed with
            # the setup, e.g. what else was tracing it.
            "note": os.environ.get("BW_NOTE", ""),
        },
    }
    part_log = dict(previous.get("parts_run", {}))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    real_parts = [p for p in parts if p != "sim"]
    real_ok = bool(real_parts) and not args.skip_real and have_two_cpus()
    if real_parts and not real_ok and not args.skip_real:
        print("bench breakwater: fewer than 2 CPUs; skipping the real runs (simulator only)")
    if real_ok:
        print("measuring capacity (closed loop, no control)...", flush=True)
        cap = {"exponential": capacity("exponential"), "bimodal": capacity("bimodal")}
        c = cap["exponential"]
        print(f"  capacity: exponential {c:.0f} req/s, bimodal {cap['bimodal']:.0f} req/s", flush=True)
        for p in real_parts:
            part_log[p] = {
                "at": stamp,
                "capacity_rps": cap,
                "load": result["setup"]["load"],
                "note": result["setup"]["note"],
            }
    if real_ok and "sweep" in parts:
        result["capacity_rps"] = cap
    if real_ok and "overhead" in parts:
        # Overhead at capacity: a closed loop through Breakwater (both
        # halves) against no control, interleaved, medians. 8 requests in
        # flight (one per connection): enough to keep the server saturated,
        # few enough that no control still meets the SLO (~1 ms of queue),
        # so the control has nothing it should refuse: what it loses is its
        # cost. (With 4 per connection the queue is ~3 ms: no control serves
        # everything late and the AQM rightly refuses, and the loop resends
        # every refusal at once.)
        closed = {"none": [], "breakwater": []}
        for _ in range(runs):
            for ctl in closed:
                closed[ctl].append(capacity("exponential", ctl, depth=1))
        result["closed_loop_max"] = {k: {"runs": v, "median": statistics.median(v)} for k, v in closed.items()}
        print(
            "  closed-loop max: "
            + ", ".join(f"{k} {v['median']:.0f} req/s" for k, v in result["closed_loop_max"].items()),
            flush=True,
        )
    if real_ok and "sweep" in parts:
        demands = [0.5, 1.0, 2.0] if args.quick else [0.1, 0.5, 0.9, 1.0, 1.5, 2.0]
        sweep: dict[str, list[dict]] = {k: [] for k in CONTROLS}
        for ctl in CONTROLS:
            for d in demands:
                reps = runs if d == 2.0 else 1
                rows = [run_one(ctl, d * c, duration=dur, warmup=warm, capacity=c) for _ in range(reps)]
                row = {k: (med(rows, k) if isinstance(rows[0][k], (int, float)) else rows[0][k]) for k in rows[0]}
                row["demand_x"] = d
                row["runs"] = [{k: v for k, v in r.items() if k not in ("timeseries", "server")} for r in rows]
                row.pop("timeseries", None)
                sweep[ctl].append(row)
                print(
                    f"  {ctl:>10} {d:>4}x: goodput {row['goodput_rps']:7.0f}  p99 {row['p99_us']:8.0f} us  "
                    f"drop {row['server_drop_rate']:.3f}  reject p99 {row['reject_p99_us']:7.0f} us  "
                    f"expired {row['expired']}",
                    flush=True,
                )
        result["sweep"] = sweep
    if real_ok and "openloop" in parts:
        # Capacity as the open-loop clients see it: what the server with no
        # control completes per second under the sweep's own traffic, and
        # the highest rate it serves within the SLO. Shown next to the
        # closed-loop capacity (the bench's denominator), not instead of it.
        print("open-loop capacity scan (no control)...", flush=True)
        demands = [0.5, 1.0] if args.quick else OPENLOOP_DEMANDS
        rows = []
        for d in demands:
            r = run_one("none", d * c, duration=dur, warmup=warm, capacity=c)
            srv = r["server"]
            th = srv.get("threads_cpu_s", {})
            rows.append(
                {
                    "demand_x": d,
                    "demand_rps": r["demand_rps"],
                    "goodput_rps": r["goodput_rps"],
                    "throughput_rps": r["throughput_rps"],
                    "p99_us": r["p99_us"],
                    "cpu_us_per_completed": r["cpu_us_per_completed"],
                    "io_us_per_msg": th.get("bw-server", 0.0) * 1e6 / max(srv.get("arrivals", 0), 1),
                }
            )
            print(
                f"  none {d:>4}x: offered {r['demand_rps']:7.0f}  completed {r['throughput_rps']:7.0f}  "
                f"goodput {r['goodput_rps']:7.0f}  p99 {r['p99_us']:8.0f} us",
                flush=True,
            )
        best = max(rows, key=lambda x: x["throughput_rps"])
        within = [x for x in rows if x["p99_us"] <= SLO_US and x["goodput_rps"] >= 0.95 * x["demand_rps"]]
        slo_cap = max(within, key=lambda x: x["demand_rps"]) if within else None
        result["open_loop_capacity"] = {
            "closed_loop_rps": c,
            "rows": rows,
            "max_throughput_rps": best["throughput_rps"],
            "max_throughput_at_x": best["demand_x"],
            "slo_capacity_rps": slo_cap["demand_rps"] if slo_cap else 0.0,
            "slo_capacity_x": slo_cap["demand_x"] if slo_cap else 0.0,
        }
    if real_ok and "bimodal" in parts:
        print("bimodal at 2x...", flush=True)
        cb = cap["bimodal"]
        result["bimodal_2x"] = {}
        for ctl in CONTROLS:
            r = run_one(ctl, 2 * cb, service="bimodal", duration=dur, warmup=warm, capacity=cb)
            r.pop("timeseries", None)
            result["bimodal_2x"][ctl] = r
    if real_ok and "shift" in parts:
        print("load shift 0.5 -> 0.9 -> 1.4 -> 0.9 -> 0.5x...", flush=True)
        phase = 0.5 if args.quick else 1.0
        steps = ",".join(f"{x}x:{phase}" for x in (0.5, 0.9, 1.4, 0.9, 0.5))
        shift = {}
        for ctl in ["breakwater", "dagor", "seda", "none"]:
            r = run_one(ctl, c, steps=steps, warmup=warm, capacity=c)
            r["settle_ms_after_1_4x"] = settle_ms(r["timeseries"], 2 * phase * 1e3, phase * 1e3, SLO_US)
            shift[ctl] = r
            print(f"  {ctl:>10}: settles {r['settle_ms_after_1_4x']} ms after the step to 1.4x", flush=True)
        result["shift"] = {"phase_s": phase, "runs": shift}
    if real_ok and "ablation" in parts:
        print("ablation...", flush=True)
        abl = {}
        # The thesis protocol over HTTP (drained clients send credit waits)
        # unless the name says push: without speculation a pushing server
        # knows no drained client's demand, so the first rows keep waits.
        variants = {
            "credits": ["--no-overcommit", "--no-aqm"],
            "credits+speculation": ["--no-aqm"],
            "credits+speculation+aqm": [],
            # Session 4's await: drained clients send their oldest request
            # as the credit wait; Eq. 2.4's floor is 0 (docs/breakwater.md).
            "credits+speculation+aqm+await": ["--carry"],
            # Session 6: await whose expired held requests stay as their
            # clients' credit waits, with Eq. 2.4's floor of 1 (the thesis's).
            "credits+speculation+aqm+await+hold": ["--carry", "--hold-expired", "--overcommit-floor", "1"],
            # Session 7: explicit credits pushed (bw-push on responses to the
            # same connection, else its credit stream); no credit waits.
            "credits+speculation+aqm+push": [],
        }
        for name, flags in variants.items():
            abl[name] = []
            lgx = ["--bw-carry"] if "--carry" in flags else []
            for d in [1.0, 2.0] if not args.quick else [2.0]:
                r = run_one(
                    "breakwater",
                    d * c,
                    server_extra=flags,
                    duration=dur,
                    warmup=warm,
                    capacity=c,
                    lg_extra=lgx,
                    push=name.endswith("+push"),
                )
                r.pop("timeseries", None)
                r["demand_x"] = d
                abl[name].append(r)
        result["ablation"] = abl
    if real_ok and "lock" in parts:
        print("lock-bound microbenchmark (2 mutex paths, p = 20%, 1 ms holds)...", flush=True)
        lock_slo = 10_000
        lock_cap = 1000 / 0.8  # path B (80%) saturates at 1/(0.8 x 1 ms)
        lock = {}
        for name, ctl, extra in [
            ("efficiency+asqm", "breakwater-efficiency", ["--asqm"]),
            ("delay", "breakwater", []),
            ("seda", "seda", []),
        ]:
            lock[name] = []
            for d in [0.8, 2.4] if args.quick else [0.8, 1.6, 2.4]:
                r = run_one(
                    ctl,
                    d * lock_cap,
                    service="lock",
                    server_extra=["--lock-p", "0.2", *extra],
                    duration=dur,
                    warmup=warm,
                    capacity=lock_cap,
                    slo_us=lock_slo,
                    mean_us=1000,
                    workers=32,
                )
                r.pop("timeseries", None)
                r["demand_x"] = d
                lock[name].append(r)
                print(
                    f"  {name:>16} {d}x: goodput {r['goodput_rps']:.0f}  p99 {r['p99_us']:.0f} us  "
                    f"drop {r['server_drop_rate']:.3f}",
                    flush=True,
                )
        result["lock"] = {"capacity_rps": lock_cap, "slo_us": lock_slo, "runs": lock}
    if "sim" in parts:
        print("simulator (10 µs service, 10 cores, 1000 clients)...", flush=True)
        sim_json = Path(tempfile.mkstemp(prefix="bw-sim-", suffix=".json")[1])
        cmd = [str(SIM), "--experiment", "all", "--json", str(sim_json)] + (["--quick"] if args.quick else [])
        if subprocess.run(cmd).returncode != 0:
            die("bw-sim failed")
        result["sim"] = json.loads(sim_json.read_text())
        sim_json.unlink(missing_ok=True)
        part_log["sim"] = {"at": stamp}
    # Parts not run this time come from the previous results.
    for key, part in [
        ("closed_loop_max", "overhead"),
        ("capacity_rps", "sweep"),
        ("sweep", "sweep"),
        ("open_loop_capacity", "openloop"),
        ("bimodal_2x", "bimodal"),
        ("shift", "shift"),
        ("ablation", "ablation"),
        ("lock", "lock"),
        ("sim", "sim"),
    ]:
        if key not in result and key in previous and part not in parts:
            result[key] = previous[key]
    result["parts_run"] = part_log
    if subset:
        result["command"] = (
            "flock -x /tmp/ts-quiet.lock .venv/bin/python bench/breakwater/run.py --parts "
            + ",".join(parts)
            + "  (the other parts kept from earlier pieces: see the part list below; "
            "all at once: make bench BENCH=breakwater)"
        )
    result["elapsed_s"] = round(time.time() - t0, 1)
    from report import render_html, render_md, verdicts

    result["verdicts"] = verdicts(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "breakwater.json").write_text(json.dumps(result, indent=1) + "\n")
    md = render_md(result)
    (RESULTS / "breakwater.md").write_text(md)
    (RESULTS / "breakwater.html").write_text(render_html(result))
    print()
    print(md)
    print(f"wrote {RESULTS}/breakwater.{{md,json,html}} in {result['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
