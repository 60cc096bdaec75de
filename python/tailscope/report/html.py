"""The HTML report: one self-contained file (plotly.js inline, no CDN, works offline).

Renders only the dict from `tailscope.analysis.pipeline.analyse`.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from tailscope.report.ldb_html import chart_count as ldb_chart_count
from tailscope.report.ldb_html import ldb_sections
from tailscope.report.text import (
    compact,
    fmt_ns,
    fmt_pct,
    fmt_percentile,
    fmt_value,
    headline,
    health_line,
    sampling_text,
)

MAX_EVENT_CDFS = 5
COMPONENTS = (
    ("own_cpu_ns", "on-CPU (own work)"),
    ("irq_ns", "hard-irq"),
    ("softirq_ns", "softirq"),
    ("runnable_wait_ns", "runnable wait"),
    ("blocked_wait_ns", "blocked wait"),
    ("other_ns", "not covered by counters"),
)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1d2330;line-height:1.45}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #dde}
.headline{font-size:1.2em;background:#f3f6fb;border-left:4px solid #3465a4;padding:.8em 1em}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0} td,th{padding:.25em .7em;text-align:left;
border-bottom:1px solid #eee} th{background:#f7f7f9} td.num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#667} .warn{color:#a40000} .grid{display:grid;grid-template-columns:1fr 1fr;gap:1em}
"""

E = html.escape


class _Figures:
    """Embeds figures; the first one carries plotly.js inline."""

    def __init__(self) -> None:
        self.first = True
        self.count = 0

    def __call__(self, fig: go.Figure, height: int = 360) -> str:
        fig.update_layout(height=height, margin={"l": 60, "r": 20, "t": 40, "b": 50}, template="plotly_white")
        out = pio.to_html(
            fig, full_html=False, include_plotlyjs=self.first, config={"displaylogo": False, "responsive": True}
        )
        self.first = False
        self.count += 1
        return out


def _target_name(t) -> str:
    """'redis-server (pid 8784): /usr/bin/redis-server *:6399' from meta's target."""
    if not isinstance(t, dict):
        return "recording"
    args = [a for a in (t.get("cmdline") or []) if a]
    name = f"{t.get('comm') or 'process'} (pid {t.get('pid')})"
    return f"{name}: {' '.join(args)[:120]}" if args else name


def _latency_cdf(r: dict) -> go.Figure:
    d = r["plots"]["latency_cdf"]
    fig = go.Figure(
        go.Scatter(
            x=[v / 1e3 for v in d["value"]], y=d["percentile"], mode="lines", name="latency", line={"color": "#3465a4"}
        )
    )
    for label, v in (("p50", r["p50_ns"]), (r["target_label"], r["p_target_ns"])):
        fig.add_vline(x=v / 1e3, line_dash="dot", annotation_text=f"{label} {fmt_ns(v)}")
    fig.update_layout(title="Latency CDF", xaxis_title="latency (µs, log)", yaxis_title="fraction of requests")
    xs = [v / 1e3 for v in d["value"] if v > 0]
    if xs:  # explicit range: vline annotations would otherwise stretch a log axis
        lo, hi = math.log10(min(xs)), math.log10(max(max(xs), r["p_target_ns"] / 1e3))
        fig.update_xaxes(type="log", range=[lo - 0.1, hi + 0.1])
    else:
        fig.update_xaxes(type="log")
    return fig


def _segments(r: dict) -> go.Figure:
    d = r["plots"]["segments"]
    seg = r["segments"]
    fig = go.Figure()
    fig.add_scatter(x=d["start_s"], y=[v / 1e3 for v in d["p50_ns"]], name="p50", mode="lines+markers")
    fig.add_scatter(x=d["start_s"], y=[v / 1e3 for v in d["p_target_ns"]], name=r["target_label"], mode="lines+markers")
    for key, color in (("median", "#4e9a06"), ("max", "#cc0000")):
        s = seg.get(key)
        if s:
            fig.add_vline(x=s["start_s"], line_color=color, line_dash="dash", annotation_text=f"{key} segment")
    fig.update_layout(
        title=f"p50 and {r['target_label']} per {seg['segment_s']:g} s segment",
        xaxis_title="time since start (s)",
        yaxis_title="latency (µs)",
    )
    return fig


def _causes_bar(r: dict, top: int) -> go.Figure:
    cs = list(reversed(r["causes"][:top]))
    labels = [c["label"] for c in cs]
    fig = go.Figure()
    fig.add_bar(
        y=labels, x=[(c["impact_ns"] or 0) / 1e3 for c in cs], orientation="h", name="impact", marker_color="#b0c4de"
    )
    fig.add_bar(
        y=labels,
        x=[(c["adjusted_impact_ns"] or 0) / 1e3 for c in cs],
        orientation="h",
        name="adjusted impact (causes deducted)",
        marker_color="#3465a4",
    )
    fig.update_layout(
        title=f"Causes ranked by impact on {r['target_label']}",
        barmode="overlay",
        xaxis_title=f"µs of {r['target_label']}",
    )
    return fig


def _event_cdf(r: dict, c: dict) -> go.Figure:
    d = r["plots"]["events"][c["event"]]
    scale = 1e3 if c["unit"] == "ns" else 1.0
    unit = "µs" if c["unit"] == "ns" else "count"
    fig = go.Figure(go.Scatter(x=[v / scale for v in d["value"]], y=d["percentile"], mode="lines", name=c["label"]))
    if c["threshold_method"] != "none":
        fig.add_vline(
            x=c["threshold_value"] / scale,
            line_color="#cc0000",
            line_dash="dash",
            annotation_text=f"threshold {fmt_value(c['threshold_value'], c['unit'])} "
            f"({fmt_percentile(c['threshold_percentile'])})",
        )
    fig.update_layout(
        title=f"{c['label']}: CDF and high threshold",
        xaxis_title=f"{c['label']} ({unit})",
        yaxis_title="fraction of requests",
        showlegend=False,
    )
    return fig


def _breakdown(r: dict) -> go.Figure:
    tb = r["time_breakdown"]
    groups = [("typical (p45–p55)", tb["typical"]), (f"slow (≥ {r['target_label']})", tb["slow"])]
    fig = go.Figure()
    for key, label in COMPONENTS:
        fig.add_bar(x=[g for g, _ in groups], y=[(row.get(key) or 0) / 1e3 for _, row in groups], name=label)
    fig.update_layout(barmode="stack", title="Where the time went (mean per request)", yaxis_title="µs")
    return fig


def _own_work(r: dict) -> str:
    w = r.get("own_work")
    if not w:
        return ""
    by = w.get("explained_by")
    return (
        f"<p><b>Own work</b> (not ranked: it is the requests' own computation, not a kernel "
        f"event): requests whose on-CPU own work exceeded {E(fmt_ns(w['threshold_value']))} "
        f"explain {E(fmt_ns(w['adjusted_impact_ns']))} "
        f"({fmt_pct(w['adjusted_impact_pct_of_target'])} of {E(r['target_label'])})"
        + (f", in part because of {E(by['label'])}" if by else "")
        + ". Without a hardware PMU tailscope cannot split it further (instructions, cache misses).</p>"
    )


def _causes_table(r: dict, top: int) -> str:
    t = r["target_label"]
    head = (
        "<tr><th>#</th><th>event</th><th>impact</th><th>% of " + E(t) + "</th><th>adjusted</th>"
        "<th>adj. %</th><th>high when above</th><th>high / recorded</th><th>explained by</th></tr>"
    )
    rows = []
    for c in r["causes"][:top]:
        by = c.get("explained_by")
        note = ""
        if by and by["deduction_ns"] > 0:
            note = (
                f"{E(by['label'])}: Jaccard {by['jaccard']:.2f}, −{E(fmt_ns(by['deduction_ns']))}"
                f"<br><span class=muted>{E(by['why'])}</span>"
            )
        thr = (
            "no high set"
            if c["threshold_method"] == "none"
            else f"{E(fmt_value(c['threshold_value'], c['unit']))} ({fmt_percentile(c['threshold_percentile'])}"
            f"{', fallback' if c['threshold_method'] == 'fallback' else ''})"
        )
        rows.append(
            f"<tr><td>{c['rank']}</td><td>{E(c['label'])} <span class=muted>{E(c['event'])}</span></td>"
            f"<td class=num>{E(fmt_ns(c['impact_ns']))}</td><td class=num>{fmt_pct(c['impact_pct_of_target'])}</td>"
            f"<td class=num>{E(fmt_ns(c['adjusted_impact_ns']))}</td>"
            f"<td class=num>{fmt_pct(c['adjusted_impact_pct_of_target'])}</td><td>{thr}</td>"
            f"<td class=num>{c['high_count']} / {c['recorded_count']}</td><td>{note}</td></tr>"
        )
    folded = "".join(
        f"<li>{E(f['event'])} is reported under {E(f['into'])}: the count of the same kernel event"
        + _proportionality(f)
        + "</li>"
        for f in r.get("folded", [])
    )
    return f"<table>{head}{''.join(rows)}</table>" + (
        f"<p class=muted>Not ranked separately:</p><ul>{folded}</ul>" if folded else ""
    )


def _proportionality(f: dict) -> str:
    """How the count tracked the time. A fit worse than a constant has a
    negative R², which reads like a bug; say it in words instead."""
    r2 = f.get("r2")
    if r2 is None:
        return ""
    if f.get("proportional"):
        return f" (count and time proportional, R² = {r2:.2f})"
    return " (count and time not proportional" + (f", R² = {r2:.2f})" if r2 >= 0 else ")")


def _segments_html(r: dict) -> str:
    seg = r["segments"]
    t = r["target_label"]
    if not seg.get("median"):
        return f"<p class=muted>{E(seg.get('note', ''))}</p>"
    parts = []
    for key, title in (("median", "Median segment (tail vs median)"), ("max", "Max segment (the worst stretch)")):
        s = seg[key]
        items = "".join(
            f"<li>{E(c['label'])}: {E(fmt_ns(c['adjusted_impact_ns']))} "
            f"({fmt_pct(c['adjusted_impact_pct_of_target'])} of its {E(t)})</li>"
            for c in s["causes"][:3]
        )
        parts.append(
            f"<div><b>{title}</b> at {s['start_s']:g} s: {s['requests']} requests, p50 "
            f"{E(fmt_ns(s['p50_ns']))}, {E(t)} {E(fmt_ns(s['p_target_ns']))}<ol>{items}</ol></div>"
        )
    rows = "".join(
        f"<tr><td>{E(c['label'])}</td><td class=num>{E(fmt_ns(c['impact_median_ns']))}</td>"
        f"<td class=num>{E(fmt_ns(c['impact_max_ns']))}</td>"
        f"<td class=num>{E(fmt_value(c['event_p_target_median'], c['unit']))}</td>"
        f"<td class=num>{E(fmt_value(c['event_p_target_max'], c['unit']))}</td></tr>"
        for c in seg["contrast"][:5]
    )
    contrast = (
        f"<table><tr><th>event</th><th>impact, median seg.</th><th>impact, max seg.</th>"
        f"<th>event {E(t)}, median seg.</th><th>event {E(t)}, max seg.</th></tr>{rows}</table>"
    )
    return (
        f"<p>{seg['count']} segments of {seg['segment_s']:g} s ({seg['eligible']} with ≥ "
        f"{seg['min_requests']} requests).</p><div class=grid>{''.join(parts)}</div>"
        f"<p>What differs between the max and the median segment:</p>{contrast}"
    )


def _health_html(h: dict, r: dict) -> str:
    rows = [
        ("sampling", sampling_text(h.get("sampling"))),
        ("drops", f"{h['drops_total']}" + (f" ({compact(h['drops_by_kind'])})" if h["drops_by_kind"] else "")),
        ("requests", f"{h['requests_read']} read; meta.json says {h.get('requests_recorded_meta')}"),
        ("with kernel counters", f"{h['counters_pct']:.1f}%"),
        ("duration", f"{h.get('duration_s')} s"),
        (
            "estimated cost",
            compact(h["estimated_cost"]) if h.get("estimated_cost") is not None else "not in meta.json (unknown)",
        ),
        (
            "mode",
            f"{h.get('mode')} ({'runtime markers' if h.get('mode') == 'marker' else 'inferred from syscalls'})"
            if h.get("mode")
            else "unknown",
        ),
        ("target", compact(h.get("target"))),
        ("kinds", compact(h.get("kinds") or {})),
        ("host / kernel", f"{h.get('host')} / {h.get('kernel')}"),
        ("finalised by", compact(h.get("finalised_by"))),
        (f"requests ≥ {r['target_label']}", str(h.get("requests_above_target"))),
    ]
    body = "".join(f"<tr><th>{E(k)}</th><td>{E(str(v))}</td></tr>" for k, v in rows)
    warns = "".join(f"<p class=warn>⚠ {E(w)}</p>" for w in h.get("warnings", []))
    return f"{warns}<table>{body}</table>"


HOW_TO_READ = """
<p>Each request carries the kernel events that happened while it ran: time spent runnable but
not running (preempted, or woken and waiting for a CPU), blocked (sleeping on a lock or I/O),
in hard irqs and softirqs on its CPU, its own on-CPU work, page faults and migrations.</p>
<p>For each event, tailscope finds a <b>threshold</b> where the event's CDF steps (VarMRI §5.1).
The requests above it form the event's <b>high set</b>. The <b>impact</b> is how much the tail
percentile would drop without them: impact = V(all requests) − V(requests outside the high set).
It is an estimate of what optimising the event away could gain, with no model of how events
add up.</p>
<p>Kernel events cause each other (a hard irq raises a softirq; a preemption shows as a
runnable wait). When a likely cause and its effect are high in the same requests, the
<b>adjusted impact</b> subtracts the cause's share from the effect (overlap measured by the
Jaccard index of the two high sets) and the row says what it is <b>explained by</b>. Rank by
adjusted impact; look at the top row first.</p>
<p>Trust a ranking only when drops are zero or small and enough requests lie above the target
percentile (see Recording health). Segments show whether the tail is steady over time; the max
segment says what is different when it is worst.</p>
"""


def render_html(result: dict, top: int = 10) -> str:
    r = result
    h = r["health"]
    title = f"tailscope report: {_target_name(h.get('target'))}"
    if r.get("empty"):
        body = (
            f"<div class=headline>{E(r['message'])}</div><p>{E(r['why'])}.</p>"
            f"<h2>Recording health</h2>{_health_html(h, r)}"
        )
        return _page(title, body)
    fig = _Figures()
    events = [c for c in r["causes"][:MAX_EVENT_CDFS] if c["event"] in r["plots"]["events"]]
    body = [
        f"<div class=headline>{E(headline(r))}</div>",
        f"<p class=muted>{r['requests']} requests"
        f"{' of kind ' + E(r['kind']) if r.get('kind') else ''}; target {E(r['target_label'])}; "
        f"{E(health_line(h))}</p>",
        "<h2>Causes of the tail, ranked</h2>",
        _causes_table(r, top),
        _own_work(r),
        fig(_causes_bar(r, top)),
        "<h2>Latency</h2>",
        fig(_latency_cdf(r)),
        "<h2>Over time</h2>",
        fig(_segments(r)),
        _segments_html(r),
        "<h2>Where slow requests' time went</h2>",
        fig(_breakdown(r)),
        "<h2>Top events: CDF and threshold</h2>",
        *[fig(_event_cdf(r, c), height=300) for c in events],
        *ldb_sections(r.get("ldb"), fig),
        "<h2>Recording health</h2>",
        _health_html(h, r),
        "<h2>How to read this</h2>",
        HOW_TO_READ,
    ]
    return _page(title, "\n".join(body))


def _page(title: str, body: str) -> str:
    return (
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{E(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>{E(title)}</h1>{body}</body></html>"
    )


def write_report(result: dict, path: str | Path, top: int = 10) -> Path:
    path = Path(path)
    path.write_text(render_html(result, top=top), encoding="utf-8")
    return path


def expected_chart_count(result: dict) -> int:
    """How many plotly charts render_html draws (for the browser test)."""
    if result.get("empty"):
        return 0
    events = [c for c in result["causes"][:MAX_EVENT_CDFS] if c["event"] in result["plots"]["events"]]
    return 4 + len(events) + ldb_chart_count(result.get("ldb"))
