"""Unit tests for every statistic in tailscope.analysis.varmri (VarMRI §5)."""

import math

import numpy as np
import pytest

from tailscope.analysis import varmri as V


# -- percentile ---------------------------------------------------------------------------
def test_percentile_nearest_rank():
    a = np.arange(1, 101)
    assert V.percentile(a, 0.99) == 99
    assert V.percentile(a, 0.5) == 50
    assert V.percentile(a, 1.0) == 100
    assert V.percentile(np.array([7]), 0.99) == 7
    assert math.isnan(V.percentile(np.array([]), 0.99))
    assert V.percentiles(a, [0.5, 0.99]) == [50, 99]


def test_percentile_matches_numpy_inverted_cdf():
    rng = np.random.default_rng(0)
    a = rng.exponential(size=10_001)
    for q in (0.5, 0.9, 0.99, 0.999):
        assert V.percentile(a, q) == np.percentile(a, q * 100, method="inverted_cdf")


# -- step detection ----------------------------------------------------------------------
def _fit(values, p=0.99):
    s = np.sort(np.asarray(values, dtype=float))
    fit = V.fit_cdf_lines(s)
    return fit, V.choose_threshold(fit, s, p)


def test_single_step():
    rng = np.random.default_rng(1)
    vals = np.concatenate([rng.uniform(0, 10, 97_000), rng.uniform(800, 900, 3_000)])
    _, thr = _fit(vals)
    assert thr.method == "step"
    assert abs(thr.percentile - 0.97) < 0.002
    assert 9 < thr.value < 11


def test_two_steps_picks_closest_below_target():
    rng = np.random.default_rng(2)
    vals = np.concatenate([rng.uniform(0, 1, 90_000), rng.uniform(100, 101, 8_000), rng.uniform(500, 501, 2_000)])
    fit, thr = _fit(vals)
    assert np.any(np.abs(fit.joints - 0.90) < 0.002) and np.any(np.abs(fit.joints - 0.98) < 0.002)
    assert abs(thr.percentile - 0.98) < 0.002 and 100 < thr.value < 102
    _, thr95 = _fit(vals, p=0.95)  # a target between the steps takes the lower step
    assert abs(thr95.percentile - 0.90) < 0.002


def test_plateau_then_tail():
    """A flat plateau (SS_yy = 0 in every range) merges into one line; its edge is the step."""
    rng = np.random.default_rng(3)
    vals = np.concatenate([np.zeros(95_000), rng.uniform(50, 100, 5_000)])
    fit, thr = _fit(vals)
    assert thr.method == "step" and thr.value == 0.0 and abs(thr.percentile - 0.95) < 0.002
    assert fit.lines[0].slope == 0.0


def test_no_step_uses_fallback():
    vals = np.linspace(0, 1000, 50_000)  # a perfectly linear CDF: one line, no joint
    fit, thr = _fit(vals)
    assert fit.joints.size == 0
    assert thr.method == "fallback" and thr.percentile == pytest.approx(0.90)
    assert V.fallback_percentile(0.999) == pytest.approx(0.99)


def test_constant_and_tiny_inputs():
    fit, thr = _fit(np.full(10_000, 5.0))
    assert fit.joints.size == 0 and thr.method == "none"
    fit, thr = _fit(np.zeros(1000))
    assert thr.method == "none"
    fit, thr = _fit([1.0, 2.0, 3.0])  # too few values for two ranges; p90 of 3 values is the max
    assert fit.joints.size == 0 and thr.method == "none"
    fit, thr = _fit([])
    assert thr.method == "none"


def test_merge_stats_is_exact():
    rng = np.random.default_rng(4)
    x, y = rng.random(300), rng.random(300)
    st = V._range_stats(x, y, np.array([0, 120]))
    m = V.merge_stats(tuple(st[0]), tuple(st[1]))
    whole = V._range_stats(x, y, np.array([0]))[0]
    assert np.allclose(m, whole)


def test_part_r2_definition():
    # perfect line → 1; flat part off the line → 0; flat part on the line → 1
    part = tuple(V._range_stats(np.arange(10.0), 2 * np.arange(10.0), np.array([0]))[0])
    assert V.part_r2(part, 2.0, part[1], part[2]) == pytest.approx(1.0)
    flat = tuple(V._range_stats(np.arange(10.0), np.full(10, 3.0), np.array([0]))[0])
    assert V.part_r2(flat, 0.0, 4.5, 3.0) == 1.0
    assert V.part_r2(flat, 1.0, 4.5, 3.0) == 0.0


def test_vectorised_scores_match_scalar():
    rng = np.random.default_rng(5)
    x = np.sort(rng.random(1000))
    y = np.sort(rng.exponential(size=1000))
    st = V._range_stats(x, y, np.arange(0, 1000, 100))
    scores, _ = V._merged_scores(st)
    for i in range(len(scores)):
        assert scores[i] == pytest.approx(V.merged_fit_score(tuple(st[i]), tuple(st[i + 1])))


def test_dequantized_counts_find_the_count_step():
    rng = np.random.default_rng(6)
    counts = np.concatenate([rng.poisson(0.2, 97_000), rng.integers(150, 250, 3_000)])
    thr, _, _ = V.find_threshold(np.sort(counts), 0.99, discrete=True)
    assert thr.method == "step" and thr.value < 150 and (counts > thr.value).sum() >= 2_900


def test_subsample_fixed_seed():
    a = np.arange(1_000_000)
    s1, s2 = V.subsample(a, 1000, 7), V.subsample(a, 1000, 7)
    assert s1.size == 1000 and np.array_equal(s1, s2)
    assert V.subsample(a[:10], 1000).size == 10


# -- impact ------------------------------------------------------------------------------
def test_impact_hand_made():
    lat = np.array([10] * 95 + [100] * 5)
    high = np.array([False] * 95 + [True] * 5)
    # p99 of all = 100; without H: p99 of 95 tens = 10 → impact 90
    assert V.impact(lat, high, 0.99) == 90
    assert V.impact(lat, np.zeros(100, bool), 0.99) == 0
    assert V.impact(lat, np.ones(100, bool), 0.99) == 100
    assert math.isnan(V.impact(np.array([]), np.array([], bool), 0.99))


def test_impact_sorted_equals_impact():
    rng = np.random.default_rng(8)
    for _ in range(30):
        n = int(rng.integers(1, 3000))
        lat = rng.integers(0, 50, n)  # ties on purpose
        high = rng.random(n) < rng.random()
        for p in (0.5, 0.9, 0.99):
            assert V.impact_sorted(np.sort(lat), lat[high], p) == V.impact(lat, high, p)


# -- Jaccard, rules ----------------------------------------------------------------------
def test_jaccard():
    a = np.array([1, 1, 0, 0, 1], bool)
    b = np.array([1, 0, 0, 1, 1], bool)
    assert V.jaccard(a, b) == pytest.approx(2 / 4)
    assert V.jaccard(a, a) == 1.0
    assert V.jaccard(np.zeros(5, bool), np.zeros(5, bool)) == 0.0
    both = np.array([1, 1, 1, 0, 0], bool)  # only requests that recorded both events count
    assert V.jaccard(a, b, both) == pytest.approx(1 / 2)
    assert V.jaccard_packed(np.packbits(a), np.packbits(b)) == V.jaccard(a, b)


def test_adjusted_impacts_rule1():
    impacts = {"irq": 100.0, "softirq": 80.0, "runnable": 50.0}
    causes = {"softirq": ["irq"], "runnable": ["irq", "softirq"]}
    sim = {("irq", "softirq"): 0.5, ("irq", "runnable"): 0.1, ("softirq", "runnable"): 0.4}
    adj = V.adjusted_impacts(impacts, causes, sim)
    assert adj["irq"] == (100.0, None)
    assert adj["softirq"] == (pytest.approx(30.0), "irq")
    # max deduction: irq 0.1·100 = 10 vs softirq 0.4·80 = 32 (raw impacts, not adjusted)
    assert adj["runnable"] == (pytest.approx(18.0), "softirq")
    # never below zero
    assert V.adjusted_impacts({"a": 10.0, "b": 5.0}, {"b": ["a"]}, {("a", "b"): 1.0})["b"][0] == 0.0


def test_proportionality_rule2():
    rng = np.random.default_rng(9)
    length = rng.exponential(1000, 5000)
    k, r2 = V.proportionality_r2(3e-3 * length, length)
    assert k == pytest.approx(3e-3) and r2 > 0.999
    _, r2 = V.proportionality_r2(rng.poisson(2, 5000), length)
    assert r2 < 0.5
    _, r2 = V.proportionality_r2(np.zeros(10), np.ones(10))
    assert r2 == 1.0


# -- segments ----------------------------------------------------------------------------
def test_segments():
    start = np.array([0, 1, 2, 10, 11, 25], dtype=np.int64) * 1_000_000_000
    seg = V.segment_ids(start, 10_000_000_000)
    assert seg.tolist() == [0, 0, 0, 1, 1, 2]
    lat = np.array([1, 2, 3, 10, 20, 5])
    ids, counts, q = V.segment_percentiles(lat, seg, [0.5, 1.0])
    assert ids.tolist() == [0, 1, 2] and counts.tolist() == [3, 2, 1]
    assert q[:, 0].tolist() == [2, 10, 5] and q[:, 1].tolist() == [3, 20, 5]
    med, mx = V.median_and_max_segment(np.array([5.0, 9.0, 1.0, 7.0]), np.array([True, True, True, False]))
    assert (med, mx) == (0, 1)
    assert V.median_and_max_segment(np.array([1.0]), np.array([False])) == (-1, -1)


def test_default_segment_seconds():
    s = V.default_segment_seconds(1_000_000, 100.0, 0.99)
    assert s in (0.5, 1.0)  # ≥ 2000 requests per segment at 10k req/s → ≥ 0.2 s; ≤ 200 segments → ≥ 0.5 s
    assert V.default_segment_seconds(10_000, 100.0, 0.999) == 200.0  # needs 20 000 per segment


def test_time_bounded_impact_caps_membership_by_time():
    """A 2 µs event in every slow request cannot explain their 1 ms: the time-bounded
    impact is the drop in p99 when the event's time is taken out of the high set."""
    rng = np.random.default_rng(3)
    lat = rng.normal(100_000, 5_000, 10_000).clip(1)
    lat[:200] += 1_000_000  # 2% slow
    ev = np.zeros_like(lat)
    ev[:200] = 2_000  # a tick in each slow request
    high = ev > 0
    membership = V.impact(lat, high, 0.99)
    bounded = V.time_bounded_impact(lat, ev, high, 0.99)
    assert membership > 900_000  # removing the slow set removes the tail
    assert 0 <= bounded <= 2_001  # but the event only took 2 µs of it
    ev[:200] = 1_000_000  # now the event is the whole excess
    assert V.time_bounded_impact(lat, ev, high, 0.99) > 900_000


def test_discrete_threshold_never_lands_on_the_high_count():
    """98% zeros and 2% exactly 1024 faults: the high set is the 1024s, not empty."""
    v = np.sort(np.r_[np.zeros(9800), np.full(200, 1024.0)])
    thr, _, _ = V.find_threshold(v, 0.99, discrete=True)
    assert thr.method != "none"
    assert thr.value < 1024
    assert np.count_nonzero(v > thr.value) == 200
