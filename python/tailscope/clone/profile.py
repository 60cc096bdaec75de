"""Profile a running server into profile.json (Ditto §4.3-4.4).

Steps (each prints a progress line):
  1. /proc: the launch (argv, cwd, environment, fd limit), threads, fds, listening sockets and
     their options (pidfd_getfd + getsockopt), epoll registrations.
  2. eBPF idle window (no load): time-driven syscalls and wakeups.
  3. eBPF + perf window at medium load on the live server: syscalls per thread with argument
     distributions and reply sizes, context switches, call stacks; a connected socket's options.
  4. callgrind window (relaunched copy, private netns, low rate): per-instruction counts and
     branch outcomes -> instruction mix, branches, dependency distances, instructions per request.
  5. cache-size sweep (same relaunch): instruction and data working sets per thread.
The profile keeps distributions and counts only: no addresses, strings or data of the target
except in the `private` section (the launch command, used to validate), which is never
written into the clone.
"""

from __future__ import annotations

import functools
import json
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

from . import isa, runner, target, threads, trace, workingset
from . import valgrind as vg
from .errors import CloneError, read_json
from .tools import find_loadgen, need

PROFILE_VERSION = 1
PROTOCOLS = {"memcached": 1, "redis": 2, "line": 3, "http": 4}
# callgrind windows per LL sweep size, pooled. Six since session 24: memcached's data-side misses
# at an 8 MiB LL are a few per window (0-12 in twelve windows of the original, mean 4.4), and the
# two windows of one profile counted 3 in all, so the clone's persistent data walkers were tuned
# to 1.5 per window and its LL rate at B sat 13% under. Twelve since session 28: six gave
# memcached's data side a persistent share of 0.05, where the validation's windows of the original
# at B kept 0.14 of A's. Ten since session 34, with anchor windows at A's LL (`ll_sweep_windows`):
# ~20 s a window or a pair, ~6.5 min for both sizes beside their anchors, ~10 min one at a time.
# Four since session 47: with the windows held (session 46) a window's LL misses no longer take
# in the connections' set-up and tear-down, which made the modes these counts were raised for
# (memcached's data side at 8 MiB: 0.1 a window, where sessions 24-28 counted 0-12), each loop
# iteration adds the original's windows at the largest LL to the target there
# (`tune.persistent_target`), and the pipeline, at 28 s a window, ran 33-43 minutes against its
# 30 (the sweep alone 9.3 min for redis's 20 pairs, 13.8 for memcached's 30 windows)
LL_SWEEP_WINDOWS = 4


def _deltas(before: list[dict], after: list[dict]) -> dict[int, dict]:
    b = {t["tid"]: t for t in before}
    out = {}
    for t in after:
        p = b.get(t["tid"], {k: 0 for k in t})
        out[t["tid"]] = {k: t[k] - p.get(k, 0) for k in ("utime", "stime", "minflt", "majflt", "vcsw", "ivcsw")}
    return out


def _tids_alive(pid: int, what: str, t0: float):
    if not target.proc_alive(pid):
        raise CloneError(
            f"the target exited {time.monotonic() - t0:.1f} s into profiling ({what}): it is too "
            "short-lived to profile; keep it running for the whole pipeline"
        )


def traced(window, what: str, progress, alive=None):
    """`window()`, a window with an eBPF trace, up to trace.TRACE_TRIES times while the trace
    fails (trace.TraceError: bpftrace did not attach, or hung and printed no maps); the last
    failure is the error. `alive()` runs before each retry and raises if the target is gone (a
    target that exited is reported as that, not as a trace failure)."""
    for attempt in range(1, trace.TRACE_TRIES + 1):
        try:
            return window()
        except trace.TraceError as exc:
            if alive is not None:
                alive()
            if attempt == trace.TRACE_TRIES:
                raise CloneError(f"{exc} ({what}, {attempt} tries)") from None
            progress(f"{what}: {exc}; trying again ({attempt + 1}/{trace.TRACE_TRIES})")


def live_windows(info: dict, load_args: list[str], rate: float, seconds: float, progress, workdir: Path) -> dict:
    """Steps 2-3 on the live target."""
    tools = need("bpftrace", "perf")
    pid = info["pid"]
    t0 = time.monotonic()
    listen_fds = [x["fd"] for x in info["listeners"]]
    notify = [int(fd) for fd, k in info["fds"].items() if k in ("eventfd", "pipe")]
    host = "127.0.0.1"
    progress("eBPF idle window (1.5 s, no load)")

    def _idle() -> dict:
        idle = trace.SyscallTrace(tools["bpftrace"], pid, listen_fds, notify, workdir / "idle")
        time.sleep(1.5)
        return idle.stop()

    idle_maps = traced(_idle, "idle window", progress, lambda: _tids_alive(pid, "idle window", t0))
    _tids_alive(pid, "idle window", t0)
    if load_args and "--preload" in load_args:
        progress("preloading the target's keys")
        try:
            runner.loadgen(None, info["port"], load_args, min(rate, 5000), 0.5, preload=True, host=host)
        except CloneError:
            _tids_alive(pid, "preload", t0)
            raise
    progress(f"eBPF + perf window at medium load ({rate:g} req/s, {seconds:g} s)")
    before = target.threads(pid)
    stacks: dict = {}

    def _live() -> tuple:
        live = trace.SyscallTrace(tools["bpftrace"], pid, listen_fds, notify, workdir / "live")
        stacks.clear()

        def _perf():
            try:
                stacks.update(trace.perf_stacks(tools["perf"], pid, max(1.0, seconds - 0.5), workdir / "live"))
            except CloneError as exc:
                stacks["error"] = str(exc)

        pt = threading.Thread(target=_perf)
        lg = find_loadgen()
        cmd = [
            lg,
            "--target",
            f"{host}:{info['port']}",
            *[a for a in load_args if a != "--preload"],
            "--rate",
            f"{rate:g}",
            "--duration",
            f"{seconds:g}",
            "--warmup",
            "0",
            "--quiet",
            "--json",
            "-",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pt.start()
        time.sleep(min(1.0, seconds / 3))
        conn_opts = target.conn_options(pid, set(listen_fds)) or {}
        out, err = proc.communicate(timeout=seconds + 120)
        pt.join()
        return live.stop(), proc, out, err, conn_opts

    maps, proc, out, err, conn_opts = traced(
        _live, "load window", progress, lambda: _tids_alive(pid, "load window", t0)
    )
    after = target.threads(pid)
    _tids_alive(pid, "load window", t0)
    if proc.returncode != 0:
        _tids_alive(pid, "load window", t0)
        raise CloneError(f"load generator failed against the target: {(err.strip().splitlines() or ['?'])[-1]}")
    summary = json.loads(out)
    if "error" in stacks:
        raise CloneError(stacks["error"])
    return {
        "idle": idle_maps,
        "live": maps,
        "stacks": stacks,
        "before": before,
        "after": after,
        "conn_opts": conn_opts,
        "loadgen": summary,
    }


def _per_thread_calls(maps: dict) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for (tid, nr, c), n in maps.get("calls", {}).items():
        out[tid][f"{trace.SYSCALLS.get(nr, f'sys{nr}')}:{trace.CLASS_NAMES.get(c, c)}"] += n
    return {t: dict(v) for t, v in out.items()}


def _mode(d: dict, default):
    return max(d.items(), key=lambda kv: kv[1])[0] if d else default


# fewer relative sleeps than this in the load window and a timer cluster keeps its fixed period
MIN_SLEEPS = 200


def sleep_table(slp: dict, members: list[int]) -> list[list[list[int]]] | None:
    """A timer cluster's requested sleeps under load, by the replies the process wrote since the
    thread's previous sleep (trace.py's @slp): row n (0..SERVED_CAP) holds [us, count] pairs,
    sorted by us. The clone's timer draws its next relative sleep from the row of the replies its
    own workers wrote since its last sleep, so a thread that sleeps longer when there was less
    work (memcached's LRU maintainer: 1,000 wakes/s at 1,800 req/s, 1,160 at 6,000) does so in
    the clone at every load, though it is profiled at one (docs/ditto.md, "Timer threads").
    None when the cluster made fewer than MIN_SLEEPS relative sleeps."""
    rows: list[dict[int, int]] = [defaultdict(int) for _ in range(trace.SERVED_CAP + 1)]
    for (tid, n, us), c in slp.items():
        if tid in members and 0 <= n <= trace.SERVED_CAP and c > 0:
            rows[n][us] += c
    if sum(sum(r.values()) for r in rows) < MIN_SLEEPS:
        return None
    return [[[us, c] for us, c in sorted(r.items())] for r in rows]


# fewer timer turns than this in the idle window and the clone's tick has no burst (`timer_turns`)
MIN_TIMER_TURNS = 5
# a loop holds its replies for its timer work when its long reply gaps come at this share of its
# timer's rate or more (`timer_turns`). A timer turn falls in a request's turn when a request wakes
# the loop between the timer's due time and its own wake, which the timeout rounds up to the next
# millisecond: at the profile's medium load (~6,000 req/s) ~80% of them do, at 1,800 ~55-70%. A
# loop that writes first shows none: the requests that came during the turn are read after it.
BEFORE_REPLY_SHARE = 0.25


def timer_turns(
    tturn: dict, worker_tids: list[int], idle_s: float, rgap: dict | None = None, live_s: float = 0.0
) -> dict | None:
    """The work the workers' event loop does on its own timer, from the idle window's timer turns
    (trace.py's @tturn: an epoll wait with a timeout that returned no event, to the next wait):
    the median turn in us and the turns per second per worker. redis's serverCron (hz 10) is
    126-321 us of each 100 ms there, median ~150 (session 32): a stall of the event loop that
    delays the requests that arrive meanwhile, and sets part of redis's p99. The idle window is
    the one where every wake of the loop is a timer's; under load the same work shares a turn with
    requests. None with fewer than MIN_TIMER_TURNS turns (memcached's workers have no timer).

    With the loaded window's reply gaps (@rgap, `live_s` its length), also whether the loop runs
    that work *before it writes the replies of the turn it shares* ("before_reply"): redis writes
    its replies in beforeSleep, after the time events, so the request whose wake finds the cron due
    waits for all of it (session 35: in a traced run at 1,800 req/s, ~60 of ~85 crons held a reply
    back 60-180 us; the clone, which wrote first, held none, and its p99 at low load was 15% under
    the original's). It does when the workers' gaps of at least half the idle turn come at
    BEFORE_REPLY_SHARE of the timer's rate or more ("deferred_per_second"); their median less the
    shorter gaps' is then the turn under load ("loaded_us": redis's cron with warm caches, ~100
    us, against ~150 after an idle second)."""
    turns = [(us, c) for (tid, us), c in tturn.items() if tid in worker_tids and c > 0]
    n = sum(c for _us, c in turns)
    if n < MIN_TIMER_TURNS or not worker_tids:
        return None
    median = _median_of_counts(turns)
    per_second = round(n / max(0.1, idle_s) / len(worker_tids), 3)
    out = {"us": int(median), "per_second": per_second, "turns": n}
    if rgap is not None and live_s > 0:
        long = [(us, c) for (tid, us), c in rgap.items() if tid in worker_tids and c > 0 and us >= median / 2]
        k = sum(c for _us, c in long)
        deferred = round(k / live_s / len(worker_tids), 3)
        out["deferred_per_second"] = deferred
        out["before_reply"] = k >= MIN_TIMER_TURNS and deferred >= per_second * BEFORE_REPLY_SHARE
        if out["before_reply"]:
            # less a reply's usual gap (its own read, work and write, which the clone's serve
            # spends anyway after the burst)
            short = [(us, c) for (tid, us), c in rgap.items() if tid in worker_tids and c > 0 and us < median / 2]
            out["loaded_us"] = max(1, int(_median_of_counts(long) - (_median_of_counts(short) if short else 0)))
    return out


def _median_of_counts(pairs: list[tuple[int, int]]) -> int:
    """The median value of (value, count) pairs (the lower one at an even split)."""
    n = sum(c for _v, c in pairs)
    acc = 0
    for v, c in sorted(pairs):
        acc += c
        if acc >= n / 2:
            return v
    return 0


def network_and_threads(info: dict, w: dict) -> dict:
    """The skeleton: network model, thread clusters, syscalls per request/connection/second."""
    maps, idle = w["live"], w["idle"]
    requests = max(1, int(w["loadgen"].get("completed", 0)))
    accepts = max(1, sum(maps.get("accepts", {}).values()))
    window_s = maps["duration_s"]
    calls = _per_thread_calls(maps)
    idle_calls = _per_thread_calls(idle)
    tids = [t["tid"] for t in w["after"]]
    roles = {t: threads.role(calls.get(t, {})) for t in tids}
    dmat = threads.distance_matrix(tids, roles, w["stacks"], calls)
    groups = threads.agglomerate(dmat)
    clusters = []
    for g in groups:
        members = [tids[i] for i in g]
        r = roles[members[0]]
        sleeps = sum(
            v for t in members for k, v in calls.get(t, {}).items() if k.startswith(("nanosleep:", "clock_nanosleep:"))
        )
        wake = sum(maps.get("sw", {}).get((t, 1), 0) for t in members)
        span_s = window_s
        gated_s = maps.get("gns", {}).get((), 0) / 1e9
        if gated_s >= 1.0:  # the period while the load's connections are open (session 7): the
            # whole window also holds the attach and detach, when a timer thread that adapts to
            # load (memcached's LRU maintainer) sleeps longer; the clone was validated under load
            sleeps = sum(maps.get("gsleep", {}).get((t,), 0) for t in members)
            wake = sum(maps.get("gsw", {}).get((t,), 0) for t in members)
            span_s = gated_s
        period_us = 0
        if r in ("timer", "waiter") and (sleeps or wake):
            per_thread = (sleeps or wake) / len(members)
            period_us = int(span_s * 1e6 / max(1, per_thread))
        cluster = {
            "role": r,
            "tids": members,
            "count": len(members),
            "period_us": period_us,
            "samples": sum(sum(w["stacks"].get(t, {}).values()) for t in members),
        }
        if r == "timer" and period_us:
            table = sleep_table(maps.get("slp", {}), members)
            if table:
                cluster["sleeps"] = table
        clusters.append(cluster)
    worker_tids = [t for t in tids if roles[t] in ("worker", "acceptor+worker")]
    acceptor_tids = [t for t in tids if roles[t] in ("acceptor", "acceptor+worker")]
    if not worker_tids:
        raise CloneError(
            "no thread of the target read requests from a connection during the load window: "
            "is --load driving this server's port?"
        )
    model = "single" if set(worker_tids) <= set(acceptor_tids) else "dispatch"

    def nr_of(name):
        return trace.NR.get(name)

    def wsum(keys, tset):
        return sum(calls.get(t, {}).get(k, 0) for t in tset for k in keys)

    reads = {n: wsum([f"{n}:conn"], worker_tids) for n in ("read", "recvfrom", "recvmsg", "readv")}
    writes = {n: wsum([f"{n}:conn"], worker_tids) for n in ("write", "sendmsg", "sendto", "writev")}
    read_call = _mode(reads, "read")
    write_call = _mode(writes, "write")
    eagain_reads = sum(
        n for (tid, nr, c), n in maps.get("eagain", {}).items() if tid in worker_tids and c == 2 and nr in trace.READS
    )
    eagain_accepts = sum(n for (tid, nr, c), n in maps.get("eagain", {}).items() if nr in (43, 288))
    args = maps.get("arg", {})

    def argdist(nr, cls, k):
        return {v: n for (a, c, kk, v), n in args.items() if a == nr and c == cls and kk == k}

    read_len = _mode(argdist(nr_of(read_call), 2, 2), 16384)
    ew_nr = 232 if wsum(["epoll_wait:other"], worker_tids) >= wsum(["epoll_pwait:other"], worker_tids) else 281
    maxevents = _mode(argdist(ew_nr, 0, 2), 32)
    timeout = _mode(argdist(ew_nr, 0, 3), -1)
    timeout = -1 if timeout >= 2**31 or timeout < 0 else int(timeout)
    notify_bytes = 8
    wr_notify = {k[2]: v for k, v in maps.get("ret", {}).items() if k[1] == 3 and k[0] in trace.WRITES}
    if wr_notify:
        notify_bytes = int(_mode(wr_notify, 8))
    notify_kind = "eventfd" if notify_bytes == 8 and info["fd_kinds"].get("eventfd") else "pipe"
    # per-connection syscalls in the worker threads (beyond data), rounded per accepted connection
    per_conn = defaultdict(float)
    for t in worker_tids:
        for k, v in calls.get(t, {}).items():
            name, cls = k.split(":")
            if cls == "conn" and name not in (*reads, *writes):
                per_conn[name] += v / accepts
    sso = [
        {"level": lv, "name": nm, "per_conn": n / accepts} for (c, lv, nm), n in maps.get("sso", {}).items() if c == 2
    ]
    conn_opt_values = w["conn_opts"]
    name_by = {(lv, opt): nm for nm, lv, opt, _k in target.SOCKOPTS}
    conn_opts = []
    for s in sorted(sso, key=lambda x: (x["level"], x["name"])):
        for _ in range(max(1, round(s["per_conn"]))):
            nm = name_by.get((s["level"], s["name"]))
            val = conn_opt_values.get(nm, 1) if nm else 1
            conn_opts.append([int(s["level"]), int(s["name"]), int(val if not isinstance(val, list) else val[0])])
    # one reply write per request, or one per read (replies of the requests one read carried are
    # buffered and written together, as redis does): whichever count the writes are closer to
    reads_data = sum(n for (nr, c, size), n in maps.get("ret", {}).items() if c == 2 and nr in trace.READS and size > 0)
    if reads_data and reads_data < requests:
        write_per_request = writes[write_call] >= 0.5 * (reads_data + requests)
    else:
        write_per_request = writes[write_call] >= 0.9 * requests
    # per-request "other" syscalls in worker threads beyond the idle (time-driven) rate
    idle_s = max(0.1, idle.get("duration_s", 1.5))
    idle_rate = defaultdict(float)
    for t in worker_tids:
        for k, v in idle_calls.get(t, {}).items():
            idle_rate[k] += v / idle_s
    extra_req, tick = [], []
    skip = {"epoll_wait:other", "epoll_pwait:other", f"{read_call}:conn", f"{write_call}:conn"}
    for k in sorted({k for t in worker_tids for k in calls.get(t, {})}):
        name, cls = k.split(":")
        if k in skip or cls in ("conn", "listen", "notify"):
            continue
        total = wsum([k], worker_tids)
        periodic = min(total, idle_rate.get(k, 0.0) * window_s)
        per_req = (total - periodic) / requests
        nr = nr_of(name)
        if nr is None:
            continue
        arg = _mode(argdist(nr, 0, 2) or argdist(nr, 0, 1), 0)
        if per_req > 0.0005:
            extra_req.append([nr, int(arg) if arg < 2**40 else 0, round(per_req, 6), name])
        if periodic > 0:
            tick.append([nr, int(arg) if arg < 2**40 else 0, round(periodic / window_s, 4), name])
    # reply sizes per request size (reads carrying one request are the common sizes)
    pairs = maps.get("pair", {})
    by_req = defaultdict(lambda: defaultdict(int))
    for (rq, rp), n in pairs.items():
        by_req[rq][rp] += n
    total_pairs = sum(pairs.values()) or 1
    kinds = []
    for rq in sorted(by_req, key=lambda r: -sum(by_req[r].values())):
        n = sum(by_req[rq].values())
        if n < 0.01 * total_pairs or rq <= 0 or len(kinds) >= 12:
            continue
        kinds.append({"req_bytes": int(rq), "sizes": {str(k): v for k, v in sorted(by_req[rq].items())}})
    bytes_in = sum(maps.get("bytes_in", {}).values())
    bytes_out = sum(maps.get("bytes_out", {}).values())
    per_request_syscalls = defaultdict(float)
    for t in tids:
        for k, v in calls.get(t, {}).items():
            per_request_syscalls[k] += v / requests
    return {
        "requests": requests,
        "window_s": window_s,
        "accepts": accepts,
        "model": model,
        "workers": len(worker_tids) if model == "dispatch" else 1,
        "notify": notify_kind,
        "notify_bytes": notify_bytes,
        "accept_call": 288 if wsum(["accept4:listen"], acceptor_tids) >= wsum(["accept:listen"], acceptor_tids) else 43,
        "accept_until_eagain": eagain_accepts > 0.3 * accepts,
        "read_call": nr_of(read_call),
        "read_len": int(read_len),
        "read_until_eagain": eagain_reads > 0.5 * requests,
        "write_call": nr_of(write_call),
        "write_per_request": bool(write_per_request),
        "epoll_maxevents": int(maxevents),
        "epoll_timeout_ms": timeout,
        "conn_opts": conn_opts,
        "getpeername_per_conn": round(per_conn.get("getpeername", 0)),
        "fcntl_per_conn": round(per_conn.get("fcntl", 0)),
        "epoll_ctl_per_conn": round(per_conn.get("epoll_ctl", 0)),
        "extra_per_request": extra_req,
        "tick_per_second": tick,
        "timer_turn": timer_turns(idle.get("tturn", {}), worker_tids, idle_s, maps.get("rgap", {}), window_s),
        "reply_kinds": kinds,
        "bytes_in_per_request": bytes_in / requests,
        "bytes_out_per_request": bytes_out / requests,
        "syscalls_per_request": dict(per_request_syscalls),
        "threads": {
            "tids": tids,
            "roles": {str(t): roles[t] for t in tids},
            "distance": dmat,
            "clusters": clusters,
            "method": "weighted Jaccard of perf call edges / syscall cosine",
            "stack_samples": {str(t): sum(w["stacks"].get(t, {}).values()) for t in tids},
        },
    }


def thread_map(native_tids: list[int], vg_threads: list[int]) -> dict[int, int]:
    """valgrind thread number -> native tid, by creation order."""
    vt = sorted(vg_threads)
    return {v: native_tids[i] for i, v in enumerate(vt) if i < len(native_tids)}


def body_groups(clusters: list[dict]) -> list[tuple[int, list[int], str]]:
    """Clusters that get one body each: all request-serving threads share one (the clone has one
    worker pool), timer/waiter clusters one each; idle threads need none. -> (index, tids, role)."""
    groups: dict[str, tuple[int, list[int], str]] = {}
    out = []
    for ci, c in enumerate(clusters):
        if c["role"] in ("worker", "acceptor+worker", "acceptor"):
            key = c["role"]
            if key in groups:
                groups[key][1].extend(c["tids"])
            else:
                groups[key] = (ci, list(c["tids"]), c["role"])
                out.append(groups[key])
        elif c["role"] in ("timer", "waiter"):
            out.append((ci, list(c["tids"]), c["role"]))
    return out


def body_profile(
    win: vg.Window, sweep: dict | None, clusters: list[dict], native_tids: list[int], events_by_role: dict[str, float]
) -> dict:
    """Per body group: the body's distributions per trigger event."""
    vmap = thread_map(native_tids, [t.thread for t in win.threads])
    out = {}
    for ci, tids, role in body_groups(clusters):
        members = set(tids)
        ts = [t for t in win.threads if vmap.get(t.thread) in members]
        if not ts:
            continue
        c = clusters[ci]
        events = events_by_role.get(role) or events_by_role.get("default", 1)
        if role in ("timer", "waiter") and c["period_us"]:
            events = max(1.0, win.seconds * 1e6 / c["period_us"] * len(members))
        a = isa.analyse(ts)
        ir = sum(t.summary.get("Ir", 0) for t in ts)
        dref = sum(t.summary.get("Dr", 0) + t.summary.get("Dw", 0) for t in ts)
        entry = {
            "role": role,
            "tids": sorted(members),
            "events": events,
            "instructions_per_event": ir / max(1, events),
            "data_refs_per_event": dref / max(1, events),
            "mix": a["mix_fraction"],
            "cond_per_insn": a["cond_branches"] / ir if ir else 0.0,
            "mispredict_rate": a["cond_mispredicts"] / a["cond_branches"] if a["cond_branches"] else 0.0,
            "branches": _branch_table(a["branches"]),
            "dep_hist": a["raw_dep_hist"],
            "avg_insn_bytes": a["avg_insn_bytes"],
            "code_footprint_bytes": a["code_footprint_bytes"],
            "static_cond_branches": a["static_cond_branches"],
            "rep": rep_per_event(a, events),
        }
        if sweep:
            entry.update(
                _ws_bins(
                    sweep,
                    [str(v) for v, tid in vmap.items() if tid in members],
                    entry["instructions_per_event"],
                    entry["data_refs_per_event"],
                )
            )
        out[str(ci)] = entry
    return out


def rep_per_event(a: dict, events: float) -> dict:
    """The rep string instructions of an analysis (isa.analyse) per trigger event: executions,
    instructions (callgrind's: iterations + executions) and bytes written per execution. The
    generator emits them as one unit (asmgen.rep_function), not as draws of the blocks' mix."""
    r = a.get("rep") or {}
    ex = r.get("executions", 0)
    return {
        "executions_per_event": ex / max(1e-9, events),
        "instructions_per_event": r.get("instructions", 0) / max(1e-9, events),
        "bytes_per_execution": r.get("bytes", 0) / ex if ex else 0.0,
        # the share of the lines it writes that miss the profiled D1 (session 12): redis's memset
        # misses all its ~150 lines every time, at A and B alike (a buffer per connection)
        "d1_miss_fraction": min(1.0, r.get("d1_misses", 0) / max(1.0, r.get("bytes", 0) / 64)),
    }


def body_instructions(
    win: vg.Window, clusters: list[dict], native_tids: list[int], events: tuple[str, ...] = ("Ir",)
) -> dict[str, float]:
    """Instructions (or the sum of other `events`) per request of each body group's threads in
    one window (by cluster index)."""
    vmap = thread_map(native_tids, [t.thread for t in win.threads])
    out = {}
    for ci, tids, _role in body_groups(clusters):
        members = set(tids)
        n = sum(t.summary.get(e, 0) for t in win.threads if vmap.get(t.thread) in members for e in events)
        out[str(ci)] = n / max(1, win.requests)
    return out


def pool_windows(wins: list[vg.Window], clusters: list[dict], native_tids: list[int]) -> dict:
    """Several callgrind windows of the original at one hierarchy as one target: the rates of the
    summed counts (as validate pools its windows), each window's own metrics, and each body group's
    instructions and D1 misses per request over the pool (the per-body targets of the instruction
    and D1 knobs)."""
    total = vg.pool(wins)
    req = max(1, total.requests)
    per_body: dict[str, float] = {}
    d1_body: dict[str, float] = {}
    for w in wins:
        for ci, v in body_instructions(w, clusters, native_tids).items():
            per_body[ci] = per_body.get(ci, 0.0) + v * w.requests / req
        for ci, v in body_instructions(w, clusters, native_tids, ("D1mr", "D1mw")).items():
            d1_body[ci] = d1_body.get(ci, 0.0) + v * w.requests / req
    return {
        "metrics": vg.metrics(total),
        "windows": [vg.metrics(w) | {"requests": w.requests} for w in wins],
        "body_instructions_per_request": per_body,
        # (session 12) each body's D1 misses per request: the D1 knob per body (tune.py)
        "body_D1_misses_per_request": d1_body,
    }


def _branch_table(branches: list[list[float]], keep: int = 256) -> list[list[float]]:
    """The (p, r, executions) of the most executed branches (enough to sample from)."""
    top = sorted(branches, key=lambda b: -b[2])[:keep]
    return [[b[0], b[1], b[2]] for b in top]


def _ws_bins(sweep: dict, vthreads: list[str], ir_per_event: float, dref_per_event: float) -> dict:
    """Hit-ratio curves of the threads (each sweep run normalised by its own accesses, so runs that
    served slightly different work compare), scaled to the detail window's accesses per event."""
    sizes = sweep["sizes"]
    n = len(sizes)
    ih, dh, ir, dref = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    for t in vthreads:
        s = sweep["threads"].get(t)
        if not s:
            continue
        for i in range(n):
            ih[i] += s["I"][i]
            dh[i] += s["D"][i]
            ir[i] += s["Ir"][i]
            dref[i] += s["Dref"][i]
    ihr = [ih[i] / ir[i] * ir_per_event if ir[i] else 0 for i in range(n)]
    dhr = [dh[i] / dref[i] * dref_per_event if dref[i] else 0 for i in range(n)]
    extra = {}
    mid = sweep.get("mid")
    if mid:  # the share of each data bin that hits at its mid size (workingset.lower_share)
        mh = {}
        for j, m in enumerate(mid["sizes"]):
            h = sum(mid["threads"].get(t, {}).get("D", [0.0] * (j + 1))[j] for t in vthreads)
            r = sum(mid["threads"].get(t, {}).get("Dref", [0.0] * (j + 1))[j] for t in vthreads)
            if r:
                mh[m] = h / r * dref_per_event
        extra["D_split"] = {str(k): v for k, v in workingset.lower_share(sizes, dhr, mh).items()}
    if sweep.get("cold"):  # first-time code fetches per event, in a window as long as the validation's
        cm = sum(sweep["cold"].get(t, {}).get("I1mr", 0) for t in vthreads)
        ci = sum(sweep["cold"].get(t, {}).get("Ir", 0) for t in vthreads)
        extra.update(I_cold=cm / ci * ir_per_event if ci else 0.0, cold_requests=sweep.get("cold_requests", 0))
    return {
        **extra,
        "ws_sizes": sizes,
        "I_hits": ihr,
        "D_hits": dhr,
        "I_accesses": ir_per_event,
        "D_accesses": dref_per_event,
        "I_bins": workingset.bins(sizes, ihr, ir_per_event),
        "D_bins": workingset.bins(sizes, dhr, dref_per_event),
    }


def run_profile(
    pid: int,
    load: str,
    rate: float,
    out: Path,
    progress,
    relaunch: str | None = None,
    seconds: float = 4.0,
    vg_rate: float = 400,
    vg_requests: int = 6000,
    sweep_requests: int = 800,
    max_ws: int | None = None,
    windows: int = 6,
) -> dict:
    """The whole profile of `pid` under `load` at medium `rate`; writes out/profile.json."""
    need("bpftrace", "perf", "valgrind", "callgrind_control", "unshare", "ip", "ss")
    load_args = runner.split_load(load)
    proto = runner.load_value(load_args, "--protocol", "redis")
    if proto not in PROTOCOLS:
        raise CloneError(f"--load: protocol {proto!r} is not one the clone can speak ({', '.join(PROTOCOLS)})")
    progress(f"inspecting pid {pid}")
    info = target.inspect(pid)
    if info["age_s"] < 1.0:
        time.sleep(1.0)
        _tids_alive(pid, "start", time.monotonic())
    work = out / "private" / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "idle").mkdir(exist_ok=True)
    (work / "live").mkdir(exist_ok=True)
    w = live_windows(info, load_args, rate, seconds, progress, work)
    net = network_and_threads(info, w)
    argv = info["cmdline"]
    if relaunch:
        import shlex

        argv = shlex.split(relaunch)
    elif len(argv) == 1 and " " in argv[0]:
        raise CloneError(
            f"pid {pid} rewrote its command line ({argv[0]!r}); pass --relaunch with the "
            "command that starts it, so valgrind can profile a second copy"
        )
    launch = {"argv": argv, "cwd": info["cwd"], "env": info["env"], "nofile": info["nofile"]}

    def original_window(tag: str, detail: bool = False) -> vg.Window:
        """One callgrind window of the relaunched original at A; one that served under half its
        requests is an error (valgrind could not keep up with --vg-rate)."""
        w = vg.window(
            launch,
            info["port"],
            load_args,
            vg_rate,
            vg_requests,
            work,
            tag,
            cache=vg.CONFIG_A,
            detail=detail,
            preload="--preload" in load_args,
        )
        if w.requests < 0.5 * vg_requests:
            raise CloneError(f"the valgrind copy served only {w.requests} of {vg_requests} requests; lower --vg-rate")
        return w

    progress(f"callgrind window: relaunched copy under valgrind, {vg_requests} requests at {vg_rate:g} req/s")
    win = original_window("detail", detail=True)
    # the tuning target (session 9): a pool of windows of the original at A, each run the way the
    # tuning loop and the validation run theirs (no --dump-instr / --collect-jumps, which slow
    # valgrind and so change how many requests one event-loop pass serves). One window is a draw
    # (memcached's D1 moved +-7% and its LL up to 1.8x between windows); the detail window above
    # gives the distributions only. Six windows since session 23 (were three), one after the other:
    # redis's code LL misses at A are ~83 per window, or ~150 in a window where jemalloc's decay path
    # runs once (the main thread signals jemalloc's background thread; ~50 code and ~37 data misses
    # more), about every other window. Three windows drew the same mode three times in session 22
    # (146 x3; the validation's six: 83 x3 and 142-158), a 1-in-4 draw; six make it 1 in 32.
    # Side by side they would be quicker, but two copies of the original side by side miss more
    # (session 22, reverted 819901f)
    pool: list[vg.Window] = []
    windows = max(1, windows)

    def pool_window(j: int) -> vg.Window:
        progress(f"callgrind window {j + 1}/{windows} (the tuning target's pool): {vg_requests} requests")
        pool.append(original_window(f"pool{j}"))
        return pool[-1]

    # the LL sweep (session 10): A's L1s, LL 2x and 4x A's (same ways): which of the LL misses
    # at A a larger LL keeps, code and data apart (generate.llc_bins; more than half of
    # memcached's LL misses at A are gone at 4x, and the clone, whose LL misses all missed any
    # LL, was 450% off at an 8 MiB LL)
    # Each size is LL_SWEEP_WINDOWS windows, pooled (session 22): redis's code misses per window
    # are bimodal (~75 or ~130 at 8 MiB: a jemalloc purge runs in some windows), and with one
    # window per size the sweep caught the low mode at 4 MiB and the high one at 8 (0.0126 and
    # 0.0217 per request), a shape no LRU cache has. Each is taken relative to anchor windows at
    # A's LL run at the same moments (session 34, `ll_sweep_windows`, `ll_sweep`): the misses that
    # no LL keeps move with the host from one run to the next
    ll_a = int(vg.CONFIG_A["LL"].split(",")[0])
    ll_sizes = [2 * ll_a, 4 * ll_a]
    busy_threads = sum(c.get("count", 0) for c in net["threads"]["clusters"] if c.get("role") != "idle")
    paired = busy_threads <= 1
    job = {
        "launch": launch,
        "port": info["port"],
        "load_args": load_args,
        "rate": vg_rate,
        "requests": vg_requests,
        "workdir": work,
        "branch": False,
        "preload": "--preload" in load_args,
    }
    sized = [{**job, "cache": {**vg.CONFIG_A, "LL": workingset.cache_arg(size)}} for size in ll_sizes]
    if paired:
        for j in range(windows):
            pool_window(j)
        ll_wins, ll_anchors = ll_sweep_windows(job, sized, LL_SWEEP_WINDOWS, paired, progress)
    else:
        # (session 47) a multi-threaded original's anchors run alone at A, as its pool's windows
        # do: the pool's first windows are the anchors, one a round
        rounds = min(LL_SWEEP_WINDOWS, windows)
        ll_wins, ll_anchors = ll_sweep_windows(job, sized, rounds, paired, progress, anchor=pool_window)
        for j in range(rounds, windows):
            pool_window(j)
    code_fp = isa.analyse(win.threads)["code_footprint_bytes"]
    dmax = max_ws or min(256 << 20, max(1 << 20, 1 << max(0, int(info["rss_kb"] * 1024 * 2 - 1).bit_length())))
    sizes = workingset.sizes(max(dmax, 2 * code_fp))
    progress(f"cache-size sweep: {len(sizes)} sizes, {sizes[0]} B .. {sizes[-1] >> 10} KiB")
    # one callgrind window per size, on the relaunched copy at the valgrind rate
    sweep = functools.partial(
        vg.sweep,
        launch,
        info["port"],
        load_args,
        vg_rate,
        sweep_requests,
        work,
        progress=progress,
        preload="--preload" in load_args,
    )
    sw = sweep(sizes)
    # the D1 sizes inside each octave bin (workingset.mid_sizes): where in its bin an original's
    # reuse distances lie (session 18: memcached's workers' (32, 64] KiB distances all lie below
    # 48 KiB, where a power-of-two sweep cannot tell them from a log-uniform bin's)
    mids = workingset.mid_sizes(sizes)
    if mids:
        msw = sweep(mids, tag="mid-bin sweep", arg=workingset.mid_cache_arg)
        sw["mid"] = {"sizes": mids, "threads": {t: {"D": v["D"], "Dref": v["Dref"]} for t, v in msw["threads"].items()}}
    # code fetched for the first time in a run is a count per run, and it grows with the run's
    # length (rarely taken and time-driven paths turn up as the window goes on), so it is
    # measured in a window as long as the validation's (session 7): at the largest swept size
    # the I1 holds all the code, and its misses are the fetches of lines not run before
    progress(f"cold code: {vg_requests} requests at the largest swept size")
    ll_cold = max(2 * sizes[-1], 2 << 20)
    cold = vg.window(
        launch,
        info["port"],
        load_args,
        vg_rate,
        vg_requests,
        work,
        "cold",
        cache={
            "I1": workingset.cache_arg(sizes[-1]),
            "D1": workingset.cache_arg(sizes[-1]),
            "LL": workingset.cache_arg(ll_cold),
        },
        branch=False,
        preload="--preload" in load_args,
    )
    sw["cold"] = {str(t.thread): {"I1mr": t.summary.get("I1mr", 0), "Ir": t.summary.get("Ir", 0)} for t in cold.threads}
    sw["cold_requests"] = cold.requests
    roles_events = {
        "worker": win.requests,
        "acceptor+worker": win.requests,
        "acceptor": max(1, sum(1 for _ in range(16))),
        "default": win.requests,
    }
    conns = int(runner.load_value(load_args, "--connections", "16") or 16)
    roles_events["acceptor"] = conns
    body = body_profile(win, sw, net["threads"]["clusters"], net["threads"]["tids"], roles_events)
    pooled = pool_windows(pool, net["threads"]["clusters"], net["threads"]["tids"])
    prof = {
        "version": PROFILE_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "load": {
            "args": load_args,
            "protocol": proto,
            "medium_rate": rate,
            "value_size": int(runner.load_value(load_args, "--value-size", "32") or 32),
            "connections": conns,
        },
        "network": {k: v for k, v in net.items() if k != "threads"},
        "threads": net["threads"],
        "listen": {
            "port": info["port"],
            "v6": all(x["family"] == 6 for x in info["listeners"]),
            "backlog": info["backlog"] or 1024,
            "options": info["listen_options"],
        },
        "body": body,
        "valgrind": {
            "config": vg.CONFIG_A,
            "requests": win.requests,
            "seconds": win.seconds,
            # the tuning target: the pool of all windows (summed counts); the detail window alone too
            "metrics": pooled["metrics"],
            "detail_metrics": vg.metrics(win),
            "code_sets": code_sets(win, win.requests),
            "windows": pooled["windows"],
            # the LL sweep's anchor windows at A (no branch simulation), each once; tune pools
            # them into the target where they ran beside another copy, as the loop's windows do
            # (`tune.target_anchors`); none where they are the pool's own windows (a multi-
            # threaded original, session 47: they are in "windows")
            "anchor_windows": _per_window(_unique(w for ws in ll_anchors for w in ws)) if paired else [],
            "anchors_paired": paired,
            "body_instructions_per_request": pooled["body_instructions_per_request"],
            "body_D1_misses_per_request": pooled["body_D1_misses_per_request"],
            "rate": vg_rate,
            "window_requests": vg_requests,
            "sweep_requests": sweep_requests,
            "ll_sweep": ll_sweep(
                pooled["metrics"],
                ll_a,
                ll_sizes,
                [vg.metrics(vg.pool(ws)) for ws in ll_wins],
                [len(pool), *(len(ws) for ws in ll_wins)],
                [vg.metrics(vg.pool(ws)) for ws in ll_anchors],
                [mode_balanced(_per_window(ws), _per_window(an)) for ws, an in zip(ll_wins, ll_anchors, strict=True)],
            ),
        },
        "private": {"launch": launch, "comm": info["comm"], "exe": info["exe"], "pid": pid},
    }
    (out / "private").mkdir(parents=True, exist_ok=True)
    (out / "private" / "profile.json").write_text(json.dumps(prof, indent=1, default=_json_default))
    return prof


def ll_sweep_windows(job: dict, sized: list[dict], n: int, paired: bool, progress, anchor=None) -> tuple[list, list]:
    """The LL sweep's windows (`vg.window` jobs `sized`, one per swept LL, each run `n` times) and
    their anchors (`job` at A's LL): (the windows per size, its anchors per size).

    A single-threaded original (`paired`): each window beside its own anchor (`vg.side_by_side`),
    a pair taking about as long as one window. A multi-threaded one: one anchor, then a window of
    each size, one at a time, `n` times. Session 34: two copies of memcached side by side missed
    more at A's LL than one alone (as its pool did in session 22: callgrind runs one thread at a
    time, and the pairing changes how the threads interleave) but not at 8 MiB, so its anchors in
    pairs read 0.016 code and 0.011 data misses a request against its pool's 0.012 and 0.0049, and
    the anchored points came out a half to a third of the raw ones; redis (one busy thread) was
    not inflated in pairs (session 22), and its runs with this code kept them (journal, session 34).

    `anchor(j)`, where given, is round j's anchor of a multi-threaded original (the profile's pool
    windows, session 47), in place of a window of `job`."""
    wins: list[list] = [[] for _ in sized]
    anchors: list[list] = [[] for _ in sized]
    if paired:
        for i, sj in enumerate(sized):
            for j in range(n):
                progress(f"LL sweep: size {i + 1}/{len(sized)}, window {j + 1}/{n}, beside one at A's LL")
                a, w = vg.side_by_side(
                    [{**job, "tag": f"llanchor{i}-{j}", "cache": vg.CONFIG_A}, {**sj, "tag": f"llsweep{i}-{j}"}]
                )
                anchors[i].append(a)
                wins[i].append(w)
    else:
        for j in range(n):
            progress(f"LL sweep: round {j + 1}/{n}: one window at A's LL, then one at each of {len(sized)} larger LLs")
            a = anchor(j) if anchor else vg.window(**{**job, "tag": f"llanchor-{j}", "cache": vg.CONFIG_A})
            for i, sj in enumerate(sized):
                anchors[i].append(a)
                wins[i].append(vg.window(**{**sj, "tag": f"llsweep{i}-{j}"}))
    return wins, anchors


def _unique(wins) -> list:
    """Each window once, in order (a multi-threaded original's anchors serve every swept size)."""
    seen: set[int] = set()
    return [w for w in wins if not (id(w) in seen or seen.add(id(w)))]


def _per_window(wins: list) -> list[dict]:
    """Each window's metrics and its request count (`mode_balanced`'s input)."""
    return [vg.metrics(w) | {"requests": w.requests} for w in wins]


# two modes of a service's windows (`split_modes`): the gap between them is at least this share
# of the upper mode's mean code-side LL misses (redis's: 74-91 and 121-158 a window at 8 MiB, a
# gap of 39 against a mean of 135; 80 and 142-158 at A's LL)
MODE_GAP = 0.25


def split_modes(values: list[float]) -> float | None:
    """The threshold between two modes of per-window values (the middle of their largest gap), or
    None when there are fewer than four values or the largest gap is under MODE_GAP of the upper
    mode's mean (one mode)."""
    v = sorted(values)
    if len(v) < 4:
        return None
    gap, i = max((v[k + 1] - v[k], k) for k in range(len(v) - 1))
    upper = v[i + 1 :]
    if gap <= 0 or gap < MODE_GAP * (sum(upper) / len(upper)):
        return None
    return v[i] + gap / 2


def mode_balanced(swept: list[dict], anchors: list[dict]) -> dict | None:
    """What a larger LL keeps of A's LL misses, per side, with the swept windows' modes weighed as
    the anchors hold them: sum over modes of the anchors' share x the swept mode's mean, over the
    same of the anchors' mode means ({"IL": ratio, "DL": ratio, "modes": [anchors in the upper
    mode, swept windows in it]}). None when either side's windows show one mode (their code-side
    misses, `split_modes`) or a mode has no window on one side: the pooled ratio stands then.

    Why (session 35): redis's windows are bimodal (a stretch of jemalloc's purge in some, drawn per
    copy), and a profile's sweep drew six of its ten anchors in the upper mode and two of its
    8 MiB windows. Each mode keeps 0.90-0.96 of its code misses at 8 MiB, the pool 0.73; the clone
    built on 0.73 missed 28% too few at B, where the validation's original kept 0.95."""
    key = "IL_misses_per_request"
    cuts = [split_modes([w.get(key, 0.0) for w in ws]) for ws in (swept, anchors)]
    if None in cuts:
        return None

    def modes(ws: list[dict], cut: float) -> list[list[dict]]:
        return [[w for w in ws if w.get(key, 0.0) <= cut], [w for w in ws if w.get(key, 0.0) > cut]]

    sm, am = modes(swept, cuts[0]), modes(anchors, cuts[1])
    if not all(sm) or not all(am):
        return None
    share = [len(m) / len(anchors) for m in am]
    # each mode's misses per request over its windows (their counts summed)
    sp, ap = [vg.pool_metrics(m) for m in sm], [vg.pool_metrics(m) for m in am]
    out: dict = {"modes": [len(am[1]), len(sm[1])]}
    for short, side in (("IL", "IL_misses_per_request"), ("DL", "DL_misses_per_request")):
        den = sum(f * a[side] for f, a in zip(share, ap, strict=True))
        num = sum(f * w[side] for f, w in zip(share, sp, strict=True))
        out[short] = num / den if den > 0 else None
    return out


# the hot code's page offsets (session 25): the lines fetched at least this often per request,
# counted by their set in a cache of CODE_SETS sets of 64-byte lines (bits 6-11 of the address:
# the same in the ELF file and in memory, since objects are mapped page-aligned)
CODE_SETS = 64
CODE_SETS_MIN_PER_REQUEST = 1.0


def code_sets(win: vg.Window, requests: int) -> dict:
    """How the original's hot code lines fall on the sets of a 64-set cache: its page offsets.

    An I1 of 64 sets or fewer is indexed by these bits alone, so this is the layout every such
    cache sees, whatever its ways (A's I1 folds them to 32 sets). memcached's ~375 lines fetched
    at least once per request sit 2-10 to a set (not 5.9 each): at 16 KiB its misses were 23%
    more at 4 ways than at 8, where the clone's contiguous blocks missed 9% fewer
    (asmgen.shape_sets gives the blocks this shape). Only counts: no address leaves the profile."""
    fetches: dict[tuple[str, int], int] = {}
    for t in win.threads:
        if "Ir" not in t.events:
            continue
        i = t.events.index("Ir")
        for (obj, addr), c in t.instr.items():
            if len(c) > i and c[i] > 0:
                key = (obj, addr >> 6)
                fetches[key] = fetches.get(key, 0) + c[i]
    hist = [0] * CODE_SETS
    for (_, line), n in fetches.items():
        if n >= CODE_SETS_MIN_PER_REQUEST * max(1, requests):
            hist[line % CODE_SETS] += 1
    return {"sets": CODE_SETS, "min_per_request": CODE_SETS_MIN_PER_REQUEST, "lines": hist}


def ll_sweep(
    target: dict,
    ll_a: int,
    sizes: list[int],
    metrics: list[dict],
    windows: list[int] | None = None,
    anchors: list[dict] | None = None,
    balanced: list[dict | None] | None = None,
) -> dict:
    """LL misses per request by side at the profiled LL (the pooled target) and each swept LL;
    `windows`: how many windows each point pools (generate.llc_bins weighs the points by it).

    `anchors`: for each swept size, the pool of windows at A's LL run at the same moments as its
    windows (`ll_sweep_windows`). A swept point is then the target's misses times its own over its
    anchors' (per side): what a larger LL keeps of A's misses, measured at the same moments.
    Session 34: redis's data misses at an 8 MiB LL were 67 per window in one profile's sweep and
    22-35 in runs an hour later, the windows at A's LL moving the same way (the host's load, most
    likely: the fewer instructions a request took, valgrind slower against the load, the more
    misses); divided by the earlier tuning pool, the sweep gave a persistent share of 0.56, and the
    clone's data side at B was 58% over. The raw points and the anchors' are kept ("raw",
    "anchor").

    `balanced`: for each swept size, `mode_balanced`'s ratios (or None): where a size has them, its
    point is the target's misses times that ratio instead (session 35), and "modes" keeps how many
    anchors and swept windows were in the upper mode (None: one mode, the pooled ratio)."""
    ms = [target, *metrics]
    out = {
        "sizes": [ll_a, *sizes],
        "IL": [m.get("IL_misses_per_request", 0.0) for m in ms],
        "DL": [m.get("DL_misses_per_request", 0.0) for m in ms],
    }
    if anchors is not None:
        if len(anchors) != len(metrics):
            raise ValueError("ll_sweep: one anchor pool per swept size")
        for key, side in (("IL", "IL_misses_per_request"), ("DL", "DL_misses_per_request")):
            out.setdefault("raw", {})[key] = out[key][1:]
            out.setdefault("anchor", {})[key] = [a.get(side, 0.0) for a in anchors]
            t = target.get(side, 0.0)
            out[key] = [t] + [
                t * m.get(side, 0.0) / a.get(side, 0.0) if a.get(side, 0.0) > 0 else m.get(side, 0.0)
                for m, a in zip(metrics, anchors, strict=True)
            ]
            for i, b in enumerate(balanced or []):
                if b is not None and b.get(key) is not None:
                    out[key][i + 1] = t * b[key]
    if balanced is not None:
        if len(balanced) != len(metrics):
            raise ValueError("ll_sweep: one balanced ratio (or None) per swept size")
        out["modes"] = [b["modes"] if b is not None else None for b in balanced]
    if windows is not None:
        out["windows"] = list(windows)
    return out


def _json_default(o):
    if isinstance(o, tuple):
        return list(o)
    return str(o)


def load_profile(path: Path) -> dict:
    """Read a profile.json; a corrupt or foreign file is a one-line CloneError."""
    try:
        prof = read_json(path)
    except OSError as exc:
        raise CloneError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not isinstance(prof, dict) or prof.get("version") != PROFILE_VERSION:
        raise CloneError(f"{path} is not a tailscope clone profile (version {PROFILE_VERSION})")
    for key in ("network", "threads", "listen", "body", "load"):
        if key not in prof:
            raise CloneError(f"{path} is corrupt: no {key!r} section")
    return prof
