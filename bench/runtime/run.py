#!/usr/bin/env python3
"""`make bench`, part `runtime`: ns per request begin/end pair.

Runs bench/runtime/build/microbench (median of its runs per case) and writes
bench/results/runtime.{json,md}. Targets (issue: foundation + VarMRI):
unsampled <= 20 ns per pair, sampled <= 100 ns per pair. The `selfdrain`
case is the sampled cost without a consumer on another CPU bouncing the ring's
cache lines; the `fake_kc` case adds the kernel-counter snapshots, and
`fake_kc_selfdrain` is both: the runtime's own cost as a real agent, which
drains every 1-16 ms rather than spinning, sees it.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXE = ROOT / "bench/runtime/build/microbench"
OUT = ROOT / "bench/results"
TARGETS = {
    "unsampled": 20.0,
    "sampled_100pct_selfdrain": 100.0,
    "sampled_100pct_fake_kc": 100.0,
    "sampled_100pct_fake_kc_selfdrain": 100.0,
    "sampled_100pct_kcounters": 100.0,
}


def main() -> int:
    if not EXE.exists():
        print(f"bench: {EXE} not built; run `make build`", file=sys.stderr)
        return 1
    res = subprocess.run([str(EXE)], capture_output=True, text=True, env={"TAILSCOPE_SAMPLE": "0"})
    if res.returncode != 0:
        print(f"bench: microbench failed: {res.stderr.strip()}", file=sys.stderr)
        return 1
    cases = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    OUT.mkdir(parents=True, exist_ok=True)
    cmd = "make -C bench/runtime && python bench/runtime/run.py"
    (OUT / "runtime.json").write_text(json.dumps({"command": cmd, "cases": cases}, indent=2))
    lines = [
        "# runtime: ns per begin/end pair (median of runs)",
        "",
        f"Reproduce: `{cmd}`",
        "",
        "| case | ns/pair | target | met |",
        "|---|---|---|---|",
    ]
    for c in cases:
        t = TARGETS.get(c["case"])
        if "skipped" in c:
            lines.append(f"| {c['case']} | skipped: {c['skipped']} | {t or ''} | |")
            continue
        ns = c["ns_per_pair_median"]
        met = "" if t is None else ("yes" if ns <= t else "no")
        lines.append(f"| {c['case']} | {ns:.1f} | {t or ''} | {met} |")
    md = "\n".join(lines) + "\n"
    (OUT / "runtime.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
