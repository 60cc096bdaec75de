#!/usr/bin/env python3
"""Make docs/img/ldb-report.png: a `--functions` recording of instrumented memcached under
SET load, its HTML report, and a headless-Chromium screenshot of the LDB sections.

    python bench/ldb/screenshot.py [--rate 4000] [--seconds 8] [--keep DIR]

Needs root (the agent), build/memcached-ldb (bench/ldb/build-memcached.sh), chromium and
chromedriver (scripts/setup.sh installs them).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "ldb"))
sys.path.insert(0, str(ROOT / "python" / "tests"))

from run import AGENT, LOADGEN, MC, agent_cmd_retry, wait_port  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=4000)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--keep", type=Path, help="keep the recording here")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "ldb-report.png")
    args = ap.parse_args()
    subprocess.run([str(ROOT / "bench" / "ldb" / "build-memcached.sh")], check=True, stdout=subprocess.DEVNULL)
    port = 22377
    with tempfile.TemporaryDirectory(prefix="ldb-shot-") as td:
        rec = args.keep or Path(td) / "rec"
        shutil.rmtree(rec, ignore_errors=True)
        srv = subprocess.Popen(
            ["taskset", "-c", "0", str(MC["ldb"]), "-p", str(port), "-U", "0", "-t", "2", "-u", "root"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(port)
            agent = agent_cmd_retry(
                ["record", "-o", str(rec), "--functions", "--sample", "100%", "--quiet", "-p", str(srv.pid)]
            )
            subprocess.run(
                [
                    str(LOADGEN),
                    "--protocol",
                    "memcached",
                    "--target",
                    f"127.0.0.1:{port}",
                    "--rate",
                    str(args.rate),
                    "--duration",
                    str(args.seconds),
                    "--set-ratio",
                    "1",
                    "--value-size",
                    "64",
                    "--cpu",
                    "1",
                    "--quiet",
                ],
                check=True,
            )
            agent.send_signal(signal.SIGINT)
            agent.wait(timeout=60)
        finally:
            srv.terminate()
            srv.wait()
        rep = subprocess.run(
            [sys.executable, "-m", "tailscope", "report", str(rec)], cwd=ROOT / "python", capture_output=True, text=True
        )
        print(rep.stdout)
        if rep.returncode != 0:
            print(rep.stderr, file=sys.stderr)
            return 1
        from test_browser import _driver

        with tempfile.TemporaryDirectory(prefix="ts-chrome-") as profile:
            drv = _driver(profile)
            try:
                drv.set_window_size(1200, 2600)
                drv.get((rec / "report.html").as_uri())
                time.sleep(4)
                drv.execute_script("document.getElementById('ldb').scrollIntoView();")
                time.sleep(1)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                drv.save_screenshot(str(args.out))
            finally:
                drv.quit()
    print(f"wrote {args.out} (agent {AGENT.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
