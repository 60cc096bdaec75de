import subprocess
import sys
from pathlib import Path

import pytest

from tailscope.synth import write_recording


@pytest.fixture(scope="session")
def recordings(tmp_path_factory):
    """Synthetic recordings, one per planted cause plus a null one (built once)."""
    base = tmp_path_factory.mktemp("recs")
    out = {}
    for cause in ("runnable", "irq", "blocked", "faults", "softirq", None):
        out[cause] = write_recording(base / str(cause), 60_000, cause=cause, parts=2, seed=3)
    return out


def run_cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "tailscope", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def cli():
    return run_cli


REPO = Path(__file__).resolve().parents[2]
