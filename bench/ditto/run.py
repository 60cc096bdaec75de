#!/usr/bin/env python3
"""Bench part `ditto`: clone memcached and redis (Debian packages) and validate the clones.

For each service: start it (pinned to CPU 0), run `tailscope clone` against the running
process at medium load (profiling, generation, tuning, leakage check), rebuild the clone from
scratch with plain gcc (timed), then `tailscope clone-report` (original vs clone at low,
medium and high load, and under two simulated cache hierarchies). Writes
bench/results/ditto.{md,json} (error tables, pipeline and build times, the command) and
bench/results/ditto.html (the validation report for both services).

    python3 bench/ditto/run.py [--services memcached,redis] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from tailscope.clone import report, validate  # noqa: E402

# the tailscope commands this script is running (`child`): a SIGTERM to the script goes on to them
_CHILDREN: list[subprocess.Popen] = []


def _on_sigterm(signum, frame) -> None:
    """A SIGTERM to this script goes on to the tailscope command it is running, which stops what
    it started (servers, valgrind copies, load generators) and exits 143; the script then stops
    too (`child`). With none running, it stops at once. Session 33: the script died and left its
    `clone-report` child running on."""
    live = [c for c in _CHILDREN if c.poll() is None]
    for c in live:
        c.send_signal(signal.SIGTERM)
    if not live:
        raise SystemExit(143)


def child(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, **kw)` (stdout=PIPE is read into the result), with a SIGTERM to this
    script passed on to the command (`_on_sigterm`); a command stopped that way stops the script
    (exit 143, one line)."""
    with subprocess.Popen(cmd, **kw) as p:
        _CHILDREN.append(p)
        try:
            out, err = p.communicate()
        finally:
            _CHILDREN.remove(p)
    if p.returncode == 143:
        print("bench ditto: terminated", file=sys.stderr)
        raise SystemExit(143)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


SERVICES = {
    "memcached": {
        "cmd": ["memcached", "-u", "root", "-p", "21311", "-t", "4", "-m", "64", "-c", "1024"],
        "port": 21311,
        "load": "--protocol memcached --keys 1000 --value-size 32 --set-ratio 0.1 --preload",
        "rate": 6000,
    },
    "redis": {
        "cmd": ["redis-server", "--port", "26479", "--save", "", "--appendonly", "no"],
        "port": 26479,
        "load": "--protocol redis --keys 1000 --value-size 32 --set-ratio 0.1 --preload",
        "rate": 6000,
    },
}


def _wait_port(port: int, timeout: float = 20) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"bench ditto: server did not listen on {port}")


def read_times(path: Path, fields: tuple[str, ...], hint: str) -> dict:
    """bench_times.json of an earlier stage, with the fields named (numbers); anything else is one
    line on stderr and exit 1 (a missing field raised KeyError with a traceback)."""
    try:
        times = json.loads(path.read_text())
    except OSError:
        raise SystemExit(f"bench ditto: no pipeline run in {path.parents[1]}: {hint}") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"bench ditto: {path} is corrupt: not JSON ({exc.msg}); {hint}") from None
    if not isinstance(times, dict):
        raise SystemExit(f"bench ditto: {path} is corrupt: not a JSON object; {hint}")
    for f in fields:
        v = times.get(f)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            what = "missing" if f not in times else f"not a time in seconds ({v!r})"
            raise SystemExit(f"bench ditto: {path} is corrupt: field '{f}' is {what}; {hint}")
    return times


def run_service(name: str, spec: dict, work: Path, quick: bool, stage: str = "all") -> dict:
    out = work / name
    if stage in ("report", "native", "simulated"):  # the clone of an earlier `--stage pipeline` run
        times = read_times(
            out / "private" / "bench_times.json", ("pipeline_s", "build_s"), "run --stage pipeline first"
        )
        if stage == "native":  # the timed load levels only (under the exclusive lock), saved for `simulated`
            t0 = time.monotonic()
            rp = child(
                [
                    sys.executable,
                    "-m",
                    "tailscope",
                    "clone-report",
                    str(out),
                    "--part",
                    "native",
                    "--duration",
                    "3" if quick else "8",
                ],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT / "python")},
            )
            if rp.returncode != 0:
                raise SystemExit(f"bench ditto: clone-report --part native failed for {name}")
            times["native_s"] = time.monotonic() - t0
            (out / "private" / "bench_times.json").write_text(json.dumps(times))
            return {}
        return validate_service(name, out, quick, times, part="simulated" if stage == "simulated" else "all")
    # the new run goes to a directory beside the last complete one, which it replaces only once
    # it is complete (session 41: a pipeline stopped or failed had cleared the last run first)
    final, out = out, work / f".{name}.partial"
    shutil.rmtree(out, ignore_errors=True)
    srv = subprocess.Popen(
        ["taskset", "-c", "0", *spec["cmd"]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_port(spec["port"])
        cmd = [
            sys.executable,
            "-m",
            "tailscope",
            "clone",
            "-p",
            str(srv.pid),
            "--load",
            spec["load"],
            "--rate",
            str(spec["rate"]),
            "-o",
            str(out),
            "--relaunch",
            " ".join(a if a else "''" for a in spec["cmd"]),
        ]
        if quick:
            cmd += ["--iterations", "3", "--vg-requests", "1000", "--sweep-requests", "400"]
        print(f"[ditto] {name}: {' '.join(cmd[2:])}", flush=True)
        t0 = time.monotonic()
        p = child(cmd, cwd=ROOT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
        pipeline_s = time.monotonic() - t0
        if p.returncode not in (0, 1) or not (out / "clone").exists():
            raise SystemExit(f"bench ditto: tailscope clone failed for {name}")
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()
    # rebuild from scratch with plain gcc, timed
    subprocess.run(["make", "-s", "-C", str(out), "clean"], check=True)
    t0 = time.monotonic()
    subprocess.run(["make", "-s", "-C", str(out)], check=True)
    build_s = time.monotonic() - t0
    times = {"pipeline_s": pipeline_s, "build_s": build_s}
    (out / "private" / "bench_times.json").write_text(json.dumps(times))
    replace_run(out, final)
    if stage == "pipeline":
        print(f"[ditto] {name}: pipeline {pipeline_s / 60:.1f} min, build {build_s:.1f} s; next: --stage report")
        return {}
    return validate_service(name, final, quick, times)


def validate_service(name: str, out: Path, quick: bool, times: dict, part: str = "all") -> dict:
    t0 = time.monotonic()
    rp = child(
        [
            sys.executable,
            "-m",
            "tailscope",
            "clone-report",
            str(out),
            "--json",
            "--duration",
            "3" if quick else "8",
            "--part",
            part,
            # (auto: 6 windows a side, up to 40 while the original's spread leaves a row unjudged)
            *(["--sim-windows", "3"] if quick else []),
        ],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT / "python")},
    )
    validate_s = time.monotonic() - t0
    if rp.returncode != 0:
        raise SystemExit(f"bench ditto: clone-report failed for {name}")
    res = json.loads(rp.stdout)
    priv = out / "private"
    prof = json.loads((priv / "profile.json").read_text())
    tuning = json.loads((priv / "tuning.json").read_text())
    leak = json.loads((priv / "leakage.json").read_text())
    # a split report: the native part's time (its own locked run) plus the simulated part's
    validate_s += times.get("native_s", 0.0) if part == "simulated" else 0.0
    times = {"pipeline_s": times["pipeline_s"], "build_s": times["build_s"], "validate_s": validate_s}
    (priv / "bench_times.json").write_text(json.dumps(times))
    return {
        "validation": res,
        "profile": prof,
        "tuning": tuning,
        "leakage": leak,
        **times,
        "clone_dir": str(out.relative_to(ROOT)),
    }


def replace_run(new: Path, final: Path) -> None:
    """Put a complete run (`new`) in the place of the service's last one (`final`): the last one
    moves aside first and goes only once the new one is in place. A move that fails puts the last
    one back and is one line saying where each run is (session 41 left a traceback there)."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    try:
        if final.exists():
            final.rename(old)
        new.rename(final)
    except OSError as exc:
        if old.exists() and not final.exists():
            try:
                old.rename(final)  # (the last run back in its place)
            except OSError:
                pass
        where = f"; the last one is in {old}" if old.exists() else f"; the last one stays in {final}"
        raise SystemExit(
            f"bench ditto: the new run is complete in {new} but could not take the place of {final} "
            f"({exc.strerror or exc}){where}"
        ) from None
    shutil.rmtree(old, ignore_errors=True)


def load_service(name: str, work: Path) -> dict:
    """A service's results from its last run (its clone directory under bench/work/ditto)."""
    out = work / name
    priv = out / "private"
    try:
        r = {k: json.loads((priv / f"{k}.json").read_text()) for k in ("profile", "tuning", "leakage")}
        r["validation"] = json.loads((priv / "validation.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"bench ditto: {name}: no complete earlier run in {out} ({exc})") from None
    r.update(
        read_times(
            priv / "bench_times.json",
            ("pipeline_s", "build_s", "validate_s"),
            f"re-run it: --services {name} --stage pipeline, then --stage report",
        )
    )
    # judged by this checkout's rules (session 26: the spread pooled over hierarchies), not by
    # those of the run that measured it: both services' rows in one report read alike
    v = r["validation"]
    if isinstance(v, dict) and "levels" in v:
        try:
            v["errors"] = validate.errors(v)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise SystemExit(f"bench ditto: --also {name}: {priv / 'validation.json'} is corrupt ({exc!r})") from None
    r["clone_dir"] = str(out.relative_to(ROOT))
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", default="memcached,redis")
    ap.add_argument("--quick", action="store_true", help="fewer tuning iterations and shorter windows")
    ap.add_argument(
        "--also",
        default="",
        help="services to report from their last run (bench/work/ditto/<name>) without re-running them, "
        "so that each service's run can hold the exclusive lock on its own",
    )
    ap.add_argument(
        "--stage",
        choices=("all", "pipeline", "report", "native", "simulated", "results"),
        default="all",
        help="pipeline: profile, generate, tune and build only; report: validate the clone a pipeline "
        "stage left (so that the heavy pipeline runs under a shared lock and the timed validation under "
        "the exclusive one); native, then simulated: the report in two parts, the timed load levels "
        "(exclusive lock) and the callgrind windows (shared lock); results: run nothing, write the results "
        "of the services' last runs. Run the simulated stages one after the other: side by side they slow "
        "each other's servers in wall time, and a service's timer work (redis's cron) runs by the wall "
        "clock (session 32: redis's data-side LL misses at A rose by half)",
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _on_sigterm)
    if os.geteuid() != 0:
        print("bench ditto: skipped: needs root (eBPF, network namespaces)")
        return 0
    for tool in ("valgrind", "bpftrace", "perf", "memcached", "redis-server"):
        if shutil.which(tool) is None:
            print(f"bench ditto: skipped: {tool} is not installed (run scripts/setup.sh)")
            return 0
    work = ROOT / "bench" / "work" / "ditto"
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    also = [n for n in args.also.split(",") if n]
    unknown = [n for n in args.services.split(",") + also if n not in SERVICES]
    if unknown:
        raise SystemExit(f"bench ditto: unknown service '{unknown[0]}' (known: {', '.join(SERVICES)})")
    for name in args.services.split(","):
        if args.stage == "results":
            results[name] = load_service(name, work)
        else:
            results[name] = run_service(name, SERVICES[name], work, args.quick, args.stage)
    if args.stage in ("pipeline", "native"):
        return 0
    for name in also:
        results[name] = load_service(name, work)
    results = {n: results[n] for n in sorted(results, key=lambda n: list(SERVICES).index(n))}
    quick = " --quick" if args.quick else ""
    py = ".venv/bin/python bench/ditto/run.py"

    def steps(n: str) -> str:
        if args.stage == "report":  # the pipeline under the shared lock, then the timed validation
            return f"{py} --services {n} --stage pipeline{quick}; {py} --services {n} --stage report{quick}"
        if args.stage in ("simulated", "results"):  # pipeline (shared), native (exclusive), simulated (shared)
            return "; ".join(f"{py} --services {n} --stage {st}{quick}" for st in ("pipeline", "native", "simulated"))
        return f"{py} --services {n}{quick}"

    command = steps(args.services)
    if also:  # the services were run one per locked run: the earlier ones first, then this one
        command = f"{'; '.join(steps(n) for n in also)}; {command} --also {args.also}"
    out_dir = ROOT / "bench" / "results"
    report.write_html(out_dir / "ditto.html", results, command=command)
    summary = {
        "command": command,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "note": "2-vCPU VM shared with other builds; timings are noisy"},
        "services": {
            n: {
                "targets": r["validation"]["errors"]["targets"],
                "errors": r["validation"]["errors"],
                "levels": r["validation"]["levels"],
                "simulated": r["validation"]["simulated"],
                "rates": r["validation"]["rates"],
                "pipeline_s": r["pipeline_s"],
                "build_s": r["build_s"],
                "validate_s": r["validate_s"],
                "tuning_iterations": r["tuning"]["iterations"],
                "leakage_ok": r["leakage"]["ok"],
                "model": r["profile"]["network"]["model"],
                "workers": r["profile"]["network"]["workers"],
                "clusters": [
                    {k: c[k] for k in ("role", "count", "period_us")} for c in r["profile"]["threads"]["clusters"]
                ],
            }
            for n, r in results.items()
        },
    }
    (out_dir / "ditto.json").write_text(json.dumps(summary, indent=1, default=str))

    def held_out(r: dict) -> list[str]:
        note = report.held_out_note(r["validation"].get("configs", {}), r["profile"], r.get("tuning"))
        busy = report.host_note(r["validation"])
        wins = report.windows_note(r["validation"])
        return (
            ([f"Held-out hierarchy: {note}", ""] if note else [])
            + ([f"Callgrind windows: {wins}", ""] if wins else [])
            + ([f"Host during the timed runs: {busy}", ""] if busy else [])
        )

    md = [
        "# Ditto: clones of memcached and redis",
        "",
        f"Reproduce: `{command}` (part `ditto` of `make bench`). Report: bench/results/ditto.html.",
        "",
        "Machine: 2 vCPUs shared with other engineers; native latencies are only meaningful when the run "
        "holds `flock -x /tmp/ts-quiet.lock` (no other heavy work meanwhile). Since session 27 the timed runs keep "
        "the CPUs from halting when idle (`clone-report --idle poll`): a CPU latency request of 0 µs, or, on a "
        "kernel without a cpuidle driver (session 33's VM), a SCHED_IDLE spinner on the server's CPU; each "
        "service's host note says which. A halted vCPU's wake-up was ~45 µs of every latency on session 27's VM, "
        "and its tail moved with the host's load.",
        "",
        "Simulated rows (callgrind): each side is the pool (summed counts) of its windows at that hierarchy; the "
        "clone was tuned to a pool of the original's windows at A taken by the profile and by the tuning loop (one "
        "beside each of its clone's windows). The original's own spread "
        "there is two standard errors of its pooled mean, 2·sd/√n, the deviation taken over its windows (at A the "
        "profile's and, since session 42, the tuning loop's windows too, for the deviation only); for two "
        "windows this is |a − b| / mean, the sessions 7–8 figure. It is never less "
        "than the same taken with the deviation pooled over every hierarchy's windows (each relative to its own "
        "hierarchy's mean: a rare stretch of the service's own shows in some windows at every hierarchy), nor than "
        "the counting noise of the pool, 2/√N for N pooled events (it binds for the LL misses, tens per window).",
        "",
    ]
    for n, r in results.items():
        md += [
            f"## {n}",
            "",
            f"Pipeline (profile + generate + tune + leakage check): {r['pipeline_s'] / 60:.1f} min; clone build "
            f"with gcc: {r['build_s']:.1f} s; tuning iterations: {r['tuning']['iterations']}; leakage check: "
            f"{'passed' if r['leakage']['ok'] else 'FAILED'}; network model: {r['profile']['network']['model']}.",
            "",
            report.error_table_md(n, r["validation"]),
            "",
            *held_out(r),
            "<details><summary>all metrics</summary>",
            "",
            report.detail_table_md(r["validation"]),
            "",
            "</details>",
            "",
        ]
    (out_dir / "ditto.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
