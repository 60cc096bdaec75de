#!/usr/bin/env python3
"""Who delays memcached and the load generator, per setup (diagnostic for docs/ldb.md).

Runs bench/ldb/wakeups.bt (bpftrace) around one run of each setup of bench/ldb/run.py's
decomposition at 20% load and prints, per setup, the wake-up-to-run waits of the server's
threads and of the load generator: a histogram, and the waits of 20 us or more by the task that
ran on that CPU just before. The probes add their own cost to every context switch, so the
latencies of these runs are not the benchmark's figures.

    flock -x /tmp/ts-quiet.lock flock /tmp/ts-agent.lock python bench/ldb/wakeups.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("ldb_run", HERE / "run.py")
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--load", type=float, default=0.2)
    ap.add_argument("--only", default="", help="';'-separated setting labels (default: all)")
    args = ap.parse_args()
    only = [s for s in args.only.split(";") if s]
    subprocess.run([str(run.ROOT / "bench" / "ldb" / "build-memcached.sh")], check=True, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="ldb-wk-") as td:
        tmp = Path(td)
        cap = run.capacity(args.seconds, tmp)
        print(f"capacity {cap:.0f} req/s; {int(args.load * 100)}% load", flush=True)
        for i, (label, setup, kw) in enumerate(run.DECOMPOSE):
            if only and label not in only:
                continue
            bt = subprocess.Popen(
                ["bpftrace", str(HERE / "wakeups.bt"), "mc-worker", "tailscope-loadg"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            time.sleep(4.0)  # bpftrace compiles and attaches
            try:
                r = run.run_setup(setup, cap * args.load, args.seconds, tmp, f"wk-{i}", analyse=False, **kw)
            finally:
                bt.send_signal(signal.SIGINT)
                out, _ = bt.communicate(timeout=60)
            print(f"\n=== {label}: p50 {r['p50_us']:.1f} us, p99 {r['p99_us']:.1f} us (probes attached)")
            print(out.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
