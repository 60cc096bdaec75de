"""Words for the analysis result: units, the headline sentence, the terminal summary.

Renders only what `tailscope.analysis.pipeline.analyse` returned; computes nothing new.
"""

from __future__ import annotations

import json
import math

MIN_HEADLINE_PCT = 5.0  # a cause below this share of pTarget is not called a cause


def fmt_ns(ns: float | None) -> str:
    """1234 → '1.23 µs', 2_100_000 → '2.1 ms'; three significant digits."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "n/a"
    a = abs(ns)
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if a >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def fmt_value(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return fmt_ns(value) if unit == "ns" else f"{value:.0f}"


def fmt_pct(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "n/a"
    return f"{p:.0f}%" if abs(p) >= 1 else f"{p:.1f}%"


def fmt_percentile(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "n/a"
    return "p" + f"{p * 100:.2f}".rstrip("0").rstrip(".")


def high_phrase(c: dict) -> str:
    """'Requests whose runnable wait exceeded 310 µs' / 'Requests with more than 3 page faults'."""
    if c["unit"] == "ns":
        return f"Requests whose {c['label']} exceeded {fmt_ns(c['threshold_value'])}"
    return f"Requests with more than {c['threshold_value']:.0f} {c['label']}"


def headline(result: dict) -> str:
    if result.get("empty"):
        return f"{result['message'].capitalize()}: {result['why']}."
    t = result["target_label"]
    lead = f"{t} is {fmt_ns(result['p_target_ns'])} (p50 {fmt_ns(result['p50_ns'])})."
    causes = [c for c in result["causes"] if (c.get("adjusted_impact_pct_of_target") or 0) >= MIN_HEADLINE_PCT]
    if not causes:
        top = result["causes"][0] if result["causes"] else None
        tail = (
            f" (the largest, {top['label']}, accounts for {fmt_pct(top['adjusted_impact_pct_of_target'])})"
            if top
            else ""
        )
        return (
            f"{lead} No kernel event that tailscope records explains much of it{tail}: look at the "
            "request's own code path, or at what happens outside the recorded requests."
        )
    first = causes[0]
    s = (
        f"{lead} {high_phrase(first)} explain {fmt_ns(first['adjusted_impact_ns'])} of it "
        f"({fmt_pct(first['adjusted_impact_pct_of_target'])} of {t})."
    )
    rest = causes[1:3]
    if rest:
        parts = [
            f"{c['label']} ({fmt_ns(c['adjusted_impact_ns'])}, {fmt_pct(c['adjusted_impact_pct_of_target'])})"
            for c in rest
        ]
        s += " Next comes " + (", then ".join(parts)) + "."
    return s + own_work_sentence(result)


def own_work_sentence(result: dict) -> str:
    """The slow requests' own on-CPU work, reported beside the kernel-event causes."""
    w = result.get("own_work")
    if not w or (w.get("adjusted_impact_pct_of_target") or 0) < MIN_HEADLINE_PCT:
        return ""
    return (
        f" Separately, requests whose own on-CPU work exceeded {fmt_ns(w['threshold_value'])} "
        f"explain {fmt_ns(w['adjusted_impact_ns'])} ({fmt_pct(w['adjusted_impact_pct_of_target'])}): "
        "that is the requests' own computation, not a kernel event"
        + (f" (explained in part by {w['explained_by']['label']})" if w.get("explained_by") else "")
        + "."
    )


def health_line(h: dict) -> str:
    parts = []
    s = h.get("sampling")
    if s is not None:
        parts.append(f"sampling {sampling_text(s)}")
    parts.append(f"{h['requests_read']} requests")
    if isinstance(h.get("duration_s"), (int, float)):
        parts.append(f"{h['duration_s']:g} s")
    parts.append(f"{h['counters_pct']:.0f}% with counters")
    parts.append(f"drops {h['drops_total']}" + (f" ({compact(h['drops_by_kind'])})" if h["drops_total"] else ""))
    if h.get("estimated_cost") is not None:
        parts.append(f"cost {compact(h['estimated_cost'])}")
    if h.get("mode"):
        parts.append(f"mode {h['mode']}")
    return "health: " + ", ".join(parts)


def sampling_text(s) -> str:
    """meta.json's sampling in words: the rate, who set it, and burst windows if any."""
    if not isinstance(s, dict) or not isinstance(s.get("rate_ppm"), (int, float)):
        return compact(s)
    out = f"{s['rate_ppm'] / 1e4:g}%" + (f" (set by {s['decided_by']})" if s.get("decided_by") else "")
    b = s.get("burst")
    if isinstance(b, dict):
        try:
            out += (
                f", in bursts: {int(b['windows'])} windows of {b['window_ms']:g} ms sampled at "
                f"{b['in_window_rate_ppm'] / 1e4:g}%"
            )
            if isinstance(b.get("effective_rate_ppm"), (int, float)):
                out += f" (effective rate {b['effective_rate_ppm'] / 1e4:.2g}%)"
            if b.get("cut_at_window_end"):
                out += f", {int(b['cut_at_window_end'])} requests cut at a window end"
            if b.get("failed"):
                out += f"; bursts stopped: {b['failed']}"
        except (KeyError, TypeError, ValueError):
            out += f", bursts: {compact(b)}"
    return out


def compact(v) -> str:
    """A meta value in one short line: dicts as k=v, others as JSON."""
    if isinstance(v, dict):
        return ", ".join(f"{k}={compact(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(compact(x) for x in v) + "]"
    return str(v) if not isinstance(v, str) else v


def causes_table(result: dict, top: int) -> str:
    t = result["target_label"]
    rows = [("#", "event", "impact", f"% of {t}", "adjusted", "high when above", "explained by")]
    for c in result["causes"][:top]:
        by = c.get("explained_by")
        rows.append(
            (
                str(c["rank"]),
                c["label"],
                fmt_ns(c["impact_ns"]),
                fmt_pct(c["impact_pct_of_target"]),
                fmt_ns(c["adjusted_impact_ns"]),
                f"{fmt_value(c['threshold_value'], c['unit'])} ({fmt_percentile(c['threshold_percentile'])})"
                if c["threshold_method"] != "none"
                else "no high set",
                f"{by['label']} (J={by['jaccard']:.2f})" if by and by["deduction_ns"] > 0 else "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def terminal_summary(result: dict, report_path: str | None, top: int = 5) -> str:
    out = [headline(result), ""]
    if not result.get("empty"):
        out += [causes_table(result, top), ""]
        for w in result["health"].get("warnings", []):
            out.append(f"warning: {w}")
    out.append(health_line(result["health"]))
    if report_path:
        out.append(f"report: {report_path}")
    return "\n".join(out)


def _clean(o):
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else o
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if hasattr(o, "item"):  # numpy scalar
        return _clean(o.item())
    return o


def to_json(result: dict) -> str:
    """The machine-readable result: everything but plot data; NaN → null."""
    doc = {k: v for k, v in result.items() if k != "plots"}
    doc["headline"] = headline(result)
    return json.dumps(_clean(doc), indent=2)
