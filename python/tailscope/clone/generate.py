"""Write a clone directory from a profile, a seed and the tuning knobs.

    clone/
      clone.c            the skeleton (same for every clone: templates/skeleton.c)
      clone_params.h     network/thread model constants (generated)
      clone_tables.h     profiled tables: reply sizes, socket options, syscall replay, threads
      body.S             the generated assembly bodies (asmgen)
      Makefile           `make` builds ./clone with plain gcc (or CC=clang)
      run.sh             starts the clone and drives it with the same load
      clone.json         seed, knobs, thread map, what the generator targeted (no original data)
      private/           the profile and validation artefacts: never share this directory

Deterministic: the same profile, seed and knobs give byte-identical files.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import numpy as np

from . import asmgen, trace, workingset
from .errors import CloneError
from .profile import PROTOCOLS

TEMPLATES = Path(__file__).resolve().parent / "templates"
# the starting point of the tuning loop: every knob neutral (the cache curves' shape comes from
# the profile's sweep; the knobs scale whole groups, see tune.py)
DEFAULT_KNOBS = {
    "instr_scale": 1.0,
    "code_scale": 1.0,
    "icode_far_scale": 1.0,
    "data_far_scale": 1.0,
    "data_ll_scale": 1.0,
    "code_llc_scale": 1.0,
    "data_llc_scale": 1.0,
    "cold_code_scale": 1.0,  # the cold code ring's calls, tuned only where the clone has no code rings
    "branch_r_scale": 1.0,
    "branch_mask_frac": 0.0,  # the share of branch patterns in the counter-mask form (asmgen._branch_patterns)
    "cond_scale": 1.0,
    "mem_scale": 1.0,  # a factor on the bodies' data references (tune.py: data references per request)
    "branch_x": 2.0,  # the random-branch unit's branches per event (asmgen.brx_function)
    "i1_bytes": 32768,
    "d1_bytes": 32768,
    "ll_bytes": 2 << 20,
    "ll_assoc": 16,
    # 1: the blocks' lines on the original's code sets (asmgen.shape_sets); off by default: on
    # session 25's memcached profile it took the clone's 4-way/8-way ratio at 16 KiB from 0.91 to
    # 1.00 (the original's 1.03), but the clone's 16 KiB point sat 23% over the original's, which
    # the contiguous layout's lower 4-way misses had hidden at B (journal, session 25)
    "shape_sets": 0.0,
}
BODY_ROLES = ("worker", "acceptor+worker", "acceptor", "timer", "waiter")
PROFILED_D1 = DEFAULT_KNOBS["d1_bytes"]  # the D1 a profile's rep miss share was measured at (CONFIG_A)


def _c_ident_ok(v) -> int:
    return int(v)


def body_name(ci, role: str) -> str:
    """The body's name in the clone (clone_body_<name>, its threads' name in clone.json): one per
    role, a background cluster by its index."""
    return {"worker": "worker", "acceptor+worker": "worker", "acceptor": "acceptor"}.get(role, f"bg{ci}")


def _body_cond(b: dict, skel: dict | None, body_ir: float) -> float:
    """Conditional branches per body instruction: the original's per event less the skeleton's."""
    cond = b.get("cond_per_insn", 0.0)
    if not skel or "cond_per_event" not in skel or body_ir <= 0:
        return cond
    return max(0.0, cond * b["instructions_per_event"] - skel["cond_per_event"]) / body_ir


def body_spec(name: str, b: dict, skel: dict | None) -> asmgen.BodySpec:
    """What the body of one cluster must add on top of the skeleton's own work (per event)."""
    ir = b["instructions_per_event"]
    skel_ir = skel.get("instructions_per_event", 0.0) if skel else 0.0
    body_ir = max(0.0, ir - skel_ir)
    mix = dict(b["mix"])
    if skel and skel.get("mix") and body_ir > 0:
        mix = {k: max(0.0, b["mix"].get(k, 0) * ir - skel["mix"].get(k, 0) * skel_ir) for k in b["mix"]}
        tot = sum(mix.values()) or 1.0
        mix = {k: v / tot for k, v in mix.items()}
    ibins, dbins, main_frac, chunk, cold_bin, cold_code = [(256, 1.0)], [(0, 1.0)], 0.0, 0, 0, 0.0
    curve = _code_curve(name, b["I_bins"]) if b.get("I_bins") else None
    skel_lines, hot_bytes = 0.0, 0.0
    dref = b.get("data_refs_per_event", 0.0)
    rep = _body_rep(b, skel, f"profile body {name}")
    # the share of its lines that missed the profiled D1 in the original; over half: a cold rep,
    # its lines come back from beyond the D1
    rep_miss = _rep_fields("profile body", b["rep"])["d1_miss_fraction"] if rep[0] > 0 else 0.0
    rep_cold = rep_miss > 0.5
    if b.get("I_bins"):
        i_bins = [list(x) for x in b["I_bins"]]
        d_bins = [list(x) for x in b["D_bins"]]
        # the footprint the body's blocks must run per event: the original's crossing less the
        # skeleton's (workingset.footprint_crossing)
        hot_bytes = workingset.footprint_crossing([tuple(x) for x in b["I_bins"]])
        if skel and skel.get("I_bins"):
            # measured (redis): in the whole clone the skeleton adds about a third of
            # its own crossing to the footprint (its loop and libc stubs are a few lines; alone,
            # its crossing also counts what an idle thread touches between requests)
            hot_bytes -= 0.35 * workingset.footprint_crossing([tuple(x) for x in skel["I_bins"]])
        if skel and skel.get("I_bins"):
            skel_lines = sum(n for s, n in skel["I_bins"] if s > 128)
            # beyond the profiled I1 the skeleton alone shows misses that the whole clone does not
            # (measured: ~1 per request at A against 119 alone, redis): keep the original's tail
            i_bins = _subtract(i_bins, [(s, n) for s, n in skel["I_bins"] if s <= 32768])
            d_bins = _subtract(d_bins, skel["D_bins"])
            dref = max(0.0, dref - skel.get("data_refs_per_event", 0.0))
        if rep_cold:
            d_bins = take_rep_lines(d_bins, rep_lines_per_event(rep, rep_miss))
        # line entries: fetches that miss even a 128-byte cache; the clone starts a new line
        # every `chunk` instructions, and each working-set bin gets its share of line entries
        # fetches that miss even at the largest swept size (cold code, run once per window) are
        # the cold code ring's (asmgen: lines never fetched before; they miss every LL). They
        # joined the largest swept bin before, whose ring is reused within the run and hits a
        # 2 MiB LL, so the clone had no instruction-side LL misses: more than half of the
        # originals' LL misses at A are instruction fetches (redis 132 of 237 in the window)
        if len(i_bins) >= 3:
            cold_code = max(0.0, i_bins[-1][1])
            i_bins = i_bins[:-1]
        if "I_cold" in b:  # measured in a window as long as the validation's (profile.py)
            cold_code = max(0.0, b["I_cold"])
        cap = max(4096, int(b.get("code_footprint_bytes", 1 << 20)) * 2)
        capped: dict[int, float] = {}
        for s_, n in i_bins:  # bins beyond the cap merge into one (a ring per bin: no duplicates)
            capped[min(int(s_), cap)] = capped.get(min(int(s_), cap), 0.0) + n
        i_bins = [[s_, n] for s_, n in sorted(capped.items())]
        cold_bin = int(d_bins[-1][0])  # workingset.bins: the last bin misses at the largest size
        far = [(s, n) for s, n in i_bins[1:] if n > 0]
        entries = sum(n for _, n in far)
        chunk = int(min(24, max(3, round(body_ir / entries)))) if entries > 0 else 0
        ibins = [(s, n / entries) for s, n in far] if entries > 0 else [(256, 1.0)]
        main = [(s, n) for s, n in d_bins[1:] if n > 0]
        mtot = sum(n for _, n in main)
        main_frac = min(1.0, mtot / dref) if dref > 0 else 0.0
        dbins = [(s, n / mtot) for s, n in main] if mtot > 0 else [(0, 1.0)]
    mem_per_insn = min(1.0, dref / body_ir) if body_ir > 0 else 0.0
    if rep[0] > 0:  # the rep unit makes the rep string instructions: the mix draws none
        mix = {k: (0.0 if k.startswith("rep/") else v) for k, v in mix.items()}
        tot = sum(mix.values()) or 1.0
        mix = {k: v / tot for k, v in mix.items()}
    split = None
    if b.get("D_split") is not None:  # (profiles since session 18: workingset.lower_share)
        try:
            split = {int(k): float(v) for k, v in dict(b["D_split"]).items()}
            if not all(math.isfinite(v) for v in split.values()):
                raise ValueError("a share is not a finite number")
            split = {k: min(1.0, max(0.0, v)) for k, v in split.items()}
        except (TypeError, ValueError) as exc:
            raise CloneError(
                f"profile body {name}: D_split is not a map of sizes to shares ({exc}): corrupt profile"
            ) from exc
    return asmgen.BodySpec(
        name=name,
        instructions=body_ir,
        data_split=split,
        mix=mix,
        cond_per_insn=_body_cond(b, skel, body_ir),
        branches=b.get("branches") or [],
        dep_hist=b.get("dep_hist") or [1] * len(asmgen.DEP_BINS),
        icode_bins=ibins,
        data_bins=dbins,
        mem_per_insn=mem_per_insn,
        main_fraction=main_frac,
        chunk_insns=chunk,
        cold_bin=cold_bin,
        cold_code_lines=cold_code,
        skel_code_lines=skel_lines,
        hot_code_bytes=max(0.0, hot_bytes),
        rep_per_event=rep[0],
        rep_iters=rep[1],
        rep_width=rep[2],
        rep_cold=rep_cold,
        code_curve=curve,
    )


def _code_curve(name: str, bins) -> list[tuple[int, float]]:
    """A body's I_bins checked: [size, fetches] pairs of finite numbers >= 0 (a one-line error
    otherwise, like _rep_fields: the profile is input the user may have edited or truncated)."""
    out = []
    for x in bins if isinstance(bins, list) else [None]:
        ok = isinstance(x, (list, tuple)) and len(x) == 2
        ok = ok and all(not isinstance(v, bool) and isinstance(v, (int, float)) for v in x)
        if not ok or not all(math.isfinite(v) and v >= 0 for v in x):
            raise CloneError(f"profile body {name} I_bins entry {x!r} is not a [size, fetches] pair: corrupt profile")
        out.append((int(x[0]), float(x[1])))
    return out


def tick_burst(net: dict) -> tuple[int, int, bool]:
    """The clone's tick burst from the profile's `timer_turn` (profile.timer_turns): (its length
    in us, its period in us, whether it runs before the replies of the turn it falls in), (0, 0,
    False) without one. The period is the loop's epoll timeout when the timer turns came about once
    per timeout (within a quarter: redis's 100 ms, whose idle window of ~1.5 s holds 14-16 turns,
    so its rate alone is 7% off); else one over their rate. The length is the turn under load
    (`loaded_us`) where the profile has one, else the idle turn's. A malformed entry is a one-line
    error (the profile is input the user may have edited)."""
    tt = net.get("timer_turn")
    if tt is None:
        return 0, 0, False
    us, rate = (tt.get("us"), tt.get("per_second")) if isinstance(tt, dict) else (None, None)
    ok_us = type(us) is int and 0 < us <= 1_000_000
    ok_rate = isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0.01 <= rate <= 10_000
    before = tt.get("before_reply", False) if isinstance(tt, dict) else False
    loaded = tt.get("loaded_us") if isinstance(tt, dict) else None
    ok_loaded = loaded is None or (type(loaded) is int and 0 < loaded <= 1_000_000)
    if not ok_us or not ok_rate or type(before) is not bool or not ok_loaded:
        raise CloneError(f"profile network timer_turn {tt!r} is not {{us, per_second}}: corrupt profile")
    period = round(1e6 / rate)
    timeout = net.get("epoll_timeout_ms")
    if type(timeout) is int and timeout > 0 and abs(period / (timeout * 1000) - 1) <= 0.25:
        period = timeout * 1000
    if loaded is not None:
        us = loaded
    return us, max(period, 2 * us), before


def sleep_rows(rows, what: str) -> tuple[list[int], list[int], list[int]]:
    """A timer cluster's `sleeps` (profile.sleep_table: SERVED_CAP + 1 rows of [us, count]) as
    the skeleton's flat tables: durations, counts cumulative within each row, and each row's
    [start, end) offsets (SERVED_CAP + 2 of them). A row with no sleep borrows the nearest row that
    has one (the fewer replies first). Malformed rows are a one-line error: the profile is input
    the user may have edited or truncated."""
    n_rows = trace.SERVED_CAP + 1
    if not isinstance(rows, list) or len(rows) != n_rows:
        raise CloneError(f"{what} sleeps is not a list of {n_rows} rows: corrupt profile")
    clean: list[list[tuple[int, int]]] = []
    for n, row in enumerate(rows):
        if not isinstance(row, list):
            raise CloneError(f"{what} sleeps row {n} is not a list: corrupt profile")
        pairs = []
        for x in row:
            ok = isinstance(x, list) and len(x) == 2 and all(type(v) is int for v in x)
            if not ok or not 0 <= x[0] <= 10_000_000 or not 0 < x[1] < 2**31:
                raise CloneError(f"{what} sleeps row {n} entry {x!r} is not a [us, count] pair: corrupt profile")
            pairs.append((x[0], x[1]))
        clean.append(pairs)
    full = [n for n in range(n_rows) if clean[n]]
    if not full:
        raise CloneError(f"{what} sleeps has no sleep in any row: corrupt profile")
    us: list[int] = []
    cum: list[int] = []
    at = [0]
    for n in range(n_rows):
        src = clean[min(full, key=lambda m: (abs(m - n), m))]
        total = 0
        for d, c in src:
            total += c
            if total >= 2**24:  # the skeleton's sample_cum draws 24 random bits
                raise CloneError(f"{what} sleeps row {n} counts add up past 2^24: corrupt profile")
            us.append(d)
            cum.append(total)
        at.append(len(us))
    return us, cum, at


REP_MAX_EXECUTIONS = 64.0  # rep executions per event the unit unrolls; more are merged (longer reps)
REP_MAX_BYTES = 1 << 20  # one execution's region at most


def _rep_fields(what: str, r) -> dict[str, float]:
    """A `rep` entry (profile body or skeleton) checked: finite numbers >= 0 (a one-line error
    otherwise: the profile is input the user may have edited or truncated)."""
    if not isinstance(r, dict):
        raise CloneError(f"{what} rep is {type(r).__name__}, not an object: corrupt profile")
    out = {}
    for k in ("executions_per_event", "instructions_per_event", "bytes_per_execution", "d1_miss_fraction"):
        v = r.get(k, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise CloneError(f"{what} rep.{k} is {v!r}, not a finite number >= 0: corrupt profile")
        out[k] = float(v)
    return out


def _body_rep(b: dict, skel: dict | None, what: str = "profile body") -> tuple[float, int, int]:
    """The rep unit of a body (asmgen.rep_function): executions per event, iterations and bytes
    per iteration of the original's rep string instructions less the skeleton's own (its libc
    copies). (0, 0, 1) for profiles before session 12, which have no `rep` (the mix draws it)."""
    if b.get("rep") is None:
        return 0.0, 0, 1
    r = _rep_fields(what, b["rep"])
    s = _rep_fields("skeleton", (skel or {}).get("rep") or {})
    ex, ins = r["executions_per_event"], r["instructions_per_event"]
    s_ex = s["executions_per_event"]
    # iterations (callgrind: n + 1 instructions per execution of n iterations) by difference
    it_b = (ins - ex) - (s["instructions_per_event"] - s_ex)
    if ex <= 1e-4 or it_b <= 0:
        return 0.0, 0, 1
    mean_len = max(1.0, ins / ex - 1)  # the original's own iterations per execution
    # the executions by difference too, unless the skeleton's make up most of them (its many
    # short copies; a near-cancellation would make one huge rep): then at the original's mean length
    ex_b = ex - s_ex if ex - s_ex > 0.1 * ex else it_b / mean_len
    ex_b = min(ex_b, REP_MAX_EXECUTIONS)
    per_iter = r["bytes_per_execution"] / mean_len
    width = min((1, 2, 4, 8), key=lambda w: abs(w - per_iter))
    iters = max(1, min(round(it_b / ex_b), REP_MAX_BYTES // width))
    return ex_b, iters, width


def code_sets(prof: dict) -> list[int] | None:
    """The profile's hot code lines per set (profile.code_sets), checked; None where it has none
    (profiles before session 25: the blocks stay contiguous)."""
    cs = (prof.get("valgrind") or {}).get("code_sets")
    if cs is None:
        return None
    lines = cs.get("lines") if isinstance(cs, dict) else None
    if (
        not isinstance(lines, list)
        or len(lines) != 64
        or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 24 for x in lines)
    ):
        raise CloneError("profile valgrind.code_sets is not 64 line counts: corrupt profile")
    return lines


def llc_bins(ll_sweep: dict | None) -> dict[str, list[tuple[int, float]]]:
    """The profile's LL sweep as bins per side: (L, misses per request that hit an LL of L bytes
    and miss one of L / 2), from the misses per request at each swept LL (the first the profiled
    one). What misses at the largest swept LL is not in a bin (the walkers' and the cold code
    ring's persistent misses). Also "persistent": {side: that fraction of the misses at the
    profiled LL}, and "persistent_misses": {side: those misses per request}.

    The points are made non-increasing (a larger LL never misses more in LRU; a draw can) by the
    least-squares fit (`nonincreasing`, weighted by the windows each point pools), not by a
    running minimum: redis's sweep of session 22 had 0.0261, 0.0126 and 0.0217 code misses per
    request at 2, 4 and 8 MiB (its windows are bimodal), and the minimum made the low draw at
    4 MiB the persistent misses, 74 per window, where six validation windows of the original at
    B (an 8 MiB LL) had 127-130; the fit takes 0.0172 for both."""
    out: dict = {"code": [], "data": [], "persistent": {}, "persistent_misses": {}}
    if not ll_sweep or len(ll_sweep.get("sizes") or []) < 2:
        return out
    sizes = ll_sweep["sizes"]
    for side, key in (("code", "IL"), ("data", "DL")):
        vals = list(ll_sweep.get(key) or [])
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in [*sizes, *vals])
        if not all(ok):
            raise CloneError(f"profile valgrind.ll_sweep {key} or sizes hold a non-number: corrupt profile")
        xs = [max(0.0, float(x)) for x in vals][: len(sizes)]
        if len(xs) < 2:  # (a side the sweep does not hold: no bins, nothing persistent)
            continue
        xs = nonincreasing(xs, _sweep_weights(ll_sweep, len(xs)))
        out[side] = [(int(sizes[i]), xs[i - 1] - xs[i]) for i in range(1, len(xs)) if xs[i - 1] > xs[i]]
        out["persistent"][side] = xs[-1] / xs[0] if xs[0] > 0 else 1.0
        out["persistent_misses"][side] = xs[-1]
    return out


def _sweep_weights(ll_sweep: dict, n: int) -> list[float]:
    """Each LL sweep point's weight: the windows it pools (profiles since session 22), else 1."""
    w = ll_sweep.get("windows")
    if isinstance(w, list) and len(w) >= n:
        try:
            ws = [float(x) for x in w[:n]]
        except (TypeError, ValueError):
            ws = []
        if ws and all(math.isfinite(x) and x > 0 for x in ws):
            return ws
    return [1.0] * n


def nonincreasing(xs: list[float], weights: list[float]) -> list[float]:
    """The weighted least-squares non-increasing fit of xs (pool adjacent violators): a run of
    points that rises is replaced by its weighted mean, as often as it takes."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count]
    for x, w in zip(xs, weights, strict=True):
        blocks.append([x * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            s, wt, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += wt
            blocks[-1][2] += c
    return [b[0] / b[1] for b in blocks for _ in range(int(b[2]))]


def _set_llc(specs: dict, prof: dict) -> None:
    """The LL conflict rings (asmgen.llc_rings) go to the body that runs most often per request
    (the worker's: its misses per event are the bins' misses per request over its events)."""
    bins = llc_bins((prof.get("valgrind") or {}).get("ll_sweep"))
    if not specs:
        return
    sp = max(specs.values(), key=lambda x: (x.name == "worker", x.events_per_request))
    sp.branch_unit = True  # the random-branch unit too (asmgen.brx_function)
    # (the workers' arena: the skeleton warms the rings' lines there, clone_warm)
    if not (bins["code"] or bins["data"]) or sp.name not in ("worker", "acceptor"):
        return
    epr = max(1e-9, sp.events_per_request)
    sp.llc_code = [(s, n / epr) for s, n in bins["code"]]
    sp.llc_data = [(s, n / epr) for s, n in bins["data"]]
    _persistent_cold_walker(sp, bins, int(max(prof["valgrind"]["ll_sweep"]["sizes"])))


def _persistent_cold_walker(sp: asmgen.BodySpec, bins: dict, keep: int) -> None:
    """Give the body a cold walker for the data misses the LL sweep's largest LL still has, where
    none of its walkers would make them (no accesses in bins beyond that LL, nor in the cold
    bin): its cold bin takes the mass whose walker touches that many new lines per event, and
    the loop's `data_ll_scale` tunes it from there (tune._ll_by_side). Session 24: memcached's
    working-set sweep (600-request runs) saw nothing beyond 8 MiB, while its LL sweep (six
    6,000-request windows at 8 MiB) saw 2 data misses per window, and the original's windows at B
    3.5 (first touches, once per window); once the walkers of its 4 and 8 MiB bins ran at the
    rings' knob (asmgen.far_data_knob), nothing of the clone but its skeleton missed at B: 1.5."""
    want = bins["persistent_misses"].get("data", 0.0) / max(1e-9, sp.events_per_request)
    if want <= 0 or sp.cold_bin <= asmgen.NEAR_MAX:
        return
    if any(m > 0 and (s > keep or s == sp.cold_bin) for s, m in sp.data_bins):
        return
    main_acc = sp.mem_per_insn * sp.main_fraction * sp.instructions  # (asmgen.walker_list)
    tot = sum(m for _, m in sp.data_bins)
    if tot <= 0 or main_acc <= 2 * want:
        return
    m = want * tot / (main_acc - want)  # its lines: m / (tot + m) x main_acc = want
    # (body_spec leaves out the bins without accesses, the cold one among them)
    sp.data_bins = [(s, x) for s, x in sp.data_bins if s != sp.cold_bin] + [(sp.cold_bin, m)]


# the most the cold code ring is raised to the persistent code misses (`_cap_cold_code`): the first
# fetches and the LL sweep's last point count the same code, so they differ by the draw, not by
# a factor
COLD_RAISE_MAX = 2.0


def _skeleton_ll(skeleton: dict | None) -> dict[str, float]:
    """The skeleton's LL misses per request at A and at the LL sweep's largest size
    (tune.measure_skeleton's "_ll"), its numbers checked; {} where it has none."""
    ll = (skeleton or {}).get("_ll")
    if ll is None:
        return {}
    if not isinstance(ll, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf") for v in ll.values()
    ):
        raise CloneError("skeleton.json _ll holds a non-number: corrupt skeleton measurement")
    return {k: float(v) for k, v in ll.items()}


def _cap_cold_code(specs: dict, prof: dict, skeleton_code: float = 0.0) -> None:
    """The cold code ring's fetches miss every LL (asmgen.cold_ring), so all bodies' cold lines per
    request are set to what the original's code misses at the largest LL of its LL sweep (the
    code misses no LL keeps). The first fetches counted at the largest swept I1 (I_cold) can be
    more: redis's 94 per window against 74 code misses at both a 4 and an 8 MiB LL (session 18),
    so the clone's code LL misses sat at its cold ring's 0.0161 per request, 27% over the
    original's 0.0126 at the held-out 8 MiB, with nothing else of its code missing there. They
    can be fewer, and since session 24 the ring is raised to the sweep's figure too, by at most
    COLD_RAISE_MAX: the clone's code that misses the largest LL is the cold ring alone (its
    conflict rings hit there by design), and memcached's first fetches, 17.9 per window against
    the sweep's 19.5 at 8 MiB, left the clone's code misses at B at 17 where the original's four
    windows had 17-20 (its LL rate 13% under with the data side matched). No LL sweep: as
    counted. `skeleton_code`: what the skeleton alone misses at that LL (measure_skeleton's "_ll",
    per request), which the ring leaves to it (session 25)."""
    persistent = llc_bins((prof.get("valgrind") or {}).get("ll_sweep"))["persistent_misses"].get("code")
    if persistent is None:
        return
    cold = sum(sp.cold_code_lines * sp.events_per_request for sp in specs.values())
    if cold > 0:
        f = min(COLD_RAISE_MAX, max(0.0, persistent - skeleton_code) / cold)
        for sp in specs.values():
            sp.cold_code_lines *= f


def _cold_window_ratio(ci: int, b: dict, vgp: dict) -> float:
    """First-time code is a count per run: `I_cold` per event is that count over the cold
    window's requests (`cold_requests`), and the clone must fetch it over the validation window's
    (as long as the profile's detail window: valgrind.requests). Returns cold / window requests;
    a missing count, or a cold window less than half or more than twice the window (a stalled
    or different run, whose count per run is not this one's), is a corrupt profile."""
    creq, wreq = b.get("cold_requests"), vgp.get("requests")
    for what, v in (("cold_requests", creq), ("valgrind.requests", wreq)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise CloneError(f"profile body {ci} has cold code (I_cold) but no {what} count ({v!r}): corrupt profile")
    if not 0.5 <= creq / wreq <= 2.0:
        raise CloneError(
            f"profile body {ci}: its cold code was counted over {creq} requests and the window has {wreq}: "
            "a count per run needs windows of one length; profile again"
        )
    return creq / wreq


def _touch_rows(specs: dict, bg_ids: dict[int, int]) -> list[tuple[int, int, int, int]]:
    """The start-up touch of all arenas as one LRU stack: (arena, offset, bytes, direction) rows
    (asmgen.TOUCH_UP / TOUCH_DOWN), the ranges that keep the longest reuse distance first. Arena
    0 is the workers' (and the acceptor's: the larger body's layout), arena k + 1 the k-th
    background row's own. Up to session 7 each arena
    was touched on its own when it was made, the workers' first: the timer's (memcached: 4.7 MiB,
    3.8 of them walked beyond the LL) came after and pushed all of the workers' regions out of a
    2 MiB LL, so every line of a slowly walked worker region missed the LL the first time the
    window reached it (the walkers' periods outgrew warm-up and window once the tuner slowed
    them: memcached's LL at A 740%)."""
    rows = []
    shared = [sp for sp in specs.values() if sp.name in ("worker", "acceptor") and sp.touch]
    if shared:
        own = max(shared, key=lambda sp: max(o + n for o, n, _, _ in sp.touch))
        rows += [(r, 0, o, n, d) for o, n, r, d in own.touch]
    for ci, row in bg_ids.items():
        if ci in specs and specs[ci].touch:
            rows += [(r, row + 1, o, n, d) for o, n, r, d in specs[ci].touch]
    rows.sort(key=lambda x: -x[0])
    return [(a, o, n, d) for _, a, o, n, d in rows if n > 0]


def rep_lines_per_event(rep: tuple[float, int, int], miss_fraction: float) -> float:
    """The lines a cold rep unit writes per event that the original's missed the profiled D1 with:
    executions x lines per execution x the original's miss share."""
    ex, iters, width = rep
    return ex * math.ceil(iters * width / 64) * miss_fraction


def take_rep_lines(d_bins: list[list[float]], lines: float, d1: int = PROFILED_D1) -> list[list[float]]:
    """The data bins less a cold rep unit's lines (session 16). The sweep's bins count every
    access of the original, its rep string instructions' too, and a cold rep's lines are in the
    bins beyond the profiled D1 (they missed it). The rep unit makes those misses itself, so the
    walkers made them twice: redis's ~23 per request, at A and B alike, that the tuning loop took
    back by slowing every walker (`data_far_scale` 0.56), and most of those walkers' misses hit at
    B. They are taken from the bins beyond `d1`, nearest first to where the clone's own rep lines
    come back (2 x REP_COLD_SPAN: its regions span REP_COLD_SPAN), the cold bin (the last) last;
    every one of those bins misses both validated D1s, so which one does not move a D1 rate."""
    out = [list(x) for x in d_bins]
    home = 2 * asmgen.REP_COLD_SPAN
    beyond = [i for i, (s_, _) in enumerate(out[:-1]) if s_ > d1]
    beyond.sort(key=lambda i: abs(math.log2(out[i][0] / home)))
    if out and out[-1][0] > d1:
        beyond.append(len(out) - 1)  # the cold bin
    left = max(0.0, lines)
    for i in beyond:
        take = min(left, out[i][1])
        out[i][1] -= take
        left -= take
        if left <= 0:
            break
    return out


def _subtract(a: list[list[float]], b: list) -> list[list[float]]:
    bd = {int(s): n for s, n in b}
    return [[s, max(0.0, n - bd.get(int(s), 0.0))] for s, n in a]


def _table(name: str, ctype: str, rows: list[str]) -> list[str]:
    if not rows:
        return [f"static const {ctype} {name}[1];"]
    return [f"static const {ctype} {name}[] = {{", *[f"\t{r}," for r in rows], "};"]


def generate(
    prof: dict,
    out: Path,
    seed: int = 1,
    knobs: dict | None = None,
    skeleton: dict | None = None,
    empty_body: bool = False,
) -> dict:
    """Write the clone directory; returns clone.json's content."""
    knobs = {**DEFAULT_KNOBS, **(knobs or {})}
    # the largest LL the profile's LL sweep measured: walkers of the bins up to it are misses a
    # larger LL keeps (asmgen.far_data_knob); llc_bins checks the sweep's numbers first
    ll_sweep = (prof.get("valgrind") or {}).get("ll_sweep")
    if llc_bins(ll_sweep)["persistent"]:
        knobs.setdefault("ll_keep_bytes", int(max(ll_sweep["sizes"])))
    out.mkdir(parents=True, exist_ok=True)
    net, listen, load = prof["network"], prof["listen"], prof["load"]
    proto = PROTOCOLS.get(load["protocol"])
    if proto is None:
        raise CloneError(f"profile has an unknown protocol {load['protocol']!r}")
    rng = np.random.default_rng(seed)
    clusters = prof["threads"]["clusters"]
    bodies = prof["body"]
    asm = ["    .intel_syntax noprefix", "    .text"]
    body_names: dict[int, str] = {}
    arenas: dict[int, int] = {}
    max_blocks = 1
    targets = {}
    specs: dict[int, asmgen.BodySpec] = {}
    for ci, c in enumerate(clusters):
        b = bodies.get(str(ci))
        if c["role"] not in BODY_ROLES or b is None:
            continue
        name = body_name(ci, c["role"])
        specs[ci] = body_spec(name, b, (skeleton or {}).get(name))
        specs[ci].walk_base = len(specs) - 1
        req = max(1, (prof.get("valgrind") or {}).get("requests") or 1)
        specs[ci].events_per_request = b.get("events", req) / req
        # code fetched for the first time is a count per run, not per request (a fresh process runs
        # rarely taken paths once): the sweep's windows are shorter than the validation window,
        # so its cold code per event is spread over the window's requests
        # (a profile from before session 7; newer ones measure it in a window of that length)
        vgp = prof.get("valgrind") or {}
        if "I_cold" not in b and vgp.get("sweep_requests") and vgp.get("window_requests"):
            specs[ci].cold_code_lines *= min(1.0, vgp["sweep_requests"] / vgp["window_requests"])
        elif "I_cold" in b:
            specs[ci].cold_code_lines *= _cold_window_ratio(ci, b, vgp)
    if not empty_body:
        _set_llc(specs, prof)
        _cap_cold_code(specs, prof, _skeleton_ll(skeleton).get("IL_at_max", 0.0))
    asmgen.layer_walkers(list(specs.values()), knobs)
    for ci, spec in specs.items():
        name = spec.name
        if empty_body:
            spec.instructions = 0.0
            spec.rep_per_event = 0.0  # (the skeleton alone: no rep unit either)
            # nor the cold code ring, the original's first fetches (session 25: it ran in the
            # skeleton's measurement, 96 of redis's skeleton's code misses per window at 8 MiB)
            spec.cold_code_lines = 0.0
        sub_rng = np.random.default_rng([seed, ci])
        lines, blocks, arena = asmgen.generate_body(spec, sub_rng, knobs)
        asm += lines
        body_names[ci] = name
        arenas[ci] = arena
        max_blocks = max(max_blocks, len(blocks) + 2)
        targets[name] = {
            "instructions_per_event": spec.instructions,
            "expected_per_event": round(spec.expected, 1),
            "block_budget": spec.block_budget,
            "mix_a": spec.mix_a,
            "mix_b": spec.mix_b,
            "blocks": [
                {
                    "weight": round(x.weight, 5),
                    "code_bytes": x.code_bytes,
                    "region_bytes": x.region_bytes,
                    "iters_per_event": round(x.iters_per_event, 4),
                    "insns": x.insns,
                }
                for x in blocks
            ],
        }
    del rng
    # clone_warm(arena) (the skeleton calls it once at start-up): every body's code rings
    # (asmgen.ring_warm), then the LL conflict rings' lines
    warm = [sp.name for sp in specs.values() if (sp.llc_code or sp.llc_data) and not empty_body]
    asm += [
        "    .globl clone_warm",
        "    .type clone_warm, @function",
        "clone_warm:",
        "    push rbx",
        "    mov rbx, rdi",
    ]
    for n in body_names.values():
        asm += ["    mov rdi, rbx", f"    call clone_ring_warm_{n}"]
    asm += ["    mov rdi, rbx", "    pop rbx"]
    asm += [f"    jmp clone_llc_warm_{n}" for n in warm[:1]] or ["    ret"]
    for need_name in ("worker", "acceptor"):
        if need_name not in body_names.values():
            asm += [f"    .globl clone_body_{need_name}", f"clone_body_{need_name}:", "    ret"]
    asm.append('    .section .note.GNU-stack,"",@progbits')
    text = "\n".join(asm) + "\n"
    if knobs.get("shape_sets", 0.0) > 0:
        text = asmgen.shape_sets(text, code_sets(prof), out / "private" / "spread")
    (out / "body.S").write_text(asmgen.spread_chunks(text, seed, out / "private" / "spread"))
    worker_arena = max([arenas[ci] for ci, n in body_names.items() if n in ("worker", "acceptor")] or [8192])
    # ---- clone_params.h
    v = knobs
    burst_us, burst_period_us, burst_before_reply = tick_burst(net)
    params = {
        "CLONE_PORT": listen["port"],
        "CLONE_SEED": seed,
        "CLONE_PROTO": proto,
        "CLONE_VALUE_BYTES": load.get("value_size", 32),
        "CLONE_LISTEN_V6": int(bool(listen.get("v6"))),
        "CLONE_BACKLOG": listen.get("backlog") or 1024,
        "CLONE_MODEL": 1 if net["model"] == "dispatch" else 0,
        "CLONE_WORKERS": max(1, net["workers"]),
        "CLONE_NOTIFY": 1 if net["notify"] == "eventfd" else 2,
        "CLONE_NOTIFY_BYTES": net["notify_bytes"],
        "CLONE_ACCEPT_CALL": net["accept_call"],
        "CLONE_ACCEPT_UNTIL_EAGAIN": int(bool(net["accept_until_eagain"])),
        "CLONE_READ_CALL": net["read_call"],
        "CLONE_READ_UNTIL_EAGAIN": int(bool(net["read_until_eagain"])),
        "CLONE_WRITE_CALL": net["write_call"],
        "CLONE_WRITE_PER_REQUEST": int(bool(net["write_per_request"])),
        "CLONE_EPOLL_MAXEVENTS": max(1, net["epoll_maxevents"]),
        "CLONE_EPOLL_TIMEOUT_MS": net["epoll_timeout_ms"],
        "CLONE_CONN_GETPEERNAME": net["getpeername_per_conn"],
        "CLONE_CONN_FCNTL": net["fcntl_per_conn"],
        "CLONE_CONN_EPOLL_MODS": max(1, net["epoll_ctl_per_conn"] - 1),
        "CLONE_CONN_EPOLL_DEL": 1 if net["epoll_ctl_per_conn"] >= 2 else 0,
        "CLONE_CONN_EPOLL_FLAGS": 0,
        "CLONE_MAX_BLOCKS": max_blocks,
        "CLONE_WORKER_ARENA": worker_arena,
        "CLONE_N_REQ_REPLAY": len(net["extra_per_request"]),
        "CLONE_N_TICK_REPLAY": len(net["tick_per_second"]),
        "CLONE_TICK_BURST_US": burst_us,
        "CLONE_TICK_BURST_PERIOD_US": burst_period_us,
        "CLONE_TICK_BEFORE_REPLY": int(burst_before_reply),
        "CLONE_MAX_BG_REPLAY": 8,
        "CLONE_SERVED_CAP": trace.SERVED_CAP,
        # the cold region at the end of every arena (asmgen.COLD_BYTES + 4 KiB): never pre-touched
        "CLONE_FAR_BYTES": asmgen.COLD_BYTES + 4096,
    }
    _ = v
    hdr = [
        "/* Generated by tailscope clone: the network and thread model. Do not edit. */",
        "#ifndef CLONE_PARAMS_H",
        "#define CLONE_PARAMS_H",
    ]
    hdr += [f"#define {k} {int(val)}" for k, val in params.items()]
    hdr += ['#define CLONE_REPLAY_FILE "clone-replay.dat"', "#endif"]
    (out / "clone_params.h").write_text("\n".join(hdr) + "\n")
    # ---- clone_tables.h
    tb = ["/* Generated by tailscope clone: profiled distributions. Do not edit. */"]
    kinds = net["reply_kinds"] or [{"req_bytes": 16, "sizes": {"5": 1}}]
    krows = []
    for i, k in enumerate(kinds):
        sizes = sorted((int(s), int(n)) for s, n in k["sizes"].items())
        cum, acc = [], 0
        for _, n in sizes:
            acc += n
            cum.append(acc)
        tb.append(f"static const uint32_t kind{i}_sizes[] = {{{', '.join(str(s) for s, _ in sizes)}}};")
        tb.append(f"static const uint32_t kind{i}_cum[] = {{{', '.join(str(c) for c in cum)}}};")
        krows.append(f"{{{int(k['req_bytes'])}, {len(sizes)}, kind{i}_sizes, kind{i}_cum}}")
    tb += _table("clone_kinds", "struct clone_kind", krows)
    tb.append(f"#define CLONE_N_KINDS {len(krows)}")
    lopts = []
    names = {
        "SO_REUSEADDR": ("SOL_SOCKET", "SO_REUSEADDR"),
        "SO_REUSEPORT": ("SOL_SOCKET", "SO_REUSEPORT"),
        "SO_KEEPALIVE": ("SOL_SOCKET", "SO_KEEPALIVE"),
        "SO_LINGER": ("SOL_SOCKET", "SO_LINGER"),
        "TCP_NODELAY": ("IPPROTO_TCP", "TCP_NODELAY"),
        "TCP_DEFER_ACCEPT": ("IPPROTO_TCP", "TCP_DEFER_ACCEPT"),
        "TCP_KEEPIDLE": ("IPPROTO_TCP", "TCP_KEEPIDLE"),
        "TCP_KEEPINTVL": ("IPPROTO_TCP", "TCP_KEEPINTVL"),
        "TCP_KEEPCNT": ("IPPROTO_TCP", "TCP_KEEPCNT"),
    }
    defaults = {
        "SO_REUSEADDR": 0,
        "SO_REUSEPORT": 0,
        "SO_KEEPALIVE": 0,
        "SO_LINGER": 0,
        "TCP_NODELAY": 0,
        "TCP_DEFER_ACCEPT": 0,
        "TCP_KEEPIDLE": 7200,
        "TCP_KEEPINTVL": 75,
        "TCP_KEEPCNT": 9,
    }
    for nm, val in sorted(listen.get("options", {}).items()):
        if nm not in names:
            continue
        val = val[0] if isinstance(val, list) else val
        if val == defaults.get(nm):
            continue
        lv, on = names[nm]
        lopts.append(f"{{{lv}, {on}, {int(val)}}}")
    tb += _table("clone_listen_opts", "struct clone_opt", lopts)
    tb.append(f"#define CLONE_N_LISTEN_OPTS {len(lopts)}")
    copts = [f"{{{lv}, {nm}, {val}}}" for lv, nm, val in net["conn_opts"]]
    tb += _table("clone_conn_opts", "struct clone_opt", copts)
    tb.append(f"#define CLONE_N_CONN_OPTS {len(copts)}")
    req = [f"{{{nr}, {arg}, {round(per * 1000)}}}" for nr, arg, per, _n in net["extra_per_request"]]
    tb += _table("clone_req_replay", "struct replay_entry", req)
    # tick entries are per second (units_k = elapsed milliseconds: per_k is calls per second x 1000)
    tick = [f"{{{nr}, {arg}, {max(1, round(rate * 1000))}}}" for nr, arg, rate, _n in net["tick_per_second"]]
    tb += _table("clone_tick_replay", "struct replay_entry", tick)
    tb += [
        "void clone_body_worker(struct body_state *);",
        "void clone_body_acceptor(struct body_state *);",
        "#define clone_worker_body clone_body_worker",
        "#define clone_acceptor_body clone_body_acceptor",
    ]
    bg_rows = []
    bg_ids: dict[int, int] = {}  # cluster index -> its row in clone_bg
    thread_map = [{"vg_thread": 1, "name": "worker" if net["model"] == "single" else "acceptor"}]
    vt = 2
    for ci, c in enumerate(clusters):
        if c["role"] not in ("timer", "waiter", "idle", "other"):
            continue
        fn = "NULL"
        if ci in body_names and c["role"] in ("timer", "waiter"):
            tb.append(f"void clone_body_{body_names[ci]}(struct body_state *);")
            fn = f"clone_body_{body_names[ci]}"
        period = c["period_us"] if c["role"] in ("timer", "waiter") else 0
        rep = bodies.get(str(ci), {}).get("replay", [])
        tb += _table(f"bg{ci}_replay", "struct replay_entry", [f"{{{r[0]}, {r[1]}, {r[2]}}}" for r in rep])
        if arenas.get(ci, 0):
            bg_ids[ci] = len(bg_rows)
        sleeps = "NULL, NULL, NULL"
        if period and c.get("sleeps") is not None:
            us, cum, at = sleep_rows(c["sleeps"], f"profile cluster {ci}")
            tb += _table(f"bg{ci}_sleep_us", "uint32_t", [str(x) for x in us])
            tb += _table(f"bg{ci}_sleep_cum", "uint32_t", [str(x) for x in cum])
            tb += _table(f"bg{ci}_sleep_at", "uint32_t", [str(x) for x in at])
            sleeps = f"bg{ci}_sleep_us, bg{ci}_sleep_cum, bg{ci}_sleep_at"
        bg_rows.append(
            f"{{{c['count']}, {int(period)}, {fn}, {arenas.get(ci, 0)}, bg{ci}_replay, {len(rep)}, {sleeps}}}"
        )
        for _ in range(c["count"]):
            thread_map.append({"vg_thread": vt, "name": body_names.get(ci, f"idle{ci}")})
            vt += 1
    tb += _table("clone_bg", "struct clone_bg", bg_rows)
    tb.append(f"#define CLONE_N_BG {len(bg_rows)}")
    touch = _touch_rows(specs, bg_ids)
    tb += _table("clone_touch", "struct clone_touch", [f"{{{a}, {o}, {n}, {d}}}" for a, o, n, d in touch])
    tb.append(f"#define CLONE_N_TOUCH {len(touch)}")
    if net["model"] == "dispatch":
        for _ in range(max(1, net["workers"])):
            thread_map.append({"vg_thread": vt, "name": "worker"})
            vt += 1
    (out / "clone_tables.h").write_text("\n".join(tb) + "\n")
    (out / "clone.c").write_text((TEMPLATES / "skeleton.c").read_text())
    (out / "Makefile").write_text(_MAKEFILE)
    load_args = " ".join(shlex.quote(a) for a in load["args"])
    try:
        from .tools import find_loadgen

        loadgen = shlex.quote(find_loadgen())
    except CloneError:
        loadgen = "tailscope-loadgen"
    (out / "run.sh").write_text(
        _RUN_SH.format(port=listen["port"], load=load_args, rate=load["medium_rate"], loadgen=loadgen)
    )
    (out / "run.sh").chmod(0o755)
    meta = {
        "seed": seed,
        "knobs": knobs,
        "thread_map": thread_map,
        "targets": targets,
        "protocol": load["protocol"],
        "port": listen["port"],
        "load_args": load["args"],
        "medium_rate": load["medium_rate"],
        "model": net["model"],
        "workers": net["workers"],
        "empty_body": empty_body,
        # the walkers' LL misses per request at the profiled LL: those the largest swept LL keeps
        # and those it misses too (asmgen.far_data_knob; tune._ll_by_side)
        "far_ll_lines": {
            k: sum((sp.far_ll_lines or {}).get(k, 0.0) * sp.events_per_request for sp in specs.values())
            for k in ("keep", "persist")
        },
    }
    (out / "clone.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    return meta


_MAKEFILE = """# Build the clone with plain gcc (or `make CC=clang`).
CC ?= gcc
CFLAGS ?= -O2 -pthread
all: clone
clone: clone.c body.S clone_params.h clone_tables.h
\t$(CC) $(CFLAGS) -o clone clone.c body.S
clean:
\trm -f clone clone-replay.dat
.PHONY: all clean
"""

_RUN_SH = """#!/usr/bin/env bash
# Start the clone and drive it with the load it was profiled under (tailscope-loadgen).
#   RATE=req/s DURATION=s PORT=n ./run.sh
# As root the clone runs in a private network namespace, so the original's port is free.
set -euo pipefail
cd "$(dirname "$0")"
PORT=${{PORT:-{port}}}
RATE=${{RATE:-{rate}}}
DURATION=${{DURATION:-10}}
LOADGEN=${{LOADGEN:-$(command -v tailscope-loadgen || echo {loadgen})}}
[ -x ./clone ] || make -s
body() {{
  ./clone -p "$PORT" & pid=$!
  trap 'kill $pid 2>/dev/null' EXIT
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break; sleep 0.05; done
  "$LOADGEN" --target 127.0.0.1:"$PORT" {load} --rate "$RATE" --duration "$DURATION"
}}
if [ "$(id -u)" = 0 ] && [ -z "${{NO_NETNS:-}}" ] && command -v unshare >/dev/null; then
  export -f body; export PORT RATE DURATION LOADGEN
  exec unshare --net bash -c 'ip link set lo up; body'
fi
body
"""


def build(clone_dir: Path, timeout: float = 120) -> float:
    """`make -C clone_dir`; returns the build time in seconds. A failure is a one-line error."""
    import subprocess
    import time

    from .tools import need

    need("make", "gcc")
    t0 = time.monotonic()
    p = subprocess.run(
        ["make", "-s", "-C", str(clone_dir), "clone"], capture_output=True, text=True, timeout=timeout, check=False
    )
    if p.returncode != 0:
        last = [ln for ln in p.stderr.splitlines() if "error" in ln][:1] or p.stderr.strip().splitlines()[-1:]
        raise CloneError(f"the clone did not build: {(last or ['?'])[0][:300]}")
    return time.monotonic() - t0


def neutral_profile(
    protocol: str = "memcached",
    port: int = 9999,
    instructions: float = 2000.0,
    icode_bins=None,
    data_bins=None,
    branches=None,
    mem_per_insn: float = 0.4,
) -> dict:
    """A synthetic profile that no target contributed to: the leakage check's reference build,
    and the generator tests' input (planted working sets and branches)."""
    from .isa import CLASSES, MEMFLAGS

    mix = {f"{c}/{m}": 0.0 for c in CLASSES for m in MEMFLAGS}
    mix.update(
        {
            "mov/reg": 0.12,
            "mov/load": 0.18,
            "mov/store": 0.09,
            "arith/reg": 0.30,
            "arith/load": 0.04,
            "arith/rmw": 0.02,
            "mul/reg": 0.01,
            "branch/reg": 0.17,
            "branch/store": 0.03,
            "branch/load": 0.02,
            "simd/reg": 0.01,
            "lock/rmw": 0.005,
            "other/reg": 0.005,
        }
    )
    body = {
        "role": "acceptor+worker",
        "events": 1000,
        "instructions_per_event": instructions,
        "data_refs_per_event": instructions * mem_per_insn,
        "mix": mix,
        "cond_per_insn": 0.15,
        "branches": branches or [[0.5, 0.05, 10], [0.95, 0.05, 10], [0.02, 0.02, 5], [0.3, 0.2, 5]],
        "dep_hist": [40, 30, 15, 8, 4, 2, 1, 0, 0, 0, 0],
        "avg_insn_bytes": 4.0,
    }
    if icode_bins is not None or data_bins is not None:
        ic = icode_bins or [(256, 1.0)]
        dc = data_bins or [(0, 1.0)]
        lines = instructions * 4.0 / 64
        body["I_bins"] = [[128, 0.0]] + [[s, f * lines] for s, f in ic]
        drefs = instructions * mem_per_insn
        body["D_bins"] = [[128, drefs * dc[0][1] if dc[0][0] == 0 else 0.0]] + [[s, f * drefs] for s, f in dc if s > 0]
        body["data_refs_per_event"] = drefs
    return {
        "version": 1,
        "load": {
            "args": ["--protocol", protocol, "--keys", "100"],
            "protocol": protocol,
            "medium_rate": 1000,
            "value_size": 32,
            "connections": 16,
        },
        "network": {
            "requests": 1000,
            "window_s": 1.0,
            "accepts": 16,
            "model": "single",
            "workers": 1,
            "notify": "eventfd",
            "notify_bytes": 8,
            "accept_call": 288,
            "accept_until_eagain": True,
            "read_call": 0,
            "read_len": 16384,
            "read_until_eagain": False,
            "write_call": 1,
            "write_per_request": False,
            "epoll_maxevents": 64,
            "epoll_timeout_ms": -1,
            "conn_opts": [],
            "getpeername_per_conn": 0,
            "fcntl_per_conn": 0,
            "epoll_ctl_per_conn": 1,
            "extra_per_request": [],
            "tick_per_second": [],
            "reply_kinds": [{"req_bytes": 14, "sizes": {"5": 1, "39": 9}}],
        },
        "threads": {
            "tids": [1],
            "roles": {"1": "acceptor+worker"},
            "distance": [[0.0]],
            "clusters": [{"role": "acceptor+worker", "tids": [1], "count": 1, "period_us": 0, "samples": 0}],
        },
        "listen": {"port": port, "v6": False, "backlog": 128, "options": {"SO_REUSEADDR": 1}},
        "body": {"0": body},
        "valgrind": {"metrics": {}, "rate": 200, "window_requests": 500, "sweep_requests": 300},
        "private": {
            "launch": {"argv": ["true"], "cwd": "/", "env": [], "nofile": 1024},
            "comm": "neutral",
            "exe": "/bin/true",
            "pid": 0,
        },
    }
