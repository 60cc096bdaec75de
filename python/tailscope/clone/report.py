"""The validation report: one self-contained HTML file and the error table (Markdown/terminal).

Renders what validate.validate() returned; computes nothing but the presentation.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

NATIVE_ROWS = [
    ("throughput_rps", "throughput (req/s)"),
    ("latency_avg_us", "avg latency (µs)"),
    ("latency_p95_us", "p95 latency (µs)"),
    ("latency_p99_us", "p99 latency (µs)"),
    ("user_cpu_us_per_request", "user CPU per request (µs)"),
    ("sys_cpu_us_per_request", "sys CPU per request (µs)"),
    ("ctx_switches_per_request", "context switches per request"),
    ("page_faults_per_request", "page faults per request"),
]
SIM_ROWS = [
    ("I1_miss_rate", "I1 miss rate"),
    ("D1_miss_rate", "D1 miss rate"),
    ("LL_miss_rate", "LL miss rate"),
    ("branch_mispredict_rate", "branch mispredict rate"),
    ("instructions_per_request", "instructions per request"),
    ("IL_misses_per_request", "LL misses per request, code side"),
    ("DL_misses_per_request", "LL misses per request, data side"),
]
TARGET_LABELS = {
    "I1_miss_rate": "simulated L1i miss rate",
    "D1_miss_rate": "simulated L1d miss rate",
    "LL_miss_rate": "simulated LL miss rate",
    "branch_mispredict_rate": "branch mispredictions",
    "syscall_mix": "syscall mix per request",
    "net_bytes_per_request": "network bytes per request",
    "instructions_per_request": "instructions per request",
    "latency_avg_us": "avg latency below saturation",
    "latency_p99_us": "p99 latency below saturation",
}


def _fmt(v: float) -> str:
    if v is None:
        return "–"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 0.01:
        return f"{v:.3f}"
    if v and abs(v) < 0.0001:  # LL miss rates (~1e-6): three significant digits, not 0.00000
        return f"{v:.3g}"
    return f"{v:.5f}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _needs(u: dict) -> str:
    """How many windows would judge an unjudged simulated row (`validate.windows_needed`)."""
    n = u.get("windows_needed")
    return f", about {n} windows a side would judge it (--sim-windows {n})" if isinstance(n, int) else ""


def holds_text(row: dict) -> str:
    """yes / no / cannot be judged, with the rows whose original varied more than the limit."""
    if row.get("holds") is False:
        word = "no"
    elif row.get("holds"):
        word = "yes"
    else:
        word = "cannot be judged" if row.get("max_judged_error") is None else "yes where judged"
    un = row.get("unjudged") or []
    if un:
        word += (
            " (not judged: "
            + "; ".join(f"{u['where']}, the original's own spread {_pct(u['original_spread'])}{_needs(u)}" for u in un)
            + ")"
        )
    return word


def _geometry(arg: str) -> tuple[int, int, int]:
    """A valgrind cache description "size,ways,line" -> (size, ways, sets)."""
    size, ways, line = (int(x) for x in arg.split(","))
    return size, ways, size // max(1, ways * line)


def held_out_note(configs: dict, prof: dict, tuning: dict | None = None) -> str:
    """How close the held-out hierarchy's L1s lie to the geometries the profile's sweeps simulated
    (the octave sizes, and since session 19 each bin's mid size: workingset.mid_sizes). With a
    finer sweep, B's D1 tests the clone between profiled sizes, not beyond them; said, not hidden.
    "" when the profile holds no sweep sizes (a synthetic profile)."""
    from math import log2

    from .workingset import cache_arg, mid_cache_arg, mid_sizes

    sizes = next((b["ws_sizes"] for b in (prof.get("body") or {}).values() if b.get("ws_sizes")), None)
    if not isinstance(sizes, list) or "B" not in configs:
        return ""
    sizes = [s for s in sizes if isinstance(s, int) and s >= 64]  # (a note, not a check: skip the odd)
    if not sizes:
        return ""
    swept = {_geometry(cache_arg(s)) for s in sizes}
    if any(b.get("D_split") is not None for b in prof["body"].values()):  # a profile with the mid-bin sweep
        swept |= {_geometry(mid_cache_arg(m)) for m in mid_sizes(sizes)}
    out = []
    for level in ("I1", "D1"):
        if level not in configs["B"]:
            continue
        try:
            size, ways, sets = _geometry(configs["B"][level])
        except (ValueError, AttributeError):  # not "size,ways,line": say nothing rather than guess
            continue
        if size <= 0:
            continue
        near = min(swept, key=lambda g: (abs(log2(g[0] / size)), abs(g[1] - ways)))
        dist = abs(log2(near[0] / size))
        where = "has the size of" if dist < 1e-9 else f"lies {dist:.2f} octave from"
        out.append(
            f"B's {level} ({size // 1024} KiB, {ways} ways, {sets} sets) {where} the nearest profiled one "
            f"({near[0] // 1024} KiB, {near[1]} ways, {near[2]} sets)"
        )
    if not out:
        return ""
    hist = (tuning or {}).get("history") or []
    from .tune import HALF_I1_KEY, MID_D1_KEY, UP_D1_KEY, half_i1_config, mid_d1_config, up_d1_config

    if any(isinstance(h, dict) and HALF_I1_KEY in (h.get("metrics") or {}) for h in hist):
        size, ways, sets = _geometry(half_i1_config()["I1"])
        tuned = (
            f"The tuning loop matched the I1 at A and at its second point, {size // 1024} KiB with {ways} ways "
            f"({sets} sets), chosen after B's I1 row had failed"
        )
        if any(isinstance(h, dict) and MID_D1_KEY in (h.get("metrics") or {}) for h in hist):
            size, ways, sets = _geometry(mid_d1_config()["D1"])
            tuned += (
                f", and the D1 at A and at the profile's mid-bin point {size // 1024} KiB with {ways} ways "
                f"({sets} sets), chosen after B's D1 rows had failed"
            )
            if any(isinstance(h, dict) and UP_D1_KEY in (h.get("metrics") or {}) for h in hist):
                size, ways, sets = _geometry(up_d1_config()["D1"])
                tuned += f" (and at {size // 1024} KiB with {ways} ways, {sets} sets, in that bin's upper part)"
        tuned += "; nothing was run at B before this validation."
    else:
        tuned = "Nothing is tuned at B."
    return "; ".join(out) + ". " + tuned


def windows_note(res: dict) -> str:
    """How many callgrind windows each side pooled per hierarchy (`clone-report --sim-windows`;
    auto runs more while the original's own spread leaves a row unjudged). "" without any."""
    sim = res.get("simulated") or {}
    n = {cfg: len((sides.get("original") or {}).get("runs") or []) for cfg, sides in sim.items()}
    if not any(n.values()):
        return ""
    out = "each side pooled " + ", ".join(f"{v} windows at {cfg}" for cfg, v in n.items()) + "."
    before = len(((sim.get("A") or {}).get("original") or {}).get("profile_runs") or [])
    if before:
        # (validate.loop_windows, session 42)
        out += (
            f" The original's spread at A also takes its deviation from its {before} windows there before the "
            "validation (the profile's and, since session 42, the tuning loop's; not its figure: the clone was "
            "tuned to them)."
        )
    return out


def host_note(res: dict) -> str:
    """How busy the machine was during the timed runs (validate.HOST_BUSY, session 21): the
    median share of one CPU that other processes and the hypervisor's steal took per kept run,
    the largest takers, how many runs were repeated, and which sessions kept a busy run. ""
    for results from before session 21 (no host figures)."""
    from .validate import HOST_BUSY, HOST_STEAL, disturbed

    kept, repeated, takers, stuck = [], 0, {}, []
    for lvl, row in (res.get("levels") or {}).items():
        for side in ("original", "clone"):
            s = row.get(side) or {}
            runs = [r for r in s.get("runs", []) if isinstance(r.get("host_other_cpu"), (int, float))]
            kept += [r["host_other_cpu"] for r in runs]
            repeated += len(s.get("busy_runs") or []) + sum(disturbed(r) for r in runs)
            for r in runs + list(s.get("busy_runs") or []):
                for name, sec in r.get("host_top") or []:
                    takers[name] = takers.get(name, 0.0) + float(sec)
            if s.get("host_busy"):
                stuck.append(f"{side} at {lvl} load")
    if not kept:
        return ""
    kept.sort()
    med = kept[len(kept) // 2]
    top = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(takers.items(), key=lambda kv: -kv[1])[:3])
    out = (
        f"other processes and the hypervisor's steal took a median {100 * med:.1f}% of one CPU per kept timed "
        f"run (most over all runs: {top or 'none'}); {repeated} run(s) took more than {100 * HOST_BUSY:.0f}%, "
        f"or had more than {100 * HOST_STEAL:.1f}% stolen by the hypervisor, and were repeated."
    )
    if stuck:
        out += " The extra tries ran out, and a busy run was kept, for: " + ", ".join(stuck) + "."
    out += stall_note(res)
    idle = idle_note(res)
    return f"{idle} {out[0].upper()}{out[1:]}" if idle else out


def stall_note(res: dict) -> str:
    """The load generator's own stalls over the kept timed runs (validate.STALL_US, session 31): how
    many, and the share of replies they disturbed, which the latencies leave out. "" for results
    from before it."""
    from .validate import STALL_US

    shares, stalls = [], 0
    for row in (res.get("levels") or {}).values():
        for side in ("original", "clone"):
            for r in (row.get(side) or {}).get("runs", []):
                if isinstance(r.get("disturbed_share"), (int, float)):
                    shares.append(r["disturbed_share"])
                    stalls += int(r.get("generator_stalls") or 0)
    if not shares:
        return ""
    shares.sort()
    return (
        f" The load generator spun and counted {stalls} stalls of its own (a turn of its loop over "
        f"{STALL_US} µs) over {len(shares)} kept runs; the replies in flight or due during one, or "
        f"within its length after it, are left out of the latencies: a median {100 * shares[len(shares) // 2]:.2f}% "
        f"of a run's replies, at most {100 * shares[-1]:.2f}%."
    )


def idle_note(res: dict) -> str:
    """How the CPUs idled during the timed runs (validate's `idle`, runner.cpus_awake, session 27);
    "" for results from before it, whose CPUs halted."""
    idle = res.get("idle")
    if not isinstance(idle, str):
        return ""
    if idle == "poll":
        return "The CPUs polled instead of halting when idle (/dev/cpu_dma_latency held at 0 µs)."
    if idle.startswith("poll ("):
        return f"The CPUs did not halt when idle: {idle.removeprefix('poll (').rstrip(')')}."
    if idle == "halt":
        return "The CPUs halted when idle (--idle halt): each latency includes a vCPU's wake-up."
    return f"The CPUs halted when idle: {idle.removeprefix('halt (').rstrip(')')}."


def error_table_md(service: str, res: dict) -> str:
    """The issue's target table with the measured worst error per metric, the original's own
    largest spread over the same rows, and the verdict (validate.verdict)."""
    t = res["errors"]["targets"]
    lines = [
        f"| {service}: metric | limit | worst error | original's own spread | holds |",
        "|---|---|---|---|---|",
    ]
    for k, lab in TARGET_LABELS.items():
        row = t.get(k)
        if not row:
            continue
        sps = [r["original_spread"] for r in row.get("rows", []) if r.get("original_spread") is not None]
        sp = _pct(max(sps)) if sps else "–"
        lines.append(f"| {lab} | ≤ {100 * row['limit']:.0f}% | {_pct(row['max_error'])} | {sp} | {holds_text(row)} |")
    return "\n".join(lines)


def detail_table_md(res: dict) -> str:
    lines = [
        "| metric | load | original | clone | error | original's own spread |",
        "|---|---|---|---|---|---|",
    ]
    osp = res["errors"].get("original_spread", {})
    for lvl, row in res["levels"].items():
        e = res["errors"]["levels"][lvl]
        sp = osp.get("levels", {}).get(lvl, {})
        for k, lab in NATIVE_ROWS:
            lines.append(
                f"| {lab} | {lvl} | {_fmt(row['original'][k])} | {_fmt(row['clone'][k])} | {100 * e[k]:.1f}% "
                f"| {_pct(sp.get(k))} |"
            )
        mix = f"{100 * e['syscall_mix']:.1f}%"
        lines.append(f"| syscall mix (total variation) | {lvl} | | | {mix} | {_pct(sp.get('syscall_mix'))} |")
        ob = row["original"]["net_bytes_in_per_request"] + row["original"]["net_bytes_out_per_request"]
        cb = row["clone"]["net_bytes_in_per_request"] + row["clone"]["net_bytes_out_per_request"]
        lines.append(
            f"| network bytes per request | {lvl} | {_fmt(ob)} | {_fmt(cb)} | {100 * e['net_bytes_per_request']:.1f}% "
            f"| {_pct(sp.get('net_bytes_per_request'))} |"
        )
    for cfg, sides in res["simulated"].items():
        e = res["errors"]["simulated"][cfg]
        sp = osp.get("simulated", {}).get(cfg, {})
        for k, lab in SIM_ROWS:
            lines.append(
                f"| {lab} | cache {cfg} | {_fmt(sides['original'].get(k))} | {_fmt(sides['clone'].get(k))} "
                f"| {_pct(e.get(k))} | {_pct(sp.get(k))} |"
            )
    return "\n".join(lines)


def write_html(path: Path, services: dict[str, dict], command: str = "") -> None:
    """One report for one or more services: {name: {"validation": res, "profile": prof, ...}}."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    parts = []
    first = True

    def fig_html(fig):
        nonlocal first
        h = fig.to_html(full_html=False, include_plotlyjs=first, config={"displaylogo": False})
        first = False
        return h

    for name, d in services.items():
        res, prof = d["validation"], d.get("profile", {})
        parts.append(f"<h2>{html.escape(name)}</h2>")
        parts.append("<h3>Targets</h3>" + _md_to_html(error_table_md(name, res)))
        note = held_out_note(res.get("configs", {}), prof, d.get("tuning"))
        if note:
            parts.append(f"<p>Held-out hierarchy: {html.escape(note)}</p>")
        wins = windows_note(res)
        if wins:
            parts.append(f"<p>Callgrind windows: {html.escape(wins)}</p>")
        busy = host_note(res)
        if busy:
            parts.append(f"<p>Host during the timed runs: {html.escape(busy)}</p>")
        lv = list(res["levels"])
        fig = make_subplots(rows=2, cols=4, subplot_titles=[lab for _, lab in NATIVE_ROWS])
        for i, (k, _lab) in enumerate(NATIVE_ROWS):
            r, c = divmod(i, 4)
            for side, color in (("original", "#1f77b4"), ("clone", "#ff7f0e")):
                fig.add_trace(
                    go.Bar(
                        x=lv,
                        y=[res["levels"][x][side][k] for x in lv],
                        name=side,
                        marker_color=color,
                        showlegend=(i == 0),
                    ),
                    row=r + 1,
                    col=c + 1,
                )
        fig.update_layout(height=560, barmode="group", title="Original vs clone at low / medium / high load")
        parts.append(fig_html(fig))
        # syscalls by type at medium load
        mid = res["levels"].get("medium") or res["levels"][lv[0]]
        keys = sorted(
            set(mid["original"]["syscalls_per_request"]) | set(mid["clone"]["syscalls_per_request"]),
            key=lambda k: -mid["original"]["syscalls_per_request"].get(k, 0),
        )[:14]
        fig = go.Figure(
            [
                go.Bar(x=keys, y=[mid[s]["syscalls_per_request"].get(k, 0) for k in keys], name=s)
                for s in ("original", "clone")
            ]
        )
        fig.update_layout(title="Syscalls per request by type (medium load)", barmode="group", height=380)
        parts.append(fig_html(fig))
        # simulated caches
        cfgs = list(res["simulated"])
        fig = make_subplots(rows=1, cols=len(SIM_ROWS), subplot_titles=[lab for _, lab in SIM_ROWS])
        for i, (k, _lab) in enumerate(SIM_ROWS):
            for side in ("original", "clone"):
                fig.add_trace(
                    go.Bar(
                        x=[f"cache {c}" for c in cfgs],
                        y=[res["simulated"][c][side].get(k, 0) for c in cfgs],
                        name=side,
                        showlegend=(i == 0),
                        marker_color="#1f77b4" if side == "original" else "#ff7f0e",
                    ),
                    row=1,
                    col=i + 1,
                )
        fig.update_layout(
            height=380,
            barmode="group",
            title=f"Simulated caches: A (profiled, tuned) {res['configs']['A']}, B (held out) {res['configs']['B']}",
        )
        parts.append(fig_html(fig))
        mix_o = next(iter(prof.get("body", {}).values()), {}).get("mix", {})
        mix_c = res["simulated"].get("A", {}).get("clone", {}).get("mix", {})
        if mix_o and mix_c:
            ks = [k for k in mix_o if mix_o[k] > 0.002 or mix_c.get(k, 0) > 0.002]
            fig = go.Figure(
                [
                    go.Bar(x=ks, y=[mix_o[k] for k in ks], name="original (worker threads)"),
                    go.Bar(x=ks, y=[mix_c.get(k, 0) for k in ks], name="clone (whole process)"),
                ]
            )
            fig.update_layout(title="Instruction mix (class/memory operand)", barmode="group", height=380)
            parts.append(fig_html(fig))
        for ci, b in prof.get("body", {}).items():
            if b.get("I_bins"):
                fig = go.Figure()
                fig.add_trace(
                    go.Scatter(x=b["ws_sizes"], y=b["I_hits"], name="instruction hits H(S)", mode="lines+markers")
                )
                fig.add_trace(go.Scatter(x=b["ws_sizes"], y=b["D_hits"], name="data hits H(S)", mode="lines+markers"))
                fig.update_xaxes(type="log", title="cache size (bytes)")
                fig.update_layout(
                    title=f"Working sets of cluster {ci} ({b['role']}): hits per event vs cache size", height=360
                )
                parts.append(fig_html(fig))
                break
        thr = prof.get("threads", {})
        if thr.get("distance"):
            labels = [f"{t} {thr['roles'][str(t)]}" for t in thr["tids"]]
            fig = go.Figure(go.Heatmap(z=thr["distance"], x=labels, y=labels, colorscale="Viridis"))
            fig.update_layout(
                title="Thread distance (1 - weighted Jaccard of perf call edges; roles never merge)", height=420
            )
            parts.append(fig_html(fig))
        if d.get("tuning"):
            tu = d["tuning"]
            parts.append(f"<p>Tuning: {tu['iterations']} iteration(s), best {tu['best_iteration']}.</p>")
        if d.get("leakage"):
            lk = d["leakage"]
            parts.append(
                f"<p>Leakage check: {'passed' if lk['ok'] else 'FAILED'} — {lk['original_strings']} strings, "
                f"{lk['original_symbols']} symbols, {lk['original_windows']} data windows of the original "
                f"searched; leaked: {len(lk['leaked_strings'])} strings, {len(lk['leaked_symbols'])} "
                f"symbols, {lk['leaked_data_windows']} windows; allowed (template/protocol): "
                f"{html.escape(', '.join(lk['allowed_strings'][:12]))}</p>"
            )
        parts.append("<h3>All metrics</h3>" + _md_to_html(detail_table_md(res)))
    body = "\n".join(parts)
    data = html.escape(json.dumps({k: v["validation"]["errors"] for k, v in services.items()}))
    cmd = f"<p>Reproduce: <code>{html.escape(command)}</code></p>" if command else ""
    path.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>tailscope clone validation</title>
<style>{_CSS}</style>
</head><body><h1>Ditto clone validation: original vs clone</h1>
<p>Profiling at medium load only; tuning at simulated cache hierarchy A; hierarchy B is held out.
Relative error = |clone − original| / original.</p>{cmd}
{body}
<script type="application/json" id="validation-data">{data}</script>
</body></html>""")


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}"
    "table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
    "td:first-child{text-align:left}"
)


def _md_to_html(md: str) -> str:
    rows = [r for r in md.splitlines() if r.startswith("|") and not r.startswith("|---")]
    out = ["<table>"]
    for i, r in enumerate(rows):
        cells = [html.escape(c.strip()) for c in r.strip("|").split("|")]
        tag = "th" if i == 0 else "td"
        out.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
    out.append("</table>")
    return "".join(out)
