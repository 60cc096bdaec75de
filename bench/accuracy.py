#!/usr/bin/env python3
"""Accuracy suite: does tailscope rank an injected cause first?

The test server (tests/accuracy/server.c, built with libtailscope, its request
thread pinned to CPU 0) injects one cause at a time; ground truth stays here,
the analyser only sees the recording:

    hog     CPU-hog thread on the same CPU            -> runnable_wait_ns
    lock    another thread holds the handler's mutex  -> blocked_wait_ns
    faults  MADV_DONTNEED + re-touch in some handlers -> fault_user_count
    ipi     mprotect loop on the other CPU (TLB IPIs) -> irq_ns
    none    null run: no cause but the platform's interrupts may claim > 10% of p99

For each cause and seed: launch the server under `tailscope-agent record` in
marker mode at 100% sampling, drive open-loop load from CPU 1, then rank with
`tailscope report --json`. Also checks the accounting identity in
instrumented mode: on-CPU + runnable + blocked is within 5% of latency
(median over requests).

Writes bench/results/accuracy.json and bench/results/accuracy.md.
Run: `python bench/accuracy.py [--seeds 5] [--causes hog,lock,...]`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "target" / "release" / "tailscope-agent"
LOADGEN = ROOT / "target" / "release" / "tailscope-loadgen"
SERVER = ROOT / "tests" / "accuracy" / "build" / "server"
RESULTS = ROOT / "bench" / "results"

EXPECTED = {
    "hog": "runnable_wait_ns",
    "lock": "blocked_wait_ns",
    "faults": "fault_user_count",
    "ipi": "irq_ns",
    "none": None,
    "none-short": None,
}
# Events the platform's own interrupts make: the null runs may blame them
# (see WORKLOAD), nothing else.
PLATFORM_EVENTS = ("irq_ns", "softirq_ns", "irq_count", "softirq_count")
# Per-cause workload: (work per request in µs, offered rate in req/s).
# The null run's requests are long (500 µs, 50% load) on purpose. It checks
# that nothing is blamed when nothing was injected, so its requests must be
# long against the platform's own interrupts: on this VM a timer tick takes
# ~20 µs and a loopback reply's softirq 10-30 µs (session 6, bpftrace). With
# 100 µs requests those events ARE the cause of the p99 (irq or softirq at
# 9-12% of p99 in 5 seeds, correctly reported); at 500 µs they are 1-4%.
# Not always: in session 29 two of five 500 µs null runs here put softirq at
# 12% and 19% of p99 (p99 876-883 µs against 573-652 in the others). bpftrace
# on CPU 0 over such runs: NET_RX softirqs of 8-32 µs, with a tail of 47 in
# 100 s at 128 µs to 4 ms (the host holding the vCPU mid-softirq). Those ARE
# the cause of that p99 and the report is right to name them, so the null run
# exempts the platform's interrupt events too (PLATFORM_EVENTS) and checks that
# nothing else (scheduler, blocking, faults, ...) is blamed.
# `none-short` keeps the 100 µs requests of the lock and fault runs as a matched
# control: there only the platform's interrupt events may pass 10%.
# The ipi requests are 500 µs at 1000/s (50% load, like the null run). An
# injected IPI costs ~5 µs of handler time (32 INVLPGs) and lands every ~10 µs
# of a request inside a burst, so irq's share of a request is a fraction of its
# time, whatever its length; the platform's reply softirq is one per request
# (10-40 µs), so its share falls as the request grows. At 100 µs softirq ranked
# first in 2 of 5 seeds on CI; at 200 µs in 2 of 5 on CI (irq 7.5-9%, softirq
# 4.5-13%) and 1 of 5 here in session 29 (irq 8-10%, softirq up to 18%). At
# 500 µs (10 seeds here): irq 7-11% of p99, softirq at most 2.7%.
WORKLOAD = {
    "hog": (200, 2000),
    "lock": (100, 2000),
    "faults": (100, 2000),
    "ipi": (500, 1000),
    "none": (500, 1000),
    # the lock and fault runs' request size, nothing injected: the matched control
    "none-short": (100, 2000),
}
NULL_MAX_PCT = 10.0
ACCOUNTING_TOL = 0.05


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"agent exited early ({proc.returncode}): {proc.stderr.read().decode()[-400:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.3).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"test server did not listen on {port}")


def load_requests(rec: Path) -> dict:
    import pyarrow.dataset as ds

    t = ds.dataset(str(rec / "requests"), format="parquet").to_table()
    return {c: t.column(c).to_numpy(zero_copy_only=False) for c in t.column_names}


def injected_share(truth: Path, request_ids: np.ndarray) -> float | None:
    """Share of the recorded requests that overlapped an injection, from the
    server's ground-truth file (None when the server wrote none). Only ids
    that are in the recording count: the file covers the server's whole run."""
    try:
        ids = {int(ln) for ln in truth.read_text().splitlines() if ln and not ln.startswith("#")}
    except (OSError, ValueError):
        return None
    if not len(request_ids):
        return None
    return float(np.isin(request_ids, np.fromiter(ids, dtype=np.int64, count=len(ids))).mean())


def accounting_error(cols: dict) -> float | None:
    """Median over requests of |on_cpu + runnable + blocked - latency| / latency."""
    ok = cols["counters_valid"].astype(bool)
    if not ok.any():
        return None
    lat = cols["latency_ns"][ok].astype(np.float64)
    acc = cols["on_cpu_ns"][ok].astype(np.float64) + cols["runnable_wait_ns"][ok] + cols["blocked_wait_ns"][ok]
    return float(np.median(np.abs(acc - lat) / np.maximum(lat, 1.0)))


def accounting_error_switched(cols: dict) -> float | None:
    """The same, over requests that context-switched at least once: the ones
    where the identity is not a matter of one uninterrupted on-CPU interval."""
    sw = cols["counters_valid"].astype(bool) & ((cols["voluntary_switch_count"] + cols["involuntary_switch_count"]) > 0)
    if not sw.any():
        return None
    return accounting_error({k: v[sw] for k, v in cols.items()})


def run_one(cause: str, seed: int, port: int, seconds: float, tmp: Path) -> dict:
    work_us, rate = WORKLOAD[cause]
    rec = tmp / f"rec-{cause}-{seed}"
    # The server lists the ids of requests that overlapped an injection: kept
    # out of the analyser, used only to show whether an injection reached the
    # requests at all (a hog that never preempted the worker is not evidence).
    truth = tmp / f"truth-{cause}-{seed}.txt"
    agent = subprocess.Popen(
        [
            str(AGENT),
            "record",
            "-o",
            str(rec),
            "--force",
            "--sample",
            "100%",
            "--mode",
            "marker",
            "--duration",
            str(seconds + 2.5),
            "--quiet",
            "--",
            str(SERVER),
            "--port",
            str(port),
            "--cpu",
            "0",
            "--work-us",
            str(work_us),
            "--inject",
            cause.split("-")[0],
            "--seed",
            str(seed),
            "--truth",
            str(truth),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_port(port, agent)
        subprocess.run(
            [
                str(LOADGEN),
                "--protocol",
                "line",
                "--target",
                f"127.0.0.1:{port}",
                "--rate",
                str(rate),
                "--duration",
                str(seconds),
                "--cpu",
                "1",
                "--seed",
                str(seed),
                "--connections",
                "4",
                "--json",
                str(tmp / "load.json"),
                "--quiet",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if agent.wait(timeout=60) != 0:
            raise RuntimeError(f"agent failed: {agent.stderr.read().decode()[-400:]}")
    finally:
        if agent.poll() is None:
            agent.terminate()
            agent.wait(timeout=30)
    rep = subprocess.run(
        [sys.executable, "-m", "tailscope", "report", str(rec), "--json"], capture_output=True, text=True
    )
    if rep.returncode != 0:
        raise RuntimeError(f"report failed: {rep.stderr.strip()}")
    ranked = json.loads(rep.stdout)
    causes = ranked.get("causes", [])
    cols = load_requests(rec)
    return {
        "injected_share": injected_share(truth, cols["request_id"].astype(np.int64)),
        "cause": cause,
        "seed": seed,
        "top": causes[0]["event"] if causes else None,
        "top_pct": causes[0].get("impact_pct_of_target") if causes else 0.0,
        "ranking": [(c["event"], c.get("impact_pct_of_target")) for c in causes[:5]],
        "all": [(c["event"], c.get("impact_pct_of_target")) for c in causes],
        "max_pct": max((c.get("impact_pct_of_target") or 0.0 for c in causes), default=0.0),
        "requests": len(cols["latency_ns"]),
        "p99_us": float(np.percentile(cols["latency_ns"], 99) / 1e3) if len(cols["latency_ns"]) else None,
        "accounting_error": accounting_error(cols),
        "accounting_error_switched": accounting_error_switched(cols),
    }


def verdict(cause: str, runs: list[dict]) -> dict:
    if cause in ("none", "none-short"):
        ok = sum(1 for r in runs if all((p or 0.0) <= NULL_MAX_PCT for e, p in r["all"] if e not in PLATFORM_EVENTS))
        return {
            "passed": ok == len(runs),
            "score": f"{ok}/{len(runs)} runs with no non-interrupt cause > {NULL_MAX_PCT:.0f}% of p99",
        }
    ok = sum(1 for r in runs if r["top"] == EXPECTED[cause])
    need = max(1, (4 * len(runs) + 4) // 5)  # 4 of 5
    return {"passed": ok >= need, "score": f"{ok}/{len(runs)} seeds ranked first"}


def run_suite(causes: list[str], seeds: int, seconds: float) -> dict:
    for exe in (AGENT, LOADGEN, SERVER):
        if not exe.exists():
            raise SystemExit(f"accuracy: {exe} not built; run `make build`")
    out: dict = {"causes": {}, "seconds": seconds, "seeds": seeds}
    port = 18000 + os.getpid() % 1000
    with tempfile.TemporaryDirectory(prefix="ts-acc-") as td:
        for cause in causes:
            runs = []
            for seed in range(1, seeds + 1):
                port += 1
                r = run_one(cause, seed, port, seconds, Path(td))
                print(
                    f"accuracy: {cause} seed {seed}: top={r['top']} ({r['top_pct']}) "
                    f"p99={r['p99_us']} us injected_share={r['injected_share']} "
                    f"acc_err={r['accounting_error']}",
                    file=sys.stderr,
                    flush=True,
                )
                runs.append(r)
            out["causes"][cause] = {"expected": EXPECTED[cause], "runs": runs, **verdict(cause, runs)}
    errs = [
        r["accounting_error"] for c in out["causes"].values() for r in c["runs"] if r["accounting_error"] is not None
    ]
    out["accounting_error_median"] = float(np.median(errs)) if errs else None
    out["accounting_passed"] = bool(errs) and out["accounting_error_median"] <= ACCOUNTING_TOL
    sw = [
        r["accounting_error_switched"]
        for c in out["causes"].values()
        for r in c["runs"]
        if r.get("accounting_error_switched") is not None
    ]
    out["accounting_error_switched_median"] = float(np.median(sw)) if sw else None
    return out


def render(res: dict, command: str) -> str:
    lines = [
        "# Accuracy: injected cause ranked first (VarMRI, marker mode, 100% sampling)",
        "",
        f"Reproduce: `{command}`",
        "",
        "| injected | work/request, rate | expected first | result | rankings (top event, % of p99) per seed "
        "| requests overlapping an injection, per seed | passed |",
        "|---|---|---|---|---|---|---|",
    ]
    for cause, c in res["causes"].items():
        per_seed = "; ".join(f"{r['top']} {r['top_pct'] if r['top_pct'] is not None else 0:.0f}%" for r in c["runs"])
        work_us, rate = WORKLOAD[cause]
        reach = (
            "; ".join(
                "—" if r.get("injected_share") is None else f"{100 * r['injected_share']:.0f}%" for r in c["runs"]
            )
            if c["expected"]
            else "—"
        )
        lines.append(
            f"| {cause} | {work_us} µs, {rate}/s | {c['expected'] or '— (null run)'} | {c['score']} | "
            f"{per_seed} | {reach} | "
            f"{'yes' if c['passed'] else 'NO'} |"
        )
    e = res.get("accounting_error_median")
    lines += [
        "",
        f"Accounting identity (on-CPU + runnable + blocked vs latency, median relative error "
        f"over all runs): {'n/a' if e is None else f'{100 * e:.2f}%'} "
        f"(limit {100 * ACCOUNTING_TOL:.0f}%): {'pass' if res['accounting_passed'] else 'FAIL'}",
    ]
    sw = res.get("accounting_error_switched_median")
    if sw is not None:
        lines.append(f"Over requests that context-switched at least once: {100 * sw:.2f}%.")
    lines += [
        "",
        "The null run's requests are 500 µs: with 100 µs requests this VM's own timer ticks "
        "(~20 µs) and loopback reply softirqs (10-30 µs) are genuinely the cause of p99 "
        "(9-12% of it), see WORKLOAD in bench/accuracy.py. `none-short` is the matched control "
        "at the lock and fault runs' 100 µs. In both null runs only the platform's interrupt events "
        "may pass 10%: the host sometimes holds the vCPU inside a softirq for 0.1-4 ms (bpftrace), "
        "and then that softirq is the cause of p99.",
    ]
    return "\n".join(lines) + "\n"


def write_results(res: dict, command: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "accuracy.json").write_text(json.dumps({"command": command, **res}, indent=2))
    (RESULTS / "accuracy.md").write_text(render(res, command))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--causes", default=",".join(EXPECTED))
    args = ap.parse_args()
    res = run_suite(args.causes.split(","), args.seeds, args.seconds)
    cmd = "python bench/accuracy.py " + " ".join(sys.argv[1:])
    write_results(res, cmd.strip())
    print(render(res, cmd.strip()))
    ok = all(c["passed"] for c in res["causes"].values()) and res["accounting_passed"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
