"""Validation: original vs clone, metric by metric, at low, medium and high load.

Both run natively in their own network namespace, the server pinned to CPU 0 and the load
generator to CPU 1, driven by the same open-loop load (tailscope-loadgen, same seed). Per
load level: REPEATS clean runs (throughput, latency, CPU, context switches, page faults; the
median is kept) and one run with the eBPF syscall trace (syscalls by type and size, network
bytes). Under valgrind: simulated I1/D1/LL miss rates, branch mispredictions and instructions
per request at the profiled hierarchy (CONFIG_A) and at a held-out one (CONFIG_B) that neither
profiling nor tuning used.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from . import runner, target, trace
from . import valgrind as vg
from .errors import CloneError
from .tools import need
from .tune import clone_launch, rel_err

LEVELS = {"low": 0.3, "medium": 1.0, "high": 1.6}
REPEATS = 3
TARGETS = {  # metric -> largest allowed relative error (the table)
    "I1_miss_rate": 0.10,
    "D1_miss_rate": 0.10,
    "LL_miss_rate": 0.10,
    "branch_mispredict_rate": 0.10,
    "syscall_mix": 0.02,
    "net_bytes_per_request": 0.02,
    "instructions_per_request": 0.05,
    "latency_avg_us": 0.15,
    "latency_p99_us": 0.15,
}


def _native_level(ns, launch, port, load_args, rate, duration, workdir: Path, tag: str, preload: bool) -> dict:
    srv = runner.start(ns, launch, port, workdir / f"{tag}.log", cpu=0)
    try:
        if preload:
            runner.loadgen(ns, port, load_args, min(rate, 5000), 0.5, preload=True, cpu=1)
        runner.loadgen(ns, port, load_args, rate, 1.0, cpu=1)
        runs = []
        hz = os.sysconf("SC_CLK_TCK")
        for _ in range(REPEATS):
            before = {t["tid"]: t for t in target.threads(srv.pid)}
            lg = runner.loadgen(ns, port, load_args, rate, duration, cpu=1)
            after = target.threads(srv.pid)
            d = {"utime": 0, "stime": 0, "minflt": 0, "majflt": 0, "vcsw": 0, "ivcsw": 0}
            for t in after:
                b = before.get(t["tid"], {k: 0 for k in d})
                for k in d:
                    d[k] += t[k] - b.get(k, 0)
            n = max(1, lg["completed"])
            runs.append(
                {
                    "throughput_rps": lg["achieved_rps"],
                    "latency_avg_us": lg["latency_us"]["mean"],
                    "latency_p95_us": _p95(lg),
                    "latency_p99_us": lg["latency_us"]["p99"],
                    "user_cpu_us_per_request": d["utime"] / hz * 1e6 / n,
                    "sys_cpu_us_per_request": d["stime"] / hz * 1e6 / n,
                    "ctx_switches_per_request": (d["vcsw"] + d["ivcsw"]) / n,
                    "page_faults_per_request": (d["minflt"] + d["majflt"]) / n,
                    "errors": lg["errors"],
                    "timeouts": lg["timeouts"],
                }
            )
        out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        out["runs"] = runs
        # the syscall run (eBPF attached: its latencies are not used)
        tools = need("bpftrace")
        info = target.inspect(srv.pid)
        notify = [int(fd) for fd, k in info["fds"].items() if k in ("eventfd", "pipe")]
        (workdir / tag).mkdir(exist_ok=True)
        # up to 3 tries: bpftrace can fail to attach or print nothing while other eBPF jobs load
        # their programs (session 5's bench failed that way once); the last failure is the error
        for attempt in range(3):
            try:
                st = trace.SyscallTrace(
                    tools["bpftrace"],
                    srv.pid,
                    [x["fd"] for x in info["listeners"]],
                    notify,
                    workdir / tag,
                    gate_conns=True,
                )
                lg = runner.loadgen(ns, port, load_args, rate, min(duration, 2.0), cpu=1)
                maps = st.stop()
                break
            except CloneError as exc:
                if attempt == 2:
                    raise CloneError(f"{tag}: {exc} (3 tries)") from None
        n = max(1, lg["completed"])
        by_type: dict[str, float] = {}
        for (_tid, nr, _c), v in maps.get("calls", {}).items():
            name = trace.SYSCALLS.get(nr, f"sys{nr}")
            by_type[name] = by_type.get(name, 0.0) + v / n
        sizes: dict[str, float] = {}
        for (nr, _c, size), v in maps.get("ret", {}).items():
            name = trace.SYSCALLS.get(nr, f"sys{nr}")
            if size > 0:
                sizes[name] = sizes.get(name, 0.0) + size * v
        calls_data = {}
        for (nr, _c, _size), v in maps.get("ret", {}).items():
            name = trace.SYSCALLS.get(nr, f"sys{nr}")
            calls_data[name] = calls_data.get(name, 0) + v
        out["syscalls_per_request"] = by_type
        out["bytes_per_call"] = {k: sizes[k] / calls_data[k] for k in sizes if calls_data.get(k)}
        out["net_bytes_in_per_request"] = sum(maps.get("bytes_in", {}).values()) / n
        out["net_bytes_out_per_request"] = sum(maps.get("bytes_out", {}).values()) / n
        return out
    finally:
        srv.stop()


def _p95(lg: dict) -> float:
    lat = lg["latency_us"]
    if "p95" in lat:
        return lat["p95"]
    # interpolate between p90 and p99 on a log scale (the loadgen reports p50/p90/p99/p99.9)
    import math

    p90, p99 = max(lat["p90"], 1e-9), max(lat["p99"], 1e-9)
    frac = (math.log(0.10) - math.log(0.05)) / (math.log(0.10) - math.log(0.01))
    return math.exp(math.log(p90) + frac * (math.log(p99) - math.log(p90)))


def syscall_mix_error(orig: dict[str, float], clone: dict[str, float]) -> float:
    """Total variation between per-request syscall counts, relative to the original's total."""
    keys = set(orig) | set(clone)
    tot = sum(orig.values())
    return sum(abs(orig.get(k, 0) - clone.get(k, 0)) for k in keys) / tot if tot else 0.0


def validate(prof: dict, clone_dir: Path, progress, duration: float = 4.0, levels: dict | None = None) -> dict:
    levels = levels or LEVELS
    launch = prof["private"]["launch"]
    port = prof["listen"]["port"]
    load = prof["load"]["args"]
    preload = "--preload" in load
    medium = prof["load"]["medium_rate"]
    work = clone_dir / "private" / "validate"
    work.mkdir(parents=True, exist_ok=True)
    if not (clone_dir / "clone").exists():
        raise CloneError(f"{clone_dir}/clone is not built: run `make -C {clone_dir}` first")
    res: dict = {"levels": {}, "rates": {}, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for lvl, f in levels.items():
        rate = medium * f
        res["rates"][lvl] = rate
        row = {}
        for side, lch in (("original", launch), ("clone", clone_launch(clone_dir, port))):
            progress(f"validate {lvl} load ({rate:g} req/s): {side}")
            with runner.NetNs() as ns:
                row[side] = _native_level(ns, lch, port, load, rate, duration, work, f"{side}-{lvl}", preload)
        res["levels"][lvl] = row
    vgp = prof["valgrind"]
    sim = {}
    for cfg_name, cfg in (("A", vg.CONFIG_A), ("B", vg.CONFIG_B)):
        sim[cfg_name] = {}
        for side, lch in (("original", launch), ("clone", clone_launch(clone_dir, port))):
            if side == "original" and cfg_name == "A" and vgp.get("metrics"):
                sim[cfg_name][side] = vgp["metrics"]
                continue
            progress(f"validate under valgrind, cache hierarchy {cfg_name}: {side}")
            win = vg.window(
                lch,
                port,
                load,
                vgp["rate"],
                vgp["window_requests"],
                work,
                f"vg{cfg_name}-{side}",
                cache=cfg,
                detail=(side == "clone" and cfg_name == "A"),
                preload=preload,
            )
            m = vg.metrics(win)
            if side == "clone" and cfg_name == "A":
                from .isa import analyse

                a = analyse(win.threads)
                m["mix"] = a["mix_fraction"]
            sim[cfg_name][side] = m
    res["simulated"] = sim
    res["configs"] = {"A": vg.CONFIG_A, "B": vg.CONFIG_B}
    res["errors"] = errors(res)
    (clone_dir / "private" / "validation.json").write_text(json.dumps(res, indent=1))
    return res


def errors(res: dict) -> dict:
    """Relative errors, per load level and simulated configuration, and which targets hold."""
    out: dict = {"levels": {}, "simulated": {}}
    for lvl, row in res["levels"].items():
        o, c = row["original"], row["clone"]
        e = {
            k: rel_err(c[k], o[k])
            for k in (
                "throughput_rps",
                "latency_avg_us",
                "latency_p95_us",
                "latency_p99_us",
                "user_cpu_us_per_request",
                "sys_cpu_us_per_request",
                "ctx_switches_per_request",
                "page_faults_per_request",
            )
        }
        e["syscall_mix"] = syscall_mix_error(o["syscalls_per_request"], c["syscalls_per_request"])
        ob = o["net_bytes_in_per_request"] + o["net_bytes_out_per_request"]
        cb = c["net_bytes_in_per_request"] + c["net_bytes_out_per_request"]
        e["net_bytes_per_request"] = rel_err(cb, ob)
        e["saturated"] = bool(
            o["throughput_rps"] < 0.95 * res["rates"][lvl] or c["throughput_rps"] < 0.95 * res["rates"][lvl]
        )
        out["levels"][lvl] = e
    for cfg, sides in res.get("simulated", {}).items():
        o, c = sides["original"], sides["clone"]
        out["simulated"][cfg] = {
            k: rel_err(c.get(k, 0), o.get(k, 0))
            for k in (
                "I1_miss_rate",
                "D1_miss_rate",
                "LL_miss_rate",
                "branch_mispredict_rate",
                "instructions_per_request",
            )
        }
    holds = {}
    for k, tol in TARGETS.items():
        vals = []
        if k in ("latency_avg_us", "latency_p99_us", "syscall_mix", "net_bytes_per_request"):
            for _lvl, e in out["levels"].items():
                if k.startswith("latency") and e["saturated"]:
                    continue
                vals.append(e[k])
        else:
            vals = [s[k] for s in out["simulated"].values() if k in s]
        holds[k] = {"max_error": max(vals) if vals else None, "limit": tol, "holds": bool(vals) and max(vals) <= tol}
    out["targets"] = holds
    return out
