#!/usr/bin/env python3
"""A/B probe for the breakwater bench: interleaved runs of a few variants at
one demand, with the server's messages counted per type and its CPU split
per thread. Not part of `make bench`; used to decide what the bench runs.

    flock -x /tmp/ts-quiet.lock .venv/bin/python bench/breakwater/probe.py \\
        --control breakwater --demand 2 --runs 3 \\
        --variant 'base||' --variant 'slice100|--io-slice-us 100|'
    # server-pushed credits (session 7) against the thesis protocol:
    ... --variant 'thesis||' --variant 'push||--bw-push'
    # demand lines (session 10) against speculative pushes:
    ... --variant 'spec|--no-demand|--bw-push' --variant 'demand||--bw-push'

A variant is `name|bw-server flags|loadgen flags`. `--closed` instead runs
the closed loop of the bench's overhead line (8 in flight, one per
connection) and prints req/s. Capacity is measured first (closed loop, no
control, default flags) unless `--capacity` is given. Medians are printed
per variant; `--json` keeps every run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench


def cpu_times() -> dict[str, list[int]]:
    """Per-CPU jiffies from /proc/stat: cpuN -> [busy, idle(+iowait), softirq]."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        f = line.split()
        if f and f[0].startswith("cpu") and f[0] != "cpu":
            v = [int(x) for x in f[1:]]
            out[f[0]] = [sum(v[:8]) - v[3] - v[4], v[3] + v[4], v[6]]
    return out


def accounted(fn, *a, **kw) -> tuple[dict, dict]:
    """Run `fn` and return (its result, CPU accounting over the call): per-CPU
    busy seconds (everything the kernel ran there, softirq included),
    children's CPU (server + load generator, both waited for inside)."""
    tick = os.sysconf("SC_CLK_TCK")
    c0, r0 = cpu_times(), resource.getrusage(resource.RUSAGE_CHILDREN)
    res = fn(*a, **kw)
    c1, r1 = cpu_times(), resource.getrusage(resource.RUSAGE_CHILDREN)
    acc = {}
    for cpu in sorted(c1):
        busy = (c1[cpu][0] - c0[cpu][0]) / tick
        idle = (c1[cpu][1] - c0[cpu][1]) / tick
        acc[f"{cpu}_busy"] = busy / max(busy + idle, 1e-9)
        acc[f"{cpu}_softirq_s"] = (c1[cpu][2] - c0[cpu][2]) / tick
        acc[f"{cpu}_wall_s"] = busy + idle
    acc["children_cpu_s"] = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return res, acc


def per_run(r: dict, cap: float, dur: float) -> dict:
    s = r["server"]
    adm = max(s.get("admitted", 0), 1)
    th = s.get("threads_cpu_s", {})
    io = th.get("bw-server", 0.0)
    worker = sum(v for k, v in th.items() if k.startswith("bw-worker"))
    arrivals = s.get("arrivals", 0)
    requests = arrivals - s.get("credit_waits", 0) - s.get("deregisters", 0)
    return {
        "goodput_x": r["goodput_rps"] / cap,
        "p99_us": r["p99_us"],
        "reject_p99_us": r["reject_p99_us"],
        "reject_p50_us": r["reject_p50_us"],
        # The load generator's worst lag behind its own schedule: when it
        # lags, replies (rejects included) wait in its socket too.
        "max_send_lag_us": r["max_send_lag_us"],
        "expired": r["expired"],
        "msgs_per_admitted": arrivals / adm,
        "requests_per_admitted": requests / adm,
        "credit_waits_per_admitted": s.get("credit_waits", 0) / adm,
        "parked_waits_per_admitted": s.get("credit_waits_parked", 0) / adm,
        "rejects_per_admitted": s.get("rejected", 0) / adm,
        "no_credit_per_admitted": s.get("rejected_no_credit", 0) / adm,
        "aqm_per_admitted": s.get("rejected_queue_delay", 0) / adm,
        "registers_per_admitted": s.get("registers", 0) / adm,
        "pushed_per_admitted": s.get("pushed_credits", 0) / adm,
        "push_chunks_per_admitted": s.get("push_chunks", 0) / adm,
        "demand_lines_per_admitted": s.get("demand_lines", 0) / adm,
        "wanting_end": s.get("wanting_now", 0),
        "io_us_per_msg": io * 1e6 / max(arrivals, 1),
        "worker_us_per_admitted": worker * 1e6 / adm,
        "server_us_per_admitted": s.get("cpu_s", 0.0) * 1e6 / adm,
        "server_busy": s.get("cpu_s", 0.0) / dur,
        "c_total_end": s.get("control", 0.0),
        **split_fields(r.get("split"), s, adm),
    }


def split_fields(sp: dict | None, s: dict, adm: int) -> dict:
    """Where admitted requests' latency went: the load generator's lag, the
    wait at the client layer, send to reply (loadgen), and the server's own
    view (FIFO wait, sojourn); `late_*`: means over the replies after the SLO."""
    out: dict = {}
    if sp:
        for part in ("lag", "client_wait", "server"):
            out[f"{part}_p50_us"] = sp[part]["p50"]
            out[f"{part}_p99_us"] = sp[part]["p99"]
        out["late_per_admitted"] = sp["late"] / adm
        for part in ("lag", "client_wait", "server"):
            out[f"late_mean_{part}_us"] = sp.get(f"late_mean_{part}") or 0.0
    for name in ("queue_wait", "sojourn"):
        b = s.get(name)
        if b:
            out[f"srv_{name}_p99_us"] = b["p99_us"]
            out[f"srv_{name}_over_1ms_per_admitted"] = b["over_1ms"] / adm
    b = s.get("aqm_budget")
    if b:
        out["aqm_budget_p50_us"] = b["p50_us"]
        out["aqm_budget_p90_us"] = b["p90_us"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--control", default="breakwater")
    ap.add_argument("--demand", type=float, default=2.0, help="multiple of capacity (open loop)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--capacity", type=float, default=None)
    ap.add_argument("--closed", action="store_true", help="closed loop, 8 in flight, req/s")
    ap.add_argument("--variant", action="append", default=[], help="name|server flags|loadgen flags")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    variants = []
    for v in args.variant or ["base||"]:
        parts = [*v.split("|"), "", ""][:3]
        if not parts[0]:
            bench.die(f"--variant {v!r}: needs a name")
        variants.append((parts[0], shlex.split(parts[1]), shlex.split(parts[2])))
    if args.runs < 1:
        bench.die("--runs must be at least 1")
    bench.build()
    out: dict = {"args": vars(args), "runs": {n: [] for n, _, _ in variants}}
    if args.closed:
        for _ in range(args.runs):
            for name, sx, lx in variants:
                rps = bench.capacity("exponential", args.control, depth=1, server_extra=sx, lg_extra=lx, push=False)
                out["runs"][name].append({"rps": rps})
                print(f"  {name:>14}: {rps:7.0f} req/s", flush=True)
        print()
        for name, _, _ in variants:
            rows = [r["rps"] for r in out["runs"][name]]
            print(f"{name:>14}: median {statistics.median(rows):7.0f} req/s  runs {[round(x) for x in rows]}")
    else:
        cap = args.capacity or bench.capacity("exponential")
        out["capacity_rps"] = cap
        print(f"capacity {cap:.0f} req/s; {args.control} at {args.demand}x", flush=True)
        dur, warm = 2.0, 0.5
        for _ in range(args.runs):
            for name, sx, lx in variants:
                r, acc = accounted(
                    bench.run_one,
                    args.control,
                    args.demand * cap,
                    duration=dur,
                    warmup=warm,
                    capacity=cap,
                    server_extra=sx,
                    lg_extra=lx,
                    push=False,  # the variant's own flags decide (--bw-push)
                )
                row = per_run(r, cap, dur + warm)
                srv_cpu = r["server"].get("cpu_s", 0.0)
                row["loadgen_cpu_s"] = acc["children_cpu_s"] - srv_cpu
                row["server_cpu_s"] = srv_cpu
                for cpu in ("cpu0", "cpu1"):
                    row[f"{cpu}_busy"] = acc.get(f"{cpu}_busy", 0.0)
                    row[f"{cpu}_softirq_s"] = acc.get(f"{cpu}_softirq_s", 0.0)
                # CPU 0 time not spent by the server: softirq of the load's
                # sends lands on the load's CPU; anything else here is foreign.
                row["cpu0_other_s"] = acc.get("cpu0_busy", 0.0) * acc.get("cpu0_wall_s", 0.0) - srv_cpu
                row["expired_at_client"] = r["expired"]
                row["server_rejected"] = r["server"].get("rejected", 0)
                row["admitted"] = r["server"].get("admitted", 0)
                row["late_admitted_per_s"] = r["throughput_rps"] - r["goodput_rps"]
                row["server"] = r["server"]
                out["runs"][name].append(row)
                print(
                    f"  {name:>14}: goodput {row['goodput_x']:.3f}x  p99 {row['p99_us']:6.0f}  "
                    f"rej p99 {row['reject_p99_us']:6.0f} (p50 {row['reject_p50_us']:.0f}, "
                    f"lg lag {row['max_send_lag_us']:.0f})  msgs/adm {row['msgs_per_admitted']:.2f} "
                    f"(waits {row['credit_waits_per_admitted']:.2f}, parked {row['parked_waits_per_admitted']:.2f}, "
                    f"rejects {row['rejects_per_admitted']:.2f}, pushed {row['pushed_per_admitted']:.2f} "
                    f"in {row['push_chunks_per_admitted']:.2f} chunks, "
                    f"demand lines {row['demand_lines_per_admitted']:.2f})  io {row['io_us_per_msg']:.1f} us/msg  "
                    f"worker {row['worker_us_per_admitted']:.0f} us/adm  busy {row['server_busy']:.2f}  "
                    f"cpu0 {row['cpu0_busy']:.2f} (other {row['cpu0_other_s']:.2f} s) cpu1 {row['cpu1_busy']:.2f}  "
                    f"loadgen {row['loadgen_cpu_s']:.2f} s  expired@client {row['expired_at_client']}  "
                    f"srv rejects {row['server_rejected']}  late/s {row['late_admitted_per_s']:.0f}",
                    flush=True,
                )
        print()
        keys = [k for k in out["runs"][variants[0][0]][0] if k != "server"]
        print("median | " + " | ".join(n for n, _, _ in variants))
        for k in keys:
            vals = [statistics.median(r[k] for r in out["runs"][n]) for n, _, _ in variants]
            print(f"{k} | " + " | ".join(f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}" for v in vals))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
