"""Analysis-speed benchmark: rank a 10M-request recording end to end.

Generates a synthetic, schema-valid recording (tailscope.synth, planted runnable-wait cause)
under bench/work/analysis-<N>/ once, then times `tailscope report DIR --json --no-html`
(Parquet load + full VarMRI ranking + segments; a fresh process each run) and reports the
median of the runs as requests/s. Writes bench/results/analysis.json and analysis.md.

    .venv/bin/python bench/analysis/bench_analysis.py [--rows 10000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
WORK = ROOT / "bench" / "work"
RESULTS = ROOT / "bench" / "results"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--parts", type=int, default=10)
    ap.add_argument("--html", action="store_true", help="also time writing the HTML report")
    args = ap.parse_args()

    from tailscope.synth import write_recording

    rec = WORK / f"analysis-{args.rows}"
    if not (rec / "meta.json").exists():
        t = time.perf_counter()
        write_recording(rec, args.rows, cause="runnable", parts=args.parts, duration_s=600.0, seed=7)
        print(f"generated {args.rows} rows in {time.perf_counter() - t:.1f} s at {rec}", file=sys.stderr)
    cmd = [sys.executable, "-m", "tailscope", "report", str(rec), "--json"]
    if not args.html:
        cmd.append("--no-html")
    times = []
    top = None
    for i in range(args.runs):
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, check=False)
        dt = time.perf_counter() - t
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        top = json.loads(p.stdout)["causes"][0]["event"]
        times.append(dt)
        print(f"run {i + 1}: {dt:.2f} s ({args.rows / dt / 1e6:.2f} M requests/s), top cause {top}", file=sys.stderr)
    med = statistics.median(times)
    command = f".venv/bin/python bench/analysis/bench_analysis.py --rows {args.rows} --runs {args.runs}" + (
        " --html" if args.html else ""
    )
    res = {
        "rows": args.rows,
        "runs": times,
        "median_s": med,
        "rows_per_s": args.rows / med,
        "top_cause": top,
        "includes": "process start, Parquet load, ranking, segments, JSON" + (", HTML" if args.html else ""),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "command": command,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "analysis.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "analysis.md").write_text(
        f"Analysis speed: {args.rows:,} requests ranked end to end in {med:.2f} s (median of {args.runs}), "
        f"{args.rows / med / 1e6:.2f} M requests/s on {os.cpu_count()} CPUs. Reproduce: `{command}`\n"
    )
    print(f"{args.rows / med:,.0f} requests/s (median {med:.2f} s of {args.runs} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
