"""The tuning loop (Ditto §4.5): profile the clone with the same tools, compare, adjust, regenerate.

First the skeleton alone (an empty body) is measured with the same callgrind window and sweep,
so the body is generated for what the original does *beyond* the skeleton's own event loop,
framing and libc work. Then, at most MAX_ITERATIONS times: generate, build, run the clone's
callgrind window at the profiled cache configuration (CONFIG_A) beside a window of the original
(which joins the target's pool, `tune`), and update one knob group per
metric, multiplicatively (the relations are close to linear, and the groups are nearly
orthogonal, as the paper observes):

    instructions per request  -> instr_scale
    data refs per request     -> mem_scale         (the bodies' memory-operand share, session 11)
    I1 miss rate              -> icode_far_scale   (calls per event of the rings beyond A's I1)
    I1 misses at half A's I1  -> footprint_scale:<body> (each body's blocks' code sizes, on its own
                                 misses; a second pair per iteration, session 29: HALF_I1_KEY;
                                 one set with the persistent LL's below and the D1 at the
                                 mid-bin point since session 47: `second_config`)
    D1 misses at the mid-bin  -> d1_reach          (the aimed distance of the lower walkers of
    point (44 KiB, 11 ways)                         the bin just beyond A's D1, asmgen.d1_reach;
    and at the upper point                          session 47: MID_D1_KEY, `d1_reach_step`; the
    (56 KiB, 14 ways)                               upper point since session 50, UP_D1_KEY: the
                                                    second set measures one of the two an
                                                    iteration, `second_point`)
    D1 miss rate              -> data_far_scale    (lines per event of the walkers below the LL;
                                 per body since session 12: data_far_scale:<body> on its misses)
    LL misses, code side      -> code_llc_scale    (the code conflict rings, asmgen.llc_rings);
                                 cold_code_scale   (the cold code ring, where the clone has no rings;
                                 with rings, on both sides' code misses at the sweep's largest
                                 LL where the loop runs the third set below)
    LL misses, data side      -> data_ll_scale     (the walkers beyond the LL: what any LL misses;
                                 on both sides' misses at the sweep's largest LL, a third set
                                 per iteration, session 39: PERSISTENT_KEY; the clone's window
                                 beside two of the original's since session 41:
                                 PERSISTENT_ORIGINALS, one where the sweep ran in pairs since
                                 session 43: `persistent_originals`; until session 42 only for
                                 an original whose LL sweep ran alone; a bimodal original's
                                 target there mode by mode since session 43:
                                 `balanced_persistent`)
                                 data_llc_scale    (the data conflict rings: what a larger LL keeps)
    branch mispredictions     -> branch_x          (the random-branch unit, asmgen.brx_function;
                                 branch_mask_frac, the patterns' share in a counter form, only
                                 upwards; from half, branch_r_scale, the transition rates, down)

After the first iteration the blocks' code is pinned (`pin_layout`): the other units' steps
change how often the blocks run, not their sizes, so the I1 knobs act on one code layout.

Each knob is one factor on a whole group, so it moves the level of a cache curve, not its shape:
the shape (which bins, how many lines per event, region and ring sizes, the hot code footprint)
comes from the profile's cache-size sweep (asmgen.layer_walkers, workingset.footprint_crossing).
It stops when every metric is within TOLERANCE, and keeps the best iteration (smallest sum of
errors beyond the target's own spread over the profile's windows, each capped at 10 tolerances:
`score`). The held-out configuration (CONFIG_B) is never used here.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from . import generate as gen
from . import profile
from . import valgrind as vg
from .workingset import cache_arg

MAX_ITERATIONS = 10
# the least windows of the original the target pools before the loop may stop (`tune`): the
# profile's six and as many run beside the clone
MIN_TARGET_WINDOWS = 12
TOLERANCE = {
    "instructions_per_request": 0.02,
    "I1_miss_rate": 0.05,
    "D1_miss_rate": 0.05,
    "LL_miss_rate": 0.05,
    "branch_mispredict_rate": 0.05,
    # the LL by side (session 10): ~80 misses per window, so a draw is +-11%
    "IL_misses_per_request": 0.10,
    "DL_misses_per_request": 0.10,
    # session 11: every miss rate is per reference, so the references per request are a target
    "data_refs_per_request": 0.03,
}
# the knobs that change the blocks' instructions (cond_scale, mem_scale) take no step when their
# metric is within this (session 11)
LAYOUT_DEADBAND = 0.03
# ... and take half their Newton step (geometrically): each of their steps moves the other's
# metric too (the branch tests are memory references; a new layout moves the branch count), and
# redis's references answered mem_scale about twice as steeply as the blocks' share predicts:
# full steps oscillated with a growing swing (3,965 / 5,017 / 3,678 against 4,363; session 12)
LAYOUT_DAMPING = 0.5
# ... and after this many iterations they stay at the best iteration's values (freeze_layout)
LAYOUT_FREEZE_AFTER = 4
# The bodies' code footprints (`footprint_scale:<body>`) keep stepping past LAYOUT_FREEZE_AFTER
# while the last iteration's I1 at half of A's is out of HALF_I1_TOLERANCE, up to this iteration
# (session 49). Session 48's memcached loop froze them at iteration 4 (timer 0.39, workers 0.64)
# while they were still stepping down (0.63 -> 0.49 -> 0.39) and the half-I1 point sat 15-16%
# over from there to iteration 10; the validation's L1i at B failed at +10.4%. They still acted:
# regenerated with the kept knobs and one footprint moved (one window at B; original 0.0205,
# the validation's clone 0.0226), the timer at 0.2 read 0.0218 and the workers at 0.5 0.0219.
# The cap leaves the last iterations a fixed layout for the secants (`i1_secant`,
# `branch_secant`, `ll_bracket`), which skip a pair whose footprints differ.
FOOTPRINT_FREEZE_AFTER = 7
LAYOUT_KNOBS = ("cond_scale", "mem_scale", "branch_mask_frac")
KNOB_OF = {
    "instructions_per_request": "instr_scale",
    "I1_miss_rate": "code_scale",
    "D1_miss_rate": "data_far_scale",
    "LL_miss_rate": "data_ll_scale",
    "IL_misses_per_request": "code_llc_scale",
    "DL_misses_per_request": "data_llc_scale",
    "branch_mispredict_rate": "branch_r_scale",
    "data_refs_per_request": "mem_scale",
}


# The second point of the I1 curve (session 29): half of A's I1 at A's ways, a size the profile
# sweeps (never B's geometry, which stays held out). The loop tuned the I1 at A alone, and the
# curve below it followed the profile's shape only as far as each body's code sizes did: memcached's
# clone was within 2% at A and 18% over at B's 16 KiB (31% at 16 KiB with 8 ways), its timer body
# 49 misses per request there against the original's 30 (its lines reused between 16 and 32 KiB,
# where the original's mostly hit nearer), while at A that body missed 0.3 against 0.9.
# Each iteration runs a second pair, the clone and the original at this I1 (A's D1 and LL); the
# original's windows pool into the target as A's do, and each body whose misses there are off by
# more than HALF_I1_DEADBAND (and that makes at least HALF_I1_MIN_SHARE of them) steps its own
# code footprint (`footprint_scale:<name>`, asmgen.code_footprint_scale) until the layout freezes.
# The whole clone's miss rate there joins the stop rule and the score at HALF_I1_TOLERANCE, the
# validation's limit: it is a proxy for B's I1 (4 ways), not B, and at 8 ways memcached's clone
# read 10-13 points further over than at 4 (offline, the clone above with its timer's footprint
# at 0.55-0.65: +15-18% at 8 ways, +5.5-6.9% at 4; the timer's misses fell 55 -> 43-44 and no
# further, the rest of them the skeleton's own loop).
HALF_I1_KEY = "I1half_miss_rate"
HALF_I1_TOLERANCE = 0.10
HALF_I1_DEADBAND = 0.05
HALF_I1_MIN_SHARE = 0.05
FOOTPRINT_PREFIX = "footprint_scale:"
# The D1's second point (session 47): the profile's mid-bin point of the bin just beyond A's D1,
# 44 KiB with 11 ways (A's 64 sets; `mid_d1_config`), measured in the same second set as the I1
# at half (`second_config`). The clone's walkers of the (32, 64] KiB bin came back nearer than
# the layer model aims them (asmgen.d1_reach): redis's clone matched the D1 at A and hit at
# 40-44 KiB what the original hits only at 64 KiB, and both services' D1 rows at B failed 10-13%
# under. The loop steps `d1_reach` (the factor on those walkers' aimed distance) by a secant on
# the clone's miss rate there, the first step at MID_D1_POWER (offline, session 47: at 1.4
# redis's clone read 90.5 misses a request at 44 KiB against 83.5 at 1.0 and the original's
# 90.3, memcached's 34.8 against 29.1 and 33.0); the rate joins the stop rule and the score at
# MID_D1_TOLERANCE, A's D1 tolerance
MID_D1_KEY = "D1mid_miss_rate"
MID_D1_TOLERANCE = 0.05
MID_D1_DEADBAND = 0.02
MID_D1_POWER = 0.4  # the first step's guess: the rate there goes as d1_reach ** 0.4 (0.24-0.54 measured)
# The D1's third point (session 50): the upper part of the same bin, 56 KiB with 14 ways (A's 64
# sets; log2 0.81 of the way through (32, 64], near its upper quartile). Session 49's memcached
# clone matched the D1 at A (2.7% under) and at 44 KiB (2.0% over) and fell too slowly beyond:
# B's 48 KiB (12 ways) read 30.9 misses a request against the original's 27.8, and the row failed
# at +14.5%. The clone's shape in that bin is flatter than the original's whatever its walkers'
# reach (offline, one window each at 44/56 KiB: 1.18-1.41 times the misses at 44 as at 56 over
# nine settings of the two walkers' reaches, the original 1.57; asmgen.REACH_HALVES), so the
# reach can only set the bin's level: the loop steps it on both points together (their errors
# balanced, `d1_reach_step`), and the points in between, B's among them, fall between their
# errors. The second set alternates between the two points (`second_point`), so the loop runs
# no more windows (the I1 at half and the persistent LL are measured in both); an iteration's
# other point is carried from the last iteration that measured it (`carry_second`).
UP_D1_KEY = "D1up_miss_rate"
UP_WAYS = 14
D1_POINTS = (MID_D1_KEY, UP_D1_KEY)
D1_REACH_STEP = (0.75, 1.5)
D1_REACH_RANGE = (0.6, 2.5)
# each step: (target / clone) ** power, within the bounds (misses per body fall a little less
# than in proportion to its footprint: some of its lines are reused nearer)
FOOTPRINT_POWER = 0.8
FOOTPRINT_STEP = (0.6, 1.5)
FOOTPRINT_RANGE = (0.1, 4.0)


def half_i1_config() -> dict:
    """A's hierarchy with an I1 of half A's size and A's ways (16 KiB, 8 ways)."""
    from .workingset import cache_arg

    return {**vg.CONFIG_A, "I1": cache_arg(int(vg.CONFIG_A["I1"].split(",")[0]) // 2)}


def mid_d1_config() -> dict:
    """A's hierarchy with the D1 of the profile's mid-bin point beyond A's D1 (44 KiB, 11 ways,
    A's 64 sets: a point the profile sweeps, never B's 48 KiB and 12 ways)."""
    from .workingset import mid_cache_arg, mid_sizes

    d1 = int(vg.CONFIG_A["D1"].split(",")[0])
    return {**vg.CONFIG_A, "D1": mid_cache_arg(mid_sizes([d1, 2 * d1])[0])}


def up_d1_config() -> dict:
    """A's hierarchy with the D1 at the upper point of the bin beyond A's D1 (56 KiB, UP_WAYS
    ways, A's 64 sets; never B's 48 KiB and 12 ways)."""
    size, ways, line = (int(x) for x in vg.CONFIG_A["D1"].split(","))
    return {**vg.CONFIG_A, "D1": f"{size // ways * UP_WAYS},{UP_WAYS},{line}"}


def second_point(it: int) -> str:
    """Which D1 point iteration `it`'s second set measures: the mid-bin point first, then they
    alternate (UP_D1_KEY on even iterations)."""
    return D1_POINTS[(it - 1) % len(D1_POINTS)]


def second_metrics(pairs: list[tuple[str, vg.Window]]) -> dict[str, float]:
    """The second set's figures from (D1 point, window) pairs: the I1 at half over all of them
    (the D1 does not move callgrind's I1, `second_config`) and each D1 point over its own."""
    if not pairs:
        return {}
    out = {HALF_I1_KEY: vg.metrics(vg.pool([w for _, w in pairs]))["I1_miss_rate"]}
    for key in D1_POINTS:
        if wins := [w for k, w in pairs if k == key]:
            out[key] = vg.metrics(vg.pool(wins))["D1_miss_rate"]
    return out


def carry_second(m: dict, history: list[dict]) -> list[str]:
    """Fill in `m` the D1 points this build was not measured at from the last iteration that
    measured them (its own window, not carried); returns the keys carried. The stop rule and the
    ranking see both points every iteration (the older one is the other build's: its knobs
    differ by this iteration's steps at most); the steps take only measured ones."""
    carried = []
    for key in D1_POINTS:
        if key in m:
            continue
        h = next((h for h in reversed(history) if key in h["metrics"] and key not in h.get("carried", ())), None)
        if h is not None:
            m[key] = h["metrics"][key]
            carried.append(key)
    return carried


def second_config(persist_cache: dict | None, point: str = MID_D1_KEY) -> dict:
    """The hierarchy of the loop's second set of windows: the I1 at half (`half_i1_config`), the
    D1 at the mid-bin point (`mid_d1_config`) and, where the loop has a persistent point
    (`persistent_ll_config`), its LL; A's LL otherwise. One set measures all three points.

    Why one set (session 47): the pipeline ran 33-43 minutes against its 30, and each iteration
    ran three sets of ~28 s (at A, at half A's I1, at the sweep's largest LL). Callgrind's
    simulated I1 and D1 are filled from the program's own fetches and accesses, not from the LL,
    and the simulation does not change how the program runs, so the I1 and D1 read the same in
    either set; the persistent LL misses are lines no LL of that size keeps, which a different
    L1 in front of it does not bring back. Both sides run in the same set, so what difference
    there is falls on both. The D1 is `point`'s: the mid-bin point or the upper one (session 50,
    UP_D1_KEY)."""
    d1 = (up_d1_config() if point == UP_D1_KEY else mid_d1_config())["D1"]
    return {**(persist_cache or vg.CONFIG_A), "I1": half_i1_config()["I1"], "D1": d1}


def clone_body_misses(wins: list[vg.Window], meta: dict, event: str = "I1mr") -> dict[str, float]:
    """The clone's `event` per request of each body name's threads over `wins` (pooled)."""
    names = {t["vg_thread"]: t["name"] for t in meta.get("thread_map") or []}
    req = max(1, sum(w.requests for w in wins))
    out: dict[str, float] = {}
    for w in wins:
        for t in w.threads:
            name = names.get(t.thread)
            if name:
                out[name] = out.get(name, 0.0) + t.summary.get(event, 0) / req
    return out


def original_body_misses(wins: list[vg.Window], prof: dict, event: str = "I1mr") -> dict[str, float]:
    """The original's `event` per request of each body's threads (by the clone's body names) over
    `wins`, each window's threads mapped by creation order as the profile maps them."""
    from .profile import body_instructions

    threads = prof.get("threads") or {}
    clusters, tids = threads.get("clusters") or [], threads.get("tids") or []
    req = max(1, sum(w.requests for w in wins))
    out: dict[str, float] = {}
    for w in wins:
        for ci, v in body_instructions(w, clusters, tids, (event,)).items():
            name = gen.body_name(ci, clusters[int(ci)]["role"])
            out[name] = out.get(name, 0.0) + v * w.requests / req
    return out


def half_i1_step(knobs: dict, clone: dict[str, float], target: dict[str, float]) -> dict:
    """Each body's footprint step on its misses per request at half of A's I1 (see HALF_I1_KEY)."""
    k = dict(knobs)
    total = sum(v for v in target.values() if v > 0)
    for name, t in target.items():
        c = clone.get(name, 0.0)
        if t <= 0 or c <= 0 or t < HALF_I1_MIN_SHARE * total or rel_err(c, t) <= HALF_I1_DEADBAND:
            continue
        key = FOOTPRINT_PREFIX + name
        k[key] = _clamp(k.get(key, 1.0) * _clamp((t / c) ** FOOTPRINT_POWER, *FOOTPRINT_STEP), *FOOTPRINT_RANGE)
    return k


def footprint_keys(*dicts: dict) -> tuple[str, ...]:
    return tuple(sorted({key for d in dicts for key in d if key.startswith(FOOTPRINT_PREFIX)}))


def errors(m: dict, target: dict) -> dict[str, float]:
    """Each tuned metric's relative error, and the second set's (I1 at half, D1 at the mid-bin
    point) where both sides measured them."""
    errs = {k: rel_err(m.get(k, 0.0), target.get(k, 0.0)) for k in TOLERANCE}
    for key in (HALF_I1_KEY, MID_D1_KEY, UP_D1_KEY):
        if key in m and key in target:
            errs[key] = rel_err(m[key], target[key])
    return errs


def rel_err(clone: float, orig: float) -> float:
    if orig == 0:
        return 0.0 if clone == 0 else 1.0
    return abs(clone - orig) / abs(orig)


def clone_launch(clone_dir: Path, port: int) -> dict:
    return {
        "argv": [str(clone_dir.resolve() / "clone"), "-p", str(port)],
        "cwd": str(clone_dir.resolve()),
        "env": [],
        "nofile": 4096,
    }


def per_name(win: vg.Window, meta: dict, sweep: dict | None, events: dict[str, float]) -> dict:
    """Per body name (worker, acceptor, bgN): the clone's own per-event costs, like body_profile."""
    from .isa import analyse

    names: dict[str, list[int]] = {}
    for t in meta["thread_map"]:
        names.setdefault(t["name"], []).append(t["vg_thread"])
    out = {}
    for name, vts in names.items():
        ts = [t for t in win.threads if t.thread in vts]
        if not ts:
            continue
        ev = events.get(name, events.get("default", 1))
        ir = sum(t.summary.get("Ir", 0) for t in ts)
        dref = sum(t.summary.get("Dr", 0) + t.summary.get("Dw", 0) for t in ts)
        entry = {"instructions_per_event": ir / max(1, ev), "data_refs_per_event": dref / max(1, ev)}
        if any("Bc" in t.summary for t in ts):
            entry["cond_per_event"] = sum(t.summary.get("Bc", 0) for t in ts) / max(1, ev)
        if ts[0].instr:
            from .profile import rep_per_event

            a = analyse(ts)
            entry["mix"] = a["mix_fraction"]
            entry["rep"] = rep_per_event(a, ev)
            # the conditional branches without the rep iterations (the body's own, as profiled)
            if "cond_per_event" in entry:
                entry["cond_per_event"] = max(0.0, entry["cond_per_event"] - a["rep"]["cond_branches"] / max(1, ev))
        if sweep:
            from .profile import _ws_bins

            b = _ws_bins(sweep, [str(v) for v in vts], entry["instructions_per_event"], entry["data_refs_per_event"])
            entry["I_bins"], entry["D_bins"] = b["I_bins"], b["D_bins"]
        out[name] = entry
    return out


def skeleton_ll_size(prof: dict) -> int | None:
    """The LL sweep's largest size, where it is larger than A's LL (else None): the size at which
    the skeleton's own persistent LL misses are measured (`measure_skeleton`)."""
    sizes = ((prof.get("valgrind") or {}).get("ll_sweep") or {}).get("sizes") or []
    big = max((int(s) for s in sizes if isinstance(s, (int, float)) and not isinstance(s, bool)), default=0)
    return big if big > int(vg.CONFIG_A["LL"].split(",")[0]) else None


def measure_skeleton(prof: dict, clone_dir: Path, progress, sweep_sizes: list[int] | None = None) -> dict:
    """Costs of the clone's skeleton alone (empty body), per body name and event; under "_ll" its
    LL misses per request at A and at the LL sweep's largest size (`skeleton_ll_size`), A's L1s."""
    from .workingset import cache_arg

    skel_dir = clone_dir / "private" / "skeleton"
    meta = gen.generate(prof, skel_dir, seed=1, empty_body=True)
    gen.build(skel_dir)
    port = prof["listen"]["port"]
    load = prof["load"]["args"]
    vgp = prof["valgrind"]
    progress("tuning: measuring the skeleton alone (empty body) under callgrind")
    job = {
        "launch": clone_launch(skel_dir, port),
        "port": port,
        "load_args": load,
        "rate": vgp["rate"],
        "requests": vgp["window_requests"],
        "workdir": skel_dir / "work",
        "preload": "--preload" in load,
    }
    big = skeleton_ll_size(prof)
    jobs = [{**job, "tag": "skel", "cache": vg.CONFIG_A, "detail": True}]
    if big:
        # (side by side: a window is bound by the wall clock, valgrind.side_by_side)
        jobs.append({**job, "tag": "skelbig", "cache": {**vg.CONFIG_A, "LL": cache_arg(big)}})
    wins = vg.side_by_side(jobs)
    win = wins[0]
    sw = None
    if sweep_sizes:
        sw = vg.sweep(
            clone_launch(skel_dir, port),
            port,
            load,
            vgp["rate"],
            vgp["sweep_requests"],
            skel_dir / "work",
            sweep_sizes,
            progress=progress,
            tag="skelsweep",
            preload="--preload" in load,
        )
    events = _events(prof, win)
    out = per_name(win, meta, sw, events)
    if big:
        a, b = vg.metrics(win), vg.metrics(wins[1])
        out["_ll"] = {
            "size": big,
            **{f"{k}_at_A": a[f"{k}_misses_per_request"] for k in ("DL", "IL")},
            **{f"{k}_at_max": b[f"{k}_misses_per_request"] for k in ("DL", "IL")},
        }
    return out


def _events(prof: dict, win: vg.Window) -> dict[str, float]:
    ev = {"worker": win.requests, "acceptor": prof["load"].get("connections", 16), "default": win.requests}
    for ci, c in enumerate(prof["threads"]["clusters"]):
        if c["role"] in ("timer", "waiter") and c["period_us"]:
            ev[f"bg{ci}"] = max(1.0, win.seconds * 1e6 / c["period_us"] * c["count"])
    return ev


def _split(win: vg.Window, meta: dict) -> dict:
    """Per request: each body name's thread total and the part its clone_body_/clone_far_ functions
    (and the conflict rings and the filler, clone_fill_)
    ran (callgrind's per-function self costs), and the far functions' misses."""
    names = {t["vg_thread"]: t["name"] for t in meta["thread_map"]}
    n = max(1, win.requests)
    out: dict = {"threads": {}, "far": {}}
    for t in win.threads:
        name = names.get(t.thread, "?")
        e = out["threads"].setdefault(
            name, {"Ir": 0.0, "body_Ir": 0.0, "Bc": 0.0, "body_Bc": 0.0, "body_Dref": 0.0, "D1m": 0.0}
        )
        e["Ir"] += t.summary.get("Ir", 0) / n
        e["D1m"] += (t.summary.get("D1mr", 0) + t.summary.get("D1mw", 0)) / n
        e["body_Ir"] += (
            t.fn_total("Ir", f"clone_body_{name}")
            + t.fn_total("Ir", f"clone_far_{name}")
            + t.fn_total("Ir", f"clone_farp_{name}")
            + t.fn_total("Ir", f"clone_llc_{name}")
            + t.fn_total("Ir", f"clone_llcv_{name}")
            + t.fn_total("Ir", f"clone_fill_{name}")
        ) / n
        e["Bc"] += t.summary.get("Bc", 0) / n
        # the blocks' data references (clone_body_: the mix that `mem_scale` scales)
        e["body_Dref"] += (t.fn_total("Dr", f"clone_body_{name}") + t.fn_total("Dw", f"clone_body_{name}")) / n
        e["body_Bc"] += (t.fn_total("Bc", f"clone_body_{name}") + t.fn_total("Bc", f"clone_far_{name}")) / n
        for ev in ("I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw", "Bcm"):
            # (clone_farp_: the walkers every LL misses, a function of their own, counted in too)
            farp = t.fn_total(ev, "clone_farp_") / n
            out["far"][ev] = out["far"].get(ev, 0.0) + t.fn_total(ev, "clone_far_") / n + farp
            out.setdefault("farp", {})
            out["farp"][ev] = out["farp"].get(ev, 0.0) + farp
            # the conflict rings (clone_llc_<name> and its variants clone_llcv_<name>)
            out.setdefault("llc", {})
            out["llc"][ev] = out["llc"].get(ev, 0.0) + t.fn_total(ev, "clone_llc") / n
        for ev in ("Bc", "Bcm"):  # the random-branch unit (clone_brx_<name>)
            out.setdefault("brx", {})
            out["brx"][ev] = out["brx"].get(ev, 0.0) + t.fn_total(ev, "clone_brx_") / n
    return out


def ll_parts(split: dict) -> dict[str, float]:
    """A `_split`'s LL misses per request by the clone's parts: the data and code conflict rings
    (clone_llc*), clone_far_'s walkers with clone_farp_'s (far) and the latter alone (farp)."""

    def dl(d: dict) -> float:
        return d.get("DLmr", 0.0) + d.get("DLmw", 0.0)

    llc, far, farp = split.get("llc") or {}, split.get("far") or {}, split.get("farp") or {}
    return {
        "data_rings": dl(llc),
        "data_far": dl(far),
        "data_farp": dl(farp),
        "code_rings": llc.get("ILmr", 0.0),
        "code_far": far.get("ILmr", 0.0),
    }


# the LL metrics that `smooth_ll` takes as the knobs' parts plus a pooled rest; each window's own
# figure stays in the metrics under the key with WINDOW_SUFFIX
LL_SMOOTHED = ("IL_misses_per_request", "DL_misses_per_request", "LL_miss_rate")
WINDOW_SUFFIX = "_window"


def ll_rest(m: dict, parts: dict) -> dict[str, float]:
    """One window's LL misses per request that no LL knob moves, code and data: its total less
    the conflict rings' and clone_far_'s (`ll_parts`). They are the skeleton's own (the event
    loop's code, the load's size tables): a few lines a window that the rest of the window pushed
    out of the LL, and how many varies from window to window, not with the knobs."""
    return {
        "IL": max(0.0, m.get("IL_misses_per_request", 0.0) - parts["code_rings"] - parts["code_far"]),
        "DL": max(0.0, m.get("DL_misses_per_request", 0.0) - parts["data_rings"] - parts["data_far"]),
    }


def smooth_ll(m: dict, parts: dict, rests: list[dict]) -> dict:
    """The metrics with the LL misses as the knobs' parts in this window (`ll_parts`) plus the
    rest (`ll_rest`) pooled over every clone window of the loop (session 48), the window's own
    figures kept under `WINDOW_SUFFIX`. Why: the loop steps and ranks its iterations on one
    window each, and memcached's rest was 2-5 code and 1-4 data misses a window around means of
    3.6 and 2.0, of ~28 and ~8 in all: the kept iteration (session 47's 9th) was one whose rest
    happened to be low (2 and 1), so its rings were set for 1.6 and 1.0 misses a window too
    few, and the validation's windows came out 9% and 22% over on the two sides, the LL rate at
    A 12.9% (where the loop had measured 0.4%)."""
    if not rests:
        return m
    raw = {k: m.get(k + WINDOW_SUFFIX, m.get(k, 0.0)) for k in LL_SMOOTHED}
    out = {**m, **{k + WINDOW_SUFFIX: v for k, v in raw.items()}}
    il = parts["code_rings"] + parts["code_far"] + statistics.fmean(r["IL"] for r in rests)
    dl = parts["data_rings"] + parts["data_far"] + statistics.fmean(r["DL"] for r in rests)
    acc = m.get("instructions_per_request", 0.0) + m.get("data_refs_per_request", 0.0)
    out["IL_misses_per_request"], out["DL_misses_per_request"] = il, dl
    out["LL_miss_rate"] = (il + dl) / acc if acc else 0.0
    return out


def _targets_by_body(prof: dict) -> dict[str, float]:
    """The original's instructions per request of each body's threads: over the profile's pool of
    windows where it has one (session 9), else its detail window."""
    req = max(1, prof["valgrind"].get("requests") or 1)
    pooled = prof["valgrind"].get("body_instructions_per_request") or {}
    out: dict[str, float] = {}
    for ci, b in prof["body"].items():
        name = gen.body_name(ci, b["role"])
        v = pooled.get(ci)
        if v is None:
            v = b["instructions_per_event"] * b.get("events", req) / req
        out[name] = out.get(name, 0.0) + v
    return out


def _d1_targets_by_body(prof: dict) -> dict[str, float]:
    """The original's D1 misses per request of each body's threads over the profile's pool
    (profiles since session 12; empty before: one D1 knob for all bodies)."""
    pooled = prof["valgrind"].get("body_D1_misses_per_request") or {}
    out: dict[str, float] = {}
    for ci, b in prof["body"].items():
        v = pooled.get(ci)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            name = gen.body_name(ci, b["role"])
            out[name] = out.get(name, 0.0) + float(v)
    return out


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, x))


def update_knobs(
    knobs: dict, m: dict, target: dict, split: dict, body_targets: dict, d1_targets: dict | None = None
) -> dict:
    """One tuning step; each metric moves its own knob (see the module docstring)."""
    k = dict(knobs)
    # instructions: per body, a Newton step on the measured body share (the response is linear)
    for name, tgt in body_targets.items():
        th = split["threads"].get(name)
        if not th or th["body_Ir"] <= 0:
            continue
        rest = th["Ir"] - th["body_Ir"]
        key = f"instr_scale:{name}"
        k[key] = _clamp(k.get(key, k.get("instr_scale", 1.0)) * max(0.05, tgt - rest) / th["body_Ir"], 0.02, 20.0)
    # conditional branches per request: a Newton step on the bodies' share (their density is
    # diluted by loop control; the misprediction RATE is per conditional branch, so their count
    # matters as much as the mispredictions)
    # (no step within LAYOUT_DEADBAND: this knob and mem_scale change the blocks' instructions,
    # so each of their steps is a new code layout, and the branch rate moved with it by +-30%
    # while the loop's last iterations tuned the random-branch unit: memcached, session 11)
    t_bc, c_bc = target.get("cond_branches_per_request", 0.0), m.get("cond_branches_per_request", 0.0)
    body_bc = sum(th.get("body_Bc", 0.0) for th in split["threads"].values())
    if t_bc > 0 and body_bc > 0 and rel_err(c_bc, t_bc) > LAYOUT_DEADBAND:
        step = _clamp((t_bc - (c_bc - body_bc)) / body_bc, 0.5, 2.0) ** LAYOUT_DAMPING
        k["cond_scale"] = _clamp(k.get("cond_scale", 1.0) * step, 0.2, 3.0)
    # data references per request (session 11): a Newton step on the blocks' share (their
    # memory-operand share scales with `mem_scale`; the walkers' and the skeleton's stay). The
    # clones made 30-36% fewer references than the originals, and every miss rate is per reference
    t_dr, c_dr = target.get("data_refs_per_request", 0.0), m.get("data_refs_per_request", 0.0)
    body_dr = sum(th.get("body_Dref", 0.0) for th in split["threads"].values())
    if t_dr > 0 and body_dr > 0 and rel_err(c_dr, t_dr) > LAYOUT_DEADBAND:
        step = _clamp((t_dr - (c_dr - body_dr)) / body_dr, 0.5, 2.0) ** LAYOUT_DAMPING
        k["mem_scale"] = _clamp(k.get("mem_scale", 1.0) * step, 0.2, 3.0)
    ir = m.get("instructions_per_request", 0.0)
    refs = ir + m.get("data_refs_per_request", 0.0)
    far = split["far"]
    # I1: misses outside the rings (clone_far_) come from the body's footprint; when they alone
    # exceed the target, shrink the footprint (damped: the response is a step), else set the rings'
    # rate by a Newton step (its misses are linear in it)
    t_i1 = target.get("I1_miss_rate", 0.0) * ir
    c_i1 = m.get("I1_miss_rate", 0.0) * ir
    rest_i1 = c_i1 - far.get("I1mr", 0.0)
    if rest_i1 > 1.05 * t_i1:
        k["code_scale"] = _clamp(k["code_scale"] * _clamp((t_i1 / rest_i1) ** 0.5, 0.5, 0.9), 0.05, 4.0)
        k["icode_far_scale"] = _clamp(k["icode_far_scale"] * 0.5, 0.001, 50.0)
    elif far.get("I1mr", 0.0) > 0:
        k["icode_far_scale"] = _clamp(
            k["icode_far_scale"] * _clamp((t_i1 - rest_i1) / far["I1mr"], 0.1, 4.0), 0.001, 50.0
        )
    elif t_i1 > rest_i1:
        k["icode_far_scale"] = _clamp(k["icode_far_scale"] * 2, 0.001, 50.0)
    if "DL_misses_per_request" in target and "DL_misses_per_request" in m:
        _ll_by_side(k, m, target, far, split.get("llc") or {}, split.get("far_ll_lines"), split.get("farp"))
        _l1_steps(k, m, target, split.get("brx"), d1_targets, split)
        return k
    # LL (profiles before session 10): the far-data loop's misses are linear in its rate
    t_ll = target.get("LL_miss_rate", 0.0) * refs
    c_ll = m.get("LL_miss_rate", 0.0) * refs
    # (the data side only: the cold code ring's fetches are in clone_far_ too, fixed by the sweep)
    far_ll = far.get("DLmr", 0.0) + far.get("DLmw", 0.0)
    rest_ll = c_ll - far_ll
    if far_ll > 0:
        step = _clamp((t_ll - rest_ll) / far_ll, 0.05, 4.0)
        k["data_ll_scale"] = _clamp(k["data_ll_scale"] * step, 1e-4, 50.0)
    elif t_ll > c_ll:  # the walkers beyond the LL missed nothing in this window: no slope to use
        k["data_ll_scale"] = _clamp(k["data_ll_scale"] * 2.0, 1e-4, 50.0)
    _l1_steps(k, m, target, split.get("brx"), d1_targets, split)
    return k


# the smallest value of an LL knob (data_ll_scale, data_llc_scale, code_llc_scale): _newton's floor
LL_KNOB_FLOOR = 1e-4
# cold_code_scale's range: the profile's first-fetch count is right within a factor of a few
COLD_KNOB_RANGE = (0.25, 4.0)


def _newton(k: dict, knob: str, want: float, have: float, lo: float = LL_KNOB_FLOOR, hi: float = 50.0) -> None:
    """A knob whose misses are linear in it: scale it by want / have (steps 0.05..4)."""
    if have > 0:
        k[knob] = _clamp(k.get(knob, 1.0) * _clamp(max(0.0, want) / have, 0.05, 4.0), lo, hi)
    elif want > 0:  # nothing measured: no slope to use
        k[knob] = _clamp(k.get(knob, 1.0) * 2.0, lo, hi)


def _access_ratio(m: dict, target: dict) -> float:
    """The clone's instruction fetches and data references per request over the target's: the
    LL sides' goals are miss rates, so their misses per request are the target's times this."""
    acc_t = target.get("instructions_per_request", 0.0) + target.get("data_refs_per_request", 0.0)
    acc_c = m.get("instructions_per_request", 0.0) + m.get("data_refs_per_request", 0.0)
    return acc_c / acc_t if acc_t > 0 and acc_c > 0 else 1.0


def _ll_by_side(
    k: dict, m: dict, target: dict, far: dict, llc: dict, far_lines: dict | None = None, farp: dict | None = None
) -> None:
    """The LL misses per request, code and data apart (session 10). Code: the cold code ring
    (fixed by the profile) and the rest of the clone are what they are; the code conflict rings
    make up the difference. Data: the walkers beyond the LL (clone_far_) give the share that
    the profile's largest swept LL still misses (`DL_persistent_fraction`; where the loop measured
    both sides there, the original's misses there, PERSISTENT_KEY), less what the rest of the
    clone misses anyway; the data conflict rings give the rest (what a larger LL keeps).
    Before, one knob on the walkers made up the code side's missing misses with data misses,
    which any LL misses (memcached: 450% at an 8 MiB LL)."""
    # the goal is the miss RATE (per instruction fetch and data reference): at the clone's own
    # accesses per request, so its misses per request are the target's times that ratio
    # (memcached: both sides within 8% of the target and the rate 12% off, on 4% more accesses)
    ratio = _access_ratio(m, target)
    t_il, c_il = ratio * target.get("IL_misses_per_request", 0.0), m.get("IL_misses_per_request", 0.0)
    llc_il = llc.get("ILmr", 0.0)
    if target.get("IL_ring_bins", 1.0) > 0:
        cold_step = 0.0
        if PERSISTENT_IL_KEY in target and PERSISTENT_IL_REST_KEY in m:
            # (session 39) the loop measured both sides at the sweep's largest LL, where of the
            # clone's code only the cold ring and its rest miss: the ring (its misses at A are
            # clone_far_'s code misses, the only code of it that misses A's LL) makes up the
            # original's there; the conflict rings then make up A's, less the ring's change.
            # memcached's clone missed 17 code lines a window at 8 MiB in all ten of session 39's
            # iterations, the original 17-22 (19.8), and its code side at B ended 10.1% under
            cold = max(0.0, far.get("ILmr", 0.0))
            before = k.get("cold_code_scale", 1.0)
            _newton(
                k,
                "cold_code_scale",
                ratio * target[PERSISTENT_IL_KEY] - m[PERSISTENT_IL_REST_KEY],
                cold,
                lo=COLD_KNOB_RANGE[0],
                hi=COLD_KNOB_RANGE[1],
            )
            cold_step = cold * (k.get("cold_code_scale", 1.0) / before - 1.0) if before > 0 else 0.0
        _newton(k, "code_llc_scale", t_il - (c_il - llc_il) - cold_step, llc_il)
    else:
        # no code bin: the profile's LL sweep saw the same code misses at every size, so there is
        # no ring to make up a difference, and the cold ring is what misses (session 22: redis's
        # sweep caught its high mode at 2, 4 and 8 MiB; the clone sat at its cold ring's 97 code
        # misses per window, 20-28% under, with code_llc_scale doubling to 50 to no effect). Its
        # misses are linear in the knob; the rest of the clone's few are counted in as its own
        _newton(k, "cold_code_scale", t_il, c_il, lo=COLD_KNOB_RANGE[0], hi=COLD_KNOB_RANGE[1])
    t_dl, c_dl = ratio * target.get("DL_misses_per_request", 0.0), m.get("DL_misses_per_request", 0.0)
    llc_dl = llc.get("DLmr", 0.0) + llc.get("DLmw", 0.0)
    # (clone_far_ does not hold clone_llc_: the rings are a function of their own)
    far_dl = max(0.0, far.get("DLmr", 0.0) + far.get("DLmw", 0.0))
    rest = max(0.0, c_dl - far_dl - llc_dl)
    p = _clamp(target.get("DL_persistent_fraction", 1.0), 0.0, 1.0)
    # what of the rest a larger LL still misses: the skeleton's own misses at the sweep's largest
    # LL where measured (measure_skeleton), else all of it. Session 25: memcached's rest at A
    # exceeded the persistent target, so the walkers every LL misses sat at their floor and at B
    # the clone's data side missed 0.26 per thousand requests against the original's 0.60
    rest_p = min(rest, target["skeleton_DL_persistent"]) if "skeleton_DL_persistent" in target else rest
    # clone_far_'s misses are the walkers' beyond the largest swept LL (data_ll_scale: every LL
    # misses them) and those of the bins between the LL and it (data_llc_scale, with the rings: a
    # larger LL keeps them), in the shares of their lines (generate's far_ll_lines; session 24:
    # up to then all were taken as persistent, and redis's clone missed 19 data lines per window
    # at B where the original missed 31-55)
    if farp is not None:  # measured: the persistent walkers are clone_farp_ (asmgen._far_function)
        far_p = min(far_dl, max(0.0, farp.get("DLmr", 0.0) + farp.get("DLmw", 0.0)))
    else:  # (a split without clone_farp_'s costs: by the groups' lines)
        lines = far_lines or {}
        keep, persist = float(lines.get("keep", 0.0)), float(lines.get("persist", 0.0))
        far_p = (persist / (keep + persist) if keep + persist > 0 else 1.0) * far_dl
    if PERSISTENT_KEY in target:
        # (session 39, `persistent_ll_config`) the loop measured both sides at the sweep's largest
        # LL: the target is the original's misses there, and the clone's rest there is what it
        # missed but for its persistent walkers (clone_farp_'s there), pooled over every
        # iteration's window there (it does not depend on the knobs), not the skeleton's estimate.
        # Session 39's first form took one window's: 7 misses, less the walkers' ~2 measured at A,
        # put the rest over the target and the walkers at the step's floor (0.24 -> 0.012)
        if PERSISTENT_REST_KEY in m:
            rest_p = max(0.0, m[PERSISTENT_REST_KEY])
        want_far = max(0.0, ratio * target[PERSISTENT_KEY] - rest_p)
    else:
        want_far = max(0.0, p * t_dl - rest_p)
    far_k = far_dl - far_p
    # (judged at the knob these misses were measured at, before this step)
    at_floor = k.get("data_ll_scale", 1.0) <= 2 * LL_KNOB_FLOOR
    if far_p > 0 or want_far > 0:
        _newton(k, "data_ll_scale", want_far, far_p)
    # at its floor, what clone_far_ still misses is not the walkers beyond the LL but those within
    # it (a few lines per window): they stay, and the rings make up only the rest (session 13:
    # memcached's DL sat 20-30% over with the rings' knob at 1.0, 9 of 44 misses from those)
    stays = far_p if at_floor else want_far
    _newton(k, "data_llc_scale", t_dl - rest - stays, llc_dl + far_k)


MASK_FRAC_MAX = 0.95  # the largest share of patterns in the counter form
MASK_FRAC_R_FROM = 0.5  # from this share on, the transition rates step down too (branch_r_scale)


def _branch_unit_step(k: dict, m: dict, target: dict, brx: dict | None) -> bool:
    """Mispredictions per request from the random-branch unit (asmgen.brx_function, linear in
    `branch_x`): a Newton step on what the rest of the clone mispredicts, at the clone's own
    conditional branch count (the cond_scale step moves that count to the original's). When
    the rest alone mispredicts more than the target, the unit goes to its floor and the excess's
    share of the patterns moves to the counter form (`branch_mask_frac`, session 13); once half
    have, the patterns' transition rates take a damped step down as well. False when the clone
    has no unit, or when the rates are to step."""
    if not brx or brx.get("Bc", 0.0) <= 0:
        return False
    bc = m.get("cond_branches_per_request", 0.0)
    total = m.get("branch_mispredict_rate", 0.0) * bc
    unit = brx.get("Bcm", 0.0)
    want = target.get("branch_mispredict_rate", 0.0) * bc - (total - unit)
    if want <= 0:
        k["branch_x"] = _clamp(k.get("branch_x", 1.0) * 0.05, 0.01, 400.0)
        # the rest over the target: move that share of the patterns not yet in the counter form
        # to it (asmgen._threshold_branch; it mispredicts ~1% where the patterns do 12-23%)
        frac = k.get("branch_mask_frac", 0.0)
        rest = total - unit
        if frac < MASK_FRAC_MAX and rest > 0:
            k["branch_mask_frac"] = min(MASK_FRAC_MAX, frac + (1.0 - frac) * _clamp(-want / rest, 0.05, 0.5))
            # below half the patterns, one lever at a time; from there the transition rates step
            # down too (a small excess would take tens of share steps to reach MASK_FRAC_MAX)
            return frac < MASK_FRAC_R_FROM
        return False
    if unit > 0:
        # (up to x10: from its floor the unit took five x4 steps to reach memcached's level, 0.01 to 15)
        k["branch_x"] = _clamp(k.get("branch_x", 1.0) * _clamp(want / unit, 0.1, 10.0), 0.01, 400.0)
    else:
        k["branch_x"] = _clamp(k.get("branch_x", 1.0) * 2.0, 0.01, 400.0)
    return True


def _l1_steps(
    k: dict, m: dict, target: dict, brx: dict | None = None, d1_targets: dict | None = None, split: dict | None = None
) -> None:
    # D1 and branches: damped multiplicative steps (monotone, sub-linear responses)
    steps = [("D1_miss_rate", "data_far_scale", 0.7)]
    if d1_targets and split:
        # per body (session 12): one factor for all bodies matched memcached's total at A with
        # its timer thread 41% over the original's timer and its workers 10% under theirs, and
        # the two drop differently at another D1 (B: 32% over)
        # The targets are misses per request, and the judged figure is the RATE, per data reference:
        # each body's target is taken at the clone's own references per request, as the LL's are
        # (`_ll_by_side`). Session 23: memcached's layout froze (LAYOUT_FREEZE_AFTER) with the
        # clone making 11-13% more references than the original, and its D1 rate sat 10-11% under
        # from there to the tenth iteration, every body on its misses-per-request target
        t_dr, c_dr = target.get("data_refs_per_request", 0.0), m.get("data_refs_per_request", 0.0)
        ratio = c_dr / t_dr if t_dr > 0 and c_dr > 0 else 1.0
        steps = []
        for name, t in d1_targets.items():
            c = split["threads"].get(name, {}).get("D1m", 0.0)
            key = f"data_far_scale:{name}"
            if c > 0:
                step = _clamp((ratio * t / c) ** 0.7, 0.33, 3.0)
                k[key] = _clamp(k.get(key, k["data_far_scale"]) * step, 0.01, 20.0)
    if not _branch_unit_step(k, m, target, brx):
        steps.append(("branch_mispredict_rate", "branch_r_scale", 0.7))
    for key, knob, power in steps:
        c, t = m.get(key, 0.0), target.get(key, 0.0)
        if c > 0 and t > 0:
            k[knob] = _clamp(k[knob] * _clamp((t / c) ** power, 0.33, 3.0), 0.01, 20.0)


def freeze_layout(
    knobs: dict, best: dict, it: int, half_i1_error: float | None = None, current: dict | None = None
) -> dict:
    """After LAYOUT_FREEZE_AFTER iterations the blocks keep the best iteration's layout (its
    LAYOUT_KNOBS): each cond_scale / mem_scale / branch_mask_frac step is a new code layout for
    callgrind's 7-bit branch address index, and memcached's branch error moved 4-26% between
    iterations while they stepped (session 13). The other knobs change constants, not the blocks'
    code; with the freeze, the same profile's branch error stayed within 0.7-5.8% from
    iteration 6 (the unit converging on a fixed layout).

    The bodies' footprints freeze with them (session 29), unless the last iteration's I1 at half
    of A's (`half_i1_error`) is out of HALF_I1_TOLERANCE: then they keep their step until
    FOOTPRINT_FREEZE_AFTER (session 49). After LAYOUT_FREEZE_AFTER they stop where they are (the
    `current` iteration's), not at the best's: the first run of the rule took memcached's from
    0.47 / 0.26 (half-I1 9.9% off) back to iteration 4's 0.57 / 0.37 (15.7%) when the point came
    within, and the loop ended 10.7% off there.

    `branch_mask_frac` keeps a step up past the freeze, and from there never goes back below
    where the last iteration had it (session 50). The loop raises it only when the rest of the
    clone alone mispredicts more than the target, with the random-branch unit at its floor
    (`_branch_unit_step`): nothing else can take the rate down. Session 50's memcached loop had
    its footprints step to iteration 7 (each a new layout), the rest's mispredictions rose from
    0.90 to 1.13-1.15 times the target's, the unit sat at its floor from iteration 7, and the mask,
    frozen at 0, could not move; the loop kept iteration 5 (branch 10.0% under, I1 9.7% over),
    and the validation failed both rows (branches 10.4%, L1i at A 10.6%)."""
    if it < LAYOUT_FREEZE_AFTER:
        return knobs
    # (session 29) the bodies' footprints too: each of their steps is a new code layout
    fp = footprint_keys(knobs, best, current or {})
    stepping = half_i1_error is not None and half_i1_error > HALF_I1_TOLERANCE and it < FOOTPRINT_FREEZE_AFTER
    stop = best if it == LAYOUT_FREEZE_AFTER or current is None else current
    frozen = {} if stepping else {key: stop.get(key, 1.0) for key in fp}
    layout = {key: best[key] for key in LAYOUT_KNOBS if key in best}
    if current is not None:
        # (session 50) the patterns' counter share keeps a step up, and never goes back down
        mask = "branch_mask_frac"
        cur, step = float(current.get(mask, 0.0)), float(knobs.get(mask, 0.0))
        floor = cur if it > LAYOUT_FREEZE_AFTER else 0.0
        layout[mask] = max(float(best.get(mask, 0.0)), floor, step if step > cur else 0.0)
    return {**knobs, **frozen, **layout}


def pin_layout(knobs: dict, meta: dict) -> dict:
    """The knobs with each body's blocks' layout pinned (`layout_budget:<name>`) at the budget
    this generation sized them on (clone.json's targets; asmgen.generate_body). The loop pins it
    after its first iteration: from then on a step of any other unit (the instructions, the
    rings, the walkers, the random-branch unit) changes how often the blocks run, not their code.
    Unpinned, memcached's I1 error went 4.0% -> 60.1% between two iterations whose I1 knob moved
    by 3% (icode_far_scale 2.05 -> 1.98; session 17's final run), and 33/29/20/4/60/30/19/11%
    over iterations 3-10. Bodies already pinned keep their pin.

    The blocks' operand mix is pinned with it (`layout_mix_a:<name>`, `layout_mix_b:<name>`:
    their memory operands per instruction, a * mem_scale - b; session 44). Taken from each
    generation's walkers, a walker's step redrew every block's instructions (asmgen)."""
    pins = {}
    for name, t in meta.get("targets", {}).items():
        for key, field in (("layout_budget", "block_budget"), ("layout_mix_a", "mix_a"), ("layout_mix_b", "mix_b")):
            if isinstance(t.get(field), (int, float)) and f"{key}:{name}" not in knobs:
                pins[f"{key}:{name}"] = t[field]
    return {**knobs, **pins}


def _d1_shape(m: dict, key: str) -> float | None:
    """The D1 miss rate at `key`'s point over the rate at A (what the reach moves: the bin's
    walkers miss A's D1 at any reach the range allows, so their reach shapes the curve beyond A,
    and the level is data_far_scale's); the rate alone where A's is not there."""
    c, a = m.get(key), m.get("D1_miss_rate")
    if not c:
        return None
    return c / a if a else c


def d1_bin_ratio(m: dict, target: dict) -> float | None:
    """The clone's D1 beyond A against the target's, over the points both have (MID_D1_KEY,
    UP_D1_KEY; each relative to A's rate, `_d1_shape`): the geometric mean of the two ratios, 1
    where their errors balance; None where neither point is there."""
    logs = [math.log(c / t) for key in D1_POINTS if (c := _d1_shape(m, key)) and (t := _d1_shape(target, key))]
    return math.exp(sum(logs) / len(logs)) if logs else None


def d1_reach_step(knobs: dict, history: list[dict], target: dict) -> dict:
    """`d1_reach` (asmgen.d1_reach, the lower walkers of the bin beyond A's D1) on the clone's D1
    at the bin's two points against the target's (`d1_bin_ratio`: the mid-bin point since
    session 47, the upper one since 50; relative to A's rate since 50, the rate itself before):
    a secant through the last iteration and the latest earlier one at another reach, once the
    two show the ratio rising with it; before that, a step as if the ratio went as the reach to
    the MID_D1_POWER. Each step within D1_REACH_STEP of the last reach, the knob within
    D1_REACH_RANGE; none within MID_D1_DEADBAND of 1, and none after an iteration that measured
    neither point (its second set not run).

    Why relative to A (session 50): session 49's memcached loop took its first step at 0.00145
    at 44 KiB against 0.00087, with A's rate 74% over (the references and data_far_scale not yet
    stepped), and set the reach to 0.75 where the clone needed 1.4; it took the next eight
    iterations to climb back. In shape, that iteration read 0.57 of A's rate against 0.59."""
    cur = history[-1] if history else None
    if cur is None or all(key in cur.get("carried", ()) or key not in cur["metrics"] for key in D1_POINTS):
        return knobs
    c = d1_bin_ratio(cur["metrics"], target)
    if not c or abs(c - 1.0) <= MID_D1_DEADBAND:
        return knobs
    x1 = float(cur["knobs"].get("d1_reach", 1.0))
    prev = next(
        (
            h
            for h in reversed(history[:-1])
            if d1_bin_ratio(h["metrics"], target) and abs(float(h["knobs"].get("d1_reach", 1.0)) - x1) > 1e-9
        ),
        None,
    )
    x = x1 * (1.0 / c) ** (1 / MID_D1_POWER)
    if prev is not None:
        x0, c0 = float(prev["knobs"].get("d1_reach", 1.0)), d1_bin_ratio(prev["metrics"], target)
        slope = (c - c0) / (x1 - x0)
        if slope > 0:
            x = x1 + (1.0 - c) / slope
    return {**knobs, "d1_reach": _clamp(_clamp(x, x1 * D1_REACH_STEP[0], x1 * D1_REACH_STEP[1]), *D1_REACH_RANGE)}


def i1_secant(knobs: dict, history: list[dict], target: dict) -> dict:
    """The I1 step as a secant on the last two iterations, when they differ in icode_far_scale
    only (same code_scale and layout) and the next step keeps code_scale too.

    update_knobs' Newton step assumes the misses outside the far function stay put as its rate
    moves. They do not: each pass of the far code (larger than the I1) flushes the I1, and the
    body's lines miss on their next fetch, so the rest's misses grow with the rate too, and the
    step overshot by about that share: memcached's loop went 0.63 -> 2.1 -> 0.76 -> 1.85 -> 0.63
    with I1 at A 68-93% off (session 15; the same swing as session 14's 35.7 -> 4.4%). The secant
    measures the whole response, the flushes included."""
    fp = footprint_keys(knobs, *(h["knobs"] for h in history[-2:]))
    fixed = ("code_scale", *LAYOUT_KNOBS, *fp)
    return _secant(
        knobs,
        history,
        target,
        "icode_far_scale",
        "I1_miss_rate",
        "instructions_per_request",
        fixed,
        ("code_scale", *fp),
        (0.001, 50.0),
    )


def branch_secant(knobs: dict, history: list[dict], target: dict) -> dict:
    """The random-branch unit's step as a secant on the last two iterations' mispredictions per
    request, when they differ in `branch_x` and share the blocks' layout and transition rates
    (LAYOUT_KNOBS, `branch_r_scale`), and the next step keeps those too.

    `_branch_unit_step`'s Newton step takes the unit's own mispredictions as the whole response
    to `branch_x`. They are not: the unit's random outcomes fill callgrind's global branch history,
    and the rest of the clone's branches, predicted on that history, mispredict more as the unit
    runs more. Session 27's memcached loop (layout frozen from iteration 2): the unit gave 0.5 of
    24 mispredictions per request at `branch_x` 1.0, yet the total went 16.4 -> 24.0 from 0.17 to
    1.0, a slope of ~9 where the unit's own share says 0.5. Within 1.8% of the target at 1.0,
    the Newton step sent it to 0.17, and the knob swung 0.17-8.1 for the rest of the loop (the
    branch row 10-32% off from iteration 4). The secant measures the whole response."""
    fixed = (*LAYOUT_KNOBS, "branch_r_scale", *footprint_keys(knobs, *(h["knobs"] for h in history[-2:])))
    return _secant(
        knobs,
        history,
        target,
        "branch_x",
        "branch_mispredict_rate",
        "cond_branches_per_request",
        fixed,
        fixed,
        (0.01, 400.0),
    )


# the LL sides' knobs and the misses per request each makes up (`_ll_by_side`)
LL_BRACKETED = (
    ("data_llc_scale", "DL_misses_per_request"),
    ("code_llc_scale", "IL_misses_per_request"),
    ("cold_code_scale", "IL_misses_per_request"),
)


def _side_error(m: dict, target: dict, key: str) -> float:
    """An LL side's misses per request over its target at the clone's own accesses."""
    return m.get(key, 0.0) - _access_ratio(m, target) * target.get(key, 0.0)


def ll_bracket(knobs: dict, history: list[dict], target: dict) -> dict:
    """The LL sides' steps by regula falsi, once the target is bracketed: when the last iteration
    missed on one side of its side's target and an earlier one of the same layout (LAYOUT_KNOBS
    and the bodies' footprints) on the other, at a knob 10% or more apart, the knob goes to where
    the line through those two points meets the target, between them. The target is taken at each
    iteration's own accesses per request (`_access_ratio`).

    `_ll_by_side`'s Newton step counts as the knob's response only the rings' and the kept
    walkers' own misses. The whole clone answered about twice as steeply, so each step overshot:
    session 36's redis loop swung `data_llc_scale` 0.09 <-> 0.15 for seven iterations, its data
    misses 0.0125 <-> 0.0217 per request against ~0.017, and its LL at A ended 15.6% under. The
    line through two such points puts the knob at ~0.12."""
    if len(history) < 2:
        return knobs
    last = history[-1]
    fixed = (*LAYOUT_KNOBS, *footprint_keys(last["knobs"]))
    out = dict(knobs)
    for knob, key in LL_BRACKETED:
        if knob not in last["knobs"] and knob not in knobs:
            continue
        if knob == "cold_code_scale" and target.get("IL_ring_bins", 1.0) > 0:
            continue  # (with code rings the cold ring is tuned at the sweep's largest LL, `_ll_by_side`)
        if knob == "code_llc_scale" and knobs.get("cold_code_scale") != last["knobs"].get("cold_code_scale"):
            continue  # (the cold ring steps now: the rings' Newton step has counted its change in)
        x1, e1 = last["knobs"].get(knob, 1.0), _side_error(last["metrics"], target, key)
        if e1 == 0 or key not in last["metrics"]:
            continue
        for h in reversed(history[:-1]):
            # (an older layout: a different curve; so is another cold ring for the code rings)
            same = (*fixed, "cold_code_scale") if knob == "code_llc_scale" else fixed
            if any(h["knobs"].get(f) != last["knobs"].get(f) for f in same) or key not in h["metrics"]:
                break
            x0, e0 = h["knobs"].get(knob, 1.0), _side_error(h["metrics"], target, key)
            if e0 * e1 < 0 and abs(x1 - x0) >= 0.1 * max(x0, x1) and (e1 - e0) * (x1 - x0) > 0:
                x = x1 - e1 * (x1 - x0) / (e1 - e0)
                out[knob] = _clamp(x, min(x0, x1), max(x0, x1))
                break
    return out


def _secant(knobs, history, target, knob, rate, count, fixed, keep, bounds) -> dict:
    """A secant step of `knob` on the events per request (`rate` x `count`) over the last two
    iterations: when they differ in the knob by 10% or more, agree on `fixed`, the next step
    keeps `keep` as the last iteration had them, and the response rose with the knob (else the
    Newton step in `knobs` stays). At most x4 either way, within `bounds`."""
    if len(history) < 2:
        return knobs
    (k0, m0), (k1, m1) = ((h["knobs"], h["metrics"]) for h in history[-2:])
    if any(k0.get(key) != k1.get(key) for key in fixed) or any(knobs.get(key) != k1.get(key) for key in keep):
        return knobs
    x0, x1 = k0.get(knob, 1.0), k1.get(knob, 1.0)
    if abs(x1 - x0) < 0.1 * max(x0, x1):
        return knobs
    c0 = m0.get(rate, 0.0) * m0.get(count, 0.0)
    c1 = m1.get(rate, 0.0) * m1.get(count, 0.0)
    slope = (c1 - c0) / (x1 - x0)
    if slope <= 0:  # noise larger than the step: keep the Newton step
        return knobs
    t = target.get(rate, 0.0) * m1.get(count, 0.0)
    return {**knobs, knob: _clamp(_clamp(x1 + (t - c1) / slope, x1 / 4, x1 * 4), *bounds)}


def mean_spread(values: list[float], n: int) -> float:
    """How far a mean of n windows of the original can be from its true figure: two standard
    errors, 2·sd/sqrt(n), relative to the mean of `values`, with the standard deviation taken over
    `values` (windows of the original, possibly more than the n pooled). For two values and n = 2
    this is |a - b| / their mean, the two-window spread of sessions 7-8 (`validate.spread`)."""
    if len(values) < 2:
        return 0.0
    m = abs(statistics.fmean(values))
    return 2 * statistics.stdev(values) / n**0.5 / m if m else 0.0


def target_spread(vgp: dict, anchors: list[dict] | None = None) -> dict[str, float]:
    """The tuning target's own spread per metric: `mean_spread` over the profile's callgrind
    windows, whose pool the target is, and never less than the pool's counting noise
    (`validate.counting_floor`, as validate judges the clone against the same figure at A);
    {} for a profile with fewer than two windows (from before they were kept). `anchors`
    (`target_anchors`) join the pool for the metrics they measure, as in `retarget`."""
    from .validate import counting_floor  # validate imports this module

    wins = vgp.get("windows") or []
    if len(wins) < 2:
        return {}
    pool = dict(vgp.get("metrics") or {})
    counted = all(isinstance(w.get("requests"), (int, float)) for w in wins)
    extra = (anchors or []) if counted else []  # (as retarget: no pool without request counts)
    out = {}
    for k in TOLERANCE:
        if all(k in w for w in wins):
            ws = [*wins, *(a for a in extra if k in a)]
            if counted:
                pool["requests"] = sum(w["requests"] for w in ws)
            floor = counting_floor(pool, k)
            out[k] = max(mean_spread([w[k] for w in ws], len(ws)), floor or 0.0)
    return out


def within(errs: dict) -> bool:
    """Every tuned metric within its tolerance: the loop's goal, where it stops."""
    return (
        all(k in errs and errs[k] <= tol for k, tol in TOLERANCE.items())
        and errs.get(HALF_I1_KEY, 0.0) <= HALF_I1_TOLERANCE
        and errs.get(MID_D1_KEY, 0.0) <= MID_D1_TOLERANCE
        and errs.get(UP_D1_KEY, 0.0) <= MID_D1_TOLERANCE
        # (session 50) a loop with a second set measures both D1 points before it may stop
        and (MID_D1_KEY in errs) == (UP_D1_KEY in errs)
    )


def within_limits(errs: dict, spread: dict | None = None) -> bool:
    """Every simulated row the validation judges (`validate.TARGETS`) within its limit there,
    each error counted beyond the target's own spread as in `score`. A metric not measured is
    not within."""
    from .validate import TARGETS  # (validate imports this module)

    spread = spread or {}
    return all(k in errs and max(0.0, errs[k] - spread.get(k, 0.0)) <= TARGETS[k] for k in TOLERANCE if k in TARGETS)


def rank(errs: dict, spread: dict | None = None) -> tuple[bool, bool, float]:
    """Which iteration the loop keeps, the least: one within every tolerance (`within`) before
    any that is not, then one within every limit the validation judges (`within_limits`) before
    any that is not, then the lower `score`. Until session 26 the score alone decided, so an
    earlier iteration with one row just out (a score of errors beyond the target's spread) could
    be kept over the last, which met them all and ended the loop.

    The middle tier (session 44): memcached's loop ran out of iterations with I1 and the branches
    trading places (I1 at 8.4-17.7% off while the branches were within 4%, and back), and kept
    iteration 6 by the score (3.72: I1 0.1%, branches 13.9%) over iteration 8 (4.40: I1 9.4%,
    branches 9.7%). The clone's branch rate is steady from window to window (200.0-200.9 per
    10,000 in the validation's 17), so the validation failed the branch row at 14.6%: an error
    beyond a limit is a sure failure, where one under it is not."""
    return (not within(errs), not within_limits(errs, spread), score(errs, spread))


def score(errs: dict, spread: dict | None = None) -> float:
    """Which iteration is best: the sum of errors in units of their tolerance, each capped at 10
    (one metric stuck far off must not decide alone). A metric an iteration failed to measure
    counts as the cap, not as a perfect match.

    Each error counts beyond the target's own spread only (`target_spread`, session 17). The LL
    rows rest on ~80-160 misses per window: redis's target moved 20-30% between the profile's
    windows, so their errors drew a score of up to ~8 from noise, and the loop kept iteration 3
    (I1 8.8%, branch 10.8% off) over iterations 7-10 (both within 0.4%) for an LL draw; the
    validation then failed redis's branch row at 10.7%."""
    spread = spread or {}
    half = min(10.0, errs[HALF_I1_KEY] / HALF_I1_TOLERANCE) if HALF_I1_KEY in errs else 0.0
    half += sum(min(10.0, errs[key] / MID_D1_TOLERANCE) for key in D1_POINTS if key in errs)
    return half + sum(
        min(10.0, max(0.0, errs[k] - spread.get(k, 0.0)) / TOLERANCE[k]) if k in errs else 10.0 for k in TOLERANCE
    )


def target_anchors(vgp: dict) -> list[dict]:
    """The profile's windows at A beyond its pool that the tuning target pools too: the LL sweep's
    anchors (`profile.ll_sweep_windows`), where each ran beside another copy under callgrind as
    the loop's and the validation's windows of the original run beside the clone; [] otherwise.

    Why (session 38): redis's code-side LL misses at A are ~0.0137 or ~0.024-0.027 a request per
    window (a jemalloc purge runs in some), and the target of 6 + 6 windows drew the upper mode in
    4 where the validation drew it in 16 of 32 (target 0.0188 a request, validation 0.021): the
    clone sat 11.7% under at A and its LL at B 10.1% under. The sweep's 20 anchors (15 in the
    upper mode) were already run, at A, and thrown away but for their pooled ratios. They ran
    without branch simulation, so they join the pool for every metric but the branches'.
    A multi-threaded original's anchors ran alone (`ll_sweep_windows`): memcached alone misses
    less at A's LL than beside another copy (its anchors 0.0121 code misses a request, its loop's
    windows 0.0135, its validation's 0.015), so they would pull the target away from the
    conditions it is judged in, and they are left out."""
    wins = vgp.get("anchor_windows")
    keys = ("requests", *vg.POOLED_KEYS)
    if (
        vgp.get("anchors_paired") is not True
        or not isinstance(wins, list)
        or not all(isinstance(w, dict) and all(isinstance(w.get(k), (int, float)) for k in keys) for w in wins)
    ):
        return []  # (none kept, run alone, or a corrupt list: the target as before)
    return [dict(w) for w in wins]


def retarget(target: dict, windows: list[dict], anchors: list[dict] | None = None) -> dict:
    """The tuning target's whole-clone figures (`vg.metrics`' keys) as the pool of `windows` (the
    profile's and those the loop ran beside the clone, each a window's metrics with its
    "requests"); the rest of `target` (the LL sweep's shares, the skeleton's misses) as it was.
    `anchors` (`target_anchors`) join the pool for every metric they measure (not the branches:
    `vg.pool_metrics` keeps those only where every window has them)."""
    if len(windows) < 2 or not all(isinstance(w.get("requests"), (int, float)) for w in windows):
        return target
    out = {**target, **vg.pool_metrics(windows)}
    if anchors:
        out.update(vg.pool_metrics([*windows, *anchors]))
    return out


# the data-side LL misses per request at the LL sweep's largest LL: the original's (the target's
# entry) and the clone's (its metrics'), where the loop measures them (`persistent_ll_config`)
PERSISTENT_KEY = "DL_at_persistent_LL"
# the same of the code side, and (the clone's metrics only) what the clone misses there but for
# its persistent walkers (data) and clone_far_'s code (the cold ring), pooled over every window
# the loop ran there
PERSISTENT_IL_KEY = "IL_at_persistent_LL"
PERSISTENT_REST_KEY = "DL_rest_at_persistent_LL"
PERSISTENT_IL_REST_KEY = "IL_rest_at_persistent_LL"
# how many windows of the original the loop runs there beside each of the clone's, all at once.
# Why (session 41): memcached's data-side misses at 8 MiB are a few a window, 0-16, with a
# deviation about their mean (3.4 a window over 91 windows beside the clone: sessions 39's and 40's
# loops and validations, and session 41's probes): ten windows pin that mean to +-1 a window, a
# tenth of its LL at B (~21 misses a window), and session 40's ten read 4.7 where its validation's
# 27 read 2.2 (the clone, tuned to 4.0 with the sweep's ten, failed that row 13.0% over).
# A third copy costs no time: three windows took 19 s as two did (about 0.7 of a CPU under
# callgrind), and the originals' median latency did not move (311-325 us against 326-333)
PERSISTENT_ORIGINALS = 2


def persistent_originals(vgp: dict) -> int:
    """How many of the original's windows the loop runs at the sweep's largest LL beside each of
    the clone's: PERSISTENT_ORIGINALS, but one for an original whose sweep ran in pairs (a
    single-threaded one, `profile.ll_sweep_windows`), so that the set runs as its sweep, its
    windows at A and the validation do, two copies at once.

    Why (session 43): redis's data-side misses follow how fast it runs against the load (its cron
    runs by the wall clock), and three copies under callgrind on two CPUs run slower than two.
    Its loop's windows at 8 MiB, three at once, missed 60.6 data lines a window in the upper mode
    and 37 in the lower; its sweep's, in pairs, 46.8 and 21.2, and the validation's at B 52 and
    25.5 (its windows at A read alike in the loop, the sweep and the validation: 106-115 and 62-76).
    Tuned to the inflated pool, the clone's data side at B was 36% over; its code side, which does
    not follow the host's speed, was not moved (the same 74 / 127-143 in every set)."""
    return 1 if vgp.get("anchors_paired") is True else PERSISTENT_ORIGINALS


def persistent_ll_config(vgp: dict) -> dict | None:
    """The cache at which the loop also runs both sides each iteration: A's L1s and the sweep's
    largest LL (a point of the profile's sweep, not the held-out hierarchy). None for a profile
    without a well-formed sweep. Until session 42 only for an original whose LL sweep ran alone
    (`profile.ll_sweep_windows`: a multi-threaded one); why for every original, below.

    Why (session 39): the clone's persistent data walkers were sized to the sweep's share of A's
    data-side misses that its largest LL still misses, times the tuning target at A. memcached's
    sweep ran alone, and its target's windows beside the clone: memcached misses more at A beside
    another program under callgrind (anchors alone 0.0046 a request, the loop's windows 0.0075) but
    not more at 8 MiB (the sweep's 0.00092 a request alone, the validation's 0.00051 beside the
    clone), so the share (0.20) times the target (0.0063) put the clone's data side at 8 MiB at
    0.0013 a request, 155% over the validation's original, and its LL at B 25.7% over. The
    original's misses at the largest LL measured beside the clone, pooled with the sweep's own
    (`persistent_target`), are in the conditions it is judged in, and do not pass through A.

    Why for a paired sweep too (session 42): redis's code-side misses come in two modes a window
    (at A 80 or 142-158, at 8 MiB 74 or 127-143: an 8 MiB LL keeps 7-10% of them in either mode),
    and the share of windows in the upper one moves from one stretch of the host to the next (the
    profile's six windows had five, the loop's last eight none). Its clone's share of code misses
    an 8 MiB LL keeps came from the sweep (0.91 persistent) and the target at A: with the target
    at A drawn low, the cold ring alone made it up, the code rings went to 0.05 and missed nothing
    from the second iteration on, and the clone kept 2.3% of its code misses at B where the
    original kept 7-10% in either mode. The validation's original at B was 14% under its figure at A (the share of
    upper-mode windows 63% there, 69% at A), and the LL at B failed 11.8% over (its code side
    17.8%). Measured at 8 MiB each iteration, both sides' code misses there set the cold ring and
    A's the rings, from pools of the same windows' kind (`_ll_by_side`)."""
    ll = vgp.get("ll_sweep")
    if not isinstance(ll, dict):
        return None
    sizes = ll.get("sizes")
    if not isinstance(sizes, list) or len(sizes) < 2 or not all(type(x) is int and x > 0 for x in sizes):
        return None
    return {**vg.CONFIG_A, "LL": cache_arg(max(sizes))}


def persistent_target(vgp: dict, orig: list[dict], side: str = "DL") -> float | None:
    """The original's LL misses per request at the sweep's largest LL, data side ("DL") or code
    side ("IL"): the pool of the sweep's raw windows there (`profile.ll_sweep`'s "raw", before the
    anchors' correction, as many windows as it pooled, each of the loop's mean requests) and the
    loop's windows `orig` (each a window's metrics with its "requests"). None without either."""
    ll = vgp.get("ll_sweep") or {}
    n_req, n_dl = 0.0, 0.0
    for w in orig:
        r, d = w.get("requests"), w.get(f"{side}_misses_per_request")
        if isinstance(r, (int, float)) and isinstance(d, (int, float)) and r > 0 and d >= 0:
            n_req, n_dl = n_req + r, n_dl + d * r
    per = n_req / len(orig) if orig and n_req > 0 else float(vgp.get("window_requests") or 0)
    try:
        sizes = [int(x) for x in ll["sizes"]]
        raw = float(ll["raw"][side][sizes[1:].index(max(sizes[1:]))])
        nwin = float(ll["windows"][sizes.index(max(sizes))])
    except (KeyError, TypeError, ValueError, IndexError):
        raw, nwin = 0.0, 0.0
    if not (raw >= 0 and nwin > 0 and per > 0):  # (NaN, a corrupt entry: the loop's windows alone)
        raw, nwin = 0.0, 0.0
    n_req, n_dl = n_req + nwin * per, n_dl + raw * nwin * per
    return n_dl / n_req if n_req > 0 else None


# where the original's windows are bimodal (`balanced_persistent`): the ratio each side's target at
# the sweep's largest LL took to its target at A, kept in the target for reading the loop's course
PERSISTENT_RATIO_KEYS = {"IL": "IL_persistent_ratio", "DL": "DL_persistent_ratio"}


def balanced_persistent(vgp: dict, target: dict, at_a: list[dict], orig: list[dict]) -> dict[str, float]:
    """For an original whose windows come in two modes (the profile's LL sweep found them at its
    largest LL: `profile.mode_balanced`), each side's target at that LL as the target at A times
    what that LL keeps of it mode by mode, weighed as the windows at A hold the modes: from the
    loop's pools (`at_a`, the target's windows at A, and `orig`, the original's at that LL) where
    both show both modes, else the sweep's own ratio. {} for an original of one mode, a sweep
    without its modes or a corrupt one, and a sweep that did not run in pairs
    (`persistent_target`'s absolute figure stands then).

    Why (session 42): redis's code misses a window are 80 or 142-158 at A and 74 or 127-143 at
    8 MiB (an 8 MiB LL keeps 7-10% in either mode), and the share of windows in the upper mode
    moves from one stretch of the host to the next. The first loop to measure both sides at 8 MiB
    pooled 110 code misses a window at A and 112 at 8 MiB: its two pools had drawn the upper mode
    in different shares, which moves each by more than the 7-10%. Aimed at 112, the cold ring
    (which every LL misses) went to 1.35 and the code rings (what a larger LL keeps) to ~0, and the
    clone kept 3% of its code misses at 8 MiB where the original keeps 7-10%: the code side at B
    (session 42's validation, the path before: 2.3% kept) fails. The modes' means do not move
    with their shares, so the ratio of the means, mode by mode, is the split the clone must make.

    Why only a sweep that ran in pairs (a single-threaded original, `profile.ll_sweep_windows`):
    one that ran alone (memcached's) measured its ratio on windows alone, and the target at A is
    drawn beside the clone, where memcached misses more at A but not at 8 MiB (session 39): the
    ratio times that target would put the target at 8 MiB over what the original misses there,
    which the absolute pool measures in the loop's own conditions."""
    if vgp.get("anchors_paired") is not True:
        return {}
    ll = vgp.get("ll_sweep")
    try:
        sizes = [int(x) for x in ll["sizes"]]
        i = sizes[1:].index(max(sizes[1:]))
        if ll["modes"][i] is None:
            return {}
        sweep = {side: float(ll[side][i + 1]) / float(ll[side][0]) for side in PERSISTENT_RATIO_KEYS}
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError):
        return {}
    loop = profile.mode_balanced(orig, at_a) if orig and at_a else None
    out: dict[str, float] = {}
    for side, rkey in PERSISTENT_RATIO_KEYS.items():
        r = (loop or {}).get(side)
        r = r if isinstance(r, float) and r >= 0 else sweep[side]
        if not r >= 0:  # (NaN)
            return {}
        key = PERSISTENT_KEY if side == "DL" else PERSISTENT_IL_KEY
        out[key] = float(target.get(f"{side}_misses_per_request", 0.0)) * r
        out[rkey] = r
    return out


def persistent_rest(win: vg.Window, meta: dict) -> dict:
    """What one of the clone's windows at the sweep's largest LL missed there per request but for
    its persistent walkers (clone_farp_'s data misses: PERSISTENT_REST_KEY) and for clone_far_'s
    code misses (the cold ring: PERSISTENT_IL_REST_KEY), with its "requests"."""
    m, sp = vg.metrics(win), _split(win, meta)
    farp, far = sp.get("farp") or {}, sp["far"]
    return {
        "requests": win.requests,
        PERSISTENT_REST_KEY: max(0.0, m["DL_misses_per_request"] - farp.get("DLmr", 0.0) - farp.get("DLmw", 0.0)),
        PERSISTENT_IL_REST_KEY: max(0.0, m["IL_misses_per_request"] - far.get("ILmr", 0.0)),
    }


def _pool_rest(rests: list[dict]) -> dict:
    """`persistent_rest` of several windows as one (weighed by their requests); {} for none."""
    n = sum(r["requests"] for r in rests)
    if n <= 0:
        return {}
    return {k: sum(r[k] * r["requests"] for r in rests) / n for k in (PERSISTENT_REST_KEY, PERSISTENT_IL_REST_KEY)}


def tune(
    prof: dict, clone_dir: Path, progress, seed: int = 1, max_iter: int = MAX_ITERATIONS, skeleton: dict | None = None
) -> dict:
    """Run the loop; leaves the best clone generated and built in clone_dir; returns the history.

    Each iteration runs the clone's window beside one of the original (as validate pairs them,
    `validate._window_pair`), and that window joins the target's pool (`retarget`): the target
    grows from the profile's windows by one per iteration. An iteration within every tolerance
    whose target pools fewer than MIN_TARGET_WINDOWS windows runs again with the same knobs (no
    new build), and the clone's windows of such a run are pooled too (`vg.pool`). The kept
    iteration is ranked against the final target. Why (session 28): a pool of six windows had the
    target off the validation's by 15-26% on the LL sides (redis's rare jemalloc stretch in 3 of 6
    windows against 7 of 27; memcached's data side 23 misses per window against 30), and one
    window of the clone counts ~20 data-side misses (+-45% from counting alone)."""
    vgp = prof["valgrind"]
    windows = [dict(w) for w in vgp.get("windows") or []]
    anchors = target_anchors(vgp)
    target = retarget(dict(vgp["metrics"]), windows, anchors)
    # the share of the data-side LL misses at A that the profile's largest swept LL still misses
    bins = gen.llc_bins(prof["valgrind"].get("ll_sweep"))
    target["DL_persistent_fraction"] = bins["persistent"].get("data", 1.0)
    # how many code conflict rings the clone has (one per code bin of the LL sweep): none, and the
    # cold code ring is the code side's knob (`_ll_by_side`)
    target["IL_ring_bins"] = float(len(bins["code"]))
    # the skeleton's data LL misses at the sweep's largest LL (`_ll_by_side`: its persistent rest)
    skel_ll = gen._skeleton_ll(skeleton)
    if "DL_at_max" in skel_ll:
        target["skeleton_DL_persistent"] = skel_ll["DL_at_max"]
    port = prof["listen"]["port"]
    load = prof["load"]["args"]
    original = (prof.get("private") or {}).get("launch")
    knobs = dict(gen.DEFAULT_KNOBS)
    body_targets = _targets_by_body(prof)
    d1_targets = _d1_targets_by_body(prof)
    history = []
    spread = target_spread({"windows": windows, "metrics": target}, anchors)
    clone_wins: list[vg.Window] = []
    ll_rests: list[dict] = []  # each clone window's LL rest (`ll_rest`)
    meta: dict = {}
    job = {
        "port": port,
        "load_args": load,
        "rate": vgp["rate"],
        "requests": vgp["window_requests"],
        "cache": vg.CONFIG_A,
        "preload": "--preload" in load,
        "workdir": clone_dir / "private" / "work",
    }
    # the second set's windows (the I1 at half of A's, a D1 point: `second_config`), each with
    # its D1 point (`second_point`)
    half_clone: list[tuple[str, vg.Window]] = []  # the clone's (this build's)
    half_orig: list[tuple[str, vg.Window]] = []  # the original's, all of the loop's: the target's pool
    # (session 39) both sides at the LL sweep's largest LL too (every original since session 42)
    persist_cache = persistent_ll_config(vgp) if original else None
    persist_clone: list[vg.Window] = []  # this build's windows there
    persist_orig: list[dict] = []  # the original's (`persistent_originals` an iteration)
    persist_rest: list[dict] = []  # the clone's rest there, each of the loop's windows
    persist_keys = (("DL", PERSISTENT_KEY), ("IL", PERSISTENT_IL_KEY))
    for side, key in persist_keys if persist_cache is not None else ():
        if (pt := persistent_target(vgp, [], side)) is not None:
            target[key] = pt
    if persist_cache is not None:  # (session 43) a bimodal original: the split mode by mode
        target.update(balanced_persistent(vgp, target, windows, []))
    for it in range(1, max_iter + 1):
        again = bool(history) and knobs == history[-1]["knobs"]
        if again:
            build_s = 0.0
        else:
            meta = gen.generate(prof, clone_dir, seed=seed, knobs=knobs, skeleton=skeleton)
            knobs = pin_layout(knobs, meta)  # (the same generation: it was sized on these budgets)
            build_s = gen.build(clone_dir)
            clone_wins, half_clone, persist_clone = [], [], []
        jobs = [{**job, "launch": clone_launch(clone_dir, port), "tag": f"tune{it}"}]
        if original:
            jobs.append({**job, "launch": original, "tag": f"tune{it}-original"})
        got = vg.side_by_side(jobs)
        clone_wins.append(got[0])
        if original:
            windows.append(vg.metrics(got[1]) | {"requests": got[1].requests})
            target = retarget(target, windows, anchors)
            spread = target_spread({"windows": windows, "metrics": target}, anchors)
            # one set for every second point (`second_config`): the I1 at half, the D1 at the
            # mid-bin point and, where the loop has one, the LL at the sweep's largest
            tag = f"tune{it}-half" if persist_cache is None else f"tune{it}-ll"
            point = second_point(it)
            sjob = {**job, "cache": second_config(persist_cache, point)}
            pw = vg.side_by_side(
                [
                    {**sjob, "launch": clone_launch(clone_dir, port), "tag": tag},
                    *(
                        {**sjob, "launch": original, "tag": f"{tag}-original{j + 1 if j else ''}"}
                        for j in range(1 if persist_cache is None else persistent_originals(vgp))
                    ),
                ]
            )
            half_clone.append((point, pw[0]))
            half_orig += [(point, w) for w in pw[1:]]
            target.update(second_metrics(half_orig))
            if persist_cache is not None:
                persist_clone.append(pw[0])
                persist_rest.append(persistent_rest(pw[0], meta))
                persist_orig += [vg.metrics(w) | {"requests": w.requests} for w in pw[1:]]
                for side, key in persist_keys:
                    if (pt := persistent_target(vgp, persist_orig, side)) is not None:
                        target[key] = pt
                target.update(balanced_persistent(vgp, target, windows, persist_orig))
        win = vg.pool(clone_wins)
        m = vg.metrics(win)
        half_bodies: dict = {}
        carried: list[str] = []
        if half_clone:
            m.update(second_metrics(half_clone))
            carried = carry_second(m, history)
            half_bodies = {
                "clone": clone_body_misses([w for _, w in half_clone], meta),
                "original": original_body_misses([w for _, w in half_orig], prof),
            }
        if persist_clone:
            pm = vg.metrics(vg.pool(persist_clone))
            m[PERSISTENT_KEY], m[PERSISTENT_IL_KEY] = pm["DL_misses_per_request"], pm["IL_misses_per_request"]
            m.update(_pool_rest(persist_rest))
        split = _split(win, meta)
        split["far_ll_lines"] = meta.get("far_ll_lines") or {}
        # the LL misses no knob moves, pooled over all of the loop's windows (`smooth_ll`)
        last = clone_wins[-1]
        ll_rests.append(ll_rest(vg.metrics(last), ll_parts(_split(last, meta))))
        m = smooth_ll(m, ll_parts(split), ll_rests)
        for h in history:  # (the earlier iterations' too, for `_best` and the secants)
            h["metrics"] = smooth_ll(h["metrics"], h["ll_parts"], ll_rests)
        errs = errors(m, target)
        sc = score(errs, spread)
        history.append(
            {
                "iteration": it,
                "knobs": dict(knobs),
                "metrics": m,
                "errors": errs,
                "score": sc,
                "build_s": build_s,
                "clone_windows": len(clone_wins),
                "target_windows": len(windows),
                # (session 39) how fast valgrind ran the clone in this iteration's window (the
                # original's is in its window's metrics, `target_windows`)
                f"clone_{vg.LATENCY_KEY}": vg.metrics(clone_wins[-1]).get(vg.LATENCY_KEY),
                # (session 42) the LL misses per request at A of the parts each LL knob moves:
                # what the loop's steps were taken on, for reading its course afterwards
                "ll_parts": ll_parts(split),
                **({"half_i1_misses_per_request": half_bodies} if half_bodies else {}),
                # (session 50) the D1 points taken from an earlier build (`carry_second`)
                **({"carried": carried} if carried else {}),
            }
        )
        pooled = f" ({len(clone_wins)} windows of this clone)" if len(clone_wins) > 1 else ""
        also = f" (+{len(anchors)} of the LL sweep's, but for the branches)" if anchors else ""
        persist = "".join(
            f", {side} at {int(persist_cache['LL'].split(',')[0]) >> 20} MiB {100 * rel_err(m[key], target[key]):.1f}%"
            for side, key in persist_keys
            if persist_cache and key in m and key in target
        )
        progress(
            f"tuning iteration {it}/{max_iter}{pooled}, target of {len(windows)} windows{also}: "
            + ", ".join(f"{k.split('_')[0]} {100 * v:.1f}%" for k, v in errs.items())
            + persist
        )
        if within(errs):
            if not original or len(windows) >= MIN_TARGET_WINDOWS:
                break
            continue  # the same knobs again: one more window each of the clone and the target
        best_knobs = _best(history, target, spread)["knobs"]
        k = update_knobs(knobs, m, target, split, body_targets, d1_targets)
        if half_bodies:
            k = half_i1_step(k, half_bodies["clone"], half_bodies["original"])
        knobs = freeze_layout(k, best_knobs, it, errs.get(HALF_I1_KEY), knobs)
        knobs = branch_secant(i1_secant(knobs, history, target), history, target)
        knobs = ll_bracket(knobs, history, target)
        knobs = d1_reach_step(knobs, history, target)
    # regenerate the best
    best = _best(history, target, spread)
    bit, bk = best["iteration"], best["knobs"]
    if bk != history[-1]["knobs"]:
        gen.generate(prof, clone_dir, seed=seed, knobs=bk, skeleton=skeleton)
        gen.build(clone_dir)
    result = {
        "iterations": len(history),
        "best_iteration": bit,
        "knobs": bk,
        # the kept iteration's errors against the final target (its history entry has them
        # against the target as it was then)
        "errors": errors(best["metrics"], target),
        "history": history,
        "target": target,
        "target_spread": spread,
        "target_windows": windows,
        "target_anchor_windows": len(anchors),
        "persistent_ll_windows": len(persist_orig),
    }
    (clone_dir / "private").mkdir(exist_ok=True)
    (clone_dir / "private" / "tuning.json").write_text(json.dumps(result, indent=1))
    return result


def _best(history: list[dict], target: dict, spread: dict) -> dict:
    """The iteration to keep (`rank`), each taken against `target` as it is now (the target grows
    with the loop's windows of the original), and of a run of iterations with the same knobs the
    last, whose metrics pool the run's windows."""
    last: dict[str, dict] = {}
    for h in history:
        last[json.dumps(h["knobs"], sort_keys=True)] = h
    cands = sorted(last.values(), key=lambda h: h["iteration"])

    def key(h):
        return rank(errors(h["metrics"], target), spread)

    return min(cands, key=key)
