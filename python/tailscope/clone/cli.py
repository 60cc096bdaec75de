"""`tailscope clone` and `tailscope clone-report`, registered into the main CLI.

tailscope clone -p PID --load "--protocol memcached --keys 1000 --preload" --rate 20000 -o clone/
make -C clone/ && clone/run.sh
tailscope clone-report clone/
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .errors import CloneError, read_json
from .runner import IDLE_MODES

# `clone --profile-windows`: at ~20 s a window, 40 add some 13 min to the pipeline (the tuning
# target of a service whose windows are bimodal, like redis's LL misses, needs tens to settle)
MAX_PROFILE_WINDOWS = 40


def register(sub) -> None:
    c = sub.add_parser("clone", help="profile a running server and generate a synthetic clone of it (Ditto)")
    c.add_argument("-p", "--pid", type=int, required=True, help="pid of the running server")
    c.add_argument(
        "--load",
        required=True,
        help='tailscope-loadgen arguments describing the load, e.g. "--protocol redis --keys 1000"',
    )
    c.add_argument(
        "--rate",
        type=float,
        default=None,
        help="medium load in req/s (profiling load; default: --rate inside --load, else 5000)",
    )
    c.add_argument("-o", "--out", required=True, help="clone directory to write")
    c.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    c.add_argument(
        "--relaunch",
        help="command that starts a foreground copy of the server for valgrind (default: its /proc command line)",
    )
    c.add_argument("--iterations", type=int, default=10, help="tuning iterations, at most 10 (default 10)")
    c.add_argument("--vg-rate", type=float, default=400, help="request rate under valgrind (default 400)")
    c.add_argument("--vg-requests", type=int, default=6000, help="requests per valgrind window (default 6000)")
    c.add_argument("--sweep-requests", type=int, default=600, help="requests per sweep window (default 600)")
    c.add_argument(
        "--profile-windows",
        type=int,
        default=6,
        help="callgrind windows of the original at the tuned hierarchy, one after the other (~20 s each), "
        f"pooled into the tuning target (default 6, at most {MAX_PROFILE_WINDOWS})",
    )
    c.add_argument("--seconds", type=float, default=4.0, help="eBPF window at medium load (default 4)")
    c.add_argument("--quiet", action="store_true", help="no progress lines")
    c.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    r = sub.add_parser("clone-report", help="validate a clone against its original, metric by metric")
    r.add_argument("dir", metavar="DIR", help="clone directory written by `tailscope clone`")
    r.add_argument("--duration", type=float, default=8.0, help="seconds per load run (default 8)")
    r.add_argument("--out", help="HTML report path (default DIR/report.html)")
    r.add_argument("--json", action="store_true", help="print the validation as JSON")
    r.add_argument(
        "--part",
        choices=("all", "native", "simulated"),
        default="all",
        help="native: the timed load levels only (saved); simulated: the callgrind windows, with the saved "
        "native part (so that only the timed part needs a quiet machine); default all",
    )
    r.add_argument(
        "--sim-windows",
        default="auto",
        metavar="N|auto",
        help="callgrind windows per side and cache hierarchy; auto (default): 6, then more, up to 40, while "
        "the original's own spread leaves a row unjudged and 40 would judge it; a row still unjudged says how "
        "many would",
    )
    r.add_argument(
        "--idle",
        choices=IDLE_MODES,
        default="poll",
        help="how the CPUs idle during the timed runs: poll (default) holds them out of their idle halt "
        "(/dev/cpu_dma_latency = 0, as latency benchmarks do; on a kernel without a cpuidle driver, which "
        "ignores that, a SCHED_IDLE spinner on the server's CPU), so that a vCPU's wake-up does not land in every "
        "latency; halt leaves them as they are",
    )
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)


def cmd_clone(ns) -> int:
    from . import generate, profile, runner, tune
    from .tools import Progress

    progress = Progress(ns.quiet)
    if not 1 <= ns.iterations <= 10:
        raise CloneError(f"--iterations {ns.iterations}: must be between 1 and 10")
    if not 1 <= ns.profile_windows <= MAX_PROFILE_WINDOWS:
        raise CloneError(f"--profile-windows {ns.profile_windows}: must be between 1 and {MAX_PROFILE_WINDOWS}")
    out = Path(ns.out)
    load_args = runner.split_load(ns.load)
    rate = ns.rate or float(_rate_in(ns.load) or 5000)
    if rate <= 0:
        raise CloneError(f"--rate {rate:g}: must be positive")
    t0 = time.monotonic()
    prof = profile.run_profile(
        ns.pid,
        " ".join(load_args),
        rate,
        out,
        progress,
        relaunch=ns.relaunch,
        seconds=ns.seconds,
        vg_rate=ns.vg_rate,
        vg_requests=ns.vg_requests,
        sweep_requests=ns.sweep_requests,
        windows=ns.profile_windows,
    )
    sizes = next((b["ws_sizes"] for b in prof["body"].values() if b.get("ws_sizes")), None)
    skel = tune.measure_skeleton(prof, out, progress, sweep_sizes=sizes)
    (out / "private" / "skeleton.json").write_text(json.dumps(skel, indent=1))
    tu = tune.tune(prof, out, progress, seed=ns.seed, max_iter=ns.iterations, skeleton=skel)
    build_s = generate.build(out)
    progress("leakage check")
    lk = leak_check(prof, out)
    total = time.monotonic() - t0
    errs = tu["errors"]
    print(f"clone written to {out}/ (built in {build_s:.1f} s; pipeline {total / 60:.1f} min)")
    half = errs.pop(tune.HALF_I1_KEY, None)
    mid = errs.pop(tune.MID_D1_KEY, None)
    up = errs.pop(tune.UP_D1_KEY, None)
    # (the loop's second I1 and D1 points are not A: name their geometry)
    at_half = f"; I1 at {tune.half_i1_config()['I1']} (size,ways,line) {100 * half:.1f}%" if half is not None else ""
    at_half += f"; D1 at {tune.mid_d1_config()['D1']} {100 * mid:.1f}%" if mid is not None else ""
    at_half += f"; D1 at {tune.up_d1_config()['D1']} {100 * up:.1f}%" if up is not None else ""
    print(
        "tuned at cache A after {} iteration(s): {}".format(
            tu["iterations"], ", ".join(f"{k} {100 * v:.1f}%" for k, v in errs.items())
        )
        + at_half
    )
    print(
        f"leakage check: {'passed' if lk['ok'] else 'FAILED'} ({len(lk['leaked_strings'])} strings, "
        f"{len(lk['leaked_symbols'])} symbols, {lk['leaked_data_windows']} data windows of the original found)"
    )
    print(f"next: make -C {out} && {out}/run.sh ; tailscope clone-report {out}")
    print(f"share {out}/ without its private/ directory (it holds the original's command line and the profile)")
    return 0 if lk["ok"] else 1


def leak_check(prof: dict, out: Path) -> dict:
    from . import generate, leakage

    # the reference: the same skeleton configuration (network and thread model, which the
    # clone must share) with a neutral body and neutral tables, so everything the template
    # compiles to is allowed and only what came from the target's body or tables is not
    ref = generate.neutral_profile(prof["load"]["protocol"], port=prof["listen"]["port"])
    for key in ("network", "threads", "listen"):
        ref[key] = json.loads(json.dumps(prof[key]))
    ref["network"]["reply_kinds"] = [{"req_bytes": 16, "sizes": {"5": 1, "40": 1, "4000": 1}}]
    ref["network"]["extra_per_request"], ref["network"]["tick_per_second"] = [], []
    ref["body"] = {k: generate.neutral_profile()["body"]["0"] | {"role": v["role"]} for k, v in prof["body"].items()}
    ref_dir = out / "private" / "reference"
    generate.generate(ref, ref_dir, seed=99)
    generate.build(ref_dir)
    exe = Path(prof["private"]["exe"])
    lk = leakage.check(exe, out, reference=ref_dir / "clone")
    (out / "private" / "leakage.json").write_text(json.dumps(lk, indent=1))
    return lk


def _rate_in(load: str) -> str | None:
    import shlex

    from .runner import load_value

    try:
        return load_value(shlex.split(load), "--rate")
    except ValueError:
        return None


def _sim_windows(arg: str) -> tuple[int, int | None]:
    """--sim-windows: "auto" -> (validate.SIM_RUNS, validate.AUTO_SIM_MAX); N -> (N, None)."""
    from . import validate

    if arg == "auto":
        return validate.SIM_RUNS, validate.AUTO_SIM_MAX
    try:
        n = int(arg)
    except ValueError:
        n = 0
    if not 2 <= n <= validate.MAX_SIM_RUNS:
        raise CloneError(f"--sim-windows {arg}: must be auto or a number between 2 and {validate.MAX_SIM_RUNS}")
    return n, None


def cmd_clone_report(ns) -> int:
    from . import profile, report, validate
    from .tools import Progress

    sim_runs, sim_max = _sim_windows(ns.sim_windows)
    d = Path(ns.dir)
    if not d.is_dir():
        raise CloneError(f"{d}: no such directory")
    pp = d / "private" / "profile.json"
    if not pp.exists():
        raise CloneError(f"{d} has no private/profile.json: not a clone directory written by `tailscope clone`")
    prof = profile.load_profile(pp)
    res = validate.validate(
        prof,
        d,
        Progress(ns.quiet),
        duration=ns.duration,
        part=ns.part,
        sim_runs=sim_runs,
        sim_max=sim_max,
        idle=ns.idle,
    )
    if ns.part == "native":
        if ns.json:
            sys.stdout.write(json.dumps(res, indent=1) + "\n")
        print(f"native part written to {d}/private/validation-native.json; next: --part simulated", file=sys.stderr)
        return 0
    extra = {}
    for name in ("tuning", "leakage"):
        p = d / "private" / f"{name}.json"
        if p.exists():
            extra[name] = read_json(p)
    out = Path(ns.out) if ns.out else d / "report.html"
    report.write_html(
        out,
        {prof["private"].get("comm", "service"): {"validation": res, "profile": prof, **extra}},
        command=f"tailscope clone-report {d}",
    )
    if ns.json:
        sys.stdout.write(json.dumps(res, indent=1) + "\n")
    else:
        print(report.error_table_md(prof["private"].get("comm", "service"), res))
        wins = report.windows_note(res)
        if wins:
            print(f"callgrind windows: {wins}")
        busy = report.host_note(res)
        if busy:
            print(f"host during the timed runs: {busy}")
        print(f"report: {out}")
    return 0


def dispatch(ns) -> int:
    """Run `clone` or `clone-report`; a CloneError becomes the CLI's one-line error."""
    from tailscope.cli import CliError, terminate_gracefully

    terminate_gracefully()  # the servers and valgrind copies it starts are stopped on SIGTERM too
    try:
        return cmd_clone(ns) if ns.command == "clone" else cmd_clone_report(ns)
    except CloneError as exc:
        if getattr(ns, "debug", False):
            raise
        raise CliError(str(exc)) from None
