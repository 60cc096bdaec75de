"""External tools the clone pipeline needs, with the line that says how to install each.

Every missing tool is a one-line `CloneError` naming the Debian package, never a traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .errors import CloneError

INSTALL = {
    "valgrind": "valgrind is missing: install it with `apt-get install valgrind` (or run scripts/setup.sh)",
    "callgrind_control": "callgrind_control is missing: install it with `apt-get install valgrind`",
    "perf": "perf is missing: install it with `apt-get install linux-perf` (or run scripts/setup.sh)",
    "bpftrace": "bpftrace is missing: install it with `apt-get install bpftrace` (or run scripts/setup.sh)",
    "gcc": "gcc is missing: install it with `apt-get install gcc make`",
    "make": "make is missing: install it with `apt-get install make`",
    "unshare": "unshare is missing: install it with `apt-get install util-linux`",
    "ip": "ip is missing: install it with `apt-get install iproute2`",
    "ss": "ss is missing: install it with `apt-get install iproute2`",
    "strings": "binutils is missing: install it with `apt-get install binutils`",
    "nm": "binutils is missing: install it with `apt-get install binutils`",
}


def need(*names: str) -> dict[str, str]:
    """Paths of the named tools; a one-line error with the install hint for the first missing."""
    found = {}
    for name in names:
        env = os.environ.get(f"TAILSCOPE_{name.upper()}")
        path = env if env else shutil.which(name)
        if not path or not os.access(path, os.X_OK):
            raise CloneError(INSTALL.get(name, f"{name} is missing from PATH"))
        found[name] = path
    return found


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def find_loadgen() -> str:
    """$TAILSCOPE_LOADGEN, else <repo>/target/release/tailscope-loadgen, else PATH."""
    env = os.environ.get("TAILSCOPE_LOADGEN")
    if env and os.access(env, os.X_OK):
        return env
    built = repo_root() / "target" / "release" / "tailscope-loadgen"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    found = shutil.which("tailscope-loadgen")
    if found:
        return found
    raise CloneError("tailscope-loadgen not found: build it with `cargo build --release -p tailscope-loadgen`")


class Progress:
    """Progress lines on stderr: `[clone 02:13] step: detail`. Quiet when quiet=True."""

    def __init__(self, quiet: bool = False, prefix: str = "clone"):
        self.t0 = time.monotonic()
        self.quiet = quiet
        self.prefix = prefix

    def __call__(self, msg: str) -> None:
        if self.quiet:
            return
        el = int(time.monotonic() - self.t0)
        print(f"[{self.prefix} {el // 60:02d}:{el % 60:02d}] {msg}", file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


def run(cmd: list[str], timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """subprocess.run with captured text output; a failure is a one-line CloneError."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        raise CloneError(f"{Path(cmd[0]).name} did not finish within {timeout:.0f} s") from None
    except FileNotFoundError:
        raise CloneError(f"{cmd[0]} is missing") from None
    if check and p.returncode != 0:
        last = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or ["(no output)"])[-1]
        raise CloneError(f"{Path(cmd[0]).name} failed (exit {p.returncode}): {last[:300]}")
    return p
