#!/usr/bin/env python3
"""`make bench`: every benchmark part, one after another.

Parts: `runtime` (ns per request begin/end pair), `analysis` (recorded requests
ranked per second), `varmri` (throughput and p99 cost of recording against
bpftrace, perf and ftrace), `breakwater` (overload control against its
baselines, real runs plus the simulator), `ldb` (per-call cost of function-level
recording against -pg/uftrace, the LDB toy against perf, instrumented memcached at 20%
and 80% load). Each part writes bench/results/<part>.{json,md}.
Select parts with `BENCH=varmri,runtime make bench` or `bench/run.py --parts ...`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

PARTS = {
    "runtime": [PY, str(ROOT / "bench/runtime/run.py")],
    "analysis": [PY, str(ROOT / "bench/analysis/bench_analysis.py")],
    "varmri": [PY, str(ROOT / "bench/varmri.py")],
    "breakwater": [PY, str(ROOT / "bench/breakwater/run.py")],
    "ldb": [PY, str(ROOT / "bench/ldb/run.py")],
    "ditto": [PY, str(ROOT / "bench/ditto/run.py")],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--parts", default=os.environ.get("BENCH", ",".join(PARTS)))
    args = ap.parse_args()
    failed = []
    for part in args.parts.split(","):
        if part not in PARTS:
            print(f"bench: unknown part {part!r} (known: {', '.join(PARTS)})", file=sys.stderr)
            return 2
        print(f"\n==> bench part `{part}`", flush=True)
        if subprocess.run(PARTS[part], cwd=ROOT).returncode != 0:
            failed.append(part)
    if failed:
        print(f"bench: failed parts: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("\nresults: bench/results/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
