"""LDB analysis: function latency, contribution to slow requests, request timelines with
lock-holder chains (breakwater-ldb-thesis.txt ch. 3, §3.3.4).

Inputs are the `functions`, `locks` and `request_events` tables of a `--functions`
recording plus its requests table (one row per recorded request: tid, start, latency, id).
`load_ldb` is the only I/O; every other function is pure over numpy arrays and returns plain
dicts for the report, the terminal and the Perfetto/Chrome trace export.

Definitions
- A FUNCTION row is one call the observer saw end: [start, start + latency) on its thread,
  wall-clock and inclusive (blocking and callees count). Its error is about one scan interval.
- Per (function, caller) statistics: count and nearest-rank p50/p99/p99.9/p99.99
  (LDB §3.3.4 "per-function statistics"; caller = the function below it on the shadow stack).
- A request's *segments* are where its time went: its own thread over [start, end); the
  threads that took it over through REQ_START … REQ_BLOCK/REQ_END (LDB §3.3.3); and, for each
  lock wait of its own thread inside the window, the holder's thread over the part of the
  hold that overlaps the wait (the holder chain, LDB §3.3.4), followed up to `CHAIN_DEPTH`
  links (the holder itself waiting for another lock).
- time_in(f, r) = Σ over FUNCTION rows of f on a segment's thread of |row ∩ segment|, leaving
  out, on the request's own threads, frames that enclose the whole segment (main, an event
  loop: every request has them).
  A lock wait counts as the pseudo-function "lock wait" on its mutex.
- Contribution of f = mean over slow requests of time_in(f, r) − mean over typical requests.
  Slow = latency ≥ pTarget (p99 by default); typical = between p45 and p55. A function that
  takes as long in every request contributes nothing; one that only slow requests wait for
  (directly or through a lock holder) contributes its whole share.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

TABLES = ("functions", "locks", "request_events")
CHAIN_DEPTH = 3
MAX_SET = 2000  # requests analysed per set (slow, typical); a fixed-seed sample beyond that
LONG_CALL_NS = 50_000_000  # calls longer than this are scanned separately (few, long-lived)
LOCK_WAIT = -1  # pseudo function id for lock waits


class LdbError(Exception):
    """A --functions recording cannot be read; one line for the user."""


@dataclass
class LdbData:
    pid: int = 0
    # functions
    tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    fn: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    site: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    parent: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    depth: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    latency: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # the row's error bound (the scan gaps around its ends; 0 where the recording has none)
    err: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # lock events
    lk_ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    lk_tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    lk_event: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    lk_mutex: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    # request events
    rq_ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rq_tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    rq_event: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    rq_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    # requests (from the requests table)
    req_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    req_tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    req_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    req_latency: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    meta: dict = field(default_factory=dict)


def has_ldb(path: str | Path) -> bool:
    return (Path(path) / "functions").is_dir()


def _read(path: Path, table: str, columns: list[str], optional: tuple[str, ...] = ()):
    files = sorted((path / table).glob("*.parquet"))
    if not files:
        return None
    try:
        import pyarrow as pa

        names = set(pq.read_schema(files[0]).names)
        columns = columns + [c for c in optional if c in names]
        return pa.concat_tables([pq.read_table(f, columns=columns) for f in files])
    except Exception as exc:  # pyarrow raises several types for corrupt files
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise LdbError(f"{path / table}: unreadable Parquet ({first})") from exc


def _strings(col) -> np.ndarray:
    """A string column as an object array, through its dictionary (few distinct values)."""
    enc = col.combine_chunks().dictionary_encode()
    names = np.asarray(enc.dictionary.to_pylist(), dtype=object)
    return names[enc.indices.fill_null(0).to_numpy(zero_copy_only=False)] if len(enc) else names[:0]


def load_ldb(path: str | Path) -> LdbData:
    """Read the LDB tables and the requests of a recording into arrays."""
    path = Path(path)
    meta_path = path / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise LdbError(f"{meta_path}: cannot read ({exc})") from exc
    if not has_ldb(path):
        raise LdbError(f"{path}: no functions/ table; record with `tailscope record --functions`")
    d = LdbData(meta=meta, pid=int((meta.get("target") or {}).get("pid") or 0))
    t = _read(
        path,
        "functions",
        ["tid", "fn_addr", "call_site", "parent_fn", "depth", "start_ns", "latency_ns"],
        optional=("error_bound_ns",),
    )
    if t is not None and t.num_rows:
        d.tid = t.column("tid").to_numpy()
        d.fn = t.column("fn_addr").to_numpy()
        d.site = t.column("call_site").to_numpy()
        d.parent = t.column("parent_fn").to_numpy()
        d.depth = t.column("depth").to_numpy()
        d.start = t.column("start_ns").to_numpy().astype(np.int64)
        d.latency = t.column("latency_ns").to_numpy().astype(np.int64)
        if "error_bound_ns" in t.column_names:
            d.err = t.column("error_bound_ns").to_numpy().astype(np.int64)
    t = _read(path, "locks", ["ts_ns", "tid", "event", "mutex"])
    if t is not None and t.num_rows:
        d.lk_ts = t.column("ts_ns").to_numpy().astype(np.int64)
        d.lk_tid = t.column("tid").to_numpy()
        d.lk_event = _strings(t.column("event"))
        d.lk_mutex = t.column("mutex").to_numpy()
    t = _read(path, "request_events", ["ts_ns", "tid", "event", "request_id"])
    if t is not None and t.num_rows:
        d.rq_ts = t.column("ts_ns").to_numpy().astype(np.int64)
        d.rq_tid = t.column("tid").to_numpy()
        d.rq_event = _strings(t.column("event"))
        d.rq_id = t.column("request_id").to_numpy()
    t = _read(path, "requests", ["request_id", "tid", "start_ns", "latency_ns"])
    if t is not None and t.num_rows:
        d.req_id = t.column("request_id").to_numpy()
        d.req_tid = t.column("tid").to_numpy()
        d.req_start = t.column("start_ns").to_numpy().astype(np.int64)
        d.req_latency = t.column("latency_ns").to_numpy().astype(np.int64)
    return d


# ---- per (function, caller) statistics ---------------------------------------------------


def nearest_rank(sorted_values: np.ndarray, q: float) -> float:
    """Nearest-rank percentile of a sorted array: value at index ceil(q·n) − 1."""
    n = sorted_values.size
    return float(sorted_values[max(int(np.ceil(q * n)) - 1, 0)]) if n else float("nan")


def function_stats(fn: np.ndarray, parent: np.ndarray, latency: np.ndarray) -> list[dict]:
    """count, total and p50/p99/p99.9/p99.99 of latency per (fn, parent), by total time."""
    if fn.size == 0:
        return []
    keys = np.stack([fn.astype(np.uint64), parent.astype(np.uint64)], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    order = np.lexsort((latency, inv))
    lat_sorted = latency[order]
    counts = np.bincount(inv, minlength=len(uniq))
    bounds = np.concatenate([[0], np.cumsum(counts)])
    totals = np.bincount(inv, weights=latency.astype(np.float64), minlength=len(uniq))
    out = []
    for g in range(len(uniq)):
        vals = lat_sorted[bounds[g] : bounds[g + 1]]
        out.append(
            {
                "fn": int(uniq[g, 0]),
                "caller": int(uniq[g, 1]),
                "count": int(counts[g]),
                "total_ns": float(totals[g]),
                "mean_ns": float(totals[g] / counts[g]),
                "p50_ns": nearest_rank(vals, 0.5),
                "p99_ns": nearest_rank(vals, 0.99),
                "p999_ns": nearest_rank(vals, 0.999),
                "p9999_ns": nearest_rank(vals, 0.9999),
                "max_ns": float(vals[-1]),
            }
        )
    out.sort(key=lambda r: -r["total_ns"])
    return out


# ---- lock episodes and holder chains -------------------------------------------------------


@dataclass
class Episodes:
    """One row per lock episode: (tid, mutex, wait_start or -1, acquired, released)."""

    tid: np.ndarray
    mutex: np.ndarray
    wait_start: np.ndarray
    acquired: np.ndarray
    released: np.ndarray


def lock_episodes(ts: np.ndarray, tid: np.ndarray, event: np.ndarray, mutex: np.ndarray) -> Episodes:
    """Pair MUTEX_WAIT?/MUTEX_LOCK/MUTEX_UNLOCK per thread. The runtime writes an episode's
    events together, in order, into its thread's ring at unlock, and the agent keeps each
    thread's ring order: so an UNLOCK's LOCK is the thread's previous event, and its WAIT (if
    it waited) the one before. Anything else is skipped."""
    z = np.zeros(0, np.int64)
    empty = Episodes(z.astype(np.uint32), z.astype(np.uint64), z, z, z)
    n = ts.size
    if n == 0:
        return empty
    code = np.zeros(n, np.int8)
    code[event == "MUTEX_WAIT"] = 1
    code[event == "MUTEX_LOCK"] = 2
    code[event == "MUTEX_UNLOCK"] = 3
    order = np.argsort(tid, kind="stable")
    c, t, m, x = code[order], tid[order], mutex[order], ts[order].astype(np.int64)
    u = np.flatnonzero(c == 3)
    u = u[u >= 1]
    lk = u - 1
    ok = (c[lk] == 2) & (t[lk] == t[u]) & (m[lk] == m[u]) & (x[u] >= x[lk])
    u, lk = u[ok], lk[ok]
    if u.size == 0:
        return empty
    w = lk - 1
    has_w = w >= 0
    wv = np.where(has_w, w, 0)
    has_w &= (c[wv] == 1) & (t[wv] == t[u]) & (m[wv] == m[u])
    wait_start = np.where(has_w, x[wv], -1)
    return Episodes(t[u].astype(np.uint32), m[u].astype(np.uint64), wait_start, x[lk], x[u])


class EpisodeIndex:
    """Lock episodes indexed for the two queries a request needs: its own thread's waits in a
    window, and the holds of a mutex that overlap a wait.

    A mutex has one holder at a time, so a hold ended, at the latest, when another thread
    next acquired the mutex. The runtime reads the clock after the unlock returns, and a
    thread preempted there stamps its release late — by up to a scheduling delay, which on a
    shared machine can cover the start of the next holder's hold and of the waits behind it.
    Each hold's release is therefore clipped to the next other-thread acquisition of the same
    mutex (`released_clipped`); a nested hold of the same thread (a recursive mutex) does not
    clip its outer one."""

    def __init__(self, ep: Episodes):
        self.ep = ep
        self.waits: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # per mutex: rows by acquisition, acquired, clipped release, running max of the latter
        self.holds: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.released_clipped = ep.released.astype(np.int64).copy()
        w = np.flatnonzero(ep.wait_start >= 0)
        for key, arr, rows, by in ((0, ep.tid, w, ep.wait_start), (1, ep.mutex, np.arange(ep.tid.size), ep.acquired)):
            if rows.size == 0:
                continue
            o = rows[np.lexsort((by[rows], arr[rows]))]
            keys = arr[o]
            cuts = np.flatnonzero(np.diff(keys.astype(np.int64) if key == 0 else keys.view(np.int64))) + 1
            for part in np.split(o, cuts):
                k = int(arr[part[0]])
                if key == 0:
                    self.waits[k] = (part, ep.wait_start[part], ep.acquired[part])
                else:
                    self.holds[k] = self._clip(part)

    def _clip(self, part: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        ep = self.ep
        acq = ep.acquired[part].astype(np.int64)
        rel = ep.released[part].astype(np.int64)
        tid = ep.tid[part].astype(np.int64)
        # The next acquisition by another thread: rows are in acquisition order, so it is the
        # first row of the next run of rows with another tid.
        nxt = np.full(part.size, np.iinfo(np.int64).max, np.int64)
        if part.size > 1:
            change = np.flatnonzero(tid[1:] != tid[:-1]) + 1  # first row of each later run
            run_end = np.concatenate([change, [part.size]])
            next_other = run_end[np.searchsorted(change, np.arange(part.size), side="right")]
            ok = next_other < part.size
            nxt[ok] = acq[next_other[ok]]
        rel = np.maximum(np.minimum(rel, nxt), acq)
        self.released_clipped[part] = rel
        return part, acq, rel, np.maximum.accumulate(rel)

    def waits_in(self, tid: int, start: int, end: int) -> np.ndarray:
        e = self.waits.get(tid)
        if e is None:
            return np.zeros(0, np.int64)
        rows, ws, acq = e
        return rows[np.searchsorted(acq, start, side="right") : np.searchsorted(ws, end, side="left")]

    def holders(self, mutex: int, waiter_tid: int, t0: int, t1: int) -> list[int]:
        """Other threads' holds of `mutex` that overlap the wait [t0, t1), clipped as above.
        The first is the hold that covers the wait's end — the last one acquired before the
        waiter got the mutex, whose release handed it over; the rest (holds that came and went
        during a long wait) follow in time order."""
        e = self.holds.get(mutex)
        if e is None:
            return []
        rows, acq, rel, relmax = e
        lo, hi = np.searchsorted(relmax, t0, side="right"), np.searchsorted(acq, t1, side="left")
        sel = np.arange(lo, hi)
        sel = sel[(rel[sel] > t0) & (self.ep.tid[rows[sel]] != waiter_tid)]
        if sel.size == 0:
            return []
        out = rows[sel].tolist()
        return [out[-1], *out[:-1]]


def holders(ep: Episodes, mutex: int, waiter_tid: int, t0: int, t1: int) -> list[int]:
    """Episodes of other threads holding `mutex` at some point of [t0, t1); the one covering
    the end of that window first (EpisodeIndex.holders)."""
    return EpisodeIndex(ep).holders(mutex, waiter_tid, t0, t1)


# ---- request segments -------------------------------------------------------------------------


def request_segments(
    d: LdbData, ep: Episodes | EpisodeIndex, tid: int, start: int, end: int, req_id: int | None, depth: int = 0
) -> list[tuple[int, int, int, str, dict]]:
    """Where a request's time went: (tid, t0, t1, role, info) with role 'own', 'handoff',
    'lock-wait' (on the waiter's thread) or 'holder' (the holder's thread during the wait)."""
    segs = [(tid, start, end, "own", {})]
    if req_id is not None and d.rq_id.size:
        sel = _rq_rows(d, req_id)
        sel = sel[(d.rq_ts[sel] >= start - 1) & (d.rq_ts[sel] <= end + 1) & (d.rq_tid[sel] != tid)]
        by_tid: dict[int, list[int]] = {}
        for i in sel[np.argsort(d.rq_ts[sel], kind="stable")]:
            by_tid.setdefault(int(d.rq_tid[i]), []).append(int(i))
        for t, idx in by_tid.items():
            begin = None
            for i in idx:
                if d.rq_event[i] == "REQ_START":
                    begin = int(d.rq_ts[i])
                elif d.rq_event[i] in ("REQ_BLOCK", "REQ_END") and begin is not None:
                    segs.append((t, begin, int(d.rq_ts[i]), "handoff", {}))
                    begin = None
            if begin is not None:
                segs.append((t, begin, end, "handoff", {}))
    ix = ep if isinstance(ep, EpisodeIndex) else EpisodeIndex(ep)
    segs.extend(_lock_segments(ix, tid, start, end, depth))
    return segs


def _rq_rows(d: LdbData, req_id: int) -> np.ndarray:
    """Rows of request_events for one request id (index built once per LdbData)."""
    idx = getattr(d, "_rq_index", None)
    if idx is None:
        order = np.argsort(d.rq_id, kind="stable")
        idx = (order, d.rq_id[order])
        d._rq_index = idx  # type: ignore[attr-defined]
    order, ids = idx
    lo, hi = np.searchsorted(ids, req_id, side="left"), np.searchsorted(ids, req_id, side="right")
    return order[lo:hi]


def _lock_segments(ix: EpisodeIndex, tid: int, start: int, end: int, depth: int):
    out = []
    ep = ix.ep
    if depth >= CHAIN_DEPTH or ep.tid.size == 0:
        return out
    for w in ix.waits_in(tid, start, end):
        w0, w1 = max(int(ep.wait_start[w]), start), min(int(ep.acquired[w]), end)
        if w1 <= w0:
            continue
        mutex = int(ep.mutex[w])
        out.append((tid, w0, w1, "lock-wait", {"mutex": mutex, "depth": depth}))
        for k, h in enumerate(ix.holders(mutex, tid, w0, w1)):
            rel = int(ix.released_clipped[h])
            h0, h1 = max(int(ep.acquired[h]), w0), min(rel, w1)
            htid = int(ep.tid[h])
            out.append(
                (
                    htid,
                    h0,
                    h1,
                    "holder",
                    {
                        "mutex": mutex,
                        "depth": depth,
                        "hold_start": int(ep.acquired[h]),
                        "hold_end": rel,
                        "waiter": tid,
                        "ends_wait": k == 0,
                    },
                )
            )
            out.extend(_lock_segments(ix, htid, h0, h1, depth + 1))
    return out


class CallIndex:
    """FUNCTION rows per thread, sorted by start, for overlap queries."""

    def __init__(self, d: LdbData):
        self.by_tid: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        if d.tid.size == 0:
            return
        order = np.lexsort((d.start, d.tid))
        tids = d.tid[order]
        cuts = np.flatnonzero(np.diff(tids.astype(np.int64))) + 1
        for part in np.split(order, cuts):
            t = int(d.tid[part[0]])
            st, lat = d.start[part], d.latency[part]
            long_ = lat > LONG_CALL_NS
            self.by_tid[t] = (part[~long_], st[~long_], part[long_], st[long_])

    def overlapping(self, tid: int, t0: int, t1: int, d: LdbData) -> np.ndarray:
        """Row indices of calls on `tid` that overlap [t0, t1)."""
        e = self.by_tid.get(tid)
        if e is None or t1 <= t0:
            return np.zeros(0, np.int64)
        rows, st, long_rows, long_st = e
        lo = np.searchsorted(st, t0 - LONG_CALL_NS, side="left")
        hi = np.searchsorted(st, t1, side="left")
        cand = rows[lo:hi]
        cand = cand[d.start[cand] + d.latency[cand] > t0]
        if long_rows.size:
            lm = (long_st < t1) & (long_st + d.latency[long_rows] > t0)
            cand = np.concatenate([cand, long_rows[lm]])
        return cand


def time_by_function(d: LdbData, idx: CallIndex, segs) -> dict[int, float]:
    """time_in(f) over a request's segments (lock waits under LOCK_WAIT)."""
    out: dict[int, float] = {}
    for tid, t0, t1, role, _info in segs:
        if role == "lock-wait":
            out[LOCK_WAIT] = out.get(LOCK_WAIT, 0.0) + (t1 - t0)
            continue
        rows = idx.overlapping(tid, t0, t1, d)
        if role in ("own", "handoff") and rows.size:
            # Frames that enclose the whole window (main, the event loop) are the request's
            # context, not its work: every request has them.
            rows = rows[~((d.start[rows] <= t0) & (d.start[rows] + d.latency[rows] >= t1))]
        if rows.size == 0:
            continue
        a = np.maximum(d.start[rows], t0)
        b = np.minimum(d.start[rows] + d.latency[rows], t1)
        ov = np.maximum(b - a, 0).astype(np.float64)
        fns = d.fn[rows]
        u, inv = np.unique(fns, return_inverse=True)
        sums = np.bincount(inv.reshape(-1), weights=ov)
        for f, s in zip(u.tolist(), sums.tolist(), strict=True):
            out[int(f)] = out.get(int(f), 0.0) + s
    return out


def _pick(n_idx: np.ndarray, cap: int, seed: int = 0) -> np.ndarray:
    if n_idx.size <= cap:
        return n_idx
    return np.sort(np.random.default_rng(seed).choice(n_idx, cap, replace=False))


def slow_and_typical(latency: np.ndarray, p_target: float = 0.99) -> tuple[np.ndarray, np.ndarray, float]:
    """Indices of slow requests (latency ≥ pTarget, nearest rank) and typical ones (p45–p55)."""
    if latency.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), float("nan")
    s = np.sort(latency)
    thr = nearest_rank(s, p_target)
    lo, hi = nearest_rank(s, 0.45), nearest_rank(s, 0.55)
    slow = np.flatnonzero(latency >= thr)
    typical = np.flatnonzero((latency >= lo) & (latency <= hi))
    return slow, typical, thr


def contributions(d: LdbData, p_target: float = 0.99) -> dict:
    """Rank functions by mean time in slow requests minus mean time in typical ones."""
    ep = EpisodeIndex(lock_episodes(d.lk_ts, d.lk_tid, d.lk_event, d.lk_mutex))
    idx = CallIndex(d)
    slow, typical, thr = slow_and_typical(d.req_latency, p_target)
    slow, typical = _pick(slow, MAX_SET, 1), _pick(typical, MAX_SET, 2)

    def mean_times(sel: np.ndarray) -> dict[int, float]:
        tot: dict[int, float] = {}
        for i in sel:
            segs = request_segments(
                d, ep, int(d.req_tid[i]), int(d.req_start[i]), int(d.req_start[i] + d.req_latency[i]), int(d.req_id[i])
            )
            for f, v in time_by_function(d, idx, segs).items():
                tot[f] = tot.get(f, 0.0) + v
        n = max(len(sel), 1)
        return {f: v / n for f, v in tot.items()}

    ms, mt = mean_times(slow), mean_times(typical)
    slow_lat = float(d.req_latency[slow].mean()) if slow.size else float("nan")
    typ_lat = float(d.req_latency[typical].mean()) if typical.size else float("nan")
    rows = []
    for f in set(ms) | set(mt):
        s, t = ms.get(f, 0.0), mt.get(f, 0.0)
        rows.append(
            {
                "fn": f,
                "slow_mean_ns": s,
                "typical_mean_ns": t,
                "contribution_ns": s - t,
                "share_of_slow": s / slow_lat if slow_lat == slow_lat and slow_lat > 0 else None,
            }
        )
    rows.sort(key=lambda r: -r["contribution_ns"])
    return {
        "ranking": rows,
        "slow_n": int(slow.size),
        "typical_n": int(typical.size),
        "threshold_ns": thr,
        "slow_mean_latency_ns": slow_lat,
        "typical_mean_latency_ns": typ_lat,
        "episodes": ep,
        "index": idx,
        "slow_times": ms,
        "typical_times": mt,
    }


# ---- timelines ---------------------------------------------------------------------------------


def timeline(d: LdbData, i: int, ep: Episodes | EpisodeIndex | None = None, idx: CallIndex | None = None) -> dict:
    """Everything that made request `i` (index into the requests arrays) take its time:
    its own calls, hand-offs, lock waits and the holders' calls during them."""
    ep = ep if ep is not None else lock_episodes(d.lk_ts, d.lk_tid, d.lk_event, d.lk_mutex)
    ep = ep if isinstance(ep, EpisodeIndex) else EpisodeIndex(ep)
    idx = idx if idx is not None else CallIndex(d)
    tid, start = int(d.req_tid[i]), int(d.req_start[i])
    end = start + int(d.req_latency[i])
    segs = request_segments(d, ep, tid, start, end, int(d.req_id[i]))
    events = [
        {
            "kind": "request",
            "tid": tid,
            "start_ns": start,
            "end_ns": end,
            "fn": None,
            "name": f"request {int(d.req_id[i])}",
            "depth": -1,
        }
    ]
    seen: set[tuple[int, int]] = set()
    for stid, t0, t1, role, info in segs:
        if role == "lock-wait":
            events.append(
                {
                    "kind": "lock-wait",
                    "tid": stid,
                    "start_ns": t0,
                    "end_ns": t1,
                    "fn": None,
                    "mutex": info["mutex"],
                    "depth": -1,
                    "name": f"wait for mutex 0x{info['mutex']:x}",
                }
            )
            continue
        if role == "holder":
            events.append(
                {
                    "kind": "lock-hold",
                    "tid": stid,
                    "start_ns": info["hold_start"],
                    "end_ns": info["hold_end"],
                    "fn": None,
                    "mutex": info["mutex"],
                    "depth": -1,
                    "waiter": info["waiter"],
                    "ends_wait": info["ends_wait"],
                    "name": f"holds mutex 0x{info['mutex']:x}",
                }
            )
        for r in idx.overlapping(stid, t0, t1, d):
            key = (stid, int(r))
            if key in seen:
                continue
            seen.add(key)
            events.append(
                {
                    "kind": "function" if role in ("own", "handoff") else "holder-function",
                    "tid": stid,
                    "start_ns": int(d.start[r]),
                    "end_ns": int(d.start[r] + d.latency[r]),
                    "fn": int(d.fn[r]),
                    "caller": int(d.parent[r]),
                    "depth": int(d.depth[r]),
                    "err_ns": int(d.err[r]) if d.err.size == d.fn.size else None,
                    "name": None,
                }
            )
    return {"request_id": int(d.req_id[i]), "tid": tid, "start_ns": start, "latency_ns": end - start, "events": events}


def slowest(d: LdbData, n: int) -> np.ndarray:
    return np.argsort(-d.req_latency, kind="stable")[: max(n, 0)]


def find_request(d: LdbData, request_id: int) -> np.ndarray:
    return np.flatnonzero(d.req_id == np.uint64(request_id))


def name_events(tl: dict, names: dict[int, str]) -> dict:
    for e in tl["events"]:
        if e["name"] is None:
            e["name"] = names.get(e["fn"], f"0x{e['fn']:x}")
    return tl


def chrome_trace(timelines: list[dict], pid: int, names: dict[int, str], origin_ns: int | None = None) -> dict:
    """Chrome/Perfetto trace JSON (ph 'X' complete events, µs) of one or more timelines."""
    evs = []
    if origin_ns is None:
        origin_ns = min((t["start_ns"] for t in timelines), default=0)
    tids = set()
    for k, tl in enumerate(timelines):
        name_events(tl, names)
        for e in tl["events"]:
            tids.add(e["tid"])
            args = {"kind": e["kind"], "request": tl["request_id"]}
            if e.get("mutex") is not None:
                args["mutex"] = f"0x{e['mutex']:x}"
            if e.get("caller"):
                args["caller"] = names.get(e["caller"], f"0x{e['caller']:x}")
            evs.append(
                {
                    "name": e["name"],
                    "cat": e["kind"],
                    "ph": "X",
                    "pid": pid + k * 0,
                    "tid": e["tid"],
                    "ts": (e["start_ns"] - origin_ns) / 1e3,
                    "dur": max(e["end_ns"] - e["start_ns"], 0) / 1e3,
                    "args": args,
                }
            )
    for t in sorted(tids):
        evs.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": t, "args": {"name": f"tid {t}"}})
    return {
        "traceEvents": evs,
        "displayTimeUnit": "ns",
        "otherData": {"source": "tailscope --functions", "origin_monotonic_ns": origin_ns},
    }


# ---- flame view ---------------------------------------------------------------------------------


def call_tree(fn: np.ndarray, parent: np.ndarray, latency: np.ndarray) -> dict[int, int]:
    """Each function's dominant caller (by total time), for a context-insensitive tree."""
    if fn.size == 0:
        return {}
    keys = np.stack([fn.astype(np.uint64), parent.astype(np.uint64)], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    tot = np.bincount(inv.reshape(-1), weights=latency.astype(np.float64))
    best: dict[int, tuple[float, int]] = {}
    for (f, p), t in zip(uniq.tolist(), tot.tolist(), strict=True):
        if f == p:
            continue  # recursion: keep the outer caller
        if f not in best or t > best[f][0]:
            best[f] = (t, p)
    return {f: p for f, (_, p) in best.items()}


def flame(tree: dict[int, int], times: dict[int, float]) -> dict:
    """Icicle data: ids, parents, values (µs) where a node's value ≥ its children's sum."""
    nodes = {f for f in times if f != LOCK_WAIT}
    parent_of = {}
    for f in nodes:
        p = tree.get(f, 0)
        seen = {f}
        while p and p not in nodes and p in tree and p not in seen:  # skip callers not in view
            seen.add(p)
            p = tree[p]
        parent_of[f] = p if p in nodes and p != f else 0
    children: dict[int, list[int]] = {}
    for f, p in parent_of.items():
        children.setdefault(p, []).append(f)
    value: dict[int, float] = {}

    def total(f: int, guard: int = 0) -> float:
        if f in value:
            return value[f]
        kids = sum(total(c, guard + 1) for c in children.get(f, []) if guard < 200)
        value[f] = max(times.get(f, 0.0), kids)
        return value[f]

    for f in nodes:
        total(f)
    if LOCK_WAIT in times:
        nodes.add(LOCK_WAIT)
        parent_of[LOCK_WAIT] = 0
        value[LOCK_WAIT] = times[LOCK_WAIT]
    ids = sorted(nodes)
    return {"ids": ids, "parents": [parent_of[f] for f in ids], "values_us": [value[f] / 1e3 for f in ids]}


def mean_times(d: LdbData, sel: np.ndarray, ep: Episodes | EpisodeIndex, idx: CallIndex) -> dict[int, float]:
    tot: dict[int, float] = {}
    for i in sel:
        segs = request_segments(
            d, ep, int(d.req_tid[i]), int(d.req_start[i]), int(d.req_start[i] + d.req_latency[i]), int(d.req_id[i])
        )
        for f, v in time_by_function(d, idx, segs).items():
            tot[f] = tot.get(f, 0.0) + v
    n = max(len(sel), 1)
    return {f: v / n for f, v in tot.items()}


# ---- the whole analysis -------------------------------------------------------------------------


def analyse_ldb(d: LdbData, symbolizer=None, p_target: float = 0.99, top: int = 20, n_timelines: int = 5) -> dict:
    """Everything the report shows about functions; plain data (names resolved)."""
    from tailscope.symbols import Symbolizer, modules_of

    sym = symbolizer if symbolizer is not None else Symbolizer(modules_of(d.meta))
    stats = function_stats(d.fn, d.parent, d.latency)
    contrib = contributions(d, p_target)
    ep, idx = contrib.pop("episodes"), contrib.pop("index")
    ms, mt = contrib.pop("slow_times"), contrib.pop("typical_times")
    tls = [timeline(d, int(i), ep, idx) for i in slowest(d, n_timelines)]
    addrs = {r["fn"] for r in stats[:200]} | {r["caller"] for r in stats[:200]}
    addrs |= {r["fn"] for r in contrib["ranking"][:200] if r["fn"] != LOCK_WAIT}
    for tl in tls:
        addrs |= {e["fn"] for e in tl["events"] if e.get("fn")} | {e["caller"] for e in tl["events"] if e.get("caller")}
    tree = call_tree(d.fn, d.parent, d.latency)
    fl_slow, fl_typ = flame(tree, ms), flame(tree, mt)
    addrs |= set(fl_slow["ids"]) | set(fl_typ["ids"]) | set(fl_slow["parents"])
    addrs.discard(0)
    addrs.discard(LOCK_WAIT)
    resolved = sym.names(sorted(addrs))
    names = {a: s.name for a, s in resolved.items()}
    names[LOCK_WAIT] = "[lock wait]"
    names[0] = ""
    where = {a: s.where for a, s in resolved.items()}
    for tl in tls:
        name_events(tl, names)
    for fl in (fl_slow, fl_typ):
        fl["labels"] = [names.get(f, f"0x{f:x}") for f in fl["ids"]]
    table = [
        {
            **r,
            "name": names.get(r["fn"], f"0x{r['fn']:x}"),
            "caller_name": names.get(r["caller"], "") if r["caller"] else "(root)",
            "where": where.get(r["fn"], ""),
        }
        for r in stats[:top]
    ]
    ranking = [
        {**r, "name": names.get(r["fn"], f"0x{r['fn']:x}"), "where": where.get(r["fn"], "")}
        for r in contrib["ranking"][:top]
    ]
    # Lock holders seen in the slowest requests: who held what, doing which function.
    holder_lines = []
    for tl in tls:
        for e in tl["events"]:
            if e["kind"] == "lock-hold":
                inside = [
                    x
                    for x in tl["events"]
                    if x["kind"] == "holder-function"
                    and x["tid"] == e["tid"]
                    and x["start_ns"] < e["end_ns"]
                    and x["end_ns"] > e["start_ns"]
                ]
                top_fn = holder_function(inside, e["start_ns"], e["end_ns"])
                holder_lines.append(
                    {
                        "request_id": tl["request_id"],
                        "waiter_tid": e.get("waiter"),
                        "holder_tid": e["tid"],
                        "mutex": e["mutex"],
                        "hold_ns": e["end_ns"] - e["start_ns"],
                        "ends_wait": bool(e.get("ends_wait")),
                        "holder_function": top_fn["name"] if top_fn else None,
                        "holder_functions": sorted({x["name"] for x in inside}),
                    }
                )
    obs = ((d.meta.get("ldb") or {}).get("observer")) or {}
    return {
        "calls": int(d.fn.size),
        "threads": int(np.unique(d.tid).size) if d.tid.size else 0,
        "lock_episodes": int(ep.ep.tid.size),
        "requests": int(d.req_latency.size),
        "functions": table,
        "ranking": ranking,
        "contribution": {k: v for k, v in contrib.items() if k != "ranking"},
        "timelines": tls,
        "holders": holder_lines,
        "flame": {"slow": fl_slow, "typical": fl_typ},
        "observer": obs,
        "config": (d.meta.get("ldb") or {}).get("config") or {},
        "runtime_features": (d.meta.get("ldb") or {}).get("runtime_features") or {},
        "priority": (d.meta.get("ldb") or {}).get("priority") or {},
        "warnings": list(sym.warnings),
        "names": {str(k): v for k, v in names.items()},
        "pid": d.pid,
    }


def holder_function(calls: list[dict], acquired: int, released: int) -> dict | None:
    """The function that held the lock over [acquired, released): of the holder's calls
    overlapping the hold, the deepest that contains it — it took and released the lock.

    A call's recorded start is the observer's first sighting, late by up to its error bound
    (`err_ns`, the scan gaps around its ends; a tenth of the hold where the recording has
    none); its recorded end is never early. So a call contains the hold when it starts by
    `acquired` + its error bound and ends at or after `released` (less 2 µs for clock reads).
    (The hold's own ends are stamped after the lock and unlock calls return.)
    Failing any, the call that overlaps the hold most."""
    hold = max(released - acquired, 1)

    def contains(x: dict) -> bool:
        err = x.get("err_ns")
        slack = hold // 10 if err is None else int(err)
        return x["start_ns"] <= acquired + slack and x["end_ns"] >= released - 2_000

    spanning = [x for x in calls if contains(x)]
    if spanning:
        return max(spanning, key=lambda x: (x["depth"], -x["start_ns"]))

    def cover(x: dict) -> int:
        return min(x["end_ns"], released) - max(x["start_ns"], acquired)

    return max(calls, key=cover, default=None)


def summary_lines(res: dict, top: int = 5) -> list[str]:
    """Terminal lines: the top contributors and the lock holders of the slowest requests."""
    from tailscope.report.text import fmt_ns

    lines = [
        f"Functions (LDB): {res['calls']} calls on {res['threads']} threads, "
        f"{res['lock_episodes']} logged lock episodes."
    ]
    c = res["contribution"]
    if res["ranking"] and c.get("slow_n"):
        lines.append(
            f"Slowest requests (≥ {fmt_ns(c['threshold_ns'])}, {c['slow_n']}) vs typical "
            f"({c['typical_n']}): functions by added time per request:"
        )
        for r in res["ranking"][:top]:
            if r["contribution_ns"] <= 0:
                break
            lines.append(
                f"  {r['name']:<32} +{fmt_ns(r['contribution_ns'])} "
                f"(slow {fmt_ns(r['slow_mean_ns'])}, typical {fmt_ns(r['typical_mean_ns'])})"
            )
    seen = set()
    for h in res["holders"]:
        key = (h["holder_tid"], h["holder_function"], h["mutex"])
        if key in seen:
            continue
        seen.add(key)
        lines.append(
            f"  lock holder: thread {h['holder_tid']} in {h['holder_function'] or '?'} held mutex "
            f"0x{h['mutex']:x} for {fmt_ns(h['hold_ns'])} while request {h['request_id']} waited"
        )
        if len(seen) >= 3:
            break
    for w in res["warnings"]:
        lines.append(f"  warning: {w}")
    return lines
