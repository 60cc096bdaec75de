"""LDB analysis, symbolisation, report sections and build flags, on synthetic and compiled
inputs (no agent, no root): the statistics' definitions, holder chains, the trace export,
the flame view's invariants, PIE/ASLR/shared-library/stripped symbolisation, and the HTML
sections rendered in headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from elftools.elf.elffile import ELFFile

from tailscope.analysis import ldb
from tailscope.buildflags import BuildFlagError, cflags
from tailscope.symbols import Symbolizer

ROOT = Path(__file__).resolve().parents[2]
CC = shutil.which("cc") or shutil.which("gcc")


def test_function_stats_nearest_rank():
    lat = np.arange(1, 101, dtype=np.int64) * 1000  # 1..100 µs for (f=1, caller=9)
    fn = np.ones(100, np.uint64)
    par = np.full(100, 9, np.uint64)
    lat2 = np.array([5, 7], np.int64)
    rows = ldb.function_stats(
        np.concatenate([fn, [2, 2]]).astype(np.uint64),
        np.concatenate([par, [9, 9]]).astype(np.uint64),
        np.concatenate([lat, lat2]),
    )
    r = {x["fn"]: x for x in rows}
    assert r[1]["count"] == 100 and r[1]["p50_ns"] == 50_000 and r[1]["p99_ns"] == 99_000
    assert r[1]["p9999_ns"] == 100_000 and r[1]["caller"] == 9
    assert r[2]["p50_ns"] == 5 and r[2]["max_ns"] == 7
    assert rows[0]["fn"] == 1  # by total time


def test_lock_episodes_pair_and_find_holders():
    ts = np.array([100, 150, 300, 90, 110, 310], np.int64)
    tid = np.array([1, 1, 1, 2, 2, 2], np.uint32)
    ev = np.array(
        ["MUTEX_WAIT", "MUTEX_LOCK", "MUTEX_UNLOCK", "MUTEX_LOCK", "MUTEX_UNLOCK", "MUTEX_UNLOCK"], dtype=object
    )
    mu = np.full(6, 0xAA, np.uint64)
    ep = ldb.lock_episodes(ts, tid, ev, mu)
    assert ep.tid.size == 2  # the stray second UNLOCK of tid 2 is skipped
    w = int(np.flatnonzero(ep.tid == 1)[0])
    assert (ep.wait_start[w], ep.acquired[w], ep.released[w]) == (100, 150, 300)
    assert ldb.holders(ep, 0xAA, 1, 100, 150) == [int(np.flatnonzero(ep.tid == 2)[0])]
    assert ldb.holders(ep, 0xBB, 1, 100, 150) == []


def _synthetic(n_req: int = 200, slow_every: int = 20) -> ldb.LdbData:
    """Requests on tid 1 (handle → 10 µs); every `slow_every`-th waits 5 ms for a mutex that
    tid 2 holds inside snap (fn 0x300) → write (fn 0x310)."""
    d = ldb.LdbData(pid=42, meta={"ldb": {"observer": {"period_p50_ns": 1024}}})
    f_tid, f_fn, f_par, f_dep, f_st, f_lat = [], [], [], [], [], []
    lk = []
    req = []
    t = 1_000_000
    for i in range(n_req):
        slow = i % slow_every == 0
        lat = 5_010_000 if slow else 10_000
        req.append((i, 1, t, lat))
        f_tid.append(1), f_fn.append(0x100), f_par.append(0), f_dep.append(0), f_st.append(t + 1), f_lat.append(lat - 2)
        if slow:
            lk += [
                (t + 5, 1, "MUTEX_WAIT"),
                (t + 5_000_005, 1, "MUTEX_LOCK"),
                (t + 5_000_100, 1, "MUTEX_UNLOCK"),
                (t - 1000, 2, "MUTEX_LOCK"),
                (t + 5_000_000, 2, "MUTEX_UNLOCK"),
            ]
            f_tid += [2, 2]
            f_fn += [0x300, 0x310]
            f_par += [0x200, 0x300]
            f_dep += [1, 2]
            f_st += [t - 2000, t + 100]
            f_lat += [5_003_000, 4_000_000]
        t += 20_000_000
    # The event loop encloses every request.
    f_tid.append(1), f_fn.append(0x50), f_par.append(0), f_dep.append(0), f_st.append(0), f_lat.append(t + 10)
    d.tid, d.fn, d.parent = np.array(f_tid, np.uint32), np.array(f_fn, np.uint64), np.array(f_par, np.uint64)
    d.depth, d.start, d.latency = np.array(f_dep, np.uint32), np.array(f_st, np.int64), np.array(f_lat, np.int64)
    d.lk_ts = np.array([x[0] for x in lk], np.int64)
    d.lk_tid = np.array([x[1] for x in lk], np.uint32)
    d.lk_event = np.array([x[2] for x in lk], dtype=object)
    d.lk_mutex = np.full(len(lk), 0xAA, np.uint64)
    d.req_id = np.array([r[0] for r in req], np.uint64)
    d.req_tid = np.array([r[1] for r in req], np.uint32)
    d.req_start = np.array([r[2] for r in req], np.int64)
    d.req_latency = np.array([r[3] for r in req], np.int64)
    return d


class _Names:
    def __init__(self):
        self.warnings: list[str] = []

    def names(self, addrs):
        from tailscope.symbols import Symbol

        table = {0x50: "loop", 0x100: "handle", 0x200: "background", 0x300: "snap", 0x310: "write"}
        return {a: Symbol(table.get(a, f"0x{a:x}"), "prog", a, known=a in table) for a in addrs}


def test_contribution_ranks_the_lock_holders_function():
    d = _synthetic()
    res = ldb.analyse_ldb(d, symbolizer=_Names(), p_target=0.97)
    top = [r["name"] for r in res["ranking"][:5]]
    # loop encloses every request: it is context, not a contributor; handle waits.
    assert "loop" not in [r["name"] for r in res["ranking"]]
    assert {"handle", "[lock wait]", "snap", "write"} <= set(top)
    snap = next(r for r in res["ranking"] if r["name"] == "snap")
    assert 4.9e6 <= snap["slow_mean_ns"] <= 5.01e6 and snap["typical_mean_ns"] == 0
    h = res["holders"][0]
    assert h["holder_tid"] == 2 and h["holder_function"] == "snap" and "write" in h["holder_functions"]
    tl = res["timelines"][0]
    kinds = {e["kind"] for e in tl["events"]}
    assert {"request", "lock-wait", "lock-hold", "holder-function", "function"} <= kinds
    # The flame views are valid icicles: a node is at least the sum of its children.
    for fl in res["flame"].values():
        val = dict(zip(fl["ids"], fl["values_us"], strict=True))
        for p in fl["parents"]:
            if p:
                kids = sum(v for g, q, v in zip(fl["ids"], fl["parents"], fl["values_us"], strict=True) if q == p)
                assert val[p] + 1e-9 >= kids
    assert res["flame"]["slow"]["values_us"][res["flame"]["slow"]["ids"].index(0x300)] > 4000
    lines = ldb.summary_lines(res)
    assert any("lock holder: thread 2 in snap" in x for x in lines)


def test_chrome_trace_format():
    d = _synthetic()
    tl = ldb.timeline(d, 0)
    doc = ldb.chrome_trace([tl], 42, {0x100: "handle", 0x300: "snap", 0x310: "write"})
    evs = doc["traceEvents"]
    x = [e for e in evs if e["ph"] == "X"]
    assert x and all(set(e) >= {"name", "ph", "ts", "dur", "pid", "tid"} for e in x)
    assert min(e["ts"] for e in x if e["cat"] == "request") == 0
    assert {e["tid"] for e in evs if e["ph"] == "M"} == {1, 2}
    json.dumps(doc)


def _short_holds_around_a_long_one() -> tuple[ldb.LdbData, int, int]:
    """One mutex (0xAA) taken every 50 µs for 2 µs by tid 3 (in fn 0x410) and tid 2 (in 0x400),
    except for a 10 ms hold [L0, L1) by tid 2 in snap (0x300 → write 0x310, under background
    0x200). The request on tid 1 waits [L0 + 20 µs, L1 + 3 µs) behind it. Two traps:
    - tid 3's hold just before the long one stamped its release 40 µs late (preempted after
      the unlock): by its stamps it overlaps the wait by 20 µs, though the mutex was tid 2's;
    - the observer first saw snap 3 ms after it began (its error bound says 4 ms), so snap's
      row covers only 70% of the hold; background encloses it all."""
    L0, L1 = 10_000_000, 20_000_000
    lk: list[tuple[int, int, str]] = []
    f_rows: list[tuple[int, int, int, int, int, int, int]] = []  # tid, fn, parent, depth, start, lat, err
    t = 1_000_000
    while t < 29_000_000:
        if not (L0 - 60_000 <= t <= L1 + 20_000):
            tid, fn = (3, 0x410) if (t // 50_000) % 2 else (2, 0x400)
            lk += [(t, tid, "MUTEX_LOCK"), (t + 2_000, tid, "MUTEX_UNLOCK")]
            f_rows.append((tid, fn, 0x200 if tid == 2 else 0, 1 if tid == 2 else 0, t - 500, 3_000, 1_000))
        t += 50_000
    lk += [
        (L0 - 5_000, 3, "MUTEX_LOCK"),
        (L0 + 40_000, 3, "MUTEX_UNLOCK"),  # released at L0, stamped late
        (L0, 2, "MUTEX_LOCK"),
        (L1, 2, "MUTEX_UNLOCK"),
        (L0 + 20_000, 1, "MUTEX_WAIT"),
        (L1 + 3_000, 1, "MUTEX_LOCK"),
        (L1 + 5_000, 1, "MUTEX_UNLOCK"),
    ]
    f_rows += [
        (3, 0x410, 0, 0, L0 - 5_500, 46_000, 1_000),
        (2, 0x200, 0, 0, 0, 30_000_000, 1_000),
        (2, 0x300, 0x200, 1, L0 + 3_000_000, L1 - L0 - 3_000_000 + 500_000, 4_000_000),
        (2, 0x310, 0x300, 2, L0 + 3_500_000, 2_500_000, 1_000_000),
    ]
    starts = [1_000_000 + i * 200_000 for i in range(140)]
    req = [(i, 1, s, 10_000) for i, s in enumerate(starts) if not L0 - 200_000 < s < L1]
    req.append((999, 1, L0 + 19_000, L1 - L0 + 6_000))
    d = ldb.LdbData(pid=42, meta={})
    lk.sort(key=lambda x: x[1])  # each thread's events in its ring order (the order above)
    d.lk_ts = np.array([x[0] for x in lk], np.int64)
    d.lk_tid = np.array([x[1] for x in lk], np.uint32)
    d.lk_event = np.array([x[2] for x in lk], dtype=object)
    d.lk_mutex = np.full(len(lk), 0xAA, np.uint64)
    cols = list(zip(*f_rows, strict=True))
    d.tid, d.fn, d.parent = (np.array(cols[0], np.uint32), np.array(cols[1], np.uint64), np.array(cols[2], np.uint64))
    d.depth, d.start = np.array(cols[3], np.uint32), np.array(cols[4], np.int64)
    d.latency, d.err = np.array(cols[5], np.int64), np.array(cols[6], np.int64)
    d.req_id = np.array([r[0] for r in req], np.uint64)
    d.req_tid = np.array([r[1] for r in req], np.uint32)
    d.req_start = np.array([r[2] for r in req], np.int64)
    d.req_latency = np.array([r[3] for r in req], np.int64)
    return d, L0, L1


def test_holder_is_the_hold_that_overlaps_the_wait_among_many_short_ones():
    d, L0, L1 = _short_holds_around_a_long_one()
    ep = ldb.lock_episodes(d.lk_ts, d.lk_tid, d.lk_event, d.lk_mutex)
    assert ep.tid.size == int((d.lk_event == "MUTEX_LOCK").sum()) > 300  # every hold paired
    got = ldb.holders(ep, 0xAA, 1, L0 + 20_000, L1 + 3_000)
    assert [(int(ep.tid[h]), int(ep.acquired[h])) for h in got] == [(2, L0)]
    # A wait that spans the tail of one short hold and the start of the next: both are
    # holders, and the one it acquired after (covering the wait's end) comes first.
    t = 1_000_000 + 50_000
    got = ldb.holders(ep, 0xAA, 1, t + 1_000, t + 50_000 + 1_000)
    assert [int(ep.acquired[h]) for h in got] == [t + 50_000, t]
    res = ldb.analyse_ldb(d, symbolizer=_Names(), p_target=0.99)
    tl = res["timelines"][0]
    assert tl["request_id"] == 999
    holds = [e for e in tl["events"] if e["kind"] == "lock-hold"]
    assert [(e["tid"], e["start_ns"], e["end_ns"], e["ends_wait"]) for e in holds] == [(2, L0, L1, True)]
    h = [x for x in res["holders"] if x["request_id"] == 999]
    assert [(x["holder_tid"], x["holder_function"]) for x in h] == [(2, "snap")]
    assert "write" in h[0]["holder_functions"] and "0x410" not in h[0]["holder_functions"]
    assert any("lock holder: thread 2 in snap" in x for x in ldb.summary_lines(res))


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    if not CC:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("sym")
    src = d / "p.c"
    src.write_text(
        "__attribute__((noinline)) int work(int x) {\n  return x * 3 + 1;\n}\n"
        "int main(int c, char **v) { (void)v; return work(c); }\n"
    )
    exe = d / "p"
    subprocess.run([CC, "-O2", "-g", "-fPIE", "-pie", "-o", str(exe), str(src)], check=True)
    stripped = d / "p-stripped"
    subprocess.run(["strip", "-o", str(stripped), str(exe)], check=True)
    return exe, stripped


def _sym_and_segment(path: Path, name: str):
    with open(path, "rb") as f:
        elf = ELFFile(f)
        sym = next(
            s
            for sec in (".symtab", ".dynsym")
            if elf.get_section_by_name(sec)
            for s in elf.get_section_by_name(sec).iter_symbols()
            if s.name == name and s["st_value"]
        )
        va = sym["st_value"]
        seg = next(
            s
            for s in elf.iter_segments()
            if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1 and s["p_vaddr"] <= va < s["p_vaddr"] + s["p_memsz"]
        )
        return va, seg["p_vaddr"], seg["p_offset"]


def test_symbolizer_pie_aslr_lines_and_stripped(prog):
    exe, stripped = prog
    va, seg_va, seg_off = _sym_and_segment(exe, "work")
    base = 0x55D0C0A00000  # where ASLR put the executable mapping
    page = seg_off & ~0xFFF
    mods = [
        {"start": base, "end": base + 0x10000, "offset": page, "path": str(exe)},
        {"start": base + 0x100000, "end": base + 0x110000, "offset": page, "path": str(stripped)},
    ]
    addr = base + (va - seg_va + seg_off - page)
    s = Symbolizer(mods).lookup(addr + 2)
    assert s.name == "work" and s.known and s.module == "p"
    assert s.file == "p.c" and s.line in (1, 2)
    sym = Symbolizer(mods)
    t = sym.lookup(addr + 0x100000)
    assert not t.known and t.name == f"p-stripped+0x{va - seg_va + seg_off:x}"
    assert any("no symbols (stripped)" in w for w in sym.warnings)
    assert Symbolizer(mods).lookup(12345).name == "0x3039"


def test_symbolizer_shared_library():
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not libc.exists():
        pytest.skip(f"{libc} not present")
    va, seg_va, seg_off = _sym_and_segment(libc, "malloc")
    page = seg_off & ~0xFFF
    base = 0x7F00AA000000
    mods = [{"start": base, "end": base + 0x200000, "offset": page, "path": str(libc)}]
    s = Symbolizer(mods, lines=False).lookup(base + (va - seg_va + seg_off - page))
    assert s.known and "malloc" in s.name and s.module == "libc.so.6"


def test_build_flags_and_wrapper(tmp_path):
    fl = cflags("vendor/,third_party", "hot_fn")
    assert "-finstrument-functions" in fl
    assert "-finstrument-functions-exclude-file-list=/usr/include,vendor/,third_party" in fl
    assert "-finstrument-functions-exclude-function-list=hot_fn" in fl
    with pytest.raises(BuildFlagError):
        cflags("a b")
    lib = ROOT / "runtime" / "build" / "libtailscope.a"
    if not lib.exists() or not CC:
        pytest.skip(f"{lib} not built")
    src = tmp_path / "x.c"
    src.write_text("int f(int x) { return x + 1; }\nint main(void) { return f(0) - 1; }\n")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tailscope.buildflags import cc_main; sys.exit(cc_main())",
            "-O1",
            "-o",
            str(tmp_path / "x"),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    nm = subprocess.run(["nm", str(tmp_path / "x")], capture_output=True, text=True).stdout
    assert "__cyg_profile_func_enter" in nm and "pthread_mutex_lock" in nm
    out = subprocess.run(
        [sys.executable, "-m", "tailscope", "flags", "--exclude-file-list", "a b"], capture_output=True, text=True
    )
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1


def _write_synthetic_recording(path: Path, d: ldb.LdbData) -> Path:
    """A --functions recording on disk (meta.json + the four tables) from LdbData."""
    from tailscope.synth import write_recording

    write_recording(path, 200, cause=None, parts=1)
    meta = json.loads((path / "meta.json").read_text())
    meta["ldb"] = {
        "observer": {
            "passes": 10,
            "fast_path": 5,
            "full_walks": 4,
            "invalid": 1,
            "seqlock_discards": 0,
            "dte_discards": 0,
            "period_hist_ns": [0] * 10 + [9] + [0] * 29,
            "period_p50_ns": 2048,
            "period_p99_ns": 2048,
            "period_max_ns": 2000,
        },
        "config": {"period_ns": 20000, "busy_poll": False},
        "runtime_features": {"fn_hooks": True, "lock_shim": True, "fn_clock": False},
        "modules": [],
    }
    (path / "meta.json").write_text(json.dumps(meta))
    for table, cols in {
        "functions": {
            "tid": pa.array(d.tid, pa.uint32()),
            "fn_addr": pa.array(d.fn, pa.uint64()),
            "call_site": pa.array(d.fn, pa.uint64()),
            "parent_fn": pa.array(d.parent, pa.uint64()),
            "depth": pa.array(d.depth, pa.uint32()),
            "start_ns": pa.array(d.start.astype(np.uint64)),
            "latency_ns": pa.array(d.latency.astype(np.uint64)),
            "start_exact": pa.array(np.zeros(d.fn.size, bool)),
            "error_bound_ns": pa.array(np.zeros(d.fn.size, np.uint64)),
        },
        "locks": {
            "ts_ns": pa.array(d.lk_ts.astype(np.uint64)),
            "tid": pa.array(d.lk_tid, pa.uint32()),
            "event": pa.array(list(d.lk_event), pa.string()),
            "mutex": pa.array(d.lk_mutex, pa.uint64()),
        },
    }.items():
        (path / table).mkdir(exist_ok=True)
        pq.write_table(pa.table(cols), path / table / "part-00000.parquet")
    return path


def test_recording_tables_match_schema(tmp_path):
    from tailscope.schema import load_schema

    p = _write_synthetic_recording(tmp_path / "r", _synthetic())
    s = load_schema()
    assert list(pq.read_schema(p / "functions" / "part-00000.parquet").names) == list(s.tables["functions"])
    assert list(pq.read_schema(p / "locks" / "part-00000.parquet").names) == list(s.tables["locks"])


def test_ldb_report_sections_render_in_chromium(tmp_path):
    from tailscope.analysis.events import ANALYSIS_COLUMNS
    from tailscope.analysis.pipeline import analyse
    from tailscope.recording import load_recording
    from tailscope.report.html import expected_chart_count, write_report

    p = _write_synthetic_recording(tmp_path / "r", _synthetic())
    rec = load_recording(p, list(ANALYSIS_COLUMNS))
    result = analyse(rec.columns, rec.meta, nulls=rec.nulls, kind_names=rec.kind_names, segment_s=5)
    d = ldb.load_ldb(p)
    d.req_id, d.req_tid, d.req_start, d.req_latency = (
        _synthetic().req_id,
        _synthetic().req_tid,
        _synthetic().req_start,
        _synthetic().req_latency,
    )
    result["ldb"] = ldb.analyse_ldb(d, symbolizer=_Names(), p_target=0.97)
    page = write_report(result, tmp_path / "report.html")
    text = page.read_text()
    for anchor in ("id=ldb-ranking", "id=ldb-functions", "id=ldb-holders", "id=ldb-observer"):
        assert anchor in text
    from test_browser import _driver

    want = expected_chart_count(result)
    with tempfile.TemporaryDirectory(prefix="ts-chrome-") as profile:
        drv = _driver(profile)
        try:
            drv.get(page.as_uri())
            from selenium.webdriver.support.ui import WebDriverWait

            WebDriverWait(drv, 30).until(
                lambda dr: len(dr.find_elements("css selector", ".js-plotly-plot .main-svg")) >= want
            )
            assert len(drv.find_elements("css selector", ".js-plotly-plot")) == want
            assert "snap" in drv.find_element("id", "ldb-holders").text
            severe = [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
            assert not severe, severe
        finally:
            drv.quit()


def test_report_says_when_ring_pressure_raised_the_agent():
    from tailscope.report.ldb_html import _priority

    assert _priority({}) == "", "an agent never at idle priority: nothing to say"
    assert "throughout" in _priority({"idle": True, "raised_for_ring_pressure": 0, "raised_s": 0.0})
    raised = _priority({"idle": True, "raised_for_ring_pressure": 3, "raised_s": 7.25})
    assert "class=warn" in raised and "3 time(s)" in raised and "7.2 s" in raised
