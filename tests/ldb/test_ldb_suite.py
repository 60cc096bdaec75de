"""LDB correctness suite: function latencies from the real agent's observer against the
target's own timestamps, and the shadow stack's behaviour under recursion, loops, short
high-rate calls, uninstrumented library frames, thread churn, signal handlers, C++
exceptions, longjmp and over-deep stacks. Plus the LDB Fig. 3.1 toy and bad input.

Real parts: the C/C++ targets in tests/ldb built with -finstrument-functions and
libtailscope, the real tailscope-agent (eBPF loaded, observer thread), Parquet read back.
Needs root; skips with the reason otherwise.

Tolerance (the issue's): a call's latency is within 2 scan intervals + 2 µs of the target's
own measurement — the scan interval in which its frame appeared and the one in which it
vanished, which the observer reports per call (functions.error_bound_ns). On a shared
machine the observer can be descheduled, and then those intervals are long; the test prints
them next to the observer's period percentiles.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# LDB_TEST_AGENT: another agent binary (a copy, while the shared target/ is being rebuilt).
AGENT = Path(os.environ.get("LDB_TEST_AGENT") or ROOT / "target" / "release" / "tailscope-agent")
BUILD = HERE / "build"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="recording needs root for eBPF"),
    pytest.mark.skipif(not AGENT.exists(), reason="tailscope-agent not built (make build)"),
]

sys.path.insert(0, str(ROOT / "python"))


@pytest.fixture(scope="session", autouse=True)
def built():
    r = subprocess.run(["make", "-s", "-C", str(HERE)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return BUILD


def run_agent(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the agent; while another agent owns the BPF maps (a concurrent recording on this
    machine), wait and retry rather than fail."""
    deadline = time.time() + 300
    while True:
        r = subprocess.run([str(AGENT), *args], capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0 and "another tailscope agent" in r.stderr and time.time() < deadline:
            time.sleep(3)
            continue
        return r


def record(tmp: Path, mode: str, *extra: str) -> tuple[dict, Path]:
    out = tmp / f"rec-{mode}"
    truth = tmp / f"truth-{mode}.txt"
    # Normal priority: the suite checks what the observer reports when it gets the CPU. At
    # SCHED_IDLE (the default) it gives way to everything else, so on a busy machine it can sit
    # out a whole pass while several threads' calls begin and end, which this suite's
    # one-miss-per-long-gap allowance does not model (docs/ldb.md, "choosing the setting").
    # A pass every 100 µs (the default is 1 ms): the throttled loop, with its idle back-off,
    # at a period well below the shortest call here (1 ms); a test may override it.
    r = run_agent(
        [
            "record",
            "-o",
            str(out),
            "--functions",
            "--fn-normal-priority",
            "--quiet",
            "--fn-period-us",
            "100",
            *extra,
            "--",
            str(BUILD / "ldbtarget"),
            mode,
            str(truth),
        ]
    )
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "meta.json").read_text())
    return meta, out


def functions(out: Path, meta: dict) -> dict[str, np.ndarray]:
    from tailscope.symbols import Symbolizer, modules_of

    t = pq.read_table(out / "functions").to_pydict()
    sym = Symbolizer(modules_of(meta), lines=False)
    names = np.array([sym.lookup(a).name for a in t["fn_addr"]], dtype=object)
    parents = np.array([sym.lookup(a).name if a else "" for a in t["parent_fn"]], dtype=object)
    return {"name": names, "parent": parents, **{k: np.array(v) for k, v in t.items()}}


def truth_rows(tmp: Path, mode: str) -> list[tuple[str, int, int, int, int, int]]:
    """(name, tid, inner start, inner end, outer start, outer end): the callee's own timestamps and
    the caller's around the call. The frame lived at least the inner and at most the outer span."""
    rows = []
    for line in (tmp / f"truth-{mode}.txt").read_text().splitlines():
        name, *ts = line.split()
        if len(ts) == 5:
            rows.append((name, *map(int, ts)))
    return rows


def match(f: dict, name: str, tid: int, start: int, end: int) -> int | None:
    """The FUNCTION row of `name` on thread `tid` that overlaps [start, end] most."""
    sel = np.flatnonzero((f["name"] == name) & (f["tid"] == tid))
    if sel.size == 0:
        return None
    s, e = f["start_ns"][sel].astype(np.int64), (f["start_ns"][sel] + f["latency_ns"][sel]).astype(np.int64)
    ov = np.minimum(e, end) - np.maximum(s, start)
    k = int(np.argmax(ov))
    return int(sel[k]) if ov[k] > 0 else None


def check_against_truth(tmp, mode, meta, f, names, min_rows, skipped_calls=0, threads_per_gap=1):
    """Every timed call was reported, within its scan intervals + 2 µs of the truth: of the
    span between its own timestamps (inside the hooks) and its caller's (outside them).
    `skipped_calls`: calls the runtime counted as not pushed (signal handlers), also allowed
    to be missing. `threads_per_gap`: how many threads run calls at once, so how many calls one
    long observer gap can hide."""
    errs, missing = [], []
    for name, tid, a, b, oa, ob in truth_rows(tmp, mode):
        if name not in names:
            continue
        i = match(f, name, tid, a, b)
        if i is None:
            missing.append((name, a, b))
            continue
        lat = int(f["latency_ns"][i])
        # Distance from the bracket [inner span, outer span]; 0 inside it.
        err = max(b - a - lat, lat - (ob - oa), 0)
        errs.append((err, int(f["error_bound_ns"][i]), name, b - a))
    # A call that begins and ends inside one gap of the observer (descheduled on a busy
    # machine) cannot be seen: allow as many misses as there were passes with such gaps.
    o = meta["ldb"]["observer"]
    shortest = min((b - a for _n, _t, a, b, _oa, _ob in truth_rows(tmp, mode) if _n in names), default=0)
    long_gaps = sum(n for i, n in enumerate(o["period_hist_ns"]) if (1 << (i + 1)) > shortest // 2)
    allowed = long_gaps * threads_per_gap + skipped_calls
    assert len(missing) <= allowed, (
        f"calls the observer never reported: {len(missing)} > {long_gaps} long "
        f"observer gaps + {skipped_calls} skipped: {missing[:5]}"
    )
    assert len(errs) + len(missing) >= min_rows and errs
    beyond = [e for e in errs if e[0] > e[1] + 2000]
    assert not beyond, f"error > scan intervals + 2 µs: {beyond[:5]}"
    o = meta["ldb"]["observer"]
    bounds = np.array([e[1] for e in errs])
    print(
        f"{mode}: {len(errs)} calls; error max {max(e[0] for e in errs)} ns; bound median "
        f"{int(np.median(bounds))} ns; observer period p50 {o['period_p50_ns']} p99 {o['period_p99_ns']} "
        f"max {o['period_max_ns']} ns"
    )
    return errs


def test_known_durations(tmp_path):
    """busy, sleep, lock-wait and I/O functions against their own timestamps."""
    meta, out = record(tmp_path, "durations")
    f = functions(out, meta)
    errs = check_against_truth(tmp_path, "durations", meta, f, {"busy_fn", "sleep_fn", "lock_wait_fn", "io_fn"}, 20)
    assert {e[2] for e in errs} == {"busy_fn", "sleep_fn", "lock_wait_fn", "io_fn"}
    o = meta["ldb"]["observer"]
    assert o["full_walks"] > 0 and o["fast_path"] > 0
    assert meta["ldb"]["runtime_features"] == {"fn_hooks": True, "lock_shim": True, "fn_clock": False}
    # The lock wait is also a MUTEX_WAIT → LOCK episode on the waiter's thread.
    lk = pq.read_table(out / "locks").to_pydict()
    assert lk["event"].count("MUTEX_WAIT") >= 5


def test_recursion_and_loop_call_sites(tmp_path):
    meta, out = record(tmp_path, "recursion")
    f = functions(out, meta)
    check_against_truth(tmp_path, "recursion", meta, f, {"rec_fn", "loop_fn"}, 26)
    rec = f["name"] == "rec_fn"
    # Six levels, three times: every level reported, nested under the previous one.
    assert rec.sum() == 18
    assert sorted(set(f["depth"][rec].tolist())) == sorted(set(range(min(f["depth"][rec]), min(f["depth"][rec]) + 6)))
    assert (f["parent"][rec & (f["depth"] > min(f["depth"][rec]))] == "rec_fn").all()
    # One call site, eight calls: eight rows, not one.
    loop = f["name"] == "loop_fn"
    assert loop.sum() == 8
    assert len(set(f["call_site"][loop].tolist())) == 1


def test_short_high_rate_calls(tmp_path):
    """Millions of ~2 ns calls: the observer discards torn or busy reads and counts them,
    and every row it writes names a real function of the target."""
    meta, out = record(tmp_path, "short", "--fn-period-us", "0")
    o = meta["ldb"]["observer"]
    f = functions(out, meta)
    assert o["invalid"] + o["seqlock_discards"] > 0, o
    known = {"main", "tiny_fn", "marker_fn", "mode_short"}
    assert set(f["name"].tolist()) <= known | {n for n in f["name"] if n.startswith("_ZL")}, set(f["name"].tolist())
    assert (f["latency_ns"] < 10 * 10**9).all()
    check_against_truth(tmp_path, "short", meta, f, {"marker_fn"}, 1)


def test_uninstrumented_library_frames(tmp_path):
    """qsort (libc, not instrumented) calls back into cmp_fn: cmp_fn's caller is sort_fn."""
    meta, out = record(tmp_path, "libcalls")
    f = functions(out, meta)
    check_against_truth(tmp_path, "libcalls", meta, f, {"sort_fn", "cmp_fn"}, 3)
    cmp = f["name"] == "cmp_fn"
    assert cmp.any() and (f["parent"][cmp] == "sort_fn").all()


def test_thread_churn(tmp_path):
    meta, out = record(tmp_path, "churn")
    f = functions(out, meta)
    o = meta["ldb"]["observer"]
    assert meta["drops"]["slots_exhausted"] == 0
    assert o["threads_seen"] >= 500, o["threads_seen"]
    churn = f["name"] == "churn_fn"
    # Each of the 1000 threads makes one call: every reported call is its own thread's. How
    # many may be missing depends on the observer's gaps on a loaded machine (a long gap hides
    # one call of each thread alive during it: up to 10 here), which check_against_truth
    # allows for exactly; the floor here is only a sanity check.
    assert churn.sum() >= 500, churn.sum()
    assert len(set(f["tid"][churn].tolist())) == churn.sum()
    check_against_truth(tmp_path, "churn", meta, f, {"churn_fn"}, 500, threads_per_gap=10)


def test_signal_handlers(tmp_path):
    meta, out = record(tmp_path, "signals")
    f = functions(out, meta)
    o = meta["ldb"]["observer"]
    assert o["resyncs"] == 0, o
    # A handler that lands inside a push (the stack's gen odd) cannot push without corrupting
    # the interrupted frame, and the observer could not see its frames anyway (gen stays odd
    # until the handler returns): the runtime skips its calls and counts them in `skipped`.
    # Here a handler's instrumented calls are exactly on_alarm and handler_fn, so each
    # handler_fn the observer missed must come with two skipped pushes (or a long gap).
    assert o["skipped"] % 2 == 0, o
    errs = check_against_truth(
        tmp_path, "signals", meta, f, {"handler_fn", "sleep_fn"}, 10, skipped_calls=o["skipped"] // 2
    )
    handler = [e for e in errs if e[2] == "handler_fn"]
    assert handler, "no handler call reported"
    print(f"signals: {len(handler)} handler calls reported, {o['skipped'] // 2} skipped by the runtime")


def test_exceptions_and_longjmp_resync(tmp_path):
    """C++ exceptions unwind through instrumented frames (their exit hooks run); longjmp skips
    exits, and the next call resynchronises. Timings after either stay right."""
    meta, out = record(tmp_path, "unwind")
    f = functions(out, meta)
    o = meta["ldb"]["observer"]
    assert o["resyncs"] >= 5 * 5, o  # each longjmp drops jump_deep's five frames
    check_against_truth(tmp_path, "unwind", meta, f, {"after_unwind_fn"}, 10)
    after = f["name"] == "after_unwind_fn"
    assert (f["parent"][after] == "unwind_fn").all(), set(f["parent"][after].tolist())
    # No frame left behind: nothing deeper than unwind_fn + 1 outlives the scenario.
    assert o["unterminated"] <= 3


def test_overdeep_stack_truncation(tmp_path):
    meta, out = record(tmp_path, "deep")
    f = functions(out, meta)
    o = meta["ldb"]["observer"]
    assert o["truncated"] >= 3 * (201 - 64), o
    assert o["max_depth_seen"] > 64
    deep = f["name"] == "deep_fn"
    assert f["depth"][deep].max() < 64
    check_against_truth(tmp_path, "deep", meta, f, {"deep_fn"}, 3)


# ---- the LDB Fig. 3.1 toy ------------------------------------------------------------------


def test_toy_names_snapshot_and_holder(tmp_path):
    out = tmp_path / "toy"
    r = run_agent(
        ["record", "-o", str(out), "--functions", "--quiet", "--sample", "100%", "--", str(BUILD / "toy"), "3"]
    )
    assert r.returncode == 0, r.stderr
    rep = subprocess.run(
        [sys.executable, "-m", "tailscope", "report", str(out), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT / "python",
    )
    assert rep.returncode == 0, rep.stderr
    res = json.loads(rep.stdout)["ldb"]
    top = [x["name"] for x in res["ranking"][:4]]
    assert "snapshot" in top, top
    assert "request_handler" in top, top
    holders = res["holders"]
    assert holders, "no lock holder found for the slowest requests"
    main_tid = res["timelines"][0]["tid"]
    assert all(h["holder_tid"] != main_tid for h in holders)
    assert any(h["holder_function"] == "snapshot" for h in holders), [
        (h["holder_function"], h["holder_functions"]) for h in holders[:3]
    ]
    assert any("write_out" in h["holder_functions"] for h in holders)
    # The per-function table has snapshot with its ~10 ms hold.
    snap = [x for x in res["functions"] if x["name"] == "snapshot"]
    assert snap and snap[0]["p50_ns"] >= 9e6, snap
    # Terminal summary says it in words.
    txt = subprocess.run(
        [sys.executable, "-m", "tailscope", "report", str(out), "--no-html"],
        capture_output=True,
        text=True,
        cwd=ROOT / "python",
    ).stdout
    assert "lock holder: thread" in txt and "in snapshot held mutex" in txt
    # Perfetto export of the slowest request carries the holder's snapshot().
    tj = tmp_path / "t.json"
    t = subprocess.run(
        [sys.executable, "-m", "tailscope", "timeline", str(out), "--slowest", "1", "-o", str(tj)],
        capture_output=True,
        text=True,
        cwd=ROOT / "python",
    )
    assert t.returncode == 0, t.stderr
    doc = json.loads(tj.read_text())
    evs = doc["traceEvents"]
    assert any(e["name"] == "snapshot" and e["cat"] == "holder-function" for e in evs)
    assert all(e["ph"] in ("X", "M") for e in evs)
    rid = res["timelines"][0]["request_id"]
    t = subprocess.run(
        [sys.executable, "-m", "tailscope", "timeline", str(out), "--request", str(rid), "-o", str(tj)],
        capture_output=True,
        text=True,
        cwd=ROOT / "python",
    )
    assert t.returncode == 0 and json.loads(tj.read_text())["traceEvents"][0]["args"]["request"] == rid


# ---- bad input -------------------------------------------------------------------------------


def test_functions_without_runtime_is_one_line(tmp_path):
    p = subprocess.Popen(["sleep", "30"])
    try:
        r = run_agent(["record", "-o", str(tmp_path / "x"), "--functions", "-p", str(p.pid)])
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 7
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--functions" in lines[0] and "does not run the tailscope runtime" in lines[0]
    # A launched command without the runtime: the same, after the wait.
    r = run_agent(["record", "-o", str(tmp_path / "y"), "--functions", "--", "sleep", "7"])
    assert r.returncode == 7
    assert r.stderr.strip().splitlines()[-1].startswith("tailscope-agent: --functions: /dev/shm/tailscope.")


def test_stripped_binary_is_module_plus_offset(tmp_path):
    out = tmp_path / "stripped"
    r = run_agent(
        ["record", "-o", str(out), "--functions", "--quiet", "--sample", "100%", "--", str(BUILD / "toy-stripped"), "1"]
    )
    assert r.returncode == 0, r.stderr
    rep = subprocess.run(
        [sys.executable, "-m", "tailscope", "report", str(out), "--no-html"],
        capture_output=True,
        text=True,
        cwd=ROOT / "python",
    )
    assert rep.returncode == 0, rep.stderr
    assert "toy-stripped+0x" in rep.stdout
    assert "no symbols (stripped)" in rep.stdout


def test_timeline_bad_input(tmp_path):
    cmd = [sys.executable, "-m", "tailscope", "timeline"]
    r = subprocess.run([*cmd, str(tmp_path), "--slowest", "1"], capture_output=True, text=True, cwd=ROOT / "python")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([*cmd, str(tmp_path)], capture_output=True, text=True, cwd=ROOT / "python")
    assert r.returncode == 1 and "--request ID or --slowest N" in r.stderr


def test_abi_version_mismatch_names_both_versions(tmp_path):
    """A process whose runtime speaks another ABI version: one line naming both."""
    import struct

    p = subprocess.Popen(["sleep", "30"])
    region = Path(f"/dev/shm/tailscope.{p.pid}")
    try:
        magic = 0x3130504F43535354
        region.write_bytes(struct.pack("<QI", magic, 1) + bytes(4096))
        r = run_agent(["record", "-o", str(tmp_path / "x"), "--functions", "-p", str(p.pid)])
    finally:
        region.unlink(missing_ok=True)
        p.kill()
        p.wait()
    assert r.returncode == 7, r.stderr
    lines = r.stderr.strip().splitlines()
    abi = re.search(r"#define TS_ABI_VERSION (\d+)", (ROOT / "runtime/include/tailscope/abi.h").read_text())[1]
    assert len(lines) == 1 and f"ABI version mismatch: region has 1, agent supports {abi}" in lines[0], lines
