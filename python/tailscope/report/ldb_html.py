"""HTML sections for function-level latency (LDB); renders only `analysis.ldb.analyse_ldb`'s dict.

Sections: functions ranked by what they add to slow requests, per-(function, caller)
percentiles, timelines of the slowest requests with their lock holders, a slow-vs-typical
flame view (icicles), and the observer's achieved granularity.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

from tailscope.report.text import fmt_ns

E = html.escape
MAX_TIMELINES = 3
KIND_COLORS = {
    "request": "#babdb6",
    "function": "#3465a4",
    "lock-wait": "#cc0000",
    "lock-hold": "#f57900",
    "holder-function": "#c17d11",
}


def _ranking_table(r: dict) -> str:
    c = r["contribution"]
    rows = []
    for x in r["ranking"][:15]:
        share = x.get("share_of_slow")
        rows.append(
            f"<tr><td>{E(x['name'])}</td><td class=muted>{E(x.get('where') or '')}</td>"
            f"<td class=num>{E(fmt_ns(x['slow_mean_ns']))}</td>"
            f"<td class=num>{E(fmt_ns(x['typical_mean_ns']))}</td>"
            f"<td class=num><b>{E(fmt_ns(x['contribution_ns']))}</b></td>"
            f"<td class=num>{'' if share is None else f'{100 * share:.0f}%'}</td></tr>"
        )
    head = (
        f"<p>{c.get('slow_n', 0)} slow requests (≥ {E(fmt_ns(c.get('threshold_ns')))}) against "
        f"{c.get('typical_n', 0)} typical ones (p45–p55). Time in a function counts on the request's "
        f"own thread, on threads it was handed to, and on the thread that held a lock it waited for. "
        f"Functions that enclose the whole request (main, event loops) are left out.</p>"
    )
    return head + (
        "<table id=ldb-ranking><tr><th>function</th><th>where</th><th>slow (mean)</th>"
        "<th>typical (mean)</th><th>added by slow</th><th>share of slow latency</th></tr>" + "".join(rows) + "</table>"
    )


def _function_table(r: dict) -> str:
    rows = []
    for x in r["functions"][:20]:
        rows.append(
            f"<tr><td>{E(x['name'])}</td><td>{E(x['caller_name'])}</td><td class=num>{x['count']}</td>"
            + "".join(f"<td class=num>{E(fmt_ns(x[k]))}</td>" for k in ("p50_ns", "p99_ns", "p999_ns", "p9999_ns"))
            + f"<td class=muted>{E(x.get('where') or '')}</td></tr>"
        )
    return (
        "<table id=ldb-functions><tr><th>function</th><th>caller</th><th>calls</th><th>p50</th><th>p99</th>"
        "<th>p99.9</th><th>p99.99</th><th>where</th></tr>" + "".join(rows) + "</table>"
        "<p class=muted>Calls shorter than the observer's scan period are mostly not seen (LDB records "
        "calls whose frames outlive a scan); latency is wall-clock and inclusive.</p>"
    )


def _timeline_fig(tl: dict) -> go.Figure:
    t0 = tl["start_ns"]
    lanes: dict[tuple[int, int], str] = {}
    fig = go.Figure()
    by_kind: dict[str, list] = {}
    for e in tl["events"]:
        depth = max(e.get("depth", -1), -1)
        lane = f"tid {e['tid']}" + ("" if depth < 0 else f" · d{depth}")
        if e["kind"] in ("lock-wait", "lock-hold"):
            lane = f"tid {e['tid']} · lock"
        lanes[(e["tid"], depth if e["kind"] not in ("lock-wait", "lock-hold") else -2)] = lane
        by_kind.setdefault(e["kind"], []).append((lane, e))
    order = [lanes[k] for k in sorted(lanes, key=lambda k: (k[0] != tl["tid"], k[0], k[1]))]
    for kind, items in by_kind.items():
        fig.add_bar(
            y=[lane for lane, _ in items],
            x=[max(e["end_ns"] - e["start_ns"], 1) / 1e6 for _, e in items],
            base=[(e["start_ns"] - t0) / 1e6 for _, e in items],
            orientation="h",
            name=kind,
            marker_color=KIND_COLORS.get(kind, "#888"),
            text=[e["name"] for _, e in items],
            textposition="inside",
            insidetextanchor="start",
            hovertext=[f"{e['name']} ({fmt_ns(e['end_ns'] - e['start_ns'])})" for _, e in items],
            hoverinfo="text",
        )
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(order)))
    fig.update_layout(
        title=f"Request {tl['request_id']} on tid {tl['tid']}: {fmt_ns(tl['latency_ns'])}",
        xaxis_title="ms since the request began",
        barmode="overlay",
        legend_orientation="h",
    )
    return fig


def _holders(r: dict) -> str:
    if not r["holders"]:
        return ""
    items = []
    seen = set()
    for h in r["holders"]:
        key = (h["request_id"], h["holder_tid"], h["mutex"])
        if key in seen:
            continue
        seen.add(key)
        fns = ", ".join(h["holder_functions"][:6]) or "no instrumented function seen"
        items.append(
            f"<li>request {h['request_id']} (tid {h['waiter_tid']}) waited for mutex "
            f"<code>0x{h['mutex']:x}</code>, held by <b>tid {h['holder_tid']}</b> for "
            f"{E(fmt_ns(h['hold_ns']))} in <b>{E(h['holder_function'] or '?')}</b> ({E(fns)})</li>"
        )
    return "<p><b>Lock holders</b> in these requests:</p><ul id=ldb-holders>" + "".join(items[:12]) + "</ul>"


def _icicle(fl: dict, title: str, color: str) -> go.Figure:
    ids = [str(i) for i in fl["ids"]]
    parents = ["" if p == 0 else str(p) for p in fl["parents"]]
    fig = go.Figure(
        go.Icicle(
            ids=ids,
            labels=fl["labels"],
            parents=parents,
            values=fl["values_us"],
            branchvalues="total",
            marker_colors=[color] * len(ids),
            hovertemplate="%{label}: %{value:.1f} µs per request<extra></extra>",
            tiling_orientation="v",
        )
    )
    fig.update_layout(title=title)
    return fig


def _observer(r: dict) -> tuple[go.Figure, str]:
    o = r.get("observer") or {}
    cfg = r.get("config") or {}
    hist = o.get("period_hist_ns") or []
    xs = [f"{(1 << i) / 1e3:g}–{(1 << (i + 1)) / 1e3:g} µs" for i, n in enumerate(hist) if n]
    ys = [n for n in hist if n]
    fig = go.Figure(go.Bar(x=xs, y=ys, marker_color="#3465a4"))
    fig.update_layout(
        title="Observer scan period (histogram of passes)", yaxis_type="log", yaxis_title="passes", xaxis_title="period"
    )
    checks = sum(o.get(k, 0) for k in ("fast_path", "full_walks", "invalid", "seqlock_discards", "dte_discards"))

    def pct(k: str) -> str:
        return f"{100 * o.get(k, 0) / checks:.2f}%" if checks else "–"

    mode = "busy-poll" if cfg.get("busy_poll") else f"throttled to {fmt_ns(cfg.get('period_ns'))}"
    rows = "".join(
        f"<tr><td>{E(label)}</td><td class=num>{o.get(k, 0)}</td><td class=num>{pct(k)}</td></tr>"
        for k, label in (
            ("fast_path", "fast path (unchanged)"),
            ("full_walks", "full walks"),
            ("invalid", "invalid (writer mid-update)"),
            ("seqlock_discards", "seqlock discards (torn copy)"),
            ("dte_discards", "double-time-error discards (Shim §3.4.1)"),
        )
    )
    table = (
        f"<p>Scan {E(mode)}; achieved period p50 ≤ {E(fmt_ns(o.get('period_p50_ns')))}, "
        f"p99 ≤ {E(fmt_ns(o.get('period_p99_ns')))}, max {E(fmt_ns(o.get('period_max_ns')))} over "
        f"{o.get('passes', 0)} passes. A call's latency is within about one period.</p>"
        f"<table id=ldb-observer><tr><th>slot check</th><th>count</th><th>share</th></tr>{rows}</table>"
        f"<p class=muted>Calls deeper than the shadow stack: {o.get('truncated', 0)}; frames dropped to "
        f"resynchronise (longjmp, exceptions): {o.get('resyncs', 0)}; calls not recorded because a signal "
        f"handler interrupted a hook: {o.get('skipped', 0)}; calls open at thread exit or at the end: "
        f"{o.get('unterminated', 0)}; lock/request events lost to full rings: {o.get('event_ring_full', 0)}; "
        f"corrupt events: {o.get('corrupt_events', 0)}.</p>"
        f"{_priority(r.get('priority') or {})}"
    )
    return fig, table


def _priority(p: dict) -> str:
    """What ring pressure did to the agent's idle priority (agent meta.json `ldb.priority`)."""
    if not p.get("idle"):
        return ""
    n, secs = int(p.get("raised_for_ring_pressure") or 0), float(p.get("raised_s") or 0.0)
    if not n:
        return "<p class=muted>The agent ran at idle priority (SCHED_IDLE) throughout.</p>"
    return (
        f"<p class=warn>The target's rings filled, so the agent left idle priority {n} time(s), "
        f"{secs:.1f} s in all, rather than drop records: the target's latency in those spans "
        "includes the agent's CPU.</p>"
    )


def ldb_sections(r: dict, fig) -> list[str]:
    """HTML chunks for the report body; `fig` embeds a plotly figure (the report's _Figures)."""
    if not r:
        return []
    out = [
        f"<h2 id=ldb>Functions (LDB)</h2><p>{r['calls']} calls on {r['threads']} threads; "
        f"{r['lock_episodes']} lock waits/holds above the threshold.</p>"
    ]
    for w in r.get("warnings", []):
        out.append(f"<p class=warn>warning: {E(w)}</p>")
    feats = r.get("runtime_features") or {}
    if feats and not feats.get("fn_hooks"):
        out.append(
            "<p class=warn>No instrumented function ran in the target: build it with "
            "<code>tailscope flags</code> (-finstrument-functions).</p>"
        )
    out += [
        "<h3>What slow requests spent their time in</h3>",
        _ranking_table(r),
        "<h3>Per-function latency</h3>",
        _function_table(r),
        "<h3>Slowest requests: timelines</h3>",
        _holders(r),
    ]
    for tl in r["timelines"][:MAX_TIMELINES]:
        lanes = len({(e["tid"], e.get("depth")) for e in tl["events"]})
        out.append(fig(_timeline_fig(tl), height=max(260, 60 + 28 * lanes)))
    out.append(
        "<h3>Slow against typical requests (flame view)</h3><p class=muted>Mean time per request in each "
        "function, laid out under its most common caller; lock waits as [lock wait]. Compare the "
        "widths.</p><div class=grid>"
    )
    out.append(fig(_icicle(r["flame"]["slow"], "slow requests", "#cc6666"), height=420))
    out.append(fig(_icicle(r["flame"]["typical"], "typical requests", "#6688cc"), height=420))
    out.append("</div><h3>Observer granularity</h3>")
    ofig, otable = _observer(r)
    out += [fig(ofig, height=300), otable]
    return out


def chart_count(r: dict) -> int:
    return 0 if not r else min(len(r["timelines"]), MAX_TIMELINES) + 3
