"""The VarMRI analysis of one recording: ranking, segments, time breakdown, health.

Input: the arrays of a loaded recording (`tailscope.recording.Recording`); output: one plain
dict (JSON-ready except the `plots` key, which holds lists for the HTML report). The report
and the terminal summary render only this dict. The maths lives in `varmri.py`.

Cost on n requests with R events: R nearest-rank partitions of n latencies (impact), R sorts
of ≤ `max_step_samples` values (step detection), bit-packed Jaccard for all pairs, one
counting sort by segment. About 1M requests/s/core or better; see bench/analysis.
"""

from __future__ import annotations

import math

import numpy as np

from tailscope.analysis import causality, varmri
from tailscope.analysis.events import EVENTS, EVENTS_BY_NAME, TIME_COMPONENTS, event_values, recorded_mask

MAX_STEP_SAMPLES = 1_000_000
CDF_POINTS = 400
RULE2_SAMPLES = 200_000  # the proportionality fit of rule 2 runs on a fixed-seed subsample
# An effect is reported as "explained by" its cause when the cause's deduction removes at
# least this share of the effect's raw impact (smaller deductions still apply, silently).
EXPLAINED_MIN_SHARE = 0.1


def target_label(p: float) -> str:
    """0.99 → 'p99', 0.999 → 'p99.9', 0.5 → 'p50'."""
    s = f"{p * 100:.6f}".rstrip("0").rstrip(".")
    return f"p{s}"


def parse_target(text: str) -> float:
    """'p99' → 0.99, 'p99.9' → 0.999, '0.99' → 0.99, '99.9' → 0.999, '99' → 0.99."""
    t = str(text).strip().lower()
    pct = t.startswith("p")
    try:
        x = float(t[1:] if pct else t)
    except ValueError:
        raise ValueError(f"--target {text!r}: expected p99, 0.99 or 99.9") from None
    q = x / 100.0 if (pct or x >= 1.0) else x
    if not (0.0 < q < 1.0):
        raise ValueError(f"--target {text!r}: the percentile must be between 0 and 100 (exclusive)")
    return q


def _quantile_grid(n: int) -> np.ndarray:
    """Percentiles to plot a CDF with: dense in the body and log-spaced into the tail."""
    body = np.linspace(0.0, 0.9, CDF_POINTS // 2, endpoint=False)
    floor = max(1.0 / max(n, 1), 1e-6)
    tail = 1.0 - np.logspace(-1, math.log10(floor), CDF_POINTS // 2)
    return np.unique(np.clip(np.concatenate([body, tail, [1.0]]), 0.0, 1.0))


def _cdf_points(sorted_values: np.ndarray) -> dict:
    n = sorted_values.size
    if n == 0:
        return {"value": [], "percentile": []}
    q = _quantile_grid(n)
    idx = np.clip(np.ceil(q * n).astype(np.int64) - 1, 0, n - 1)
    return {"value": sorted_values[idx].tolist(), "percentile": ((idx + 1) / n).tolist()}


# Events that measure the request's own work rather than interference.
OWN_WORK_EVENTS = frozenset({"own_cpu_ns"})


def rank_causes(
    latency: np.ndarray,
    columns: dict[str, np.ndarray],
    nulls: dict[str, np.ndarray],
    counters_valid: np.ndarray,
    p_target: float,
    v_target_all: float,
    *,
    seed: int = 0,
    max_step_samples: int = MAX_STEP_SAMPLES,
    n_ranges: int = 1000,
    with_plots: bool = True,
) -> dict:
    """Impact of every event, Rule 2 folding, Jaccard, Rule 1 adjustment, ranking.

    Returns {"causes": [...ranked...], "folded": [...], "correlations": [...], "plots": {...}}.
    `v_target_all` = V(all latencies), the denominator of every percentage."""
    n = latency.size
    per_event: dict[str, dict] = {}
    packed_high: dict[str, np.ndarray] = {}
    packed_rec: dict[str, np.ndarray] = {}
    recs: dict[str, np.ndarray] = {}
    plots: dict[str, dict] = {}
    sorted_cache: dict[bytes, np.ndarray] = {}
    for ev in EVENTS:
        if any(c not in columns for c in ev.sources):
            continue
        rec = recorded_mask(ev, counters_valid, nulls)
        n_rec = int(np.count_nonzero(rec))
        values_full = event_values(ev, columns)
        all_rec = n_rec == n
        vals = values_full if all_rec else values_full[rec]
        # Step detection on a fixed-seed uniform subsample; threshold applied to all values.
        sample = np.sort(varmri.subsample(vals, max_step_samples, seed)).astype(np.float64)
        thr, fit, _ = varmri.find_threshold(sample, p_target, discrete=not ev.is_length, n_ranges=n_ranges, seed=seed)
        if thr.method == "none":
            high = np.zeros(n, dtype=bool)
        else:
            high = values_full > thr.value
            if not all_rec:
                high &= rec
        key = b"all" if all_rec else np.packbits(rec).tobytes()
        if key not in sorted_cache:
            sorted_cache[key] = np.sort(latency if all_rec else latency[rec])
        lat_sorted = sorted_cache[key]
        imp = varmri.impact_sorted(lat_sorted, latency[high], p_target)
        imp_membership = imp
        if ev.is_length and high.any():
            # An event cannot explain more of pTarget than the time it took:
            # cap by p_target(L) - p_target(L with E's time taken out of H).
            imp = min(
                imp,
                varmri.time_bounded_impact(
                    latency if all_rec else latency[rec],
                    values_full if all_rec else values_full[rec],
                    high if all_rec else high[rec],
                    p_target,
                ),
            )
        v_rec = float(lat_sorted[varmri.nearest_rank_index(lat_sorted.size, p_target)]) if n_rec else math.nan
        high_count = int(np.count_nonzero(high))
        ev_q = varmri.percentiles(sample, [0.5, p_target]) if sample.size else [math.nan, math.nan]
        per_event[ev.name] = {
            "event": ev.name,
            "label": ev.label,
            "unit": ev.unit,
            "impact_ns": imp,
            "membership_impact_ns": imp_membership,
            "impact_pct_of_target": 100.0 * imp / v_target_all if v_target_all > 0 else math.nan,
            "threshold_value": thr.value,
            "threshold_percentile": thr.percentile,
            "threshold_method": thr.method,
            "high_count": high_count,
            "recorded_count": n_rec,
            "target_latency_of_recorded_ns": v_rec,
            "event_p50": ev_q[0],
            "event_p_target": ev_q[1],
            "step_count": int(fit.joints.size),
        }
        packed_high[ev.name] = np.packbits(high)
        packed_rec[ev.name] = np.packbits(rec)
        recs[ev.name] = rec
        if with_plots:
            plots[ev.name] = {
                **_cdf_points(sample),
                "threshold_value": thr.value,
                "threshold_percentile": thr.percentile,
                "joints": fit.joints.tolist()[:50],
            }

    # Rule 2: fold a count into its length when it is in direct proportion to it.
    folded = []
    for count, length in causality.COUNT_OF_LENGTH:
        if count not in per_event or length not in per_event:
            continue
        both = recs[count] & recs[length]
        c = columns[count][both] if not both.all() else columns[count]
        ln = event_values(EVENTS_BY_NAME[length], columns)
        ln = ln[both] if not both.all() else ln
        if c.size > RULE2_SAMPLES:
            pick = np.random.default_rng(seed + 1).integers(0, c.size, size=RULE2_SAMPLES)
            c, ln = c[pick], ln[pick]
        k, r2 = varmri.proportionality_r2(c, ln)
        # A count and the length of the same kernel event are one phenomenon:
        # the length (time) is what a slow request pays, so the count is
        # always reported under it (Rule 2 generalised; see docs/analysis.md).
        # r2 records how proportional they were.
        folded.append(
            {
                "event": count,
                "into": length,
                "k_per_ns": k,
                "r2": None if math.isnan(r2) else r2,
                "proportional": bool(not math.isnan(r2) and r2 > causality.RULE2_R2),
            }
        )
    folded_names = {f["event"] for f in folded}

    # Jaccard over requests that recorded both: (H1 ∩ R2) vs (H2 ∩ R1), bit-packed.
    names = list(per_event)
    sim: dict[tuple[str, str], float] = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ha = packed_high[a] & packed_rec[b]
            hb = packed_high[b] & packed_rec[a]
            sim[(a, b)] = sim[(b, a)] = varmri.jaccard_packed(ha, hb)

    causes_of = causality.causes_of()
    impacts = {e: d["impact_ns"] for e, d in per_event.items() if e not in folded_names}
    adjusted = varmri.adjusted_impacts(impacts, causes_of, sim)
    causes = []
    for e, (adj, by) in adjusted.items():
        d = per_event[e]
        d["adjusted_impact_ns"] = adj
        d["adjusted_impact_pct_of_target"] = 100.0 * adj / v_target_all if v_target_all > 0 else math.nan
        d["caused_by"] = [
            {
                "event": c,
                "jaccard": sim.get((c, e), 0.0),
                "deduction_ns": sim.get((c, e), 0.0) * max(impacts.get(c, 0.0), 0.0),
                "why": causality.edge_reason(c, e),
            }
            for c in causes_of.get(e, [])
            if c in impacts
        ]
        d["explained_by"] = None
        if by is not None and sim.get((by, e), 0.0) * impacts[by] >= EXPLAINED_MIN_SHARE * d["impact_ns"]:
            j = sim.get((by, e), 0.0)
            d["explained_by"] = {
                "event": by,
                "label": EVENTS_BY_NAME[by].label,
                "jaccard": j,
                "deduction_ns": j * impacts[by],
                "why": causality.edge_reason(by, e),
            }
        causes.append(d)

    def key(d: dict) -> tuple:
        a = d["adjusted_impact_ns"]
        i = d["impact_ns"]
        return (0 if a == a else 1, -(a if a == a else 0.0), -(i if i == i else 0.0))

    causes.sort(key=key)
    # The request's own on-CPU work is the baseline, not interference by a
    # kernel event: report it beside the ranking, not in it (docs/analysis.md).
    own_work = next((d for d in causes if d["event"] in OWN_WORK_EVENTS), None)
    causes = [d for d in causes if d["event"] not in OWN_WORK_EVENTS]
    for r, d in enumerate(causes, 1):
        d["rank"] = r
    correlations = sorted(
        ({"a": a, "b": b, "jaccard": j} for (a, b), j in sim.items() if a < b and j >= 0.3), key=lambda x: -x["jaccard"]
    )
    return {"causes": causes, "own_work": own_work, "folded": folded, "correlations": correlations[:20], "plots": plots}


def time_breakdown(
    latency: np.ndarray,
    columns: dict[str, np.ndarray],
    counters_valid: np.ndarray,
    v_target: float,
    p45: float,
    p55: float,
) -> dict:
    """Mean time per request in each component (own on-CPU, irq, softirq, runnable wait,
    blocked wait, and the rest of the latency that no counter covers) for slow requests
    (latency ≥ V_pTarget) and typical ones (p45 ≤ latency ≤ p55), counters-valid rows only."""
    cv = counters_valid
    groups = {"slow": cv & (latency >= v_target), "typical": cv & (latency >= p45) & (latency <= p55)}
    out = {}
    for g, m in groups.items():
        idx = np.flatnonzero(m)
        cnt = int(idx.size)
        sub = {
            c: columns[c][idx]
            for c in ("on_cpu_ns", "irq_ns", "softirq_ns", "runnable_wait_ns", "blocked_wait_ns")
            if c in columns
        }
        row = {"requests": cnt}
        total = np.zeros(cnt)
        for comp in TIME_COMPONENTS:
            v = event_values(EVENTS_BY_NAME[comp], sub).astype(np.float64) if cnt else np.zeros(0)
            total += v
            row[comp] = float(v.mean()) if cnt else math.nan
        lat = latency[idx].astype(np.float64)
        row["other_ns"] = float(np.maximum(lat - total, 0).mean()) if cnt else math.nan
        row["latency_ns"] = float(lat.mean()) if cnt else math.nan
        out[g] = row
    return out


def _drops(meta: dict) -> tuple[int, dict]:
    d = meta.get("drops")
    if isinstance(d, dict):
        by_kind = {}
        for k, v in d.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                by_kind[str(k)] = v
            elif isinstance(v, dict):  # nested {kind: {count: n}} or similar
                for k2, v2 in v.items():
                    if isinstance(v2, (int, float)) and not isinstance(v2, bool):
                        by_kind[f"{k}.{k2}"] = v2
        return int(sum(by_kind.values())), by_kind
    if isinstance(d, (int, float)) and not isinstance(d, bool):
        return int(d), {"total": int(d)}
    return 0, {}


def _find_cost(meta: dict):
    for k in ("cost", "estimated_cost", "overhead", "agent_cost"):
        if k in meta:
            return meta[k]
    return None


def health(
    meta: dict, n_rows: int, n_counters: int, kind_counts: dict[str, int], p_target: float, n_above_target: int
) -> dict:
    """Recording health: what was sampled, dropped and recorded, and what to trust."""
    drops_total, drops_by_kind = _drops(meta)
    h = {
        "sampling": meta.get("sampling"),
        "drops_total": drops_total,
        "drops_by_kind": drops_by_kind,
        "requests_recorded_meta": meta.get("requests_recorded"),
        "requests_read": n_rows,
        "requests_with_counters": n_counters,
        "counters_pct": 100.0 * n_counters / n_rows if n_rows else 0.0,
        "duration_s": meta.get("duration_s"),
        "estimated_cost": _find_cost(meta),
        "mode": meta.get("mode"),
        "target": meta.get("target"),
        "host": meta.get("host"),
        "kernel": meta.get("kernel"),
        "tailscope_version": meta.get("tailscope_version"),
        "finalised_by": meta.get("finalised_by"),
        "kinds": kind_counts,
        "requests_above_target": n_above_target,
    }
    warnings = []
    if drops_total:
        warnings.append(
            f"{drops_total} records dropped ({', '.join(f'{k}: {v}' for k, v in drops_by_kind.items())});"
            " trust the ranking only when drops are small"
        )
    if n_rows and h["counters_pct"] < 50:
        warnings.append(f"only {h['counters_pct']:.0f}% of requests carry kernel counters")
    if n_rows and n_above_target < 20:
        warnings.append(
            f"only {n_above_target} requests at or above {target_label(p_target)}: the tail is noisy; record longer"
        )
    rr = meta.get("requests_recorded")
    if isinstance(rr, int) and rr != n_rows and rr >= 0:
        warnings.append(f"meta.json says {rr} requests recorded, the Parquet parts hold {n_rows}")
    h["warnings"] = warnings
    return h


def _empty_why(meta: dict, note: str) -> str:
    parts = []
    dur = meta.get("duration_s")
    if isinstance(dur, (int, float)):
        parts.append(f"the recording lasted {dur:g} s")
    total, by_kind = _drops(meta)
    if total:
        parts.append(f"{total} records were dropped ({', '.join(f'{k}: {v}' for k, v in by_kind.items())})")
    else:
        parts.append("no drops were reported")
    if meta.get("sampling") is not None:
        parts.append(f"sampling: {meta.get('sampling')}")
    if meta.get("finalised_by") is not None:
        parts.append(f"finalised by {meta.get('finalised_by')}")
    if note:
        parts.append(note)
    return "; ".join(parts)


def analyse(
    columns: dict[str, np.ndarray],
    meta: dict,
    *,
    nulls: dict[str, np.ndarray] | None = None,
    kind_names: list[str] | None = None,
    p_target: float = 0.99,
    segment_s: float | None = None,
    kind: str | None = None,
    seed: int = 0,
    max_step_samples: int = MAX_STEP_SAMPLES,
    note: str = "",
) -> dict:
    """Full VarMRI analysis of one recording. See the module docstring."""
    nulls = dict(nulls or {})
    kind_names = list(kind_names or [])
    n_all = int(columns["latency_ns"].size)
    kind_counts: dict[str, int] = {}
    if "kind" in columns and n_all:
        counts = np.bincount(columns["kind"], minlength=len(kind_names))
        kind_counts = {
            (kind_names[i] if i < len(kind_names) else str(i)) or "(unnamed)": int(c) for i, c in enumerate(counts) if c
        }
    if kind is not None:
        if kind not in kind_names:
            present = ", ".join(sorted(kind_counts)) or "none"
            raise ValueError(f"no requests of kind {kind!r} in the recording (kinds present: {present})")
        keep = columns["kind"] == kind_names.index(kind)
        columns = {k: v[keep] for k, v in columns.items()}
        nulls = {k: v[keep] for k, v in nulls.items()}
    latency = columns["latency_ns"]
    latency = latency.view(np.int64) if latency.dtype == np.uint64 else latency.astype(np.int64)
    n = int(latency.size)
    cv = columns.get("counters_valid", np.zeros(n, dtype=bool)).astype(bool, copy=False)
    result: dict = {
        "p_target": p_target,
        "target_label": target_label(p_target),
        "kind": kind,
        "requests": n,
        "empty": n == 0,
    }
    if n == 0:
        result.update(
            {
                "message": "no requests recorded" if kind is None else f"no requests of kind {kind}",
                "why": _empty_why(meta, note),
                "headline": "",
                "causes": [],
                "own_work": None,
                "folded": [],
                "correlations": [],
                "segments": None,
                "time_breakdown": None,
                "p50_ns": None,
                "p_target_ns": None,
                "health": health(meta, 0, 0, kind_counts, p_target, 0),
                "plots": {},
            }
        )
        return result

    p45, p50, p55, v_target = varmri.percentiles(latency, [0.45, 0.5, 0.55, p_target])
    n_counters = int(np.count_nonzero(cv))
    ranked = rank_causes(latency, columns, nulls, cv, p_target, v_target, seed=seed, max_step_samples=max_step_samples)
    lat_sample = varmri.subsample(latency, MAX_STEP_SAMPLES, seed)
    plots = {"latency_cdf": _cdf_points(np.sort(lat_sample)), "events": ranked.pop("plots")}
    result.update(
        {
            "p50_ns": p50,
            "p_target_ns": v_target,
            "requests_with_counters": n_counters,
            **ranked,
            "time_breakdown": time_breakdown(latency, columns, cv, v_target, p45, p55),
            "health": health(meta, n, n_counters, kind_counts, p_target, int(np.count_nonzero(latency >= v_target))),
        }
    )
    result["segments"] = segments_analysis(
        latency, columns, nulls, cv, meta, p_target, segment_s, seed=seed, max_step_samples=max_step_samples
    )
    plots["segments"] = result["segments"].pop("series_plot", None)
    result["plots"] = plots
    return result


def segments_analysis(
    latency, columns, nulls, cv, meta, p_target, segment_s, *, seed=0, max_step_samples=MAX_STEP_SAMPLES
) -> dict:
    """VarMRI §6 methodology: cut the recording into time segments, p50/pTarget per segment,
    then rank causes in the median segment (tail vs median) and in the max segment (why the
    worst stretch is worse), and contrast the two."""
    start = columns["start_ns"]
    start = start.view(np.int64) if start.dtype == np.uint64 else start.astype(np.int64)
    t0 = int(start.min())
    span_s = (int(start.max()) - t0) / 1e9
    dur = meta.get("duration_s")
    duration = float(dur) if isinstance(dur, (int, float)) and dur > 0 else max(span_s, 1e-9)
    duration = max(duration, span_s, 1e-9)
    seg_s = float(segment_s) if segment_s else varmri.default_segment_seconds(latency.size, duration, p_target)
    seg_ns = max(int(seg_s * 1e9), 1)
    seg = varmri.segment_ids(start, seg_ns, t0)
    ids, counts, pq = varmri.segment_percentiles(latency, seg, [0.5, p_target])
    min_req = int(max(100, math.ceil(5.0 / max(1.0 - p_target, 1e-9))))
    eligible = counts >= min_req
    series = [
        {
            "start_s": float(i * seg_s),
            "requests": int(c),
            "p50_ns": float(q[0]),
            "p_target_ns": float(q[1]),
            "eligible": bool(e),
        }
        for i, c, q, e in zip(ids.tolist(), counts.tolist(), pq, eligible.tolist(), strict=True)
    ]
    out = {
        "segment_s": seg_s,
        "count": int(ids.size),
        "eligible": int(eligible.sum()),
        "min_requests": min_req,
        "series": series,
        "median": None,
        "max": None,
        "contrast": [],
        "series_plot": {
            "start_s": [s["start_s"] for s in series],
            "p50_ns": [s["p50_ns"] for s in series],
            "p_target_ns": [s["p_target_ns"] for s in series],
        },
    }
    if int(eligible.sum()) < 2:
        out["note"] = f"{int(eligible.sum())} segment(s) with ≥ {min_req} requests: no median/max segment contrast"
        return out
    med, mx = varmri.median_and_max_segment(pq[:, 1], eligible)
    seg_results = {}
    for name, s in (("median", med), ("max", mx)):
        m = seg == ids[s]
        sub_cols = {k: v[m] for k, v in columns.items()}
        sub_nulls = {k: v[m] for k, v in nulls.items()}
        lat = latency[m]
        r = rank_causes(
            lat,
            sub_cols,
            sub_nulls,
            cv[m],
            p_target,
            float(pq[s, 1]),
            seed=seed,
            max_step_samples=max_step_samples,
            with_plots=False,
        )
        seg_results[name] = r
        out[name] = {
            "index": int(s),
            "start_s": float(ids[s] * seg_s),
            "requests": int(counts[s]),
            "p50_ns": float(pq[s, 0]),
            "p_target_ns": float(pq[s, 1]),
            "causes": [_brief(c) for c in r["causes"][:5]],
        }
    med_by = {c["event"]: c for c in seg_results["median"]["causes"]}
    contrast = []
    for c in seg_results["max"]["causes"]:
        m = med_by.get(c["event"])
        if m is None:
            continue
        contrast.append(
            {
                "event": c["event"],
                "label": c["label"],
                "unit": c["unit"],
                "impact_max_ns": c["adjusted_impact_ns"],
                "impact_median_ns": m["adjusted_impact_ns"],
                "event_p_target_max": c["event_p_target"],
                "event_p_target_median": m["event_p_target"],
                "event_p50_max": c["event_p50"],
                "event_p50_median": m["event_p50"],
            }
        )
    contrast.sort(key=lambda d: -((d["impact_max_ns"] or 0) - (d["impact_median_ns"] or 0)))
    out["contrast"] = contrast[:8]
    return out


def _brief(c: dict) -> dict:
    keys = (
        "event",
        "label",
        "unit",
        "impact_ns",
        "impact_pct_of_target",
        "adjusted_impact_ns",
        "adjusted_impact_pct_of_target",
        "threshold_value",
        "threshold_percentile",
        "high_count",
    )
    return {k: c[k] for k in keys}
