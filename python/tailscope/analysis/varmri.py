"""VarMRI statistics (Huang et al., "Long-term Monitoring of Kernel and Hardware Events to
Understand Latency Variance", §5), as pure functions over numpy arrays.

Nothing here reads files or knows about columns; `tailscope.analysis.pipeline` feeds these
functions the arrays of one recording. Every function states its formula and its source.

Conventions
- Percentiles are nearest-rank: V_q(L) = the ceil(q·n)-th smallest value of L (an observed
  latency, never an interpolation). Computed with np.partition, O(n).
- An event E is "recorded" for a request when the request carries E (counters_valid and the
  source columns not null). Each statistic uses only the requests that recorded the events it
  involves (VarMRI §5: robustness to missing data).
- pThreshold (§5.1) is a percentile of E; the threshold *value* is E's value at that
  percentile; the high set H = {requests with E > threshold value}.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# -- percentiles ---------------------------------------------------------------------------


def nearest_rank_index(n: int, q: float) -> int:
    """0-based index of the nearest-rank q-percentile in a sorted array of n values:
    k = ceil(q·n) − 1, clamped to [0, n−1]. (The 1e-9 guards against 0.99·100 = 99.000…01.)"""
    return min(max(math.ceil(q * n - 1e-9) - 1, 0), n - 1)


def percentile(values: np.ndarray, q: float) -> float:
    """Nearest-rank q-percentile of `values` (0 < q ≤ 1), NaN for an empty array.

    V_q(L) = L_(k) with k = ceil(q·|L|), the k-th order statistic. O(n) via np.partition.
    """
    n = int(values.size)
    if n == 0:
        return math.nan
    k = nearest_rank_index(n, q)
    return float(np.partition(values, k)[k])


def percentiles(values: np.ndarray, qs: list[float]) -> list[float]:
    """Several nearest-rank percentiles with one multi-kth np.partition."""
    n = int(values.size)
    if n == 0:
        return [math.nan] * len(qs)
    ks = [nearest_rank_index(n, q) for q in qs]
    part = np.partition(values, sorted(set(ks)))
    return [float(part[k]) for k in ks]


# -- pThreshold: CDF step detection (§5.1) -------------------------------------------------


@dataclass(frozen=True)
class LineFit:
    """One fitted line of the piecewise-linear CDF: covers sorted ranks [start, end)."""

    start: int
    end: int
    slope: float
    intercept: float


@dataclass(frozen=True)
class StepFit:
    """Result of `fit_cdf_lines`: lines over the quantile function and their joints.

    joints[i] is the percentile where line i ends and line i+1 begins (fraction of values at
    or below the joint); joint_values[i] is the largest value on line i's side of it.
    """

    n: int
    lines: tuple[LineFit, ...]
    joints: np.ndarray
    joint_values: np.ndarray
    slope_ratios: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per joint, ≥ 1
    jump_ratios: np.ndarray = field(default_factory=lambda: np.zeros(0))  # |gap| / rise of both lines

    @property
    def strong(self) -> np.ndarray:
        """Joints that are steps: slopes differ ≥ STEP_SLOPE_RATIO× or the lines jump by at
        least their own combined rise (a gap in the values)."""
        if self.slope_ratios.size != self.joints.size:
            return np.ones(self.joints.size, dtype=bool)
        jumps = self.jump_ratios if self.jump_ratios.size == self.joints.size else np.zeros(self.joints.size)
        return (self.slope_ratios >= STEP_SLOPE_RATIO) | (jumps >= STEP_JUMP_RATIO)


def _range_stats(x: np.ndarray, y: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Centred sufficient statistics per range: rows of (n, mean_x, mean_y, Cxx, Cxy, Cyy)
    where Cab = Σ(a − mean_a)(b − mean_b). Centred sums (Chan et al.'s parallel update, as in
    Apache Commons Math SimpleRegression.append, VarMRI's ref. apache_2016) stay accurate where
    raw Σx², Σy² would cancel catastrophically."""
    n = np.diff(np.append(starts, x.size)).astype(np.float64)
    mx = np.add.reduceat(x, starts) / n
    my = np.add.reduceat(y, starts) / n
    dx = x - np.repeat(mx, n.astype(np.int64))
    dy = y - np.repeat(my, n.astype(np.int64))
    return np.column_stack(
        [
            n,
            mx,
            my,
            np.add.reduceat(dx * dx, starts),
            np.add.reduceat(dx * dy, starts),
            np.add.reduceat(dy * dy, starts),
        ]
    )


def merge_stats(a: tuple, b: tuple) -> tuple:
    """O(1) merge of two ranges' centred statistics (n, mx, my, Cxx, Cxy, Cyy):
    n = na + nb, m = (na·ma + nb·mb)/n, C = Ca + Cb + na·nb/n · δa·δb with δ = mb − ma."""
    na, mxa, mya, cxxa, cxya, cyya = a
    nb, mxb, myb, cxxb, cxyb, cyyb = b
    n = na + nb
    dx, dy = mxb - mxa, myb - mya
    f = na * nb / n
    return (
        n,
        mxa + dx * nb / n,
        mya + dy * nb / n,
        cxxa + cxxb + f * dx * dx,
        cxya + cxyb + f * dx * dy,
        cyya + cyyb + f * dy * dy,
    )


MIN_STEP_PERCENTILE = 0.5  # a high set is at most the upper half of the requests
STEP_JUMP_RATIO = 1.0
STEP_SLOPE_RATIO = 5.0  # a joint is a step when the slopes on its two sides differ ≥ 5×
FLAT_TOL = 1e-12  # per-point squared residual, on values normalised to [0, 1]


def part_r2(part: tuple, slope: float, mx: float, my: float) -> float:
    """R² of the line y = my + slope·(x − mx) evaluated on one part's points only:
    R² = 1 − SSE/SST with SST = Cyy and, from the part's centred statistics,
    SSE = Cyy − 2b·Cxy + b²·Cxx + n·((my_p − my) − b·(mx_p − mx))².

    Flat part (SST ≈ 0, all values equal, a plateau of the CDF): R² is undefined; we define
    it as 1 when the line passes through the plateau exactly (SSE ≈ 0) and 0 otherwise, so
    plateaus merge with each other and never with a slope (the plateau's edge is a step)."""
    n, mxp, myp, cxx, cxy, cyy = part
    d = (myp - my) - slope * (mxp - mx)
    sse = max(cyy - 2.0 * slope * cxy + slope * slope * cxx + n * d * d, 0.0)
    if cyy <= FLAT_TOL * n:
        return 1.0 if sse <= FLAT_TOL * n else 0.0
    return 1.0 - sse / cyy


def merged_fit_score(a: tuple, b: tuple) -> float:
    """min(R²_a, R²_b) of the least-squares line fitted to a ∪ b, each R² on its own part
    (VarMRI §5.1: merge "if the R-squared value … is larger than 0.95 for both ranges under
    the new regression model"). A merged range with Cxx = 0 cannot happen (x are distinct
    percentiles), but is treated as a vertical line that fits nothing (score 0)."""
    m = merge_stats(a, b)
    if m[3] <= 0.0:
        return 0.0
    slope = m[4] / m[3]
    return min(part_r2(a, slope, m[1], m[2]), part_r2(b, slope, m[1], m[2]))


def _merged_scores(st: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised `merge_stats` + `merged_fit_score` for every adjacent pair of ranges.
    st: (R, 6) centred statistics. Returns (scores (R−1,), merged stats (R−1, 6))."""
    a, b = st[:-1], st[1:]
    na, nb = a[:, 0], b[:, 0]
    n = na + nb
    dx, dy = b[:, 1] - a[:, 1], b[:, 2] - a[:, 2]
    f = na * nb / n
    m = np.column_stack(
        [
            n,
            a[:, 1] + dx * nb / n,
            a[:, 2] + dy * nb / n,
            a[:, 3] + b[:, 3] + f * dx * dx,
            a[:, 4] + b[:, 4] + f * dx * dy,
            a[:, 5] + b[:, 5] + f * dy * dy,
        ]
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(m[:, 3] > 0, m[:, 4] / np.where(m[:, 3] > 0, m[:, 3], 1.0), 0.0)
        scores = np.minimum(_part_r2_vec(a, slope, m[:, 1], m[:, 2]), _part_r2_vec(b, slope, m[:, 1], m[:, 2]))
    scores[m[:, 3] <= 0] = 0.0
    return scores, m


def _part_r2_vec(p: np.ndarray, slope: np.ndarray, mx: np.ndarray, my: np.ndarray) -> np.ndarray:
    """Vectorised `part_r2` (same formula and flat-part rule)."""
    n, mxp, myp, cxx, cxy, cyy = p.T
    d = (myp - my) - slope * (mxp - mx)
    sse = np.maximum(cyy - 2.0 * slope * cxy + slope * slope * cxx + n * d * d, 0.0)
    flat = cyy <= FLAT_TOL * n
    r2 = 1.0 - sse / np.where(flat, 1.0, cyy)
    return np.where(flat, np.where(sse <= FLAT_TOL * n, 1.0, 0.0), r2)


def _select_merges(scores: np.ndarray, r2_min: float) -> np.ndarray:
    """Pairs to merge in one pass: candidates (score > r2_min) whose score is a local
    maximum among their neighbours; in a run of tied neighbours every other pair, so that
    no range is in two merges."""
    cand = scores > r2_min
    left = np.concatenate([[-np.inf], scores[:-1]])
    right = np.concatenate([scores[1:], [-np.inf]])
    sel = cand & (scores >= left) & (scores >= right)
    idx = np.arange(sel.size)
    run_start = np.maximum.accumulate(np.where(sel, 0, idx + 1))
    return sel & ((idx - run_start) % 2 == 0)


def fit_cdf_lines(
    sorted_values: np.ndarray, n_ranges: int = 1000, r2_min: float = 0.95, min_points: int = 5
) -> StepFit:
    """Piecewise-linear fit of an event's CDF, VarMRI §5.1.

    The CDF is taken as the quantile function: x = (rank + ½)/n (percentile), y = value,
    normalised to [0, 1] by the value span (R² is scale-free; normalising keeps the sums well
    conditioned). It is split by rank into `n_ranges` equal ranges (fewer when there are fewer
    than `min_points` values per range), a least-squares line is fitted to each, and adjacent
    ranges are merged while the merged line has R² > `r2_min` on both parts.

    Merge order (the paper leaves it open): parallel best-first. Each pass scores every
    adjacent pair (O(1) per pair from centred sufficient statistics, `merge_stats`) and merges
    all pairs whose score is a local maximum; passes repeat until no pair qualifies. Cost:
    O(R) numpy work per pass, O(log R) passes typically, on top of the caller's sort.

    Edge cases: fewer than 2·min_points values or a constant event → a single line, no joints.
    """
    v = np.asarray(sorted_values, dtype=np.float64)
    n = int(v.size)
    r = min(n_ranges, n // max(min_points, 1))
    if n == 0:
        return StepFit(0, (), np.zeros(0), np.zeros(0))
    lo, hi = float(v[0]), float(v[-1])
    if r < 2 or hi <= lo:
        return StepFit(n, (LineFit(0, n, 0.0, lo),), np.zeros(0), np.zeros(0))
    x = (np.arange(n, dtype=np.float64) + 0.5) / n
    y = (v - lo) / (hi - lo)
    starts = (np.arange(r, dtype=np.int64) * n) // r
    st = _range_stats(x, y, starts)
    while st.shape[0] > 1:
        scores, merged = _merged_scores(st)
        sel = _select_merges(scores, r2_min)
        if not sel.any():
            break
        i = np.flatnonzero(sel)
        st[i] = merged[i]
        keep = np.ones(st.shape[0], dtype=bool)
        keep[i + 1] = False
        st = st[keep]
        starts = starts[keep]
    ends = np.append(starts[1:], n)
    span = hi - lo
    lines = []
    for k in range(st.shape[0]):
        _, mx, my, cxx, cxy, _ = st[k]
        slope = cxy / cxx if cxx > 0 else 0.0
        # back to value units: y = lo + span·(my + slope·(x − mx))
        lines.append(LineFit(int(starts[k]), int(ends[k]), slope * span, lo + span * (my - slope * mx)))
    joint_ranks = ends[:-1].astype(np.int64)
    joints = joint_ranks / n
    joint_values = v[joint_ranks - 1] if joint_ranks.size else np.zeros(0)
    slopes = np.abs(np.array([ln.slope for ln in lines]))
    tiny = 1e-9 * span
    ratios = (np.maximum(slopes[:-1], slopes[1:]) + tiny) / (np.minimum(slopes[:-1], slopes[1:]) + tiny)
    xj = joints
    left = np.array([ln.intercept + ln.slope * x for ln, x in zip(lines[:-1], xj, strict=True)])
    right = np.array([ln.intercept + ln.slope * x for ln, x in zip(lines[1:], xj, strict=True)])
    rise = np.array([abs(ln.slope) * (ln.end - ln.start) / n for ln in lines])
    jumps = np.abs(right - left) / (rise[:-1] + rise[1:] + tiny) if xj.size else np.zeros(0)
    return StepFit(n, tuple(lines), joints, joint_values, ratios, jumps)


@dataclass(frozen=True)
class Threshold:
    """pThreshold of one event. method: 'step' (a CDF joint), 'fallback' (no joint below
    pTarget), 'none' (no high set: constant event or too few values)."""

    percentile: float
    value: float
    method: str


def fallback_percentile(p_target: float) -> float:
    """pThreshold when the CDF has no step below pTarget: 1 − 10·(1 − pTarget)
    (p90 for p99, p99 for p99.9), floored at 0.5. Our choice, not the paper's: the high set is
    then ten times the tail the target looks at, enough to move it if the event matters and
    small enough that removing it from an unrelated event barely moves the target."""
    return max(0.5, 1.0 - 10.0 * (1.0 - p_target))


def choose_threshold(fit: StepFit, sorted_values: np.ndarray, p_target: float) -> Threshold:
    """pThreshold: the joint closest to pTarget from below, VarMRI §5.1 ("the one whose
    percentile is smaller than pTarget and is the closest"), in three tiers:

    1. 'step': the closest joint in [MIN_STEP_PERCENTILE, pTarget] that is a step
       (`StepFit.strong`: slopes differ ≥ STEP_SLOPE_RATIO×, or a gap ≥ the lines' rise).
       On sampled data the quantile function wobbles around its
       true shape at the scale of one range, so the R² test also cuts straight stretches into
       pieces whose slopes differ by ~1.0–1.3×, with no gap; such joints are not steps, and taking one
       would put the threshold inside a real high set and cut it (our addition).
    2. 'joint': no strong step → the closest joint of any strength in that interval (the
       paper's rule as written; what smooth, step-less distributions get).
    3. 'fallback': no joint at all → `fallback_percentile`.
    'none' when the high set would be empty (constant event, or threshold = maximum).

    A joint equal to pTarget (±1e-9) is accepted: joints sit on range boundaries, and a step
    exactly at the target is the most telling one. Joints below the median are ignored: a
    "high" set holding most requests is not high. The threshold value is the largest value
    below the joint, so H = {E > value} is exactly the part of the CDF above it."""
    v = np.asarray(sorted_values)
    n = int(v.size)
    if n == 0 or v[0] == v[-1]:
        return Threshold(math.nan if n == 0 else 1.0, math.nan if n == 0 else float(v[-1]), "none")
    top = float(v[-1])
    ok = (fit.joints <= p_target + 1e-9) & (fit.joints >= MIN_STEP_PERCENTILE) & (fit.joint_values < top)
    strong = ok & fit.strong
    for mask, method in ((strong, "step"), (ok, "joint")):
        if mask.any():
            i = int(np.flatnonzero(mask)[-1])
            return Threshold(float(fit.joints[i]), float(fit.joint_values[i]), method)
    p = fallback_percentile(p_target)
    value = float(v[nearest_rank_index(n, p)])
    if value >= top:
        return Threshold(p, value, "none")
    return Threshold(p, value, "fallback")


def dequantize(sorted_counts: np.ndarray, seed: int = 0) -> np.ndarray:
    """Count events are integers, so their quantile function is a staircase: a range that
    spans k distinct counts fits a line with R² ≈ 1 − 1/k², which fails the 0.95 test
    everywhere and hides the real steps. Adding U[0, 1) to each count (then re-sorting) turns
    a tread k into a linear ramp over [k, k+1): slopes change only where the count
    distribution does, which is what step detection should see. Map a threshold found on the
    dequantized values back with floor(). (Our addition; the paper's events were lengths.)"""
    rng = np.random.default_rng(seed)
    return np.sort(np.asarray(sorted_counts, dtype=np.float64) + rng.random(sorted_counts.size))


def find_threshold(
    sorted_values: np.ndarray, p_target: float, *, discrete: bool = False, n_ranges: int = 1000, seed: int = 0
) -> tuple[Threshold, StepFit, np.ndarray]:
    """pThreshold of one event from its sorted values (§5.1): `fit_cdf_lines` then
    `choose_threshold`. Count events (`discrete`) are dequantized first and the threshold
    value floored back to an integer. Returns (threshold, fit, the values the fit saw)."""
    v = np.asarray(sorted_values, dtype=np.float64)
    if v.size == 0 or v[0] == v[-1]:
        fit = fit_cdf_lines(v, n_ranges=n_ranges)
        return choose_threshold(fit, v, p_target), fit, v
    work = dequantize(v, seed) if discrete else v
    fit = fit_cdf_lines(work, n_ranges=n_ranges)
    thr = choose_threshold(fit, work, p_target)
    if discrete and thr.method != "none":
        value = float(math.floor(thr.value))
        # A joint can land a range inside the tread of the high count itself
        # (e.g. 98% zeros, 2% exactly 1024: joint at p98.1, value 1024, empty H).
        # If the floored value's CDF level is above the joint, the step is below
        # it: step down to the next smaller observed count.
        below = int(np.searchsorted(v, value, side="right"))
        if below / v.size > thr.percentile + 1.0 / n_ranges:
            lower = int(np.searchsorted(v, value, side="left"))
            if lower > 0:
                value = float(v[lower - 1])
        thr = Threshold(thr.percentile, value, thr.method if value < v[-1] else "none")
    return thr, fit, work


def subsample(values: np.ndarray, max_n: int, seed: int = 0) -> np.ndarray:
    """Uniform random subsample (with replacement) of at most max_n values, fixed seed.
    Used for step detection on large recordings: the CDF of 1M samples locates a step to well
    within one of the 1000 ranges (each range holds ~1000 samples)."""
    if values.size <= max_n:
        return values
    idx = np.random.default_rng(seed).integers(0, values.size, size=max_n)
    return values[idx]


# -- impact (§5.1) -------------------------------------------------------------------------


def impact(latency: np.ndarray, high: np.ndarray, p_target: float, v_all: float | None = None) -> float:
    """Impact(E) = V(L) − V(L \\ H), VarMRI §5.1 (Definition: impact value).

    latency: latencies of the requests that recorded E (the multiset L);
    high: bool mask over `latency`, the requests whose E exceeds the pThreshold value (H);
    V: the nearest-rank pTarget percentile. 0 when H is empty; NaN when L is; V(∅) = 0 when
    H is all of L (removing every request removes all the tail). `v_all`, when given, is
    V(L) already computed (several events often share the same L)."""
    if latency.size == 0:
        return math.nan
    n_high = int(np.count_nonzero(high))
    if n_high == 0:
        return 0.0
    if v_all is None:
        v_all = percentile(latency, p_target)
    rest = latency[~high]
    v_rest = percentile(rest, p_target) if rest.size else 0.0
    return v_all - v_rest


def impact_sorted(sorted_latency: np.ndarray, high_latency: np.ndarray, p_target: float) -> float:
    """`impact` computed from L sorted once and the latencies of H alone: O(|H| log n).

    V(L \\ H) is the k-th smallest of L \\ H, k = ceil(p·(n − h)). It lies between L_(k) and
    L_(k+h), so only those candidates are tried: for a value x, #{L \\ H ≤ x} =
    #{L ≤ x} − #{H ≤ x} (two binary searches), and V(L \\ H) is the smallest candidate with
    #{L \\ H ≤ x} ≥ k. Same result as `impact`; used for every event of a recording."""
    n = int(sorted_latency.size)
    h = int(high_latency.size)
    if n == 0:
        return math.nan
    if h == 0:
        return 0.0
    v_all = float(sorted_latency[nearest_rank_index(n, p_target)])
    if h >= n:
        return v_all
    k = nearest_rank_index(n - h, p_target) + 1  # 1-based rank within L \ H
    hs = np.sort(high_latency)
    cand = sorted_latency[k - 1 : min(k + h, n)]
    le_all = np.searchsorted(sorted_latency, cand, side="right")
    le_high = np.searchsorted(hs, cand, side="right")
    ok = np.flatnonzero(le_all - le_high >= k)
    return v_all - float(cand[ok[0]])


# -- correlation and causality (§5.2) ------------------------------------------------------


def time_bounded_impact(latency: np.ndarray, event_ns: np.ndarray, high: np.ndarray, p_target: float) -> float:
    """Upper bound on a length event's impact: how far pTarget drops if the high
    requests had not spent the event's time.

        Impact_time(E) = V(L) - V({ l_i - e_i·[i in H] })

    where e_i is the event's length in request i. tailscope reports
    min(VarMRI §5.1 impact, Impact_time): membership in a high set cannot
    explain more of the tail than the time the event actually took (e.g. a
    timer tick of 2 µs in every long request). Documented in docs/analysis.md.
    """
    if latency.size == 0:
        return 0.0
    v_all = percentile(latency, p_target)
    cf = latency.astype(np.float64, copy=True)
    cf[high] = np.maximum(cf[high] - event_ns[high].astype(np.float64), 0.0)
    return float(v_all - percentile(cf, p_target))


def jaccard(high_a: np.ndarray, high_b: np.ndarray, both: np.ndarray | None = None) -> float:
    """Jaccard similarity |Ha ∩ Hb| / |Ha ∪ Hb| of two high sets, over the requests that
    recorded both events (`both`, a bool mask; None = all), VarMRI §5.2. (The paper calls it
    "Jaccard distance" but uses it as a correlation: 1 = same requests; we use the
    similarity.) 0 when both sets are empty."""
    if both is not None:
        high_a = high_a & both
        high_b = high_b & both
    union = int(np.count_nonzero(high_a | high_b))
    if union == 0:
        return 0.0
    return int(np.count_nonzero(high_a & high_b)) / union


def jaccard_packed(a: np.ndarray, b: np.ndarray) -> float:
    """`jaccard` over np.packbits-packed masks (8× less memory traffic; used for all pairs)."""
    union = int(np.bitwise_count(a | b).sum())
    if union == 0:
        return 0.0
    return int(np.bitwise_count(a & b).sum()) / union


def adjusted_impacts(
    impacts: dict[str, float], causes: dict[str, list[str]], similarity: dict[tuple[str, str], float]
) -> dict[str, tuple[float, str | None]]:
    """Rule-1 adjustment, VarMRI §5.2:
        Impact'(E2) = Impact(E2) − max_{E1 may cause E2} Jaccard(H1, H2) · Impact(E1).

    impacts: event → Impact; causes: E2 → [E1 that may cause it] (the causality table);
    similarity: (E1, E2) → Jaccard. Uses the raw, not adjusted, impact of E1 (as the paper).
    Only positive cause impacts are deducted. Returns E2 → (Impact', the E1 whose term was
    the max deduction, or None). Impact' may go negative in principle; it is floored at 0."""
    out: dict[str, tuple[float, str | None]] = {}
    for e2, imp in impacts.items():
        best, best_cause = 0.0, None
        for e1 in causes.get(e2, ()):
            if e1 not in impacts or not (impacts[e1] > 0):
                continue
            j = similarity.get((e1, e2), similarity.get((e2, e1), 0.0))
            d = j * impacts[e1]
            if d > best:
                best, best_cause = d, e1
        if math.isnan(imp):
            out[e2] = (imp, None)
        else:
            out[e2] = (max(imp - best, 0.0) if imp > 0 else imp, best_cause)
    return out


def proportionality_r2(child: np.ndarray, parent: np.ndarray) -> tuple[float, float]:
    """Rule 2, VarMRI §5.2: fit child = k·parent (least squares through the origin) and
    return (k, R²) with R² = 1 − Σ(c − k·p)² / Σ(c − c̄)². R² > 0.99 means the child moves in
    direct proportion to the parent, so it is not a separate cause and is dropped from the
    report. A constant child (SST = 0) gives R² = 1 when it is fitted exactly (0 = k·p),
    else 0. Empty input → (nan, nan)."""
    c = np.asarray(child, dtype=np.float64)
    p = np.asarray(parent, dtype=np.float64)
    if c.size == 0:
        return math.nan, math.nan
    spp = float(np.dot(p, p))
    k = float(np.dot(p, c)) / spp if spp > 0 else 0.0
    sse = float(np.sum((c - k * p) ** 2))
    sst = float(np.sum((c - c.mean()) ** 2))
    if sst <= 1e-12 * c.size * max(1.0, float(np.max(np.abs(c))) ** 2):
        return k, 1.0 if sse <= 1e-9 * c.size else 0.0
    return k, 1.0 - sse / sst


# -- segments (§6 methodology) -------------------------------------------------------------


def segment_ids(start_ns: np.ndarray, segment_ns: int, t0: int | None = None) -> np.ndarray:
    """Segment index of each request: floor((start − t0) / segment length), t0 = min start."""
    if start_ns.size == 0:
        return np.zeros(0, dtype=np.int64)
    base = int(start_ns.min()) if t0 is None else t0
    return ((start_ns.astype(np.int64) - base) // int(segment_ns)).astype(np.int64)


def segment_percentiles(
    latency: np.ndarray, seg: np.ndarray, qs: list[float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-segment request counts and nearest-rank percentiles of latency.

    Returns (segment ids present, counts, matrix[segment, q]). One stable counting sort by
    segment (radix for ≤ 65535 segments) then np.partition per segment: O(n) overall."""
    if latency.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, len(qs)))
    all_counts = np.bincount(seg)
    ids = np.flatnonzero(all_counts)
    counts = all_counts[ids]
    key = seg.astype(np.uint16) if all_counts.size <= 65536 else seg
    order = np.argsort(key, kind="stable")
    lat_sorted = latency[order]
    bounds = np.concatenate([[0], np.cumsum(counts)])
    out = np.empty((ids.size, len(qs)))
    for s in range(ids.size):
        out[s] = percentiles(lat_sorted[bounds[s] : bounds[s + 1]], qs)
    return ids, counts, out


def median_and_max_segment(p_target_per_segment: np.ndarray, eligible: np.ndarray) -> tuple[int, int]:
    """Indices of the median segment (its pTarget is the lower median of the eligible
    segments' pTargets) and the max segment (largest pTarget), VarMRI §6 "median-segment" and
    "max-segment". eligible: bool mask of segments with enough requests. (-1, -1) if none."""
    idx = np.flatnonzero(eligible)
    if idx.size == 0:
        return -1, -1
    vals = p_target_per_segment[idx]
    order = np.argsort(vals, kind="stable")
    med = int(idx[order[(idx.size - 1) // 2]])
    mx = int(idx[order[-1]])
    return med, mx


def default_segment_seconds(n_requests: int, duration_s: float, p_target: float, max_segments: int = 200) -> float:
    """Segment length: long enough that a segment holds at least
    max(2000, 20/(1 − pTarget)) requests (≥ 20 requests above pTarget, for a stable tail),
    and at most `max_segments` segments; rounded up to 1, 2 or 5 × 10^k seconds."""
    if n_requests <= 0 or duration_s <= 0:
        return max(duration_s, 1.0)
    need = max(2000.0, 20.0 / max(1.0 - p_target, 1e-9))
    rate = n_requests / duration_s
    s = max(need / rate, duration_s / max_segments)
    exp = math.floor(math.log10(s))
    for m in (1, 2, 5, 10):
        if m * 10.0**exp >= s - 1e-12:
            return m * 10.0**exp
    return s
