"""The generated body: x86-64 assembly blocks that match a cluster's profiled distributions.

One function per thread cluster, `clone_body_<c>(struct body_state *st)`, runs once per
trigger event (a request for workers, a wakeup for timer threads). It is a sequence of code
blocks (Ditto §4.4.5, Fig. 3); block b is a straight-line run of K_b instructions looped n_b
times per event (n_b may be fractional: a 16.16 fixed-point accumulator in the state carries
the remainder across events). Each block has

  * a code size W_b in one instruction working-set bin: its instruction fetches reuse lines
    at distance ~W_b, so they hit in an I-cache of size >= W_b and miss below;
  * a data region of size R_b in one data working-set bin, walked sequentially one line per
    access with a cursor that persists across events (Ditto §4.4.4, Fig. 4), plus accesses to a
    tiny always-hit region (the stack-like accesses of the original);
  * instructions sampled from the class/memory-flag mix, registers picked so that
    read-after-write distances follow the profiled histogram (§4.4.6);
  * conditional branches whose outcome is a bit of a rotating 64-bit pattern register, so a
    branch's taken rate p and transition rate r are those of the pattern (§4.4.3); rare or
    near-certain branches (p < 1/64 or > 63/64) test low bits of the block's pass counter.
    The pattern is rotated by the block's own passes so far, so a branch reads consecutive bits
    from one pass to the next, across events too (session 13: rotated by a counter that every
    block's passes advanced, a block run once per event read bits ~D apart, D the passes of
    all blocks per event, so its transition rate was the stride's, not the profile's. This
    alone did not lower the mispredictions: redis's 66 once-per-event pattern branches
    mispredicted 23% before and 30% after; see _branch_patterns for the lever that does).

Registers: r15 data base, r13 region cursor, r12 loop count, r11/r10 the branch patterns' start
values, rdi the state; rax rbx rcx rdx rsi rbp r8 r9 and xmm0-7 carry the mix. The branch state
is in memory (session 11, `STATE_PATTERNS`): each block's pass counter is a per-thread qword
of the state (`STATE_BLOCK_PASSES`), incremented in place, and the rotating patterns are two
more, so every conditional branch's test reads memory (`bt qword ptr [rdi + P], k` /
`test dword ptr [rdi + C], M`) and
the loop's rotations and counter are read-modify-writes. With the pattern and counter in
registers, a block's scaffolding (a test per conditional branch, the loop control) was all
register-only, and with the original's short cache-line chunks it left too little room for
the memory classes: the clones made 30-36% fewer data references per request than the
originals (memcached 2,385 vs 3,395, redis 2,741 vs 4,283), which moved every per-reference
rate.
Everything is drawn from a numpy Generator seeded by the caller: same seed, same text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .isa import CLASSES, DEP_BINS, MEMFLAGS

GPR = ["rax", "rbx", "rcx", "rdx", "rsi", "rbp", "r8", "r9"]
ACC = GPR[:4]  # written only read-modify-write: their values stay live
TMP = GPR[4:]  # loads and moves land here and are consumed into an accumulator
XACC = ["xmm0", "xmm1", "xmm2", "xmm3"]
XTMP = ["xmm4", "xmm5", "xmm6", "xmm7"]
GPR32 = {"rax": "eax", "rbx": "ebx", "rcx": "ecx", "rdx": "edx", "rsi": "esi", "rbp": "ebp", "r8": "r8d", "r9": "r9d"}
XMM = [f"xmm{i}" for i in range(8)]
TINY_BYTES = 128  # the always-hit region (two lines)
PATTERN_OFF = 0  # unused; patterns are immediates
DIVISOR_OFF = 120  # a constant divisor kept in the tiny region
ZERO_OFF = 112  # a qword the mix never writes (its tiny-region slots end below 112): always 0
SINK_OFF = 0  # where the walkers store the sum of their loads (a tiny-region slot the mix writes too)
STATE_DATA, STATE_ITER, STATE_BLOCKS = 0, 8, 16  # struct body_state offsets
STATE_PATTERNS = (STATE_BLOCKS, STATE_BLOCKS + 8)  # the two rotating branch patterns (per thread)
STATE_BLOCK_PASSES = STATE_BLOCKS + 16  # + 8 b: block b's passes so far (per thread, session 13)
EST_INSN_BYTES = 4.6  # average encoded size of the generated instructions (measured)


@dataclass
class Block:
    """One generated block (all sizes in bytes)."""

    weight: float  # fraction of the body's dynamic instructions
    code_bytes: int  # W_b
    region_bytes: int  # R_b (0: tiny region only)
    main_per_insn: float  # main-region accesses per instruction
    iters_per_event: float = 0.0
    insns: int = 0
    region_off: int = 0
    lines: list[str] = field(default_factory=list)


@dataclass
class BodySpec:
    """What a cluster's body must reproduce (per trigger event)."""

    name: str
    instructions: float  # dynamic instructions per event (body share)
    mix: dict[str, float]  # class/memflag -> fraction
    cond_per_insn: float  # conditional branches per instruction
    branches: list[list[float]]  # [p, r, weight]
    dep_hist: list[float]  # RAW distance histogram over DEP_BINS
    icode_bins: list[tuple[int, float]]  # (code working-set size, fraction of instructions)
    data_bins: list[tuple[int, float]]  # (data working-set size, fraction of main accesses)
    mem_per_insn: float  # data accesses per instruction
    main_fraction: float  # fraction of data accesses that are not tiny-region
    rep_len: int = 32  # iterations of a `rep` drawn from the mix (profiles without `rep`)
    # the rep unit (rep_function, session 12): rep string executions per event and their iterations
    # and bytes per iteration; with it the mix draws no `rep`
    rep_per_event: float = 0.0
    rep_iters: int = 0
    rep_width: int = 1
    rep_cold: bool = False  # its lines miss the profiled D1: it rotates over regions (rep_function)
    chunk_insns: int = 0  # instructions per cache-line chunk (0: straight-line blocks)
    expected: float = 0.0  # set by generate_body: the body's exact instructions per event
    block_budget: float = 0.0  # set by generate_body: the blocks' share of those instructions
    # set by generate_body: the blocks' memory operands per instruction are mix_a * mem_scale -
    # mix_b (`layout_mix_a:<name>`, `layout_mix_b:<name>` pin them: tune.pin_layout)
    mix_a: float = 0.0
    mix_b: float = 0.0
    cold_bin: int = 0  # the data bin of accesses that miss at the largest swept size (0: none)
    cold_code_lines: float = 0.0  # code line entries per event that miss at the largest swept size
    walk_sizes: dict | None = None  # bin -> walker region bytes (layer_walkers: all bodies at once)
    near_sizes: dict | None = None  # region bytes of each near block (layer_walkers)
    ring_sizes: dict | None = None  # code bin -> ring bytes (layer_walkers)
    skel_code_lines: float = 0.0  # the skeleton's own I-cache line entries per event
    hot_code_bytes: float = 0.0  # code the blocks run per event (0: as the bins say)
    events_per_request: float = 1.0  # how often the body runs, per request of the window
    walk_base: int = 0  # which 16 walker slots of the arena this body uses (bodies sharing an arena)
    # set by generate_body: (offset, bytes, rank, TOUCH_UP or TOUCH_DOWN) ranges touched at start-up
    touch: list | None = None
    # LL misses that a larger LL would not have (the profile's LL sweep, session 10): per side,
    # (LL size in bytes at which they hit, misses per event at the profiled LL); see llc_rings
    llc_code: list | None = None
    llc_data: list | None = None
    branch_unit: bool = False  # the random-branch unit (brx_function, knob branch_x): one body has it
    # the original's own I-side working-set bins for this cluster (the profile's I_bins, skeleton
    # included: the curve the whole thread shows), for the blocks' order (zigzag_order)
    code_curve: list | None = None
    # per data bin (its upper size): the share of its accesses whose reuse distance lies below
    # the bin's mid size (the profile's mid-bin sweep, workingset.lower_share); the bin's two
    # cursor walkers take that share and the rest (walker_list; none given: half each)
    data_split: dict | None = None
    # set by generate_body: the walkers' lines per event that miss the profiled LL, those the
    # largest swept LL keeps ("keep": bins up to `ll_keep_bytes`) and those it misses too
    # ("persist": bins beyond it and the cold walker); tune._ll_by_side splits clone_far_'s
    # LL misses by them
    far_ll_lines: dict | None = None


def far_data_knob(s: int, cold: bool, knobs: dict) -> str:
    """The knob a walker of data bin (s/2, s] runs at. Within the LL the knobs name (`ll_bytes`):
    `data_far_scale`. Beyond it, up to the largest LL the profile's LL sweep measured
    (`ll_keep_bytes`, set by generate; the LL itself without a sweep): `data_llc_scale`, the LL
    conflict rings' knob, since these are misses a larger LL keeps, as the rings' are. Beyond that,
    and the cold walker: `data_ll_scale`, what every LL misses. Up to session 24 every walker
    beyond the LL ran at `data_ll_scale`, which the loop sets to the share of the misses the
    largest swept LL still has: redis's clone_far_ missed 39 lines per window at a 2 MiB LL and 10
    at 8 MiB (its 4 MiB bin's walkers), so its data misses at B were 19 against the original's
    31-55. The (ll/2, ll] bin stays with `data_ll_scale`, as before (its walkers hit the LL)."""
    ll = knobs.get("ll_bytes", 2 << 20)
    if not cold and s < ll:
        return "data_far_scale"
    if not cold and ll < s <= knobs.get("ll_keep_bytes", ll):
        return "data_llc_scale"
    return "data_ll_scale"


def couple(icode_bins, data_bins, min_mass: float = 0.05) -> list[tuple[float, int, int]]:
    """Comonotone coupling of the instruction and data working-set distributions.

    Both lists are (size, mass) with masses summing to 1; walking both CDFs in size order
    pairs small code loops with small data and large with large. Returns (mass, W, R) segments.
    """
    a = [[s, m] for s, m in sorted(icode_bins) if m > 0]
    b = [[s, m] for s, m in sorted(data_bins) if m > 0]
    if not a:
        a = [[256, 1.0]]
    if not b:
        b = [[0, 1.0]]
    ta, tb = sum(m for _, m in a), sum(m for _, m in b)
    for x in a:
        x[1] /= ta
    for x in b:
        x[1] /= tb
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        m = min(a[i][1], b[j][1])
        if m > 1e-9:
            out.append((m, a[i][0], b[j][0]))
        a[i][1] -= m
        b[j][1] -= m
        if a[i][1] <= 1e-9:
            i += 1
        if b[j][1] <= 1e-9:
            j += 1
    return _merge_small(out, min_mass)


def _merge_small(segs: list[tuple[float, int, int]], min_mass: float = 0.05) -> list[tuple[float, int, int]]:
    """Fold segments lighter than min_mass into a neighbour: each block costs a loop whose exit
    mispredicts, so dozens of tiny blocks would inflate the branch misprediction rate. The
    bodies use 15% (BLOCK_MIN_MASS): the blocks hold only the code bins up to the I1 and the
    data bins up to 1 KiB (the rest are rings and walkers), and at 5% memcached's timer body had
    6 looping blocks, ~6 mispredictions per wakeup at 2.5 wakeups per request: 15 of the
    clone's 27 per request."""
    out: list[list] = []
    for m, w, r in segs:
        if out and (m < min_mass or out[-1][0] < min_mass):
            prev = out[-1]
            heavier = [w, r] if m > prev[0] else [prev[1], prev[2]]
            if max(r, prev[2]) >= 1 << 20:
                heavier[1] = max(r, prev[2])  # keep far data far: it is what the LL sees
            out[-1] = [prev[0] + m, *heavier]
        else:
            out.append([m, w, r])
    return [tuple(x) for x in out]


def _pattern(p: float, r: float, rng: np.random.Generator | None = None, form_r: float | None = None) -> int | None:
    """A 64-bit cyclic pattern with round(64p) ones and about 64r transitions (even, feasible).

    Run lengths are split at random (seeded), so the sequence is irregular like a two-state
    Markov chain rather than a strictly periodic one a history predictor would learn. `form_r`
    (default r) decides between this and the counter-mask form: the profiled rate, so that a
    tuning step on r (branch_r_scale) changes the patterns' bits and not the code's layout
    (session 13: redis's rate fell from 0.0146 to 0.0046 in one step as patterns crossed over).
    """
    ones = round(64 * p)
    if ones <= 1 or ones >= 63 or (r if form_r is None else form_r) < 3 / 64:
        return None  # too coarse for a 64-bit pattern: the counter-mask form (_mask_branch)
    maxt = 2 * min(ones, 64 - ones)
    t = max(2, min(maxt, 2 * round(64 * r / 2)))
    runs = t // 2
    one_runs = _split(ones, runs, rng)
    zero_runs = _split(64 - ones, runs, rng)
    bits = []
    for o, z in zip(one_runs, zero_runs, strict=True):
        bits += [1] * o + [0] * z
    v = 0
    for k, bit in enumerate(bits):
        v |= bit << k
    return v


def _branch_patterns(spec, bw, knobs, rng) -> list:
    """Two branch patterns drawn from the body's profiled (taken, transition) pairs.

    A pattern whose draw u is below `branch_mask_frac` takes a counter form whatever its rates
    (session 13; `_threshold_branch`, which keeps its taken rate). callgrind's predictor indexes
    its counters by 7 global history bits and 7 address bits; a block's pattern branches read
    bits of one rotating register, and their mispredictions hardly follow r (0.13 at r = 0.05,
    0.18 at 0.5 in a standalone body), while a counter's periodic outcomes are predicted well.
    redis's worker: 23-30% of its pattern branches mispredicted against a profiled 1.06%
    overall, and branch_r_scale from 0.5 to 0.2 left the rate at 0.0128-0.0139 (target 0.0106),
    until the patterns crossed to the mask form all at once (0.0054). The fraction is the tuning
    loop's lever on the patterns' share."""
    pats = []
    frac = body_knob(knobs, "branch_mask_frac", spec.name, 0.0)
    # every draw first, and each pattern's run lengths from a generator of its own: a knob that
    # changes one pattern's runs (branch_r_scale) must not change which pair the next one draws
    draws = [
        (int(rng.choice(len(bw), p=bw)) if spec.branches else 0, float(rng.random()), int(rng.integers(0, 2**62)))
        for _ in range(2)
    ]
    for bsel, u, seed in draws:
        p, r = (spec.branches[bsel][0], spec.branches[bsel][1]) if spec.branches else (0.5, 0.1)
        r0, r = r, min(1.0, r * body_knob(knobs, "branch_r_scale", spec.name))
        pats.append((p, r, FORCED if u < frac else _pattern(p, r, np.random.default_rng(seed), form_r=r0)))
    return pats


FORCED = -1  # a pattern the tuning loop moved to the counter form (_branch_patterns, _threshold_branch)
DETERMINED_BITS = 6  # a branch whose rare outcome comes at most once in 2^6 runs counts as one-way
DETERMINED_PASSES = 1 << DETERMINED_BITS  # (a loop's back edge: passes per event, taken all but once)


def _outcome_class(p: float, r: float, pat) -> str:
    """A generated conditional branch's outcome class, as spread_chunks keeps branches apart:
    't' taken or 'n' not taken all but at most once in 2^DETERMINED_BITS runs, 'v' varying."""
    if pat == FORCED:
        t = max(1, min(255, round(256 * p)))
        rare = min(t, 256 - t) / 256
    elif pat is None:
        rare = 2.0 ** -_mask_bits(p, r)[0]
    else:
        return "v"  # a 64-bit pattern: at least two of each outcome (_pattern)
    if rare > 2.0**-DETERMINED_BITS:
        return "v"
    return "t" if p >= 0.5 else "n"


def _threshold_branch(p: float, target: str, ctr: int) -> tuple[list[str], float]:
    """`cmp byte ptr [rdi + ctr], T; jb`: taken while the pass counter's low byte is below
    T = round(256 p), so the taken rate is p to 1/256 with two transitions per 256 passes (the
    form `branch_mask_frac` gives a pattern; the mask form would round p to a power of two:
    0.36 to 0.5). Returns the lines and the taken rate they give."""
    t = max(1, min(255, round(256 * p)))
    return [f"    cmp byte ptr [rdi + {ctr}], {t}", f"    jb {target}"], t / 256


def _mask_bits(p: float, r: float) -> tuple[int, int]:
    """`_mask_branch`'s j (the rare outcome's bits) and s (their shift)."""
    q = max(min(p, 1 - p), 1e-9)
    j = max(1, min(30, round(-math.log2(q))))
    rr = max(r, 2.0**-30)
    return j, max(0, min(31 - j, round(1 - j - math.log2(rr))))


def _mask_branch(p: float, r: float, target: str, ctr: int = STATE_ITER) -> list[str]:
    """`test dword ptr [rdi + ctr], M; jz/jnz` on a pass counter in the state (the block's own
    since session 13, `st->iter` for the rings' variants): M = j ones shifted left by s.

    The outcome is "counter bits s..s+j-1 all zero" for 2^s iterations in every 2^(s+j): the
    rare outcome has probability 2^-j and there are two transitions per 2^(s+j) iterations,
    so j = round(-log2 min(p, 1-p)) and s = round(1 - j - log2 r) (clamped to 31 bits).
    """
    j, sh = _mask_bits(p, r)
    mask = ((1 << j) - 1) << sh
    jcc = "jz" if p < 0.5 else "jnz"
    return [f"    test dword ptr [rdi + {ctr}], {mask}", f"    {jcc} {target}"]


def _split(n: int, k: int, rng: np.random.Generator | None = None) -> list[int]:
    """n into k positive parts: even, or uniformly random compositions when rng is given."""
    if rng is None or k <= 1 or n == k:
        base, extra = divmod(n, k)
        return [base + (1 if i < extra else 0) for i in range(k)]
    cuts = sorted(rng.choice(np.arange(1, n), size=k - 1, replace=False).tolist())
    edges = [0, *cuts, n]
    return [edges[i + 1] - edges[i] for i in range(k)]


class _Regs:
    """Register choice following a RAW distance distribution.

    Every value written is read before its register is overwritten when possible: a load
    whose result is never read is dead code that valgrind's JIT removes (and out-of-order
    cores may too), so the clone's data references would not count.
    """

    def __init__(self, rng: np.random.Generator, dep_hist: list[float]):
        self.rng = rng
        h = np.asarray(dep_hist, dtype=float)
        self.dep_p = h / h.sum() if h.sum() > 0 else np.full(len(DEP_BINS), 1 / len(DEP_BINS))
        self.t = 0
        self.last_write = {r: -100 for r in GPR}
        self.last_xwrite = {r: -100 for r in XMM}
        self.unread: set[str] = set()

    def _pick(self, names: list[str], table: dict) -> str:
        b = int(self.rng.choice(len(DEP_BINS), p=self.dep_p))
        lo = DEP_BINS[b]
        hi = DEP_BINS[b + 1] if b + 1 < len(DEP_BINS) else 4096
        want = self.rng.integers(lo, hi)
        return min(names, key=lambda r: abs((self.t - table[r]) - want))

    def src(self, xmm: bool = False) -> str:
        """A source that consumes a pending temporary value if there is one."""
        table = self.last_xwrite if xmm else self.last_write
        tmps = [r for r in (XTMP if xmm else TMP) if r in self.unread]
        r = self._pick(tmps, table) if tmps else self._pick(XACC if xmm else ACC, table)
        self.unread.discard(r)
        return r

    def acc(self, xmm: bool = False) -> str:
        """An accumulator (read-modify-write destination, or a flags-only source)."""
        return self._pick(XACC if xmm else ACC, self.last_xwrite if xmm else self.last_write)

    def dst(self, xmm: bool = False) -> str:
        """A temporary to load or move into: one whose value was consumed, oldest first."""
        table = self.last_xwrite if xmm else self.last_write
        names = XTMP if xmm else TMP
        cands = [r for r in names if r not in self.unread] or list(names)
        return min(cands, key=lambda k: table[k] + self.rng.random())

    def wrote(self, r: str):
        if r in self.last_write:
            self.last_write[r] = self.t
        elif r in self.last_xwrite:
            self.last_xwrite[r] = self.t
        self.unread.add(r)

    def tick(self, n: int = 1):
        self.t += n


class _Mem:
    """Addresses: main-region line j of the current block, or a tiny-region slot."""

    def __init__(self, rng):
        self.rng = rng
        self.main_left = 0
        self.main_j = 0
        self.region_off = 0

    def addr(self, size: str = "qword", align: int = 8) -> str:
        if self.main_left > 0:
            self.main_left -= 1
            off = self.region_off + 64 * self.main_j
            self.main_j += 1
            return f"{size} ptr [r15 + r13 + {off}]"
        off = int(self.rng.integers(0, (TINY_BYTES - 16) // align)) * align
        return f"{size} ptr [r15 + {off}]"


def _emit(cls: str, mem: str, regs: _Regs, mema: _Mem, rng, rep_len: int) -> list[str]:
    """Instructions for one sampled (class, memflag).

    Data flow keeps every load live: loads and moves write temporaries, arithmetic consumes a
    pending temporary into an accumulator (read-modify-write), compares read accumulators.
    """
    if cls == "mov":
        if mem in ("load", "rmw"):
            d = regs.dst()
            regs.wrote(d)
            return [f"mov {d}, {mema.addr()}"]
        if mem == "store":
            return [f"mov {mema.addr()}, {regs.src()}"]
        d = regs.dst()
        if rng.random() < 0.3:
            regs.wrote(d)
            return [f"mov {GPR32[d]}, {int(rng.integers(1, 1 << 16))}"]
        s_ = regs.src()
        regs.wrote(d)
        return [f"mov {d}, {s_}"]
    if cls == "arith":
        op = str(rng.choice(["add", "sub", "xor", "and", "or", "cmp", "test", "lea", "shl", "inc"]))
        if mem == "load":
            a = regs.acc()
            op = op if op in ("add", "sub", "xor", "and", "or") else "add"
            regs.wrote(a)
            regs.unread.discard(a)
            return [f"{op} {a}, {mema.addr()}"]
        if mem in ("store", "rmw"):
            op = op if op in ("add", "sub", "xor", "and", "or") else "add"
            return [f"{op} {mema.addr()}, {regs.src()}"]
        if op in ("cmp", "test"):
            return [f"{op} {regs.acc()}, {regs.acc()}"]
        if op == "lea":
            s_ = regs.src()
            d = regs.dst()
            regs.wrote(d)
            return [f"lea {d}, [{s_} + {regs.acc()}*2 + {int(rng.integers(1, 64))}]"]
        a = regs.acc()
        if op == "shl":
            return [f"shl {a}, {int(rng.integers(1, 8))}"]
        if op == "inc":
            return [f"inc {a}"]
        return [f"{op} {a}, {regs.src()}"]
    if cls == "mul":
        a = regs.acc()
        if mem != "reg":
            return [f"imul {a}, {mema.addr()}"]
        return [f"imul {a}, {regs.src()}"]
    if cls == "div":
        return [f"mov eax, {GPR32[regs.src()]}", "xor edx, edx", f"div dword ptr [r15 + {DIVISOR_OFF}]"]
    if cls == "fp":
        a = regs.acc(xmm=True)
        op = str(rng.choice(["addsd", "mulsd", "subsd", "maxsd"]))
        if mem != "reg":
            return [f"{op} {a}, {mema.addr()}"]
        return [f"{op} {a}, {regs.src(xmm=True)}"]
    if cls == "simd":
        if mem == "store":
            return [f"movdqu {mema.addr('xmmword', 16)}, {regs.src(xmm=True)}"]
        if mem != "reg":
            d = regs.dst(xmm=True)
            regs.wrote(d)
            return [f"movdqu {d}, {mema.addr('xmmword', 16)}"]
        op = str(rng.choice(["paddd", "pxor", "pcmpeqb", "por", "pand"]))
        return [f"{op} {regs.acc(xmm=True)}, {regs.src(xmm=True)}"]
    if cls == "lock":
        return [f"lock add {mema.addr()}, {regs.src()}"]
    if cls == "rep":
        return ["push rdi", "push rcx", "lea rdi, [r15 + 0]", f"mov ecx, {rep_len}", "rep stosb", "pop rcx", "pop rdi"]
    if cls == "branch":  # unconditional: a direct jump or a call to the cluster's leaf
        if mem in ("store", "load", "rmw"):
            return ["call {leaf}"]
        return ["jmp 1f", "1:"]
    return ["nop"]


BLOCK_MIN_MASS = 0.15  # blocks lighter than this merge into a neighbour (_merge_small)
NEAR_MAX = 1024  # data bins up to this size are walked inside the blocks; larger ones by walkers
COLD_BYTES = 8 << 20  # every arena ends with a region never touched before the body walks it
COLOR_LINES = 64  # lines of a 4 KiB page: the sets a D1 of 32 KiB and 8 ways spans (place_colored)
# The colour of the LL rings' slot line (their accumulators and cursors, read every event) and so
# of their lanes after it. Up to session 35 every line the clone reads once per event or more and
# does not walk sat at the start of a 4 KiB page: the tiny region (the sink), the blocks' cursors
# (BLOCK_SLOTS), the first block region and this slot line all fell in D1 set 0 of A (64 sets).
# redis's clone touched 9.1 distinct lines of set 0 per request against 3.6-5.1 in every other
# set (a lackey trace), so set 0 thrashed an 8-way D1: 7.1 misses per request at A that the same
# 32 KiB with 16 ways did not have, against 0.4 for redis. The tuning loop took them back by
# slowing the far walkers, whose misses the held-out 48 KiB D1 keeps (redis's D1 at B 8-11%
# under, sessions 33-35). The blocks' cursors, the first block region and this slot line now
# have colours of their own: 7.2 lines of set 0 per request, 2.2 misses at A that 16 ways keep.
HOT_COLOR = 48
# the variant tables of the rings (.rodata) start on a line (2^6 bytes): their start-up warm reads
# one entry per 64 bytes (llc_warm, ring_warm)
TABLE_ALIGN = 6
WALK_LINES = 8  # lines per pass of a walker (fewer when it walks fewer lines per event)
# arena offset of the blocks' shared region cursors (8 B each, 32 per body): half a page past
# 4 KiB, so their lines are not in the D1 set of the arena's first line (see HOT_COLOR)
BLOCK_SLOTS = 4096 + 2048
BODY_SLOTS = 48  # walker/ring slots per body (16 B each)
RING_SLOT0 = 32  # per body, slots 0-31 are the data walkers', 32-46 the code rings', 47 the cold ring's
COLD_RING_LINES = 4096  # the cold code ring's one-line variants (256 KiB of code)
# a conflict ring leaves this many ways of its sets free at the size where it must hit. 1 until
# session 24: the 8 MiB bin's data ring of memcached's clone, 60 lines over the 4 sets an 8 MiB LL
# gives them, 15 of 16 ways each, lost a line to whatever else of the window fell in those sets
# (1-2 of the clone's ~6 data-side LL misses per window at B, where the ring should hit). With 4
# ways free a ring is 12 lines per set there, and still 2 x 12 > 16 in the sets of half that LL
LLC_SLACK = 4
WALK_SLOTS = 128  # arena offset of the walkers' shared accumulators and cursors (16 B each)
WALK_PLAN_ROUNDS = 4  # layer_walkers: plans of the walkers at most (it stops when one keeps its modes)
WALK_MID = 0.71  # a region of 2^-0.5 S: the log-middle of the bin (S/2, S]
# a cursor walker's bin is walked by two walkers, half the lines each, at the bin's quartiles
# 2^-0.75 S and 2^-0.25 S (sizes log-uniform within the bin, as the blocks assume): one walker at
# the log-middle put the whole bin on one side of any cache size inside it (redis's (32, 64] KiB
# bin at 45 KiB: all of it hit a 48 KiB D1, where the original's bin straddles it)
WALK_QUARTILES = (0.59, 0.84)
# ... and for the bins within the profiled D1: the sweep's caches are 8-way, and a reuse distance
# at 0.84 x 32 KiB (430 lines over 64 sets, 6.7 a set) misses an 8-way set a third of the time,
# where the original's accesses of that bin hit it (session 16)
WALK_QUARTILES_IN_D1 = (0.55, 0.65)


def walk_quartiles(s: int, knobs: dict) -> tuple[float, float]:
    return WALK_QUARTILES_IN_D1 if s <= knobs.get("d1_bytes", 32768) else WALK_QUARTILES


# which of the bin's two walkers (lower, upper quartile) d1_reach moves: the lower only (session 48).
# The knob is tuned at the mid-bin point (44 KiB), the lower half of the bin; moving the upper
# walker too put memcached's at 0.84 x 1.3 x 64 KiB, beyond its bin, where the loop never looks:
# its clone matched the original at 32 and 44 KiB and then fell too slowly (misses per request
# at 44/48/56 KiB: clone 37.7/32.9/27.1, original 36.0/29.2/19.2; moving the lower walker only,
# at the same reach, 37.1/31.8/24.9; redis's clone at its reach 87.1/86.1/83.2 and 86.7/85.1/80.0).
# A reach of its own for the upper walker does not give the clone the original's shape either
# (session 50, offline: memcached's clone with session 49's knobs, one window each, misses per
# request at 44/48/56 KiB; the original 35.5/28.9/22.6): the upper walker's reach at 0.65 / 0.8
# / 1.0 / 1.2 read 31.9/28.2/22.7, 33.1/29.3/23.5, 34.8/30.7/24.7, 35.8/32.7/27.4, and the lower
# one's at 1.7 (upper 0.65) 33.3/30.3/26.2: either reach moves all three points, 56 KiB most, so
# the two knobs stepped each on its own point diverge (the lower reach moves 56 KiB 2.5 times as
# much as 44). The loop steps this one reach on both points together (tune.d1_reach_step)
REACH_HALVES = (True, False)


def d1_reach(s: int, knobs: dict, h: int = 0) -> float:
    """The factor on the reuse distance layer_walkers aims the walkers of data bin (s/2, s] at:
    `d1_reach` (tune.py's step at the D1 of the profile's mid-bin point) for the bin just beyond
    the profiled D1, (d1, 2 d1], and 1 for every other bin.

    Why (session 47): the walkers of that bin, aimed at its quartiles (38.9 and 53.8 KiB), came
    back nearer in the running clone: redis's clone had the original's D1 misses at A (32 KiB,
    8 ways) but at 40 and 44 KiB (10 and 11 ways) it already hit what the original hits only at
    64 KiB (86.5 and 83.6 misses a request against the original's 92.8 and 90.3, 83.6 at 64 KiB),
    and memcached's clone was 10% under at 44 KiB; at B's 48 KiB D1 both failed, 10% and 13%
    under. The layer model's distances are the fully associative stack's, over the clone's own
    regions; what shortens them in the 64-set D1 is not modelled, so the loop measures it.
    Only the lower walker (h = 0) moves (REACH_HALVES)."""
    d1 = int(knobs.get("d1_bytes", 32768))
    return float(knobs.get("d1_reach", 1.0)) if d1 < s <= 2 * d1 and REACH_HALVES[h] else 1.0


def body_knob(knobs: dict, key: str, name: str, default: float = 1.0) -> float:
    """A knob for one body (`key:name`) or for all bodies (`key`)."""
    return float(knobs.get(f"{key}:{name}", knobs.get(key, default)))


def code_footprint_scale(knobs: dict, name: str) -> float:
    """The factor on a body's blocks' code sizes: `code_scale` (all bodies, the I1 step at A) times
    `footprint_scale:<name>` (the body's own, the step at half of A's I1; tune.half_i1_step). The
    body's key multiplies the global one, where `body_knob`'s replaces it: the two steps act on
    different figures and both stay in force."""
    return float(knobs.get("code_scale", 1.0)) * float(knobs.get(f"footprint_scale:{name}", 1.0))


def body_instructions(spec: BodySpec, knobs: dict) -> float:
    """A body's instructions per event as generated: the rep unit's are the profile's, not
    scaled; `instr_scale` scales the rest, so the blocks' share stays proportional to it (tune.py's
    Newton step on the body's share)."""
    rep_fixed = rep_function(spec, 0)[1]
    return max(0.0, spec.instructions - rep_fixed) * body_knob(knobs, "instr_scale", spec.name) + rep_fixed


def _walk_split(lines: float) -> tuple[int, float]:
    """A walker's lines per event as whole lines and a fraction (at most 256 whole lines)."""
    whole = min(256, int(lines))
    return whole, (lines - whole if whole < 256 else 0.0)


def walker_cost(w: dict) -> tuple[int, int]:
    """A cursor walker's instructions and data references per event (_far_function): the
    accumulator and cursor (7 instructions, 3 references), `whole` loads and their sink store,
    the fractional line's conditional load and its store (5, 2), the cursor update (6, 1)."""
    whole, frac = _walk_split(w["lines"])
    f = round(frac * 65536) > 0
    return 13 + whole + (1 if whole else 0) + (5 if f else 0), 4 + whole + (1 if whole else 0) + (2 if f else 0)


def place_colored(off: int, color: int) -> int:
    """The first line-aligned offset at or after `off` whose line is `color` modulo COLOR_LINES.

    Regions are placed one after another in colour: each starts in the set after the last line
    of the one before (session 13). Up to session 12 every region started on a 4 KiB boundary, so
    every region began in D1 set 0 (32 KiB, 8 ways: 64 sets span 4 KiB) and in one of the LL's
    4 KiB-aligned sets, and the small hot regions of all three of memcached's arenas piled into
    the first sets of each 64: a slowly walked worker region lost 4-8% of its lines from a 2 MiB
    LL between two passes (its data-side LL misses 190-330% over the original's whatever the
    knobs said; 0.024 -> 0.0075 misses per request with colour, target 0.0058), and the D1 knobs
    started 5x over the original's D1 misses."""
    x = (off + 63) // 64
    return 64 * (x + (color - x) % COLOR_LINES)


def plan_walkers(
    spec: BodySpec, instructions: float, knobs: dict, below: int, off: int, color: int = 0
) -> tuple[list[dict], int]:
    """The walkers of walker_list, placed: each region one after another in cache colour
    (place_colored) from `off`. Returns the walkers and the arena offset after their regions."""
    out = walker_list(spec, instructions, knobs, below)
    nest_bytes = max((w["bytes"] for w in out if w.get("nested")), default=0)  # the nested region
    nest_off = None
    for w in out:
        if w["cold"]:
            continue
        if w.get("nested") and nest_off is not None:
            w["off"] = nest_off  # (its members share the region the first one placed)
            continue
        w["off"] = place_colored(off, color)
        size = nest_bytes if w.get("nested") else w["bytes"]
        if w.get("nested"):
            nest_off = w["off"]
        off = w["off"] + size
        color += size // 64
    return out, (off + 4095) // 4096 * 4096


def walker_list(spec: BodySpec, instructions: float, knobs: dict, below: int) -> list[dict]:
    """The data working-set bins beyond NEAR_MAX: one walker per bin (Ditto's per-bin regions).

    A walker touches `lines` new lines of its own region per event (a fractional number of passes
    of WALK_LINES lines), with its cursor and pass accumulator in the arena, shared by every
    thread that runs the body (the original's large data, a hash table or slab, is shared by its
    workers; per-thread cursors starting together would re-touch each other's lines at once).
    Regions are LRU stack layers like the blocks' (`below` is what the blocks' regions add): a
    region walked slowly is reused after every smaller region was walked, so it is sized
    (q x S) - (everything below it), for two walkers at the bin's quartiles q (WALK_QUARTILES).
    The arena is touched in address order at start-up, so a region's lines start with the reuse
    distance they keep. The largest bin (accesses that
    miss at the largest swept size: cold data) walks the cold region at the arena's end, never
    touched before. `data_far_scale` scales the walkers within the LL the knobs name, and
    `data_ll_scale` those beyond it: the same factor for every bin, so the curve keeps its shape.
    Both the code (plan_walkers) and the LRU stack that sizes the regions (layer_walkers) take
    the walkers from here, so the stack counts the traffic the clone makes (session 17).
    Returns the walkers, unplaced; a cursor walker (and a static one that replaced it) names its
    half of the bin as `h`, the key of spec.walk_sizes."""
    tot = sum(m for _, m in spec.data_bins)
    if tot <= 0 or not spec.data_bins:
        return []
    main_acc = spec.mem_per_insn * spec.main_fraction * instructions
    d1 = knobs.get("d1_bytes", 32768)
    out = []
    # the static walkers' first passes (lines per event, at the profiled rate): see below
    first_pass = 0.0
    nest_lines, nested = 0, None
    for i, (s, m) in enumerate(sorted(x for x in spec.data_bins if x[0] > NEAR_MAX)):
        cold = s == spec.cold_bin
        scale = body_knob(knobs, far_data_knob(s, cold, knobs), spec.name)
        lines = m / tot * main_acc * scale
        if m / tot * main_acc <= 1e-4:
            # (at the profiled rate: a walker that a knob switched on and off moved every region
            # after it, and the LL response of memcached's clone flipped between -80% and +400%)
            continue
        lines0 = m / tot * main_acc  # at the profiled rate (the mode must not flip with a knob)
        if not cold and s <= d1 and first_pass > 0 and lines0 < WALK_MID * s / 64:
            # A static walker's first pass in an event comes back from one event's traffic, as
            # the lines an original touches once per event do; those are the accesses of the
            # bin of that distance (redis: 143 per request in the 16 KiB bin, its event's own
            # lines). Each first pass is one of them already, so the cursor walkers of the bins
            # within the D1 make only what the first passes do not: up to session 15 both made
            # them, the clone's event touched ~500 distinct lines where redis's touches ~250,
            # and its once-per-event lines came back from 32-48 KiB: ~50 misses per request at A
            # that B does not have (the loop then slowed every walker; session 16)
            take = min(first_pass, lines0)
            first_pass -= take
            if lines0 - take <= 1e-4:
                continue
            lines *= (lines0 - take) / lines0
            lines0 -= take
        if not cold and s <= d1 // 2 and nested is not None and lines0 < WALK_MID * s / 64:
            # What the first passes leave of a bin that hits half the D1 cycles the nested
            # region: more loads at its own size, which hit every validated D1 as the original's
            # accesses of that bin do. As cursor walkers they were new lines every event, and an
            # event's footprint decides where every once-per-event line comes back: redis's
            # clone touched ~19 KiB per event where redis's own lines come back from within
            # 16 KiB (the clone's sweep missed 238 lines per request at 16 KiB, redis 128), so
            # its first passes and its 32 KiB bin's walkers missed the 32 KiB D1 and hit the
            # held-out 48 KiB one: D1 at B -12.7% (session 17). A held-out D1 below half the
            # profiled one would see these at the nested region's distance, not the bin's
            nested["lines"] += lines
            nested["per_pass"] = max(1, round(nested["lines"]))
            continue
        per_pass = _walk_split(lines)[0] + 1  # loads per event
        if not cold and lines0 >= WALK_MID * s / 64:
            # more accesses per event than the bin's lines: a region walked by a cursor would need
            # 2 events' lines and land far beyond the bin (memcached's 2 KiB bin: 77 accesses
            # per event in a 22-line region). These are reuses within the event: a static walker
            # cycles a region of the bin's size (fixed addresses, no cursor) round(lines) times
            out.append({**_static_walker(s, lines, int(WALK_MID * s), 2 * i), "nested": True})
            own = out[-1]["bytes"] // 64
            # The bins' static regions nest (session 17): one region, each walker cycling its
            # first WALK_MID x S bytes, in bin order, so a walker's first pass over the lines of
            # the smaller regions comes back from those regions' distance (the smaller bins'
            # reuses, which one region per bin did not make: the 4 and 8 KiB bins' walkers
            # made 7 and 0 of redis's 98 and 116 reuses per event) and only its lines beyond
            # them are the event's own. Disjoint, the three static regions added 157 lines to
            # redis's event where nested they add 90
            first_pass += max(0.0, min(lines0, own) - nest_lines)
            out[-1]["new_lines"] = max(0, own - nest_lines)
            nest_lines = max(nest_lines, own)
            nested = out[-1]
            continue
        if cold:
            out.append(
                {"bin": s, "lines": lines, "per_pass": per_pass, "bytes": COLD_BYTES, "cold": True, "slot": 2 * i}
            )
            continue
        split = (spec.data_split or {}).get(s, 0.5) if s > d1 else 0.5
        for h, q in enumerate(walk_quartiles(s, knobs)):
            share = split if h == 0 else 1.0 - split
            if share * lines0 <= 1e-4:
                continue
            lh = lines * share
            pp = _walk_split(lh)[0] + 1
            if spec.walk_sizes and (s, h) in spec.walk_sizes:
                size = int(spec.walk_sizes[(s, h)])
            else:
                size = max(2 * 64 * pp, (int(q * d1_reach(s, knobs, h) * s) - below) // 64 * 64)
                below += size
            # (decided at the profiled rate, as the mode above: the layer model's sizes do not
            # move with a uniform rate, so a knob-scaled test flipped the mode with the knob)
            if size < 64 * (_walk_split(lines0 * share)[0] + 1):
                # reused within the event: a region smaller than one event's loads, cycled
                # (static, like the bins above). A cursor walker touches each line once per
                # event at most, so its lines come back after at least one event's traffic:
                # redis's 16 KiB-bin walkers (73 lines per event) missed a 16 KiB D1 every
                # time and a 32 KiB one 18% of the time (up to session 13: at least two events'
                # loads per cycle), where the original's accesses of that bin hit at 16 KiB.
                # The price: after the region's first pass in an event its loads come back at
                # the region's own size, a hit in caches smaller than the bin too (the curve is
                # kept at the validated hierarchies' sizes, not below the bin)
                out.append({**_static_walker(s, lh, size, 2 * i + h), "h": h})
                first_pass += min(lines0 * share, out[-1]["bytes"] // 64)
                continue
            # a whole number of events' loads per cycle, at least two: one event's traffic is
            # the least reuse distance a cursor gives, and rounding down to it fell short of
            # the bin (the working-set test's 64 KiB bin: 28% hit a 32 KiB D1)
            size = 64 * max(2, round(size / 64 / pp)) * pp
            out.append({"bin": s, "lines": lh, "per_pass": pp, "bytes": size, "cold": False, "slot": 2 * i + h, "h": h})
    return out


def _static_walker(bin_bytes: int, lines: float, size: int, slot: int) -> dict:
    """A walker reused within the event (plan_walkers): a region of `size` bytes (whole lines, at
    least two) that its round(lines) loads per event cycle over at fixed addresses."""
    return {
        "bin": bin_bytes,
        "lines": lines,
        "per_pass": max(1, round(lines)),
        "bytes": max(128, size // 64 * 64),
        "cold": False,
        "slot": slot,
        "static": True,
    }


def _near_blocks(spec: BodySpec, ll: int, i1: int = 32768) -> list[Block]:
    """The blocks of a body before code generation: coupled code and near-data bins, regions
    layered (deterministic: no random draws)."""
    tot_mass = max(1e-12, sum(m for _, m in spec.data_bins))
    near_bins = [(s, m) for s, m in spec.data_bins if s <= NEAR_MAX]
    near_mass = sum(m for _, m in near_bins) / tot_mass
    main_per_insn = spec.mem_per_insn * spec.main_fraction
    blocks: list[Block] = []
    code_bins = spec.icode_bins
    if spec.chunk_insns > 0:
        code_bins = [(s, m) for s, m in spec.icode_bins if s <= i1] or [(256, 1.0)]
    for i, (mass, w, r) in enumerate(couple(code_bins, near_bins or [(0, 1.0)], BLOCK_MIN_MASS)):
        # a bin (S/2, S] is only known as a whole; assume sizes log-uniform inside it and place
        # alternate blocks at its quartiles 2^-0.75 S and 2^-0.25 S
        frac = 0.59 if i % 2 == 0 else 0.84
        blocks.append(
            Block(
                weight=mass,
                code_bytes=max(64, int(frac * w)),
                region_bytes=int(frac * r) if r > 0 else 0,
                main_per_insn=main_per_insn * near_mass,
            )
        )
    _layer_regions(blocks, ll)
    for bi, b in enumerate(blocks):
        if spec.near_sizes and bi in spec.near_sizes:
            b.region_bytes = spec.near_sizes[bi]
    return blocks


def _slot(spec: BodySpec, i: int) -> int:
    """Arena offset of a body's i-th walker/ring slot (accumulator, cursor): 32 per body."""
    return WALK_SLOTS + 16 * (i + BODY_SLOTS * spec.walk_base)


def plan_rings(spec: BodySpec, instructions: float, knobs: dict) -> list[dict]:
    """The code working-set bins beyond the I1 the knobs name (A's): one ring per bin.

    Code that a body runs every event is reused at the distance of everything the event runs
    (its own code, the skeleton's, other threads'), so blocks alone give every first-pass fetch
    one reuse distance: a step in the miss curve. A ring is M variants (straight chains of v
    cache-line chunks, each ending in `ret`) called in turn through a table, one call at a
    fractional rate per event: its lines are reused every M calls, at the distance of all the
    code run meanwhile (sized by layer_walkers like the data regions). `icode_far_scale` scales
    the rings of bins beyond the I1 the knobs name (what the tuning loop controls at A)."""
    if spec.chunk_insns <= 0 or instructions <= 0:
        return []
    i1 = knobs.get("i1_bytes", 32768)
    entries = instructions / spec.chunk_insns
    out = []
    for k, (s, m) in enumerate(sorted(x for x in spec.icode_bins if x[0] > i1)):
        if k >= BODY_SLOTS - 1 - RING_SLOT0:  # the last slot is the cold ring's
            break
        c = m * entries
        if c < 1e-3:
            continue
        # the knob scales the calls, not the variants: a larger variant would add to the code
        # every event runs (measured: icode_far_scale 50 made every line miss a 32 KiB I1)
        v = max(1, math.ceil(c))
        scale = body_knob(knobs, "icode_far_scale", spec.name) if s > i1 else 1.0
        size = (spec.ring_sizes or {}).get(s, WALK_MID * s)
        # at least one variant more than the calls of one event: a variant called twice in an
        # event is reused at the ring's size, whatever the ring's period
        m_var = max(2, math.ceil(c * scale / v) + 1, round(size / (64 * v)))
        out.append({"bin": s, "lines": c * scale, "v": v, "calls": c * scale / v, "M": m_var, "slot": RING_SLOT0 + k})
    return out


def cold_ring(spec: BodySpec, knobs: dict) -> dict | None:
    """The cold code ring: code lines that the run fetches for the first time (the original's
    fetches that miss at every swept size: code that runs once in a window). COLD_RING_LINES
    one-line variants called in turn at `cold_code_lines` times `cold_code_scale` calls per
    event; a valgrind run (preload, warm-up and window: under 4,000 events) never comes back to a
    line at up to one call per event, so each call misses every I1 and every LL, whatever their
    sizes. The knob is tuned only for a clone without code conflict rings (tune._ll_by_side):
    there the ring is the only code that misses the LL, and the profile's first fetches at the
    largest swept I1 (`I_cold`) can be fewer than the code misses its LL sweep saw at every size
    (session 22: redis, 97 against 127 per window)."""
    if spec.cold_code_lines <= 0 or spec.chunk_insns <= 0:
        return None
    calls = min(1.0, spec.cold_code_lines * float(knobs.get("cold_code_scale", 1.0)))
    if calls < 1e-4:
        return None
    return {
        "bin": 0,
        "lines": calls,
        "v": 1,
        "calls": calls,
        "M": COLD_RING_LINES,
        "slot": BODY_SLOTS - 1,
        "cold": True,
    }


def llc_rings(spec: BodySpec, knobs: dict) -> list[dict]:
    """The LL conflict rings: LL misses at the profiled LL (`ll_bytes`, `ll_assoc` ways) that a
    larger LL does not have, code side (`llc_code`) and data side (`llc_data`) apart.

    The original's LL misses at A are mostly lines reused at a distance beyond 2 MiB (memcached:
    IL 0.014 and DL 0.009 per request at a 2 MiB LL, 0.003 and 0.0006 at 8 MiB; the profile's
    LL sweep), code pushed out by data between two runs of a rarely run path. The clone cannot
    reproduce such distances by capacity in a window of a few thousand requests (2 MiB of new
    lines between two uses costs tens of thousands of misses per window), so these rings
    reproduce them by conflict: K lines `ll_bytes / ll_assoc` apart share one set of the
    profiled LL, called (code: one-line `ret` variants in a section of their own) or loaded
    (data: lines of the arena) in turn. With K > ways every access misses that LL; an LL of L
    bytes and the same associativity spreads the K lines over L / ll_bytes sets, so with
    K = (ways - LLC_SLACK) x L / ll_bytes they all hit there: one ring per LL sweep bin (the
    misses that hit at L and miss at L / 2). The misses per event are the ring's accesses per
    event, linear in `code_llc_scale` / `data_llc_scale` (tune.py). Lanes (64 B apart) keep the
    rings in sets of their own."""
    ll = int(knobs.get("ll_bytes", 2 << 20))
    ways = int(knobs.get("ll_assoc", 16))
    stride = ll // ways
    out = []
    for side, bins, knob in (("code", spec.llc_code, "code_llc_scale"), ("data", spec.llc_data, "data_llc_scale")):
        scale = body_knob(knobs, knob, spec.name)
        for size, rate in sorted(bins or []):
            if size <= ll or rate * scale < 1e-5:
                continue
            k = max(ways + 1, (ways - LLC_SLACK) * int(size) // ll)
            if k * stride > 64 << 20:  # at most 64 MiB of address space (a ring per LL up to 32x A's)
                continue
            calls = min(0.5 * k, rate * scale)
            out.append({"side": side, "bin": int(size), "K": k, "calls": calls, "stride": stride})
    for lane, r in enumerate(out):
        r["lane"] = lane
        r["fixed"] = max(1, round(r["calls"] * 65536))
    return out


def llc_function(spec: BodySpec, rings: list[dict], region_off: int) -> tuple[list[str], float]:
    """clone_llc_<name> (called by clone_far_<name>) and its code rings' variants
    (clone_llcv_<name>, a section of their own aligned to the stride): the lines and the
    function's expected instructions per event (call and ret included). The data rings' lines
    are in the arena at `region_off` (a slot line, then lane l's line j at 64 (1 + l) + j x stride);
    each ring's 16.16 accumulator and cursor are in the slot line."""
    name = spec.name
    out = [f"    .type clone_llc_{name}, @function", "    .p2align 6", f"clone_llc_{name}:"]
    expected = 2.0  # call, ret
    tables = []
    code = [r for r in rings if r["side"] == "code"]
    for r in rings:
        lab = f".L{name}_llc{r['lane']}"
        acc, cur = region_off + 16 * r["lane"], region_off + 16 * r["lane"] + 8
        first = region_off + 64 * (_llc_slot_lines(rings) + r["lane"])
        out += [
            f"    mov r12, [r15 + {acc}]",
            f"    add r12, {r['fixed']}",
            "    mov rax, r12",
            "    and eax, 65535",
            f"    mov [r15 + {acc}], rax",
            "    shr r12, 16",
            f"    jz {lab}_done",
            f"{lab}_call:",
            f"    mov r13, [r15 + {cur}]",
            "    lea rax, [r13 + 1]",
            f"    cmp rax, {r['K']}",
            f"    cmovae rax, qword ptr [r15 + {ZERO_OFF}]",
            f"    mov [r15 + {cur}], rax",
        ]
        if r["side"] == "code":
            out += [
                f"    lea rax, [rip + {lab}_tab]",
                "    lea rax, [rax + r13 * 4]",
                "    movsxd r13, dword ptr [rax]",
                "    add rax, r13",
                "    call rax",
            ]
            per = 13 + 1
            # (line-aligned, so that llc_warm's one read per 64 bytes reads every line of it: at
            # 4-byte alignment memcached's 96-byte table spanned 3 lines, the warm read 2, and the
            # third was read first in the window, 1 data-side miss a window at A and B alike,
            # where the original's whole data side at B is 0.08; session 48)
            tables += [
                f"    .p2align {TABLE_ALIGN}",
                f"{lab}_tab:",
                *[f"    .long {lab}_v{j} - ." for j in range(r["K"])],
            ]
        else:
            out += [
                f"    imul r13, r13, {r['stride']}",
                f"    mov rax, qword ptr [r15 + r13 + {first}]",
                f"    mov [r15 + {SINK_OFF}], rax",
            ]
            per = 11
        out += ["    dec r12", f"    jnz {lab}_call", f"{lab}_done:"]
        expected += 7 + r["fixed"] / 65536 * per
    out += ["    ret", f"    .size clone_llc_{name}, .-clone_llc_{name}"]
    if code:
        stride = code[0]["stride"]
        out += [
            f'    .section .text.clone_llcv_{name},"ax",@progbits',
            f"    .balign {stride}, 0xcc",
            f"    .type clone_llcv_{name}, @function",
            f"clone_llcv_{name}:",
        ]
        for j in range(max(r["K"] for r in code)):
            out.append(f"    .balign {stride}, 0xcc")
            for r in code:
                if j < r["K"]:
                    out += [f".L{name}_llc{r['lane']}_v{j}:", "    ret", "    .balign 64, 0xcc"]
                else:
                    out.append("    .skip 64, 0xcc")
        out += [f"    .size clone_llcv_{name}, .-clone_llcv_{name}", "    .text"]
    if tables:
        out += ["    .section .rodata", *tables, "    .text"]
    return out, expected


def _llc_slot_lines(rings: list[dict]) -> int:
    return (16 * len(rings) + 63) // 64


# the original's misses at I1/2 over those at I1/4, below which a body's parts run in a zig-zag
# (zigzag_order): the midpoint of what the two orders give the clone's own code, measured on
# session 14's memcached and redis profiles: one order 0.90-0.99 (every line the event runs once
# misses at both sizes), the zig-zag 0.49-0.56
ZIGZAG_BELOW = 0.75
ORDER_SLOT = 29  # the event counter whose parity picks the blocks' order: block cursor slot 29 of its body
BRX_SLOT = 30  # the random-branch unit's accumulator and state: block cursor slots 30 and 31 of its body
BRX_A, BRX_C = 6364136223846793005, 1442695040888963407  # the 64-bit LCG (Knuth's MMIX constants)


# the zig-zag's instructions per event: the parity counter's increment, and per call its table
# read (mov, and, lea, movsxd, add) with the call itself
ZIG_FIXED, ZIG_PER_CALL = 1, 6


def zigzag_order(spec: BodySpec, i1: int) -> bool:
    """Whether the body's parts (its blocks and its far function) run in a zig-zag, one order on
    even events and the reverse on odd ones (generate_body), rather than in one order.

    In one order every line an event runs once comes back after everything the event runs, so
    between I1/4 and I1/2 the clone's miss curve is flat when an event's code is larger than
    I1/2: a step. The zig-zag spreads those lines' reuse distances evenly from the skeleton's code
    up to the whole event's, and the curve falls to about half. Which one the original looks like
    is in its own sweep: its misses at I1/2 over those at I1/4 (memcached's worker 0.42-0.44, its
    acceptor 0.30-0.34: a smooth curve; redis 0.81-0.82: a step between 16 and 32 KiB). The
    order nearer to that ratio is taken (ZIGZAG_BELOW). I1/4 and I1/2 are swept sizes of the
    profile; the held-out hierarchy is not used. No curve (a synthetic spec): one order."""
    if not spec.code_curve:
        return False

    def misses(size: float) -> float:
        return sum(n for s, n in spec.code_curve if s > size)

    quarter = misses(i1 / 4)
    return quarter > 0 and misses(i1 / 2) / quarter < ZIGZAG_BELOW


def brx_function(spec: BodySpec, knobs: dict) -> tuple[list[str], float]:
    """clone_brx_<name> (called by clone_far_<name>): `branch_x` conditional branches per event
    on the top bit of a 64-bit LCG, which no predictor learns: each mispredicts about half the
    time, so the body's mispredictions are linear in the knob (tune.py: a Newton step on what the
    rest of the clone mispredicts). The (p, r) patterns alone gave mispredictions in steps: a
    tuning step that changed a block's structure moved them by +-40% (redis: 11.9, 19.7 or 24.4
    per request, whatever branch_r_scale said), and the loop never settled (sessions 8-9:
    memcached 20%, redis 8-12%). Returns the lines and the expected instructions per event."""
    rate = max(0.0, body_knob(knobs, "branch_x", spec.name, 0.0))
    fixed = round(rate * 65536)
    if not spec.branch_unit or fixed <= 0:
        return [], 0.0
    name = spec.name
    acc = BLOCK_SLOTS + 8 * (BRX_SLOT + 32 * spec.walk_base)
    state = acc + 8
    lab = f".L{name}_brx"
    out = [
        f"    .type clone_brx_{name}, @function",
        "    .p2align 6",
        f"clone_brx_{name}:",
        f"    mov r12, [r15 + {acc}]",
        f"    add r12, {fixed}",
        "    mov rax, r12",
        "    and eax, 65535",
        f"    mov [r15 + {acc}], rax",
        "    shr r12, 16",
        f"    jz {lab}_done",
        f"{lab}_loop:",
        f"    mov rax, [r15 + {state}]",
        f"    mov r13, {BRX_A}",
        "    imul rax, r13",
        f"    mov r13, {BRX_C}",
        "    add rax, r13",
        f"    mov [r15 + {state}], rax",
        "    test rax, rax",
        f"    js {lab}_skip",
        "    inc r13",
        f"{lab}_skip:",
        "    dec r12",
        f"    jnz {lab}_loop",
        f"{lab}_done:",
        "    ret",
        f"    .size clone_brx_{name}, .-clone_brx_{name}",
    ]
    return out, 2 + 7 + fixed / 65536 * 10.5


REP_OP = {1: "stosb", 2: "stosw", 4: "stosd", 8: "stosq"}


def rep_bytes(spec: BodySpec) -> int:
    """Bytes the rep unit writes per execution; 0 without the unit. Its region is these, rounded
    up to a line, and one line more for its accumulator (rep_region_bytes)."""
    if spec.rep_per_event <= 0 or spec.rep_iters <= 0:
        return 0
    return spec.rep_iters * spec.rep_width


REP_COLD_SPAN = 128 << 10  # a cold rep rotates over regions of this much in all (4x A's D1)
REP_REVISIT_REQUESTS = 100  # ... and each region comes back within this many requests


def _rep_layout(spec: BodySpec) -> tuple[int, int]:
    """(stride, count) of the rep unit's regions: one, or for a cold rep as many as fill
    REP_COLD_SPAN, so that each comes back after beyond any D1 swept, within the LL. A rare
    rep's one region already comes back from beyond the D1; rotating it too would bring its
    lines back from beyond the LL (memcached's timer: one 1,104-byte copy every ~130 requests,
    114 regions, each back after ~15,000 requests, longer than a window): at most as many
    regions as it runs executions in REP_REVISIT_REQUESTS requests."""
    stride = (rep_bytes(spec) + 63) // 64 * 64
    if not stride:
        return 0, 0
    if not spec.rep_cold:
        return stride, 1
    per_request = spec.rep_per_event * spec.events_per_request
    count = min(-(-REP_COLD_SPAN // stride), int(per_request * REP_REVISIT_REQUESTS))
    return stride, max(1, count)


def rep_region_bytes(spec: BodySpec) -> int:
    stride, count = _rep_layout(spec)
    return stride * count + 64 if stride else 0  # and a line for its accumulator and cursor


def rep_function(spec: BodySpec, region_off: int) -> tuple[list[str], float, float]:
    """clone_rep_<name> (called by clone_far_<name>): the original's rep string instructions, as
    many executions per event as it made (`rep_per_event`: the whole ones unconditionally, the
    fraction by a 16.16 accumulator and a branch, as real code decides to copy) of its mean
    length, each writing one region from its start (the next of several when the original's
    missed the profiled D1: `rep_cold`, a buffer per connection say). Callgrind counts a rep of n iterations
    as n + 1 instructions and conditional branches and n data writes; its exit mispredicts about
    once per execution, as the original's did. Up to session 11 `rep` was a class of the mix,
    32 iterations a draw, in the hot loop blocks: redis's rep is a ~6,000-iteration memset
    0.24 times per request, so the clone made hundreds of times its executions, and in a block of
    ~80 passes one `rep` more or less (a coin) was half the clone's data references.
    Returns the lines, the expected instructions and data references per event."""
    nb = rep_bytes(spec)
    if nb <= 0:
        return [], 0.0, 0.0
    name, n = spec.name, spec.rep_iters
    op = REP_OP.get(spec.rep_width, "stosb")
    whole = int(spec.rep_per_event)
    frac = round((spec.rep_per_event - whole) * 65536)
    acc = region_off + rep_region_bytes(spec) - 64  # its own line after the regions
    stride, count = _rep_layout(spec)
    if count > 1:  # a cold rep: the next region each execution (rax is 0: the wrap)
        dest = [
            f"    mov rdi, qword ptr [r15 + {acc + 8}]",
            f"    add rdi, {stride}",
            f"    cmp rdi, {stride * count}",
            "    cmovae rdi, rax",
            f"    mov qword ptr [r15 + {acc + 8}], rdi",
            f"    lea rdi, [r15 + rdi + {region_off}]",
        ]
        d_ins, d_refs = 6, 2
    else:
        dest, d_ins, d_refs = [f"    lea rdi, [r15 + {region_off}]"], 1, 0
    out = [
        f"    .type clone_rep_{name}, @function",
        "    .p2align 6",
        f"clone_rep_{name}:",
        "    push rcx",
        "    push rdi",
        "    xor eax, eax",
    ]
    ins, refs = 1 + 2 + 1 + 2 + 1, 1 + 2 + 2 + 1.0  # call, pushes, xor, pops, ret
    for _ in range(whole):
        out += [*dest, f"    mov ecx, {n}", f"    rep {op}"]
        ins += d_ins + 1 + n + 1
        refs += d_refs + n
    if frac > 0:
        out += [
            f"    mov rcx, qword ptr [r15 + {acc}]",
            f"    add rcx, {frac}",
            "    mov rdi, rcx",
            "    and edi, 65535",
            f"    mov qword ptr [r15 + {acc}], rdi",
            "    shr rcx, 16",
            f"    jz .L{name}_rep_skip",
            f"    imul rcx, rcx, {n}",
            *dest,
            f"    rep {op}",
            f".L{name}_rep_skip:",
        ]
        ins += 7 + frac / 65536 * (n + 2 + d_ins)
        refs += 2 + frac / 65536 * (n + d_refs)
    out += ["    pop rdi", "    pop rcx", "    ret", f"    .size clone_rep_{name}, .-clone_rep_{name}"]
    return out, ins, refs


def llc_region_bytes(rings: list[dict]) -> int:
    """Arena bytes of the conflict rings' region (slot lines, lanes, K strides); 0 without rings."""
    if not rings:
        return 0
    return 64 * (_llc_slot_lines(rings) + len(rings)) + max(r["K"] for r in rings) * rings[0]["stride"]


# the direction of a start-up touch range (spec.touch's 4th field; skeleton.c's clone_touch.down)
TOUCH_UP, TOUCH_DOWN = 0, 1


def llc_touch(rings: list[dict], region_off: int) -> list[tuple[int, int, float, int]]:
    """The start-up touch of the conflict rings' region: its slot lines and each data line
    (not the whole region: its pages between the lines are never used)."""
    if not rings:
        return []
    rows = [(region_off, 64 * _llc_slot_lines(rings), -1, TOUCH_UP)]
    for r in rings:
        if r["side"] == "data":
            first = region_off + 64 * (_llc_slot_lines(rings) + r["lane"])
            rows += [(first + j * r["stride"], 64, -1, TOUCH_UP) for j in range(r["K"])]
    return rows


def llc_warm(spec: BodySpec, rings: list[dict], region_off: int) -> list[str]:
    """clone_llc_warm_<name>(arena): every line of the conflict rings once, code (a call of each
    variant) and data (a load of each line), at start-up. At ~0.01 accesses per request a ring
    of 30-60 lines goes round about once in a validation window, so without this most of its
    accesses were first uses, which miss any LL: memcached's clone at an 8 MiB LL kept 32 of its
    35 data-ring misses and 20 of its 51 code-ring misses (session 10's run)."""
    name = spec.name
    out = [
        f"    .globl clone_llc_warm_{name}",
        f"    .type clone_llc_warm_{name}, @function",
        f"clone_llc_warm_{name}:",
        "    xor eax, eax",
    ]
    for r in rings:
        if r["side"] == "code":
            out += [f"    call .L{name}_llc{r['lane']}_v{j}" for j in range(r["K"])]
            # and the lines of its table, which the body reads (data) to call a variant: read
            # for the first time in the window, each missed any LL (session 24: 1 of memcached's
            # clone's ~6 data-side LL misses per window at B)
            lab = f".L{name}_llc{r['lane']}_tab"
            for off in range(0, 4 * r["K"], 64):
                out += [f"    movsxd rdx, dword ptr [rip + {lab} + {off}]", "    add rax, rdx"]
        else:
            first = region_off + 64 * (_llc_slot_lines(rings) + r["lane"])
            out += [f"    add rax, qword ptr [rdi + {first + j * r['stride']}]" for j in range(r["K"])]
    # the sum is stored: loads whose result is never used are dead code to valgrind's JIT
    out += [f"    mov [rdi + {SINK_OFF}], rax", "    ret", f"    .size clone_llc_warm_{name}, .-clone_llc_warm_{name}"]
    return out


def ring_warm(spec: BodySpec, rings: list[dict]) -> list[str]:
    """clone_ring_warm_<name>(arena): every variant of the body's code rings called once at
    start-up (the cold ring's excepted: its lines are meant to be new in the window), as
    llc_warm does for the LL conflict rings. A ring beyond the I1 is called a fraction of a time
    per event, so a slow one has not gone round once when the window starts, and each of its
    first calls in the window fetches a line for the first time, which misses every LL
    (session 21: redis's 859-variant ring, 0.5 calls per event, went round once in ~1,700
    requests; the preload and the warm-up made ~800 calls, so its other 59-63 variants missed
    a 2, an 8 and a 16 MiB LL alike in the window, on top of the cold ring's 74 misses: the
    clone's code misses at B sat near A's, and with the loop's ring knob they moved from one
    tuning to the next). The variants read and write the state at rdi and the arena at r15
    only, and keep r12-r15 (the far function's loop counts on it); the registers the C caller
    keeps are saved here."""
    name = spec.name
    fn = f"clone_ring_warm_{name}"
    # a section of its own: run once, it must not move the code after it (the pinned layout)
    out = [f'    .section .text.{fn},"ax",@progbits', f"    .globl {fn}", f"    .type {fn}, @function", f"{fn}:"]
    warm = [r for r in rings if not r.get("cold")]
    cold = [r for r in rings if r.get("cold")]
    if warm or cold:
        saved = ["rbx", "rbp", "r12", "r13", "r14", "r15"]
        out += [f"    push {x}" for x in saved]
        out += ["    sub rsp, 8", "    mov r15, rdi"]  # (the stack 16-byte aligned at each call)
        for r in cold:
            # the cold ring's code stays new, but its table is data the body reads to call a
            # variant: one new line of it per 16 calls missed any LL in the window (session 24:
            # memcached's acceptor and timer clones, one each per window at B). Every line of
            # it read once, the sum stored (an unused load is dead code to valgrind's JIT)
            lab = f".L{name}_r{r['slot']}"
            out += [
                "    xor ebx, ebx",
                "    xor r12d, r12d",
                f"    lea rax, [rip + {lab}_tab]",
                f"{lab}_tabwarm:",
                "    movsxd r13, dword ptr [rax + r12 * 4]",
                "    add rbx, r13",
                "    add r12, 16",
                f"    cmp r12, {r['M']}",
                f"    jb {lab}_tabwarm",
                f"    mov [r15 + {SINK_OFF}], rbx",
            ]
        for r in warm:
            lab = f".L{name}_r{r['slot']}"
            out += [
                "    xor r12d, r12d",
                f"{lab}_warm:",
                f"    lea rax, [rip + {lab}_tab]",
                "    lea rax, [rax + r12 * 4]",
                "    movsxd r13, dword ptr [rax]",
                "    add rax, r13",
                "    call rax",
                "    inc r12",
                f"    cmp r12, {r['M']}",
                f"    jb {lab}_warm",
            ]
        out += ["    add rsp, 8", *[f"    pop {x}" for x in reversed(saved)]]
    out += ["    ret", f"    .size {fn}, .-{fn}", "    .text"]
    return out


def _streams(sp: BodySpec, main_now: float, knobs: dict) -> list[list]:
    """The data a body brings into the caches outside the sized regions, as fixed layers of the
    LRU stack (layer_walkers): its rep unit (rep_function: each execution writes its region's
    lines; a cold rep rotates over REP_COLD_SPAN) and its cold walker (lines never touched
    before). Up to session 13 they were left out, the reuse distance nobody counted: redis's
    cold rep brings ~24 new lines per request into the D1. (Counting them moved its held-out D1
    little by itself; what moved it is the static walker of plan_walkers.)"""
    out = []
    stride, count = _rep_layout(sp)
    if stride:
        per_exec = -(-rep_bytes(sp) // 64)
        out.append([-1, "stream", "rep", stride * count / 64, sp.rep_per_event * sp.events_per_request * per_exec, 0.0])
    tot = sum(m for _, m in sp.data_bins) or 1.0
    for s, m in sp.data_bins:
        if s == sp.cold_bin and s > NEAR_MAX and m > 0:
            lines = m / tot * main_now * body_knob(knobs, "data_ll_scale", sp.name)  # (plan_walkers)
            out.append([-1, "stream", "cold", COLD_BYTES / 64, lines, 0.0])
    return out


def layer_walkers(specs: list[BodySpec], knobs: dict, rounds: int = 30) -> None:
    """Size every body's data regions (near blocks and walkers) as one LRU stack.

    The simulated caches are shared by all threads, and the original's per-thread working-set
    curves were measured in that shared cache. A region of L lines walked at a lines per request
    is reused every P = L / a requests, and in that time every other region q brings min(L_q,
    P x a_q) distinct lines: the reuse distance is D = 64 x sum_q min(L_q, P a_q), whichever
    body walks q. Each region's size is solved (a damped fixed point) so that D is its target:
    its bin's quartile for near blocks and walkers (two per bin, WALK_QUARTILES). Sized body by body and by size
    alone (the first version), memcached's timer and worker regions overlapped: a region that
    a body walks once per several requests sees all the others' traffic, so nearly every region
    beyond 32 KiB missed a 32 KiB D1 and together they exceeded a 2 MiB LL."""
    ll = knobs.get("ll_bytes", 2 << 20)
    items = []  # [spec index, kind, key, lines, accesses per request, target bytes]
    bodies = []  # (spec index, instructions per event, the near regions' bytes)
    for i, sp in enumerate(specs):
        # the walkers at the rate they run at (plan_walkers: the knobs scale it; session 13). At
        # the profiled rate, a walker that the D1 knob slowed went round its region less often
        # than sized, everything else walked meanwhile pushed its lines beyond the LL, and
        # memcached's data-side LL misses went from 32% to 160-200% over as the D1 knobs fell
        ins = body_instructions(sp, knobs)  # (once per body: it builds the rep unit's text)
        main_now = sp.mem_per_insn * sp.main_fraction * ins * sp.events_per_request
        near = _near_blocks(sp, ll, knobs.get("i1_bytes", 32768))
        for bi, b in enumerate(near):
            if b.region_bytes and b.weight > 0:
                a = b.weight * b.main_per_insn * ins * sp.events_per_request
                if a / sp.events_per_request >= b.region_bytes / 64:
                    continue  # cycled within one run of its block: reused at its own size (as sized)
                items.append([i, "near", bi, b.region_bytes / 64, max(1e-6, a), b.region_bytes])
        items += _streams(sp, main_now, knobs)
        bodies.append((i, ins, sum(b.region_bytes for b in near)))
        sp.walk_sizes = None
    # the walkers as the code makes them (walker_list), at the rate they run at. Which walkers are
    # static and how many lines their first passes take from the cursor walkers within the D1
    # depend on the sizes solved here, so: plan, solve, and plan again with the solved sizes
    # until the plan keeps its modes (up to session 16 this stack counted the traffic of the
    # cursor walkers the first passes replace, and redis's regions beyond the D1 came out 7-15%
    # smaller than their bins' quartiles; session 17)
    modes = None
    for _ in range(WALK_PLAN_ROUNDS):
        walks = []
        for i, ins, below in bodies:
            sp = specs[i]
            plan = walker_list(sp, ins, knobs, below)
            for w in plan:
                if w["cold"]:
                    continue  # a stream (_streams)
                if "h" not in w:  # a bin reused within the event: its region, every event
                    fixed = w.get("new_lines", w["bytes"] // 64)
                    walks.append([i, "fixed", w["bin"], fixed, fixed * sp.events_per_request, 0.0])
                    continue
                key, q = (w["bin"], w["h"]), walk_quartiles(w["bin"], knobs)[w["h"]] * d1_reach(w["bin"], knobs, w["h"])
                start = sp.walk_sizes[key] / 64 if sp.walk_sizes and key in sp.walk_sizes else q * w["bin"] / 64
                a = max(1e-6, w["lines"] * sp.events_per_request)
                walks.append([i, "walk", key, start, a, q * w["bin"]])
        _solve(items + walks, rounds)
        for i, _ins, _below in bodies:
            specs[i].walk_sizes = {}
        for i, kind, key, lines, _a, _t in walks:
            if kind == "walk":
                specs[i].walk_sizes[key] = max(2 * 64 * WALK_LINES, max(128, int(lines) * 64))
        plan_modes = [
            (i, w["bin"], w.get("h"), bool(w.get("static")), round(w["lines"], 6))
            for i, ins, below in bodies
            for w in walker_list(specs[i], ins, knobs, below)
        ]
        if plan_modes == modes:
            break
        modes = plan_modes
    # the code: per body, its blocks and the skeleton run every event (fixed), rings (solved);
    # the L1 caches are split, so code and data are separate stacks
    code = []
    for i, sp in enumerate(specs):
        ins = body_instructions(sp, knobs)
        if sp.hot_code_bytes > 0:  # the footprint _code_fit gives the blocks
            blocks_lines = sp.hot_code_bytes * code_footprint_scale(knobs, sp.name) / 64
        else:
            i1 = knobs.get("i1_bytes", 32768)
            blocks_lines = sum(
                max(64, min(b.code_bytes, i1 // 2) * code_footprint_scale(knobs, sp.name)) / 64
                for b in _near_blocks(sp, ll, i1)
                if b.weight > 0
            )
        hot = sp.skel_code_lines + blocks_lines
        code.append([i, "hot", 0, hot, hot * sp.events_per_request, 0.0])
        for r in plan_rings(sp, ins, {**knobs, "icode_far_scale": 1.0}):  # sized at the profiled rate
            a = r["lines"] * sp.events_per_request
            code.append([i, "ring", r["bin"], r["M"] * r["v"], max(1e-6, a), WALK_MID * r["bin"]])
    _solve(code, rounds)
    for sp in specs:
        sp.near_sizes, sp.ring_sizes = {}, {}
    for i, kind, key, lines, _a, _t in items + code:
        size = max(128, int(lines) * 64)
        if kind == "near":
            specs[i].near_sizes[key] = size
        elif kind == "ring":
            specs[i].ring_sizes[key] = size


def _solve(group: list[list], rounds: int) -> None:
    """layer_walkers' damped fixed point: each solved item's lines move toward the size at which
    everything else brings its target reuse distance between two of its passes."""
    for _ in range(rounds):
        for it in group:
            if it[1] in ("hot", "fixed", "stream"):
                continue
            period = it[3] / it[4]
            d = 64 * sum(min(q[3], period * q[4]) for q in group)
            it[3] = max(2.0, it[3] * (it[5] / max(64.0, d)) ** 0.5)


def _code_fit(spec: BodySpec, blocks: list[Block], budget: float, i1: int) -> float:
    """The factor on the blocks' code sizes that makes their per-event footprint (each block's
    code, at most what it runs per event) spec.hot_code_bytes (bisection; 1.0 when unset)."""
    if spec.chunk_insns <= 0 or spec.hot_code_bytes <= 0:
        return 1.0

    def footprint(x: float) -> float:
        tot = 0.0
        for b in blocks:
            if b.weight > 0:
                # as generate_body sizes a block: whole passes over whole chunks
                pec = b.weight * budget / spec.chunk_insns
                want = max(1.0, min(min(b.code_bytes, i1 // 2) * x / 64, pec))
                tot += 64 * max(1, round(pec / max(1, round(pec / want))))
        return tot

    lo, hi = 0.01, 4.0
    if footprint(hi) <= spec.hot_code_bytes:
        return hi
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        if footprint(mid) > spec.hot_code_bytes:
            hi = mid
        else:
            lo = mid
    return lo


def generate_body(spec: BodySpec, rng: np.random.Generator, knobs: dict) -> tuple[list[str], list[Block], int]:
    """Assembly lines (intel syntax) of clone_body_<name>, its blocks, and its arena size.

    The dynamic instruction count per event is counted exactly while emitting (every
    scaffolding instruction included: block setup, loop control, rep iterations, call + ret), so
    `spec.expected` ends up as the body's instructions per event; a straight-line filler at the
    end makes up the rounding of whole passes. Blocks that run once per event have no loop (no
    loop-exit misprediction), blocks that run k >= 2 times loop with a constant count, and only
    blocks whose code is larger than the I1 the knobs name (`i1_bytes`) run a fractional number
    of passes (a 16.16 accumulator in the state): their fetches all miss that I1, so the I1
    misses per event are linear in their pass rate (`icode_far_scale`). Data accesses beyond the
    LL (`ll_bytes`) come from one far-data loop at a fractional rate (`data_ll_scale`), linear too.
    """
    i1 = knobs.get("i1_bytes", 32768)
    ll = knobs.get("ll_bytes", 2 << 20)
    _, rep_fixed, rep_fixed_refs = rep_function(spec, 0)
    instructions = body_instructions(spec, knobs)
    # data bins up to NEAR_MAX: the blocks' regions (coupled with the code bins); beyond: walkers
    blocks = _near_blocks(spec, ll, i1)
    # layout of the arena: tiny region and the walkers' slots, each block's region, the walkers'
    # regions (one after another in cache colour: place_colored; each body's arena starts at a
    # colour of its own), and the cold region at the end
    off = 8192
    # (after the body's block cursors' lines, not in the tiny region's sets: HOT_COLOR)
    color = (BLOCK_SLOTS + 8 * 32 * (spec.walk_base + 1)) // 64 % COLOR_LINES
    for b in blocks:
        if b.region_bytes:
            b.region_off = place_colored(off, color)
            color += b.region_bytes // 64 + 1
            # the walk reaches one step past the region
            off = b.region_off + 2 * b.region_bytes + 64 * 64 + 4096
    walkers, off = plan_walkers(spec, instructions, knobs, sum(b.region_bytes for b in blocks), off, color)
    spec.far_ll_lines = {"keep": 0.0, "persist": 0.0}
    for w in walkers:
        if is_persistent_walker(w, knobs):
            spec.far_ll_lines["persist"] += w["lines"]
        elif far_data_knob(w["bin"], w["cold"], knobs) == "data_llc_scale":
            spec.far_ll_lines["keep"] += w["lines"]
    llc = llc_rings(spec, knobs)
    llc_off = place_colored(off, HOT_COLOR)
    off = (llc_off + llc_region_bytes(llc) + 4095) // 4096 * 4096
    rep_off = off
    off = (off + rep_region_bytes(spec) + 4095) // 4096 * 4096
    rep_lines, rep_ins, rep_refs = rep_function(spec, rep_off)
    for w in walkers:
        if w["cold"]:
            w["off"] = off
    # the walkers' instructions (see _far_function) come out of the blocks' budget
    walk_ins = walk_refs = 0.0
    for w in walkers:
        if w.get("static"):
            walk_ins += w["per_pass"] + 1
            walk_refs += w["per_pass"] + 1
            continue
        ins, refs = walker_cost(w)
        walk_ins += ins
        walk_refs += refs
    # the rep unit's instructions and references come out of the blocks' too
    walk_ins += rep_ins
    walk_refs += rep_refs
    rings = plan_rings(spec, instructions, knobs)
    cr = cold_ring(spec, knobs)
    if cr:
        rings.append(cr)
    arena = off + COLD_BYTES + 4096
    # the start-up touch of the arena, as (offset, bytes, rank) ranges: the walkers' regions
    # ranked by their bin (the reuse distance they keep), and everything before the first one
    # (tiny region, slots, the blocks' regions) last; the skeleton touches the ranges of all
    # arenas together, largest rank first (generate.py: clone_touch)
    # (the nested static regions are one: its largest member's). The persistent walkers' regions
    # (bins beyond the largest swept LL) are not touched, as the cold one is not: a slow walker
    # never comes round in a run, so its lines keep the distance the touch leaves them at, and
    # that is the regions touched after it, a few MiB (session 26: redis's 16 and 32 MiB bins'
    # walkers, 1.8 and 3.0 MiB regions, hit an 8 MiB LL on 18 of 41 misses a window at A, and
    # its clone's data side at B was half the original's; the LL sweep had 45% of A's misses at
    # 8 MiB). The skeleton maps the arenas populated, so their first touches do not fault either
    #
    # Each range upwards (TOUCH_UP), but a walker's whose bin is within A's LL (`ll_bytes`)
    # downwards (TOUCH_DOWN), so that the lines its cursor reads first are its region's most
    # recent: those walkers are to hit A's LL. Session 37: upwards, redis's (1, 2] MiB bin walker
    # (an 833 KB region) began at ~1.7 MB of A's 2 MiB LL, and missed it 82-210 times a 5,855-
    # request window once the run's own misses had filled its sets (the original's whole data
    # side: ~80); a 32-way LL of the same size, or a 2.25 MiB one, took 90% of those misses away,
    # and so did the downward touch. The bins beyond the LL keep the upward touch (session 24)
    ll = knobs.get("ll_bytes", 2 << 20)
    regions = sorted((w for w in walkers if not w["cold"]), key=lambda w: (w["off"], -w["bytes"]))
    regions = [w for j, w in enumerate(regions) if j == 0 or w["off"] != regions[j - 1]["off"]]
    near_end = regions[0]["off"] if regions else off
    spec.touch = [(0, near_end, 0, TOUCH_UP)] + [
        (w["off"], w["bytes"], w["bin"] * 4 + w["bytes"] / (1 << 30), TOUCH_DOWN if w["bin"] <= ll else TOUCH_UP)
        for w in regions
        if not is_persistent_walker(w, knobs)
    ]
    spec.touch += llc_touch(llc, llc_off)
    if rep_lines:
        spec.touch.append((rep_off, rep_region_bytes(spec), 0, TOUCH_UP))
    keys = [f"{c}/{m}" for c in CLASSES for m in MEMFLAGS]
    mixf = np.array([max(0.0, spec.mix.get(k, 0.0)) for k in keys])
    mixf = mixf / mixf.sum() if mixf.sum() > 0 else np.full(len(keys), 1 / len(keys))
    br_idx = [i for i, k in enumerate(keys) if k.startswith("branch/")]
    # conditional branches per instruction of the chunks; `cond_scale` (tuned) makes up for the
    # loop control and block setup, which dilute them, so the body's total matches
    # (per instruction of the body; the rep unit's have no test of their own, and are not scaled)
    cond = spec.cond_per_insn * spec.instructions / max(1.0, spec.instructions - rep_fixed)
    cond = min(0.45, cond * body_knob(knobs, "cond_scale", spec.name))
    if mixf[br_idx].sum() > 0:
        mixf[br_idx] *= max(0.0, mixf[br_idx].sum() - cond) / mixf[br_idx].sum()
    # the walkers make data references of their own: the rest of the body draws fewer memory
    # operands, so the body's references per instruction stay the profiled ones
    mem = np.array([not k.endswith("/reg") for k in keys])
    mu = mixf[mem].sum()
    rest = max(1.0, instructions - walk_ins)
    # `mem_scale` (tuned, session 11): a factor on the references the body asks for, so that the
    # clone's data references per request follow the original's (tune.py: a Newton step)
    mem_scale = body_knob(knobs, "mem_scale", spec.name)
    # (the rep unit's references are fixed: the factor applies to the rest, as instr_scale does)
    rest_refs = max(0.0, spec.mem_per_insn * spec.instructions - rep_fixed_refs)
    rest_refs /= max(1.0, spec.instructions - rep_fixed)
    # = mix_a * mem_scale - mix_b. Pinned with the layout when the knobs pin them: taken from
    # each generation's walkers and instructions, a walker's step of 2 instructions (memcached's
    # worker `data_far_scale` 0.623 -> 0.643, session 44) moved this by 0.1% and redrew the
    # blocks' instructions: a block went from 253 instructions a pass to 255 and, by rounding,
    # from 2 passes an event to 1 (conditional branches -5.5% a request, mispredictions -14%, I1
    # +9%), and the loop's I1 and branch steps chased each other to its last iteration
    spec.mix_a = rest_refs * (instructions - rep_ins) / rest
    spec.mix_b = (walk_refs - rep_refs) / rest
    mix_a = knobs.get(f"layout_mix_a:{spec.name}", spec.mix_a)
    mix_b = knobs.get(f"layout_mix_b:{spec.name}", spec.mix_b)
    mu_want = float(mix_a) * mem_scale - float(mix_b)
    mu_want = min(0.9, max(0.0, mu_want))
    if 0 < mu and mixf[~mem].sum() > 0:
        reg_total = mixf[~mem].sum()
        mixf[mem] *= mu_want / mu
        mixf[~mem] *= max(0.0, reg_total + mu - mu_want) / reg_total
    cost = _draw_cost(keys, spec.rep_len)
    mixp = _draw_mix(keys, mixf, cost, cond, spec.chunk_insns, 1)
    bw = np.array([b[2] for b in spec.branches], dtype=float) if spec.branches else np.array([1.0])
    bw = bw / bw.sum()
    # every part draws from a generator of its own, keyed by what it is (ring slot, block index),
    # so a knob changes only the part it tunes: with one stream, a ring or a block that drew a
    # few numbers more shifted every later draw, each tuning iteration measured a different
    # random program and the loop's steps were noise (session 5: branch_r_scale from 1.0 to 0.02
    # left the misprediction rate anywhere between 0.012 and 0.025)
    base = int(rng.integers(0, 2**62))

    def sub(*key: int) -> np.random.Generator:
        return np.random.default_rng([base, *key])

    regs = _Regs(sub(0), spec.dep_hist)
    leaf = f".Lleaf_{spec.name}"
    # the rings' variants first: their instructions come out of the blocks' budget
    ring_ins = 0.0
    for r in rings:
        lab = f".L{spec.name}_r{r['slot']}"
        if r.get("cold"):  # one line each: the fetch of a new line is all it is for
            r["text"] = [f"    .p2align 6\n{lab}_v{j}:\n    ret" for j in range(r["M"])]
            r["fixed"] = max(1, round(r["calls"] * 65536))
            r["expected"] = 7 + r["fixed"] / 65536 * (12 + 1)
            ring_ins += r["expected"]
            continue
        pats = _branch_patterns(spec, bw, knobs, sub(1, r["slot"], 0))
        mixr = _draw_mix(keys, mixf, cost, cond, spec.chunk_insns, r["v"])
        r["text"], counts = [], []
        for j in range(r["M"]):
            fb = Block(weight=0.0, code_bytes=64 * r["v"], region_bytes=0, main_per_insn=0.0)
            vr = sub(1, r["slot"], 1, j)
            regs.rng = vr
            body, count = _block_body(
                spec, fb, f"{lab}_v{j}", pats, regs, _Mem(vr), vr, keys, mixr, cond, leaf, STATE_ITER
            )
            r["text"] += [f"    .p2align 6\n{lab}_v{j}:", *body, "    ret"]
            counts.append(count + 1)
        fixed = max(1, round(r["calls"] * 65536))
        r["fixed"] = fixed
        r["expected"] = 7 + fixed / 65536 * (12 + float(np.mean(counts)))
        ring_ins += r["expected"]
    llc_lines, llc_ins = llc_function(spec, llc, llc_off) if llc else ([], 0.0)
    if spec.llc_code or spec.llc_data:  # (clone_warm calls it: defined even when no ring is left)
        llc_lines = llc_lines + llc_warm(spec, llc, llc_off)
    brx_lines, brx_ins = brx_function(spec, knobs) if len(blocks) < BRX_SLOT else ([], 0.0)
    # the blocks' calls and rets, the order's parity (below), the prologue and epilogue, the far
    # function's call and each block's setup come out of their budget too (before session 15 only
    # the filler made up for what whole passes left: these ~35 instructions went over the target)
    nb = sum(1 for b in blocks if b.weight > 0)
    zig = nb > 0 and len(blocks) < ORDER_SLOT and zigzag_order(spec, i1)
    fixed_ins = (2 * nb + (ZIG_FIXED + (ZIG_PER_CALL - 1) * (nb + 1) if zig else 0) + 24) + sum(
        11 + (2 if b.region_bytes else 0) for b in blocks if b.weight > 0
    )
    block_budget = max(0.0, instructions - walk_ins - ring_ins - llc_ins - brx_ins - fixed_ins)
    spec.block_budget = block_budget
    # the blocks' layout (each block's chunks: _code_fit and below; their passes too, with one
    # block taking the difference: `elastic` below) is sized on `layout_budget:<name>` when the
    # knobs pin one (tune.pin_layout: the first iteration's block_budget), not on the budget
    # itself. Sized on the budget, every other unit's step moved the layout:
    # branch_x 1.0 -> 6.6 (~70 more instructions per event) resized memcached's worker blocks
    # (28/274/437 lines of assembly into 46/516/419) and moved its I1 misses by +48% at fixed
    # I1 knobs (session 17, repeated exactly); its I1 loop never converged
    layout_budget = float(knobs.get(f"layout_budget:{spec.name}", block_budget))
    # the blocks carry all the near-data accesses in what is left of the instructions
    for b in blocks:
        b.main_per_insn = min(1.0, b.main_per_insn * instructions / max(1.0, block_budget))
    out = [
        f"    .globl clone_body_{spec.name}",
        f"    .type clone_body_{spec.name}, @function",
        "    .p2align 12",  # (a page of its own: its I1 sets do not depend on the code before it)
        f"clone_body_{spec.name}:",
        "    push rbx",
        "    push rbp",
        "    push r12",
        "    push r13",
        "    push r14",
        "    push r15",
        f"    mov r15, [rdi + {STATE_DATA}]",
        # st->iter: once per event, for the rare branches of the rings' variants (the blocks count
        # their own passes)
        f"    inc qword ptr [rdi + {STATE_ITER}]",
    ]
    out += [f"    pxor {x}, {x}" for x in XMM[:4]]
    expected = 12.0 + 4 + 7  # prologue above; epilogue: 6 pops, ret
    carry = 0.0
    code_scale = code_footprint_scale(knobs, spec.name) * _code_fit(spec, blocks, layout_budget, i1)
    block_fns: list[tuple[str, list[str]]] = []
    for b in blocks:
        if b.weight <= 0:
            continue
        b.code_bytes = min(b.code_bytes, i1 // 2)
        if spec.chunk_insns > 0:
            per_event_chunks = b.weight * layout_budget / spec.chunk_insns
            want = max(1.0, min(b.code_bytes * code_scale / 64, per_event_chunks))
            chunks = max(1, round(per_event_chunks / max(1, round(per_event_chunks / want))))
            b.code_bytes = 64 * chunks
    # each block's passes are its share of the layout budget (the same every iteration once the
    # loop pins it); what the budget itself differs by goes to one block, the one with the most
    # passes (the finest step), rounded down (the filler makes up the rest). Shared out over all
    # blocks, a budget 2% lower turned memcached's worker block of 338 instructions per pass from
    # 2 passes into 1, and its conditional branches per request, data references and
    # mispredictions took one of two levels by which side of the rounding the budget fell
    # (1,356 or 1,436 branches per request over session 18's first pinned run)
    delta = block_budget - layout_budget
    active = [bi for bi, b in enumerate(blocks) if b.weight > 0]
    elastic = max(active, key=lambda bi: blocks[bi].weight / max(64, blocks[bi].code_bytes), default=-1)
    for bi, b in enumerate(blocks):
        if b.weight <= 0:
            continue
        lab = f".L{spec.name}_{bi}"
        # the region cursor lives in the arena, shared by the threads that run this body (like
        # the walkers'): per-thread cursors starting together re-touched each other's lines
        cur_slot = BLOCK_SLOTS + 8 * (bi + 32 * spec.walk_base)
        pats = _branch_patterns(spec, bw, knobs, sub(2, bi, 0))
        br = sub(2, bi, 1)
        regs.rng = br
        mema = _Mem(br)
        mixb = _draw_mix(keys, mixf, cost, cond, spec.chunk_insns, max(1, b.code_bytes // 64), looped=True)
        passes_slot = STATE_BLOCK_PASSES + 8 * bi
        body, count = _block_body(spec, b, lab, pats, regs, mema, br, keys, mixb, cond, leaf, passes_slot)
        # per iteration: the body, two pattern rotations, the region cursor, the iteration counter
        k_iter = count + 2 + (4 if b.region_bytes else 0) + 1
        passes_f = b.weight * layout_budget / max(1, k_iter + 2)
        setup = 10 + (2 if b.region_bytes else 0)
        # the rounding left over by earlier blocks is carried in instructions (blocks differ in
        # their instructions per pass)
        per_pass = max(1, k_iter + 2)
        last_block = not any(x.weight > 0 for x in blocks[bi + 1 :])
        # the last block rounds down: the straight-line filler makes up a shortfall, nothing an excess
        rnd = math.floor if last_block and passes_f + carry / per_pass >= 1 else round
        passes = max(1, rnd(passes_f + carry / per_pass))
        carry += (passes_f - passes) * per_pass
        if bi == elastic and delta:
            extra = max(math.floor(delta / per_pass), 1 - passes)
            passes += extra
            # (only a budget so far below the pin that this block would drop its last pass
            # leaves a negative rest: the later blocks take it)
            carry += min(0.0, delta - extra * per_pass)
        mode = "once" if passes == 1 else "loop"
        b.iters_per_event = passes
        if mode == "loop":
            head = [f"    mov r12d, {passes}"]
            expected += 1 + setup + passes * (k_iter + 2)
        else:
            head = []
            expected += setup + k_iter
        # each block is a function of its own, called from the body's two call sequences (below)
        fn = [f"{lab}_fn:", *head]
        expected += 2  # its call and its ret
        if b.region_bytes:
            fn.append(f"    mov r13, [r15 + {cur_slot}]")
        fn += [
            f"    mov r11, {pats[0][2] if (pats[0][2] or 0) > 0 else 0x5555555555555555}",
            f"    mov r10, {pats[1][2] if (pats[1][2] or 0) > 0 else 0x3333333333333333}",
            "    push rcx",
            f"    mov ecx, dword ptr [rdi + {passes_slot}]",
            "    ror r11, cl",
            "    ror r10, cl",
            "    pop rcx",
            f"    mov [rdi + {STATE_PATTERNS[0]}], r11",
            f"    mov [rdi + {STATE_PATTERNS[1]}], r10",
        ]
        # enter the loop head by a jump, so each pass starts a superblock there (the generator
        # test rebuilds branch outcome sequences per pass from lackey's superblock trace)
        # (aligned like its first chunk: padding between the head and the chunk would execute)
        fn.append(f"    jmp {lab}\n    .p2align {6 if spec.chunk_insns > 0 else 4}\n{lab}:")
        fn += body
        fn += [
            f"    ror qword ptr [rdi + {STATE_PATTERNS[0]}], 1",
            f"    ror qword ptr [rdi + {STATE_PATTERNS[1]}], 1",
        ]
        if b.region_bytes:
            main_n = max(1, mema.main_j)
            step = 64 * main_n
            limit = max(step * 2, b.region_bytes)
            # cmp/jb + (rarely) sub: counted as 3 per iteration
            # branchless wrap (a short region would make a wrap branch alternate and mispredict)
            fn += [
                f"    add r13, {step}",
                f"    cmp r13, {limit}",
                f"    lea rax, [r13 - {limit}]",
                "    cmovae r13, rax",
            ]
        fn.append(f"    inc qword ptr [rdi + {passes_slot}]")
        if mode != "once":
            fn += [f"{lab}_qb{'t' if passes >= DETERMINED_PASSES else 'v'}:", "    dec r12", f"    jnz {lab}"]
        if b.region_bytes:
            fn.append(f"    mov [r15 + {cur_slot}], r13")
        fn += [f"{lab}_done:", "    ret"]
        block_fns.append((f"{lab}_fn", fn))
        b.insns = round(k_iter)
    regs.rng = sub(3)
    far_lines, far_expected = _far_function(
        spec,
        regs.rng,
        regs,
        knobs,
        i1,
        walkers,
        rings,
        len(blocks),
        keys,
        mixp,
        cond,
        leaf,
        bool(llc),  # (not llc_lines: they hold clone_llc_warm_ even when no ring is left)
        bool(brx_lines),
        bool(rep_lines),
    )
    far_lines += llc_lines + brx_lines + rep_lines + ring_warm(spec, rings)
    far_expected += llc_ins + brx_ins + rep_ins
    # the blocks, then the far function; with `zig` (zigzag_order: why and when) the reverse on
    # odd events, by the parity of an arena counter shared by the threads that run this body, so
    # consecutive events of any of them alternate
    seq = [lab for lab, _ in block_fns] + [f"clone_far_{spec.name}"]
    order_tab: list[str] = []
    if zig:
        # each call's target read from a table by the parity (an indirect call), not a branch on
        # it: no predictor learns a branch that alternates between events whose history is the
        # same, and callgrind's mispredicted it on every event (session 25: memcached's timer
        # body, 2.4 mispredictions per request of the original's 24; the clone sat 20% over
        # with the random-branch unit at its floor)
        order_off = BLOCK_SLOTS + 8 * (ORDER_SLOT + 32 * spec.walk_base)
        tab = f".L{spec.name}_order"
        out.append(f"    inc qword ptr [r15 + {order_off}]")
        for i in range(len(seq)):
            out += [
                f"    mov eax, dword ptr [r15 + {order_off}]",
                "    and eax, 1",
                f"    lea rcx, [rip + {tab}]",
                f"    movsxd rax, dword ptr [rcx + rax*4 + {8 * i}]",
                "    add rax, rcx",
                "    call rax",
            ]
        # (position i: the forward order's i-th part, then the reverse order's)
        order_tab = ["    .p2align 3", f"{tab}:"]
        for fwd, rev in zip(seq, reversed(seq), strict=True):
            order_tab += [f"    .long {fwd} - {tab}", f"    .long {rev} - {tab}"]
        expected += ZIG_FIXED + (ZIG_PER_CALL - 1) * len(seq)  # (the calls are counted below)
    else:
        out += [f"    call {x}" for x in seq]
    expected += 1 + far_expected
    # the filler: register arithmetic for what whole passes left over (filler_function), a
    # function of its own after all the body's other code, so that its length (which moves with
    # every knob step) does not move the blocks' or the far function's lines (the I1 sets, and the
    # address bits callgrind's branch predictor indexes by)
    fill = min(4096, round(instructions - expected - 2))  # (its call and ret)
    fill_lines = []
    if fill > 0:
        fname = f"clone_fill_{spec.name}"
        out.append(f"    call {fname}")
        fill_lines = filler_function(fname, fill, regs)
        expected += fill + 2
    out += [
        "    pop r15",
        "    pop r14",
        "    pop r13",
        "    pop r12",
        "    pop rbp",
        "    pop rbx",
        "    ret",
        f"{leaf}:",
        "    ret",
        *[ln for _, fn in block_fns for ln in fn],
        f"{BLOCKS_END}{spec.name}:",
        f"    .size clone_body_{spec.name}, .-clone_body_{spec.name}",
        *far_lines,
        *fill_lines,
        *order_tab,
    ]
    spec.expected = expected
    return out, blocks, arena


FILL_UNROLL = 16  # the filler loop's additions per pass: with its control, one 64-byte line
FILL_CONTROL = 4  # dec, mov, cmovz, jmp
FILL_ENTRY = 4  # mov, lea, lea, jmp
FILL_LOOP_MIN = FILL_ENTRY + FILL_CONTROL  # below this many instructions the filler is straight


def filler_function(fname: str, fill: int, regs: _Regs) -> list[str]:
    """clone_fill_<name>: register arithmetic of as many instructions as `fill` straight
    additions and a ret, from code of a fixed size (one line for the loop, for any count).

    The filler makes up what whole passes of the blocks leave over, so its length moves with
    every knob step, and by a whole pass of the elastic block when that block gains or loses
    one. Straight-line code (up to session 44) added its lines to the code every event fetches:
    redis's I1 misses per request went up by a fifth when a ring step took one pass (161
    instructions) from the blocks to the filler (session 45: iterations 6 -> 7, the blocks' own
    misses 48k -> 88k a window, the filler's 12k -> 27k), and the loop's I1 knob stepped back
    and forth over that cliff for its last six iterations. A loop in one cache line fetches the
    same lines whatever its count.

    The loop is closed by an indirect jump picked with cmov, not a conditional branch: the
    validation's branch row counts conditional branches only, and a loop exit after the random
    branch unit's outcomes (the far function's) would mispredict by the history it inherits. The
    first pass enters part-way, so that the count is exact to one instruction."""

    def adds(k: int) -> list[str]:
        return [f"    add {regs.acc()}, {regs.src()}" for _ in range(k)]

    if fill < FILL_LOOP_MIN:
        return [f"    .type {fname}, @function", f"{fname}:", *adds(fill), "    ret", f"    .size {fname}, .-{fname}"]
    per = FILL_UNROLL + FILL_CONTROL
    # fill (what straight code did in as many additions) = pre + FILL_ENTRY + n * per - skip
    rest = fill - FILL_ENTRY
    n = -(-rest // per)
    skip = n * per - rest  # additions the first pass skips (0 <= skip < per)
    pre = 0
    if skip > FILL_UNROLL:  # (it would enter at the loop control: n >= 2 here; a straight prefix)
        n -= 1
        pre, skip = per - skip, 0
    top, entry, done = f".L{fname}_top", f".L{fname}_entry", f".L{fname}_done"
    lines = [f"    .type {fname}, @function", f"{fname}:"]
    lines += adds(pre)
    lines += [
        f"    mov r12d, {n}",
        f"    lea r13, [rip + {top}]",
        f"    lea r14, [rip + {done}]",
        f"    jmp {entry}",
        "    .p2align 6",
        f"{top}:",
    ]
    lines += [*adds(skip), f"{entry}:", *adds(FILL_UNROLL - skip)]
    lines += [
        "    dec r12d",
        "    mov r11, r13",
        "    cmovz r11, r14",
        "    jmp r11",
        f"{done}:",
        "    ret",
        f"    .size {fname}, .-{fname}",
    ]
    return lines


def _far_function(
    spec, rng, regs, knobs, i1, walkers, rings, bi, keys, mixp, cond, leaf, llc=False, brx=False, rep=False
):
    """clone_far_<name>: what the tuning loop controls linearly, in a function of its own so that
    callgrind reports its costs apart from the rest of the body.

    - far code: a block of code larger than the I1 (`i1_bytes` + 1/4), in cache-line chunks like
      the body, run at a fractional number of passes per event: every fetch of a line misses that
      I1 (and any smaller one), so the I1 misses are linear in `icode_far_scale`;
    - the data walkers (plan_walkers): per working-set bin beyond NEAR_MAX, new lines of a region
      sized in that bin, at a fractional number of passes per event: their misses are linear in
      `data_far_scale` (within the LL) and `data_ll_scale` (beyond it).
    Returns the function's lines and its expected instructions per event."""
    name = spec.name
    out = [
        f"    .type clone_far_{name}, @function",
        "    .p2align 6",
        f"clone_far_{name}:",
    ]
    expected = 1.0  # ret
    tables, variants = [], []
    for r in rings:
        lab = f".L{name}_r{r['slot']}"
        slot = _slot(spec, r["slot"])
        out += [
            f"    mov r12, [r15 + {slot}]",
            f"    add r12, {r['fixed']}",
            "    mov rax, r12",
            "    and eax, 65535",
            f"    mov [r15 + {slot}], rax",
            "    shr r12, 16",
            f"    jz {lab}_done",
            f"{lab}_call:",
            f"    mov r13, [r15 + {slot + 8}]",
            "    lea rax, [r13 + 1]",
            f"    cmp rax, {r['M']}",
            f"    cmovae rax, qword ptr [r15 + {ZERO_OFF}]",
            f"    mov [r15 + {slot + 8}], rax",
            f"    lea rax, [rip + {lab}_tab]",
            "    lea rax, [rax + r13 * 4]",
            "    movsxd r13, dword ptr [rax]",
            "    add rax, r13",
            "    call rax",
            "    dec r12",
            f"    jnz {lab}_call",
            f"{lab}_done:",
        ]
        expected += r["expected"]
        tables += [f"    .p2align {TABLE_ALIGN}", f"{lab}_tab:", *[f"    .long {lab}_v{j} - ." for j in range(r["M"])]]
        variants += r["text"]
    # the walkers every LL misses (data_ll_scale beyond the LL: the cold walker and the bins beyond
    # the largest swept LL) run in clone_farp_<name>, called from here, so that callgrind counts
    # their misses apart from the other walkers' (tune._ll_by_side, session 24: splitting
    # clone_far_'s misses by the walkers' lines gave the persistent ones too few, redis's clone
    # made 88 data misses per window at B against a target of 62)
    persist = [w for w in walkers if is_persistent_walker(w, knobs)]
    walkers = [w for w in walkers if not is_persistent_walker(w, knobs)]
    farp = []
    for w in persist:
        code, cost = _walker_code(spec, w)
        farp += code
        expected += cost
    for w in walkers:
        code, cost = _walker_code(spec, w)
        out += code
        expected += cost
    if farp:
        out.append(f"    call clone_farp_{name}")
        expected += 2  # call, ret
    if llc:  # the LL conflict rings (llc_function), apart so that callgrind reports their costs
        out.append(f"    call clone_llc_{name}")
    if brx:  # the random-branch unit (brx_function)
        out.append(f"    call clone_brx_{name}")
    if rep:  # the rep unit (rep_function)
        out.append(f"    call clone_rep_{name}")
    out += ["    ret", f"    .size clone_far_{name}, .-clone_far_{name}"]
    if farp:
        fn = f"clone_farp_{name}"
        out += [f"    .type {fn}, @function", f"{fn}:", *farp, "    ret", f"    .size {fn}, .-{fn}"]
    return _far_tail(out, name, variants, tables), expected


def is_persistent_walker(w: dict, knobs: dict) -> bool:
    """A walker whose lines every LL misses: the cold one, and those of the bins beyond the largest
    LL the profile's LL sweep measured (far_data_knob)."""
    return w["cold"] or (
        far_data_knob(w["bin"], False, knobs) == "data_ll_scale" and w["bin"] > knobs.get("ll_bytes", 2 << 20)
    )


def _walker_code(spec, w: dict) -> tuple[list[str], float]:
    """One walker's code in the far functions (plan_walkers) and its instructions per event."""
    out: list[str] = []
    if w.get("static"):
        lines_r = w["bytes"] // 64
        out += [f"    add r12, qword ptr [r15 + {w['off'] + 64 * (j % lines_r)}]" for j in range(w["per_pass"])]
        out.append(f"    mov [r15 + {SINK_OFF}], r12")  # keep the loads live (see below)
        return out, w["per_pass"] + 1
    slot = _slot(spec, w["slot"])
    whole, frac = _walk_split(w["lines"])
    has_frac = round(frac * 65536) > 0
    n_loads = whole + (1 if has_frac else 0)
    last = max(0, w["bytes"] - 64 * n_loads)  # the last cursor whose lines stay in the region
    # branchless: the whole lines are new every event, and one more line is new when the
    # accumulator overflows (a fractional rate with no branch to mispredict); the cursor
    # restarts at 0 when the next event's lines would leave the region (the region is a whole
    # number of events' lines, so the walk is a cycle over all of it: subtracting the span
    # instead, as the first version did, re-walked the same lines shifted by one)
    out += [
        f"    mov r12, [r15 + {slot}]",
        f"    add r12, {round(frac * 65536)}",
        "    mov rax, r12",
        "    shr rax, 16",
        "    and r12d, 65535",
        f"    mov [r15 + {slot}], r12",
        f"    mov r13, [r15 + {slot + 8}]",
    ]
    out += [f"    add r12, qword ptr [r15 + r13 + {w['off'] + 64 * j}]" for j in range(whole)]
    # the sum of the loads is stored: when the next walker overwrote r12 in the same
    # superblock, valgrind's JIT removed every load of this one as dead code (two walkers
    # measured the misses of one; 9 of redis's 10 walkers missed nothing)
    if whole:
        out.append(f"    mov [r15 + {SINK_OFF}], r12")
    if has_frac:
        # the fractional line is loaded only in the events where it is new; in the others
        # the load reads the sink (tiny region, always cached). Up to session 7 it loaded the
        # next line every event, and that line was touched again in the next event: one access
        # per walker and event at the distance of everything between two events, in no bin
        # of the profile (memcached's timer body, 3.1 events per request, missed a 32 KiB D1
        # on every walker at every event, whatever data_far_scale said; the tuner drove that
        # knob to 0.02, the walkers' periods outgrew warm-up and window, and their lines came
        # back from the start-up touch, out of the LL: 740% at A; see generate._touch_rows)
        out += [
            f"    lea r12, [r13 + {w['off'] + 64 * whole}]",
            "    test rax, rax",
            "    cmovz r12, rax",
            "    mov r12, qword ptr [r15 + r12]",
            f"    mov [r15 + {SINK_OFF}], r12",
        ]
    out += [
        "    shl rax, 6",
        f"    lea r13, [r13 + rax + {64 * whole}]",
        "    xor eax, eax",
        f"    cmp r13, {last + 1}",
        "    cmovae r13, rax",
        f"    mov [r15 + {slot + 8}], r13",
    ]
    return out, walker_cost(w)[0]


def _far_tail(out: list[str], name: str, variants: list[str], tables: list[str]) -> list[str]:
    """The far function's code rings' variants and tables, after its code."""
    if variants:
        # the code rings' variants in a section of their own, page aligned (session 13): after
        # the far function's code, every step of a knob that changes its size or a body's (the
        # walkers' whole lines, cond_scale, mem_scale) moved them to other I1 sets, and memcached's
        # I1 misses went from 0.0004 to 0.0013 per instruction with the ring knob steady. Named
        # clone_far_<name>_rings: callgrind's costs stay the far function's (tune._split)
        rings = f"clone_far_{name}_rings"
        out += [
            f'    .section .text.{rings},"ax",@progbits',
            "    .p2align 12",
            f"    .type {rings}, @function",
            f"{rings}:",
            *variants,
            f"    .size {rings}, .-{rings}",
            "    .text",
        ]
    if tables:
        out += ["    .section .rodata", *tables, "    .text"]
    return out


def _layer_regions(blocks: list[Block], ll: int) -> None:
    """Nest the data regions as LRU stack layers: a region walked across events is reused after
    every smaller region was walked too, so its reuse distance is the sum of the regions up to
    it. Sizing each region as (its target) - (the regions below it) puts that sum, not the region
    alone, at the target size. Regions stay below 1/8 of the LL: the regions of every thread together
    must fit in it (data beyond the LL has its own loop, at a controlled rate)."""
    below = 0
    for b in sorted((b for b in blocks if b.region_bytes), key=lambda x: x.region_bytes):
        want = min(b.region_bytes, ll // 8)
        b.region_bytes = max(128, (want - below) // 64 * 64)
        below += b.region_bytes


def _draw_cost(keys: list[str], rep_len: int) -> np.ndarray:
    """Dynamic instructions one draw of each class emits (rep iterations, div setup, call + ret)."""
    return np.array(
        [
            (rep_len + 7)
            if k.startswith("rep/")
            else 3
            if k.startswith("div/")
            else 2
            if k in ("branch/store", "branch/load", "branch/rmw")
            else 1
            for k in keys
        ],
        dtype=float,
    )


# per block iteration: the pattern rotations and the counter are read-modify-writes of the state
LOOP_SCAFFOLD = {"arith/reg": 4.0, "arith/rmw": 3.0, "mov/reg": 1.0, "branch/reg": 1.0}


def _draw_mix(
    keys: list[str], f: np.ndarray, cost: np.ndarray, cond: float, chunk_insns: int, n_chunks: int, looped=False
) -> np.ndarray:
    """Draw probabilities for the mix instructions of a block, so that the block *as executed*
    follows the profiled mix `f` (fractions per instruction, conditional branches removed).

    Every chunk also executes scaffolding the mix does not choose: its closing `jmp`, a `bt` per
    conditional branch, and per iteration the loop control (pattern rotations, cursor, counter).
    With the short chunks that reproduce the original's I-cache line entries (5-8 instructions),
    that is a third to a half of the chunk, all register-only: drawn in proportion to `f`, the
    body executed ~0.15 data references per instruction where the original had 0.43-0.53, so
    every per-request data miss count was half the original's (the miss *rates* per access could
    still match at one hierarchy, but not the working-set curve). The scaffolding is subtracted
    from its own classes first, and the room left goes to the memory-operand classes up to their
    target share, then to the register classes in proportion.

    Since session 11 the test before each conditional branch reads its pattern (or the
    iteration counter) from memory and the loop's rotations and counter are read-modify-writes
    (asmgen docstring): those references count toward the memory share, and a scaffolding class
    beyond its own share takes the excess from the other classes of its kind (memory or
    register), so the block's references per instruction stay the target's where they fit."""
    sc = np.zeros(len(keys))
    idx = {k: i for i, k in enumerate(keys)}
    per = max(1, chunk_insns)
    if chunk_insns > 0:
        sc[idx["branch/reg"]] += 1.0 / per  # the chunk's closing jmp
    sc[idx["arith/load"]] += cond  # bt / test before each conditional branch: reads the state
    if looped:
        for k, v in LOOP_SCAFFOLD.items():
            sc[idx[k]] += v / (per * max(1, n_chunks))
    room = max(0.05, 1.0 - cond - sc.sum())
    mem = np.array([not k.endswith("/reg") for k in keys])
    want = f - sc
    for kind in (mem, ~mem):
        over = -want[kind & (want < 0)].sum()
        under = want[kind & (want > 0)].sum()
        if over > 0 and under > 0:
            want[kind & (want > 0)] *= max(0.0, under - over) / under
    want = np.maximum(0.0, want)
    g = np.zeros(len(keys))
    mem_want = want[mem].sum()
    if mem_want > 0:
        g[mem] = want[mem] * min(1.0, room / mem_want)
    left = room - g.sum()
    reg_want = want[~mem].sum()
    if left > 0 and reg_want > 0:
        g[~mem] = want[~mem] * (left / reg_want)
    if g.sum() <= 0:
        g = f.copy()
    p = g / cost
    return p / p.sum() if p.sum() > 0 else np.full(len(keys), 1 / len(keys))


def _block_body(
    spec, b, lab, pats, regs, mema, rng, keys, mixp, cond, leaf, ctr: int = STATE_ITER
) -> tuple[list[str], int]:
    """One iteration's instructions of block b and their dynamic count (rep iterations and the
    leaf's ret included). `ctr`: the state's pass counter its rare branches test (_mask_branch)."""
    body: list[str] = []
    state = {"count": 0, "skipped": 0.0}
    # each chunk draws from its own generator (keyed by its index): a knob that changes how many
    # numbers one chunk draws (cond_scale, the branch density) leaves the other chunks as they were
    cbase = int(rng.integers(0, 2**62))
    g = [rng]
    tiny = _Mem(rng)  # main_left 0: tiny-region addresses only
    if spec.chunk_insns > 0:
        k_target = (b.code_bytes // 64) * spec.chunk_insns
    else:
        k_target = max(8, int(b.code_bytes / EST_INSN_BYTES))
    # the block's mix by quota, not by independent draws: each class gets the whole part of its
    # expected draws in this block, and the fraction by one coin (so the expectation stays the
    # mix's), shuffled. A block runs its draws once per pass, so independent draws put a sampling
    # error times the passes into the body: redis's 9-chunk block, 26 passes per event, drew 11
    # `rep` (32 iterations each) where 4 were due, and the body made 40% more data references and
    # conditional branches. (Other rare classes in a hot block stay a coin: they are 1-3
    # instructions each.)
    cost = _draw_cost(keys, spec.rep_len)
    n_draws = max(1, round(k_target / max(1.0, float((mixp * cost).sum()))))
    qrng = np.random.default_rng([cbase, 1 << 20])
    want = mixp * n_draws
    quota = np.floor(want).astype(int) + (qrng.random(len(keys)) < want - np.floor(want))
    # `rep` by its iterations, not by a coin (session 12): a block gets round(want) reps (at least
    # one) sharing the iterations it is due, want * rep_len; a coin only below one iteration. As a
    # coin, a 32-iteration `rep` due 0.22 times per pass in redis's hottest block (~80 passes per
    # event) was in or out on the last digits of mem_scale: the clone's data references per
    # request flipped between ~2,480 and ~5,000 (target 4,323) and the tuning loop ratcheted
    # mem_scale and cond_scale to their caps with no effect
    rep_lens: dict[int, list[int]] = {}
    for k in (i for i, key in enumerate(keys) if key.startswith("rep/")):
        iters = want[k] * spec.rep_len
        if iters < 1:
            lens = [1] if qrng.random() < iters else []
        else:
            n = max(1, round(want[k]))
            whole = round(iters)
            # (a drawn rep writes the tiny region from its start: below ZERO_OFF and DIVISOR_OFF)
            lens = [min(96, whole // n + (1 if j < whole % n else 0)) for j in range(n)]
        quota[k] = len(lens)
        rep_lens[k] = lens
    pool = np.repeat(np.arange(len(keys)), quota)
    qrng.shuffle(pool)
    # each rep in the pool takes its own length, in pool order (a wrapped pool reuses them)
    seen: dict[int, int] = {}
    pool_len = []
    for k in pool.tolist():
        if k in rep_lens:
            pool_len.append(rep_lens[k][seen.get(k, 0)])
            seen[k] = seen.get(k, 0) + 1
        else:
            pool_len.append(spec.rep_len)
    drawn = [0]
    k_target = 0

    def emit_mix():
        at = drawn[0] % len(pool) if len(pool) else -1
        k = int(pool[at]) if at >= 0 else int(g[0].choice(len(keys), p=mixp))
        rep_len = pool_len[at] if at >= 0 else spec.rep_len
        drawn[0] += 1
        cls, mem = keys[k].split("/")
        lines = _emit(cls, mem, regs, mema, g[0], rep_len)
        for ln in lines:
            if ln == "1:":
                body.append(f"{lab}_j{state['count']}:")
                continue
            if ln == "jmp 1f":
                ln = f"jmp {lab}_j{state['count']}"
            body.append("    " + ln.replace("{leaf}", leaf))
        n = sum(1 for ln in lines if ln != "1:")
        if cls == "rep":
            n += rep_len  # callgrind: n + 1 for a rep of n iterations
        if any(ln.startswith("call") for ln in lines):
            n += 1  # the leaf's ret
        state["count"] += n
        regs.tick(n)

    def emit_cond(target: str | None = None):
        which = int(g[0].integers(0, 2))
        p, _r, pat = pats[which]
        reg = f"qword ptr [rdi + {STATE_PATTERNS[which]}]"
        skip = target or f"{lab}_s{state['count']}"
        bit = int(g[0].integers(0, 64))  # drawn whatever the form: a form change moves nothing else
        # a label naming the branch's outcome class for spread_chunks (no code)
        body.append(f"{lab}_q{state['count']}{_outcome_class(p, _r, pat)}:")
        if pat == FORCED:
            lines, p = _threshold_branch(p, skip, ctr)
            body.extend(lines)
        elif pat is None:
            body.extend(_mask_branch(p, _r, skip, ctr))
        else:
            body.extend([f"    bt {reg}, {bit}", f"    jc {skip}"])
        state["count"] += 2
        regs.tick(2)
        # the instruction a taken branch skips: one drawn from the mix (single-instruction
        # classes), its memory operand in the tiny region (a skipped region access would break
        # the walk)
        k = int(g[0].choice(len(keys), p=mixp))
        cls, mem = keys[k].split("/")
        if cls in ("rep", "div", "branch", "lock"):
            cls, mem = "arith", "reg"
        body.extend(f"    {ln}" for ln in _emit(cls, mem, regs, tiny, g[0], spec.rep_len))
        state["count"] += 1
        regs.tick()
        # a taken branch (probability p) skips that instruction, and at a chunk's end the jump too
        state["skipped"] += p * (2 if target else 1)
        if target is None:
            body.append(f"{skip}:")

    if spec.chunk_insns > 0:
        k_target = (b.code_bytes // 64) * spec.chunk_insns
    else:
        k_target = max(8, int(b.code_bytes / EST_INSN_BYTES))
    main_n = round(b.main_per_insn * k_target) if b.region_bytes else 0
    main_n = min(main_n, max(1, b.region_bytes // 128)) if b.region_bytes else 0
    b.main_n = main_n
    mema.main_left, mema.main_j, mema.region_off = main_n, 0, b.region_off
    if spec.chunk_insns > 0:
        n_chunks = max(1, b.code_bytes // 64)
        per_chunk_cond = cond * spec.chunk_insns
        for ci in range(n_chunks):
            nxt = f"{lab}_c{ci + 1}" if ci + 1 < n_chunks else f"{lab}_t"
            middle = 0 < ci < n_chunks - 1
            # middle chunks are entered only by a jump: spread_chunks() may pad their start
            # chunks after the first are entered only by a jump too: shape_sets() may put whole
            # lines before them (never run) to move them onto the sets the original's code uses
            gap = f"{SETGAP_MARK}{lab}_c{ci}\n" if ci > 0 else ""
            body.append(
                f"    .p2align 6\n{gap}{PAD_MARK}{lab}_c{ci}\n{lab}_c{ci}:"
                if middle
                else f"    .p2align 6\n{gap}{lab}_c{ci}:"
            )
            start_count = state["count"]
            g[0] = regs.rng = tiny.rng = mema.rng = np.random.default_rng([cbase, ci])
            extra_conds = max(0.0, per_chunk_cond - 1)
            n_in = int(extra_conds) + (1 if g[0].random() < extra_conds - int(extra_conds) else 0)
            end_cond = g[0].random() < min(1.0, per_chunk_cond)
            # the chunk's own instructions: the mix, then the closing branch (3) and jump (1)
            room = spec.chunk_insns - 1 - (3 if end_cond else 0)
            while state["count"] - start_count < room or state["count"] == start_count:
                if n_in and g[0].random() < 0.3:
                    emit_cond()
                    n_in -= 1
                else:
                    emit_mix()
            if end_cond:
                emit_cond(target=nxt)
            body.append(f"    jmp {nxt}")
            if middle:
                body.append(f"{lab}_c{ci}_end:")
            state["count"] += 1
        body.append(f"{lab}_t:")
    else:
        n_cond = round(cond * k_target) if cond > 0 else 0
        cond_at = (
            set(g[0].choice(max(1, k_target), size=min(n_cond, k_target), replace=False).tolist()) if n_cond else set()
        )
        while state["count"] < k_target:
            if state["count"] in cond_at:
                emit_cond()
            else:
                emit_mix()
    count = state["count"]
    while mema.main_left > 0:
        d = regs.dst()
        body.append(f"    mov {d}, {mema.addr()}")
        regs.wrote(d)
        count += 1
    return body, count - state["skipped"]


PAD_MARK = "    # pad "
SETGAP_MARK = "    # setgap "
BLOCKS_END = ".Lblocks_end_"  # + body name: the end of a body's blocks (shape_sets)


def set_quotas(hist: list[int], lines: int) -> list[int]:
    """`lines` shared out over the sets in proportion to `hist` (largest remainders)."""
    tot = sum(hist)
    if tot <= 0 or lines <= 0:
        return [0] * len(hist)
    raw = [lines * h / tot for h in hist]
    q = [int(x) for x in raw]
    for i in sorted(range(len(hist)), key=lambda i: (q[i] - raw[i], i))[: lines - sum(q)]:
        q[i] += 1
    return q


def _assemble_labels(text: str, work) -> dict[str, int] | None:
    """Each label's address in the assembled text (local labels kept), None without gcc/nm."""
    got = _assemble(text, work)
    return got[0] if got else None


def _assemble(text: str, work, jumps: bool = False) -> tuple[dict[str, int], list[int]] | None:
    """`_assemble_labels`, and with `jumps` the addresses of the conditional jumps (objdump),
    sorted; None without gcc, nm or objdump."""
    import re
    import subprocess
    from pathlib import Path

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    src, obj = work / "labels.S", work / "labels.o"
    src.write_text(text)
    try:
        subprocess.run(
            ["gcc", "-c", "-Wa,-L", "-o", str(obj), str(src)], check=True, capture_output=True, text=True, timeout=120
        )
        nm = subprocess.run(["nm", str(obj)], check=True, capture_output=True, text=True, timeout=60).stdout
        dis = ""
        if jumps:
            cmd = ["objdump", "-d", "--no-show-raw-insn", str(obj)]
            dis = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        for f in (src, obj):
            f.unlink(missing_ok=True)
    addr = {}
    for ln in nm.splitlines():
        parts = ln.split()
        if len(parts) == 3:
            addr[parts[2]] = int(parts[0], 16)
    jcc = sorted(int(m.group(1), 16) for m in re.finditer(r"^\s*([0-9a-f]+):\s+j(?!mp)[a-z]+\s", dis, re.M))
    return addr, jcc


def shape_sets(text: str, hist: list[int] | None, workdir) -> str:
    """Move each body's chunks onto the sets the original's hot code lines use (session 25).

    `hist` is the profile's `code_sets` (profile.code_sets): how many of the original's hot lines
    fall on each set of a 64-set cache. Contiguous, the blocks load every set alike, so unlike
    the original they miss no more at 4 ways than at 8 of the same size (memcached at 16 KiB: the
    original +23%, the clone -9%; its L1i row at B failed at 11.6%). The blocks' lines are shared
    out over the sets in proportion to `hist`, and page by page a set takes a line only while it
    has quota left: a chunk (entered only by a jump) starts at the next such line, whole lines of
    int3 before it. The code between chunks (block heads and tails) stays where it falls. A body
    starts on a page of its own, so a line's set is its offset there. Returns the text with the
    marks removed and unchanged code where there is nothing to shape or no assembler."""
    import re

    if SETGAP_MARK not in text:
        return text
    sets = len(hist or [])
    addr = _assemble_labels(text, workdir) if hist and sum(hist) > 0 else None
    out: list[str] = []
    start = shift = pages = 0
    quota: list[int] = []
    for ln in text.split("\n"):
        m = re.match(r"^clone_body_(\S+):$", ln)
        if m and addr is not None:
            name = m.group(1)
            start = addr.get(f"clone_body_{name}", 0)
            lines = max(0, (addr.get(f"{BLOCKS_END}{name}", start) - start + 63) // 64)
            quota = set_quotas(hist, lines)
            pages, shift = max(quota, default=0), 0
        if not ln.startswith(SETGAP_MARK):
            out.append(ln)
            continue
        a = addr.get(ln[len(SETGAP_MARK) :].strip()) if addr is not None else None
        if a is None or not pages:
            continue
        pos = (a - start) // 64 + shift
        gap = 0
        while True:
            page, st = divmod(pos + gap, sets)
            if page >= pages:  # past the shape (the heads' lines took slots): contiguous from here
                gap = 0
                break
            if page < quota[st]:
                break
            gap += 1
        if gap:
            out.append(f"    .skip {64 * gap}, 0xcc")
            shift += gap
    return "\n".join(out)


PAD_MARGIN = 4  # bytes a chunk keeps free at its line's end (a short jump may relax to a near one)


PREDICTOR_SLOTS = 128  # callgrind's predictor: the branch address's low 7 bits (with 7 of history)


def _clash(a: str, b: str) -> int:
    """Whether two branches on one predictor slot evict each other's counts: unless both go the
    same one way (`_outcome_class`)."""
    return 0 if a == b and a in "tn" else 1


def spread_chunks(text: str, seed: int, workdir) -> str:
    """Place each middle chunk at an offset inside its 64-byte line that keeps its conditional
    branches off the predictor slots the other branches of its block's loop use.

    Chunks start line-aligned, so their conditional branches sit at a handful of offsets. The
    simulated predictor (callgrind: 2-bit counters indexed by 7 bits of global history and the
    branch address's low 7 bits) then maps most of a body's branches onto a few counters, and
    branches with opposite outcomes evict each other: on memcached's clone, 160 branches shared
    17 of the 128 address slots and ~6 branches run once per request mispredicted every time.
    Real code has its branches at every offset. Up to session 29 each pad was drawn at random;
    that still left pairs on one slot, and in a loop run 34 times per request one pair is 33
    mispredictions per request: redis's clone read 4.5-5.0 or 35-50 per request by layout (the
    original 23.2-23.7), a never-taken branch at 0x...ef mispredicting 33 of its 34 runs beside
    an always-taken one at 0x...3ef (session 30). Now, loop by loop (a block's function, where
    two branches alternate every pass), each chunk in text order takes, of the pads its line has
    room for, one whose branches clash (`_clash`) with the fewest branches already placed (the
    loop's others: its unpadded chunks and its back edge), drawn at random among those. The
    generator labels each branch with its outcome class (`_outcome_class`); an unlabelled one
    counts as varying. The chunk sizes and branch addresses come from assembling the text once
    (local labels kept); each pad (never executed: chunks are entered by a jump) keeps the chunk
    inside its line, so the I-cache line entries are unchanged. Same text + seed, same output.
    Returns the text unchanged if the assembler is not available."""
    import bisect
    import re
    import zlib

    if PAD_MARK not in text:
        return text
    got = _assemble(text, workdir, jumps=True)
    if got is None:
        return text
    addr, jcc = got
    cls = {}  # a conditional jump's address -> its outcome class
    loops: dict[str, tuple[int, int]] = {}  # a block's label -> its function's address range
    for lab, a in addr.items():
        m = re.match(r"^(\.L.+)_q(?:\d+|b)([tnv])$", lab)
        if m:
            k = bisect.bisect_left(jcc, a)
            if k < len(jcc):
                cls[jcc[k]] = m.group(2)
            blk = m.group(1)
            if f"{blk}_fn" in addr and f"{blk}_done" in addr:
                loops[blk] = (addr[f"{blk}_fn"], addr[f"{blk}_done"])

    def branches(lo: int, hi: int) -> list[int]:
        return jcc[bisect.bisect_left(jcc, lo) : bisect.bisect_left(jcc, hi)]

    chunks = [m.group(1) for m in re.finditer(r"^    # pad (\S+)$", text, re.M)]
    padded = {lab: (addr[lab], addr[lab + "_end"]) for lab in chunks if lab in addr and lab + "_end" in addr}
    taken: dict[str, dict[int, list[str]]] = {}  # per loop: slot -> the outcome classes placed there
    inside = {j for a, e in padded.values() for j in branches(a, e)}
    for blk, (lo, hi) in loops.items():
        slots = taken.setdefault(blk, {})
        for j in branches(lo, hi):
            if j not in inside:
                slots.setdefault(j % PREDICTOR_SLOTS, []).append(cls.get(j, "v"))
    pads = {}
    for lab in chunks:
        if lab not in padded or padded[lab][0] % 64:
            continue
        a, e = padded[lab]
        room = 64 - (e - a) - PAD_MARGIN
        if room <= 0:
            continue
        # keyed by the chunk's label: a chunk keeps its pad when other chunks come and go
        rng = np.random.default_rng([seed, 0x5EED, zlib.crc32(lab.encode())])
        slots = taken.get(re.sub(r"_c\d+$", "", lab), {})
        own = branches(a, e)
        cost = [
            sum(_clash(cls.get(j, "v"), c) for j in own for c in slots.get((j + pad) % PREDICTOR_SLOTS, ()))
            for pad in range(room + 1)
        ]
        best = [pad for pad, c in enumerate(cost) if c == min(cost)]
        pad = best[int(rng.integers(0, len(best)))]
        for j in own:
            slots.setdefault((j + pad) % PREDICTOR_SLOTS, []).append(cls.get(j, "v"))
        pads[lab] = pad

    out = []
    for ln in text.split("\n"):
        m = re.match(r"^    # pad (\S+)$", ln)
        if not m:
            out.append(ln)
            continue
        pad = pads.get(m.group(1), 0)
        out.append(f"    .skip {pad}, 0xcc" if pad else "    # no room to pad")
    return "\n".join(out)


def harness_c(name: str, arena: int, calls: int, max_blocks: int = 64, touch: list | None = None) -> str:
    """A standalone C driver that calls clone_body_<name> `calls` times (tests, offline checks).
    Its start-up touch: every line below the cold region, downwards; or, with `touch` (the body's
    spec.touch), the skeleton's: those ranges, largest rank first, each in its direction, on an
    arena mapped populated (skeleton.c arenas_touch, arena_new)."""
    if touch is None:
        top = (arena - COLD_BYTES - 4096) // 64 * 64
        touch_c = f"for (long off = {top}; off >= 64; off -= 64) st.data[off - 64] = 0;"
        populate = ""
    else:
        rows = sorted((row for row in touch if row[1] > 0), key=lambda x: -x[2])
        up = "for (long off = {}; off < {}; off += 64) st.data[off] = 0;"
        down = "for (long off = {1}; off > {0}; off -= 64) st.data[off - 64] = 0;"
        touch_c = "\n\t".join(
            (down if d == TOUCH_DOWN else up).format(o // 64 * 64, (o + n) // 64 * 64) for o, n, _, d in rows
        )
        populate = " | MAP_POPULATE"
    return f"""/* harness for clone_body_{name}: generated by tailscope */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
struct body_state {{ char *data; uint64_t iter; uint64_t blocks[2 * {max_blocks}]; }};
void clone_body_{name}(struct body_state *);
void clone_llc_warm_{name}(char *) __attribute__((weak));
void clone_ring_warm_{name}(char *) __attribute__((weak));
int main(int argc, char **argv) {{
	long n = argc > 1 ? atol(argv[1]) : {calls};
	struct body_state st = {{0}};
	st.data = mmap(NULL, {arena}, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS{populate}, -1, 0);
	if (st.data == MAP_FAILED) return 1;
	{touch_c}
	*(uint32_t *)(st.data + {DIVISOR_OFF}) = 7;
	if (clone_ring_warm_{name}) clone_ring_warm_{name}(st.data);
	if (clone_llc_warm_{name}) clone_llc_warm_{name}(st.data);
	for (long i = 0; i < n; i++) clone_body_{name}(&st);
	return 0;
}}
"""


def write_standalone(
    spec: BodySpec,
    out_dir,
    seed: int,
    calls: int,
    knobs: dict | None = None,
    code_sets: list[int] | None = None,
    skeleton_touch: bool = False,
) -> dict:
    """body.S + harness.c + a build of ./harness in out_dir; returns the blocks and arena.
    `code_sets`: the blocks' lines shaped onto those sets (shape_sets), else contiguous.
    `skeleton_touch`: the harness touches the arena as the skeleton does (harness_c)."""
    import subprocess
    from pathlib import Path

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines, blocks, arena = generate_body(spec, np.random.default_rng(seed), knobs or {})
    asm = ["    .intel_syntax noprefix", "    .text", *lines, '    .section .note.GNU-stack,"",@progbits']
    text = "\n".join(asm) + "\n"
    (out_dir / "body.S").write_text(shape_sets(text, code_sets, out_dir / "shape") if code_sets else text)
    touch = spec.touch if skeleton_touch else None
    (out_dir / "harness.c").write_text(harness_c(spec.name, arena, calls, max(64, len(blocks) + 2), touch))
    subprocess.run(
        ["gcc", "-O1", "-o", str(out_dir / "harness"), str(out_dir / "harness.c"), str(out_dir / "body.S")],
        check=True,
        capture_output=True,
        text=True,
    )
    return {"blocks": blocks, "arena": arena, "lines": lines}
