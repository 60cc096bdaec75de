"""Render bench part `breakwater`: acceptance verdicts, the markdown table (as
ratios), and a self-contained HTML report with plotly figures.

Pure functions of the result dict that bench/breakwater/run.py builds; no I/O.
"""

from __future__ import annotations

import html
import statistics

SIM_CONTROLS = ["breakwater", "dagor", "seda"]


def _at(rows: list[dict], demand_x: float) -> dict | None:
    return next((r for r in rows if r.get("demand_x") == demand_x), None)


def _sim_settle(bins: list[dict], step_ms: float, phase_ms: float, slo_us: float) -> float | None:
    inside = [b for b in bins if step_ms <= b["t_ms"] < step_ms + phase_ms]
    if len(inside) < 6:
        return None
    good = [b["goodput_rps"] for b in inside]
    converged = statistics.median(good[len(good) // 2 :])
    for k in range(len(inside) - 2):
        g = sum(good[k : k + 3]) / 3
        ok = all((b["p99_us"] or 0) <= 2 * slo_us for b in inside[k : k + 3])
        if converged > 0 and abs(g - converged) <= 0.05 * converged and ok:
            return inside[k]["t_ms"] - step_ms
    return None


def verdicts(r: dict) -> list[dict]:
    """Each acceptance line of the issue: the goal, what was measured, and
    whether it holds. Lines that could not be measured say so."""
    out = []

    def line(name: str, goal: str, measured: str, holds: bool | None) -> None:
        out.append({"target": name, "goal": goal, "measured": measured, "holds": holds})

    slo = r["setup"]["slo_us"]
    if "sweep" in r:
        cap = r["capacity_rps"]["exponential"]
        sw = r["sweep"]
        bw = _at(sw["breakwater"], 2.0)
        if bw:
            line(
                "at 2x capacity",
                "goodput >= 90% of capacity",
                f"{bw['goodput_rps']:.0f} req/s = {bw['goodput_rps'] / cap:.1%} of {cap:.0f}",
                bw["goodput_rps"] >= 0.9 * cap,
            )
            ol = r.get("open_loop_capacity")
            if ol and ol.get("closed_loop_rps"):
                k = ol["max_throughput_rps"] / ol["closed_loop_rps"]
                line(
                    "at 2x capacity",
                    "goodput >= 90% of the open-loop capacity (no control's most completed req/s "
                    "under the sweep's own 1000 Poisson clients; second denominator, see the capacity section)",
                    f"{bw['goodput_rps']:.0f} req/s = {bw['goodput_rps'] / (k * cap):.1%} of {k * cap:.0f} "
                    f"(= {k:.3f} x closed loop)",
                    bw["goodput_rps"] >= 0.9 * k * cap,
                )
            line("at 2x capacity", f"p99 of admitted <= SLO ({slo} us)", f"{bw['p99_us']:.0f} us", bw["p99_us"] <= slo)
            line(
                "at 2x capacity",
                "reject latency <= 1 ms",
                f"p50 {bw['reject_p50_us']:.0f} us, p99 {bw['reject_p99_us']:.0f} us, mean "
                f"{bw['reject_mean_us']:.0f} us (p99 judged)",
                bw["reject_p99_us"] <= 1000 if bw["rejected"] else None,
            )
            for base in ("seda", "dagor"):
                b = _at(sw[base], 2.0)
                ratio = bw["goodput_rps"] / b["goodput_rps"] if b["goodput_rps"] else float("inf")
                line("vs baselines at 2x", f">= 5% more goodput than {base}", f"x{ratio:.2f}", ratio >= 1.05)
            worse = [k for k in sw if k != "breakwater" and _at(sw[k], 2.0)["p99_us"] <= bw["p99_us"]]
            line(
                "vs baselines at 2x",
                "better p99 than every baseline",
                "better than all" if not worse else f"not better than: {', '.join(worse)}",
                not worse,
            )
        # Overhead. Below capacity (open loop, 0.5x, where no control is
        # stable) throughput equals demand for both, so the line also gives
        # the server CPU per completed request. At capacity the open-loop
        # no-control server is unstable (its queue grows without bound: see
        # 0.9x/1.0x in the sweep), so the comparison there is the closed-loop
        # maximum throughput through each control (see docs/breakwater.md).
        n, b = _at(sw["none"], 0.5), _at(sw["breakwater"], 0.5)
        if n and b and n["throughput_rps"]:
            ratio = b["throughput_rps"] / n["throughput_rps"]
            cpu = ""
            if n.get("cpu_us_per_completed") and b.get("cpu_us_per_completed"):
                cpu = (
                    f"; server CPU per request {b['cpu_us_per_completed']:.0f} us vs "
                    f"{n['cpu_us_per_completed']:.0f} us (x{b['cpu_us_per_completed'] / n['cpu_us_per_completed']:.2f})"
                )
            line(
                "overhead at/below capacity",
                "<= 5% throughput loss vs none at 0.5x (open loop)",
                f"breakwater/none = {ratio:.3f}{cpu}",
                ratio >= 0.95,
            )
        cl = r.get("closed_loop_max")
        if cl and cl["none"]["median"]:
            ratio = cl["breakwater"]["median"] / cl["none"]["median"]
            line(
                "overhead at/below capacity",
                "<= 5% loss of closed-loop max throughput vs none (at capacity, 8 in flight)",
                f"breakwater {cl['breakwater']['median']:.0f} / none {cl['none']['median']:.0f} req/s = {ratio:.3f}",
                ratio >= 0.95,
            )
    if "shift" in r:
        s = r["shift"]["runs"]["breakwater"]["settle_ms_after_1_4x"]
        line(
            "after the step to 1.4x",
            "goodput within 5% of converged and p99 <= 2xSLO within 100 ms",
            "never settled" if s is None else f"settled after {s:.0f} ms",
            s is not None and s <= 100,
        )
    sim = r.get("sim", {})
    if "dist" in sim:
        wins, total = 0, 0
        for dist in ("constant", "exponential", "bimodal"):
            for load in (1.2, 2.0):
                rows = {
                    x["control"]: x["steps"][0]["goodput_rps"]
                    for x in sim["dist"]
                    if x["dist"] == dist and x["demand"] == load
                }
                total += 1
                wins += rows["breakwater"] >= max(v for k, v in rows.items() if k != "breakwater")
        line(
            "simulator, Fig. 2.8 shape",
            "breakwater has the most goodput at 1.2x and 2x, every distribution",
            f"{wins} of {total} cases",
            wins == total,
        )
    if "shift" in sim:
        settles = {}
        for x in sim["shift"]:
            ph = x["phase_s"] * 1e3
            settles[x["control"]] = _sim_settle(x["bins"], 2 * ph, ph, x["slo_us"])
        bw = settles.get("breakwater")
        others = [v for k, v in settles.items() if k != "breakwater"]
        holds = bw is not None and all(o is None or o > bw for o in others)
        line(
            "simulator, Fig. 2.11 shape",
            "breakwater converges after the 1.4x spike faster than DAGOR and SEDA",
            ", ".join(f"{k} {'never' if v is None else f'{v:.0f} ms'}" for k, v in settles.items()),
            holds,
        )
    return out


def _fmt(v, spec=".0f"):
    return "n/a" if v is None else format(v, spec)


def render_md(r: dict) -> str:
    s = r["setup"]
    lines = [
        "# Bench: breakwater (overload control)",
        "",
        f"Reproduce: `{r['command']}`",
        "",
        f"Setup: server (`bw-server`, 1 worker) on CPU 0, `tailscope-loadgen --protocol breakwater` on CPU 1, "
        f"{s['clients']} logical clients over {s['connections']} HTTP/2 connections, exponential busy-loop "
        f"service mean {s['mean_service_us']} us, SLO {s['slo_us']} us, {s['run_s']} s runs after "
        f"{s['warmup_s']} s warm-up, 2x runs repeated {s['headline_runs']}x (medians). "
        f"Load average at start: {', '.join(f'{x:.2f}' for x in s['load'])} (the box is shared: "
        "timings are noisy).",
        "",
    ]
    if s.get("worker_priority"):
        lines += [
            f"Worker scheduling: `{s['worker_priority']}` (bw-server `--worker-priority`; `inline`: the "
            "worker runs on the I/O thread between socket polls, docs/breakwater.md session 9; "
            "`normal`/`idle`: a worker thread, session 5).",
            "",
        ]
    if "io_slice_us" in s:
        slice_us = s["io_slice_us"]
        lines += [
            "I/O thread time slice (every control): "
            + (f"{slice_us} us" if slice_us else "the kernel's default")
            + " (bw-server `--io-slice-us`; see docs/breakwater.md, session 6).",
            "",
        ]
    if s.get("protocol"):
        how = {
            "push": "server push (explicit credits pushed to drained clients: in `bw-push` on a response to "
            "another client of the same connection, else on the connection's credit stream; loadgen `--bw-push`)",
            "wait": "the thesis protocol over HTTP (a drained client sends a credit wait)",
        }.get(s["protocol"], s["protocol"])
        lines += [
            f"Breakwater's client protocol (sweep, bimodal, shift, overhead): {how}; "
            "the ablation runs both (docs/breakwater.md, session 7).",
            "",
        ]
    if r.get("parts_run"):
        lines += ["Parts and when they ran (each against the capacity measured just before it):", ""]
        for part, info in r["parts_run"].items():
            capx = info.get("capacity_rps", {}).get("exponential")
            extra = f", capacity {capx:.0f} req/s" if capx else ""
            load = info.get("load")
            extra += f", load {', '.join(f'{x:.2f}' for x in load)}" if load else ""
            extra += f" ({info['note']})" if info.get("note") else ""
            lines.append(f"- {part}: {info.get('at', '?')}{extra}")
        lines.append("")
    if "sweep" in r:
        cap = r["capacity_rps"]
        lines += [
            f"Measured capacity (closed loop, no control): exponential {cap['exponential']:.0f} req/s, "
            f"bimodal {cap['bimodal']:.0f} req/s.",
            "",
        ]
        ol = r.get("open_loop_capacity")
        if ol:
            k = ol["max_throughput_rps"] / ol["closed_loop_rps"] if ol.get("closed_loop_rps") else float("nan")
            ks = ol["slo_capacity_rps"] / ol["closed_loop_rps"] if ol.get("closed_loop_rps") else float("nan")
            lines += [
                "## Capacity: closed loop and open loop (no control)",
                "",
                f"Part `openloop`: no control under the sweep's own traffic (Poisson, 1000 clients over "
                f"{r['setup'].get('connections', 8)} connections) at multiples of the closed-loop capacity "
                f"measured just before it ({ol['closed_loop_rps']:.0f} req/s). The bench's denominator is the "
                f"closed loop; docs/breakwater.md (session 8) gives the rationale.",
                "",
                "| offered x closed loop | offered req/s | completed req/s | goodput req/s | p99 us | "
                "server CPU us / completed | I/O thread us / message |",
                "|---|---|---|---|---|---|---|",
            ]
            for x in ol["rows"]:
                lines.append(
                    f"| {x['demand_x']}x | {x['demand_rps']:.0f} | {x['throughput_rps']:.0f} | "
                    f"{x['goodput_rps']:.0f} | {x['p99_us']:.0f} | {x['cpu_us_per_completed']:.0f} | "
                    f"{x['io_us_per_msg']:.1f} |"
                )
            lines += [
                "",
                f"- open-loop capacity (most completed req/s, any latency): {ol['max_throughput_rps']:.0f} req/s "
                f"at {ol['max_throughput_at_x']}x = **{k:.3f} x the closed loop**",
                f"- open-loop SLO capacity (highest offered rate with p99 <= {r['setup']['slo_us']} us "
                "and goodput >= 95% of it): "
                + (
                    f"{ol['slo_capacity_rps']:.0f} req/s = {ks:.3f} x the closed loop"
                    if ol["slo_capacity_rps"]
                    else "none of the rates scanned"
                ),
                "",
            ]
        lines += [
            "## At 2x capacity (exponential), breakwater against each control",
            "",
            "| control | goodput req/s | goodput / capacity | breakwater goodput ÷ this | p99 us | "
            "this p99 ÷ breakwater p99 | server drop rate | reject p99 us | expired at client |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        bw = _at(r["sweep"]["breakwater"], 2.0)
        for ctl, rows in r["sweep"].items():
            x = _at(rows, 2.0)
            gr = bw["goodput_rps"] / x["goodput_rps"] if x["goodput_rps"] else float("inf")
            pr = x["p99_us"] / bw["p99_us"] if bw["p99_us"] else float("nan")
            lines.append(
                f"| {ctl} | {x['goodput_rps']:.0f} | {x['goodput_rps'] / cap['exponential']:.2f} | "
                f"x{gr:.2f} | {x['p99_us']:.0f} | x{pr:.2f} | {x['server_drop_rate']:.3f} | "
                f"{x['reject_p99_us']:.0f} | {x['expired']} |"
            )
        lines += [
            "",
            "## Demand sweep (goodput req/s / p99 us)",
            "",
            "| demand | " + " | ".join(r["sweep"]) + " |",
            "|---|" + "---|" * len(r["sweep"]),
        ]
        for i, row in enumerate(r["sweep"]["none"]):
            cells = [f"{r['sweep'][c][i]['goodput_rps']:.0f} / {r['sweep'][c][i]['p99_us']:.0f}" for c in r["sweep"]]
            lines.append(f"| {row['demand_x']}x | " + " | ".join(cells) + " |")
        lines += ["", "## Bimodal service at 2x", "", "| control | goodput | p99 us | drop rate |", "|---|---|---|---|"]
        for ctl, x in r["bimodal_2x"].items():
            lines.append(f"| {ctl} | {x['goodput_rps']:.0f} | {x['p99_us']:.0f} | {x['server_drop_rate']:.3f} |")
        lines += ["", "## Load shift (20 ms bins): time to settle after the step to 1.4x", ""]
        for ctl, x in r["shift"]["runs"].items():
            lines.append(f"- {ctl}: {_fmt(x['settle_ms_after_1_4x'])} ms")
        lines += [
            "",
            "## Ablation (real)",
            "",
            "| variant | demand | goodput | p99 us | drop rate |",
            "|---|---|---|---|---|",
        ]
        for name, rows in r["ablation"].items():
            for x in rows:
                lines.append(
                    f"| {name} | {x['demand_x']}x | {x['goodput_rps']:.0f} | {x['p99_us']:.0f} | "
                    f"{x['server_drop_rate']:.3f} |"
                )
        lk = r["lock"]
        lines += [
            "",
            f"## Lock-bound microbenchmark (capacity {lk['capacity_rps']:.0f} req/s, SLO {lk['slo_us']} us)",
            "",
            "| signal | demand | goodput | p99 us | drop rate |",
            "|---|---|---|---|---|",
        ]
        for name, rows in lk["runs"].items():
            for x in rows:
                lines.append(
                    f"| {name} | {x['demand_x']}x | {x['goodput_rps']:.0f} | {x['p99_us']:.0f} | "
                    f"{x['server_drop_rate']:.3f} |"
                )
        eff = _at(lk["runs"]["efficiency+asqm"], max(x["demand_x"] for x in lk["runs"]["seda"]))
        sed = _at(lk["runs"]["seda"], eff["demand_x"])
        if sed and sed["goodput_rps"]:
            lines.append(
                f"\nAt {eff['demand_x']}x: efficiency+ASQM goodput ÷ SEDA = "
                f"x{eff['goodput_rps'] / sed['goodput_rps']:.2f}."
            )
    sim = r.get("sim", {})
    if "dist" in sim:
        lines += [
            "",
            "## Simulator: thesis Fig. 2.8 (10 µs service, 1000 clients, goodput kreq/s / drop rate)",
            "",
            "| distribution | demand | breakwater | dagor | seda | breakwater ÷ best baseline |",
            "|---|---|---|---|---|---|",
        ]
        for dist in ("constant", "exponential", "bimodal"):
            for load in (0.9, 1.2, 2.0):
                rows = {x["control"]: x["steps"][0] for x in sim["dist"] if x["dist"] == dist and x["demand"] == load}
                best = max(rows[k]["goodput_rps"] for k in ("dagor", "seda"))
                cells = [f"{rows[k]['goodput_rps'] / 1e3:.0f} / {rows[k]['drop_rate']:.3f}" for k in SIM_CONTROLS]
                lines.append(
                    f"| {dist} | {load}x | "
                    + " | ".join(cells)
                    + f" | x{rows['breakwater']['goodput_rps'] / best:.3f} |"
                )
    if "messages" in sim:
        lines += [
            "",
            "## Simulator: messages per request, speculation vs synchronisation (Fig. 2.12)",
            "",
            "| demand | speculation rx+tx / req | goodput k | synchronisation rx+tx / req | goodput k |",
            "|---|---|---|---|---|",
        ]
        by = {}
        for x in sim["messages"]:
            st = x["steps"][0]
            m = st["messages"]
            by.setdefault(x["demand"], {})[x["variant"]] = (
                (m["server_rx"] + m["server_tx"]) / max(1, st["created"]),
                st["goodput_rps"] / 1e3,
            )
        for d, v in sorted(by.items()):
            sp, sy = v["speculation"], v["synchronization"]
            lines.append(f"| {d}x | {sp[0]:.2f} | {sp[1]:.0f} | {sy[0]:.2f} | {sy[1]:.0f} |")
    lines += ["", "## Acceptance", "", "| target | goal | measured | holds |", "|---|---|---|---|"]
    for v in r["verdicts"]:
        h = {True: "yes", False: "**no**", None: "n/a"}[v["holds"]]
        lines.append(f"| {v['target']} | {v['goal']} | {v['measured']} | {h} |")
    lines.append("")
    return "\n".join(lines)


def render_html(r: dict) -> str:
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.subplots import make_subplots

    parts: list[str] = []
    first = [True]

    def add(fig, title: str, note: str = "") -> None:
        fig.update_layout(title=title, height=420, margin=dict(t=60, l=60, r=20, b=50))
        parts.append(f"<p>{html.escape(note)}</p>" if note else "")
        parts.append(pio.to_html(fig, full_html=False, include_plotlyjs=first[0]))
        first[0] = False

    slo = r["setup"]["slo_us"]
    if "sweep" in r:
        cap = r["capacity_rps"]["exponential"]
        fig = make_subplots(
            rows=2,
            cols=2,
            subplot_titles=(
                "goodput (req/s)",
                "p99 of admitted (µs, log)",
                "server drop rate",
                "reject latency p99 (µs)",
            ),
        )
        for ctl, rows in r["sweep"].items():
            x = [row["demand_x"] for row in rows]
            show = True
            for (i, j), key in (
                ((1, 1), "goodput_rps"),
                ((1, 2), "p99_us"),
                ((2, 1), "server_drop_rate"),
                ((2, 2), "reject_p99_us"),
            ):
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=[row[key] for row in rows],
                        name=ctl,
                        legendgroup=ctl,
                        showlegend=show,
                        mode="lines+markers",
                    ),
                    row=i,
                    col=j,
                )
                show = False
        fig.add_hline(y=cap, line_dash="dot", row=1, col=1)
        fig.add_hline(y=slo, line_dash="dot", row=1, col=2)
        fig.update_yaxes(type="log", row=1, col=2)
        fig.update_xaxes(title_text="demand (x capacity)")
        fig.update_layout(height=700)
        add(
            fig,
            "Real runs: demand sweep (exponential service, mean 100 µs)",
            f"Capacity {cap:.0f} req/s (dotted); SLO {slo} µs (dotted).",
        )
        sh = r["shift"]
        fig = make_subplots(
            rows=3,
            cols=1,
            shared_xaxes=True,
            subplot_titles=("goodput (req/s)", "p99 (µs, log)", "mean reject latency (µs)"),
        )
        for ctl, run in sh["runs"].items():
            ts = run["timeseries"]
            t = [b["t_ms"] for b in ts]
            fig.add_trace(go.Scatter(x=t, y=[b["good"] / 0.02 for b in ts], name=ctl, legendgroup=ctl), 1, 1)
            fig.add_trace(
                go.Scatter(x=t, y=[b["p99_us"] for b in ts], name=ctl, legendgroup=ctl, showlegend=False), 2, 1
            )
            fig.add_trace(
                go.Scatter(x=t, y=[b["reject_mean_us"] for b in ts], name=ctl, legendgroup=ctl, showlegend=False), 3, 1
            )
        fig.update_yaxes(type="log", row=2, col=1)
        fig.update_xaxes(title_text="time (ms)", row=3, col=1)
        fig.update_layout(height=800)
        add(
            fig,
            "Real runs: load shift 0.5 → 0.9 → 1.4 → 0.9 → 0.5 x capacity, 20 ms bins",
            f"Phases of {sh['phase_s']} s each.",
        )
        fig = make_subplots(rows=1, cols=2, subplot_titles=("goodput (req/s)", "p99 (µs)"))
        for name, rows in r["ablation"].items():
            x = [f"{row['demand_x']}x" for row in rows]
            fig.add_trace(go.Bar(x=x, y=[row["goodput_rps"] for row in rows], name=name, legendgroup=name), 1, 1)
            fig.add_trace(
                go.Bar(x=x, y=[row["p99_us"] for row in rows], name=name, legendgroup=name, showlegend=False), 1, 2
            )
        add(fig, "Real runs: ablation (credits → + speculation → + AQM)")
        lk = r["lock"]
        fig = make_subplots(rows=1, cols=3, subplot_titles=("goodput (req/s)", "p99 (µs)", "drop rate"))
        for name, rows in lk["runs"].items():
            x = [row["demand_x"] for row in rows]
            for j, key in enumerate(("goodput_rps", "p99_us", "server_drop_rate"), start=1):
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=[row[key] for row in rows],
                        name=name,
                        legendgroup=name,
                        showlegend=j == 1,
                        mode="lines+markers",
                    ),
                    1,
                    j,
                )
        fig.update_xaxes(title_text="demand (x lock capacity)")
        add(
            fig,
            "Real runs: lock-bound microbenchmark (two mutex paths, p = 20%, 1 ms holds)",
            "Efficiency signal with ASQM vs the delay signal vs SEDA.",
        )
    sim = r.get("sim", {})
    if "sweep" in sim:
        fig = make_subplots(rows=1, cols=3, subplot_titles=("goodput (kreq/s)", "p99 (µs, log)", "drop rate"))
        by: dict[str, list] = {}
        for x in sim["sweep"]:
            by.setdefault(x["control"], []).append(x)
        for ctl, rows in by.items():
            d = [row["demand"] for row in rows]
            st = [row["steps"][0] for row in rows]
            fig.add_trace(go.Scatter(x=d, y=[s["goodput_rps"] / 1e3 for s in st], name=ctl, legendgroup=ctl), 1, 1)
            fig.add_trace(
                go.Scatter(x=d, y=[s["p99_us"] for s in st], name=ctl, legendgroup=ctl, showlegend=False), 1, 2
            )
            fig.add_trace(
                go.Scatter(x=d, y=[s["drop_rate"] for s in st], name=ctl, legendgroup=ctl, showlegend=False), 1, 3
            )
        fig.update_yaxes(type="log", row=1, col=2)
        fig.update_xaxes(title_text="demand (x capacity)")
        add(fig, "Simulator: demand sweep, 10 µs exponential service (cf. thesis Fig. 2.7)")
    if "dist" in sim:
        fig = make_subplots(rows=2, cols=3, subplot_titles=[f"{d}x capacity" for d in (0.9, 1.2, 2.0)] * 2)
        for j, load in enumerate((0.9, 1.2, 2.0), start=1):
            for ctl in SIM_CONTROLS:
                rows = [x for x in sim["dist"] if x["demand"] == load and x["control"] == ctl]
                xs = [x["dist"] for x in rows]
                fig.add_trace(
                    go.Bar(
                        x=xs,
                        y=[x["steps"][0]["goodput_rps"] / 1e3 for x in rows],
                        name=ctl,
                        legendgroup=ctl,
                        showlegend=j == 1,
                    ),
                    1,
                    j,
                )
                fig.add_trace(
                    go.Bar(
                        x=xs, y=[x["steps"][0]["drop_rate"] for x in rows], name=ctl, legendgroup=ctl, showlegend=False
                    ),
                    2,
                    j,
                )
        fig.update_yaxes(title_text="goodput (kreq/s)", row=1, col=1)
        fig.update_yaxes(title_text="drop rate", row=2, col=1)
        fig.update_layout(height=650)
        add(fig, "Simulator: goodput and drop rate by service-time distribution (cf. thesis Fig. 2.8)")
    if "shift" in sim:
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("goodput (kreq/s)", "p99 (µs, log)"))
        for x in sim["shift"]:
            t = [b["t_ms"] for b in x["bins"]]
            fig.add_trace(
                go.Scatter(
                    x=t, y=[b["goodput_rps"] / 1e3 for b in x["bins"]], name=x["control"], legendgroup=x["control"]
                ),
                1,
                1,
            )
            fig.add_trace(
                go.Scatter(
                    x=t,
                    y=[b["p99_us"] for b in x["bins"]],
                    name=x["control"],
                    legendgroup=x["control"],
                    showlegend=False,
                ),
                2,
                1,
            )
        fig.update_yaxes(type="log", row=2, col=1)
        fig.update_xaxes(title_text="time (ms)", row=2, col=1)
        fig.update_layout(height=650)
        add(fig, "Simulator: load shift 0.5 → 0.9 → 1.4 → 0.9 → 0.5 x capacity (cf. thesis Fig. 2.11)")
    if "ablation" in sim and "messages" in sim:
        fig = make_subplots(
            rows=1,
            cols=3,
            subplot_titles=("ablation: throughput (kreq/s)", "ablation: p99 (µs)", "server messages per request"),
        )
        by = {}
        for x in sim["ablation"]:
            by.setdefault(x["variant"], []).append(x)
        for name, rows in by.items():
            d = [x["demand"] for x in rows]
            fig.add_trace(
                go.Scatter(x=d, y=[x["steps"][0]["throughput_rps"] / 1e3 for x in rows], name=name, legendgroup=name),
                1,
                1,
            )
            fig.add_trace(
                go.Scatter(
                    x=d, y=[x["steps"][0]["p99_us"] for x in rows], name=name, legendgroup=name, showlegend=False
                ),
                1,
                2,
            )
        fig.update_yaxes(type="log", row=1, col=2)
        by = {}
        for x in sim["messages"]:
            by.setdefault(x["variant"], []).append(x)
        for name, rows in by.items():
            d = [x["demand"] for x in rows]
            per = [
                (x["steps"][0]["messages"]["server_rx"] + x["steps"][0]["messages"]["server_tx"])
                / max(1, x["steps"][0]["created"])
                for x in rows
            ]
            fig.add_trace(go.Scatter(x=d, y=per, name=name), 1, 3)
        fig.update_xaxes(title_text="demand (x capacity)")
        add(
            fig,
            "Simulator: ablation (cf. Fig. 2.13) and message counts, speculation vs synchronisation (cf. Fig. 2.12)",
        )
    rows = "".join(
        f"<tr><td>{html.escape(v['target'])}</td><td>{html.escape(v['goal'])}</td>"
        f"<td>{html.escape(v['measured'])}</td><td>{ {True: 'yes', False: 'NO', None: 'n/a'}[v['holds']] }</td></tr>"
        for v in r["verdicts"]
    )
    head = (
        f"<h1>tailscope bench: Breakwater overload control</h1><p>Reproduce: <code>"
        f"{html.escape(r['command'])}</code></p><table border=1 cellpadding=4><tr><th>target</th><th>goal</th>"
        f"<th>measured</th><th>holds</th></tr>{rows}</table>"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>breakwater bench</title></head>"
        f"<body style='font-family:sans-serif;max-width:1200px;margin:auto'>{head}{''.join(parts)}</body></html>\n"
    )
