"""The accuracy suite (bench/accuracy.py) as a test: each injected cause ranks
first in >= 4 of 5 seeds, the null runs (500 µs and 100 µs requests) blame
nothing but the platform's interrupts for > 10% of p99, and
on-CPU + runnable + blocked accounts for latency within 5% (median).

Needs root, eBPF and the built binaries; skips with the reason otherwise.
Writes the table to bench/results/accuracy.{json,md}.
"""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import accuracy  # noqa: E402

SEEDS = int(os.environ.get("TAILSCOPE_ACCURACY_SEEDS", "5"))


@pytest.fixture(scope="module")
def suite():
    if os.geteuid() != 0:
        pytest.skip("accuracy suite needs root for eBPF")
    for exe in (accuracy.AGENT, accuracy.LOADGEN, accuracy.SERVER):
        if not exe.exists():
            pytest.skip(f"{exe} not built (run make build)")
    res = accuracy.run_suite(list(accuracy.EXPECTED), SEEDS, 5.0)
    accuracy.write_results(res, f"python bench/accuracy.py --seeds {SEEDS}")
    print(accuracy.render(res, "make test"))
    return res


@pytest.mark.parametrize("cause", ["hog", "lock", "faults", "ipi"])
def test_injected_cause_ranks_first(suite, cause):
    c = suite["causes"][cause]
    assert c["passed"], f"{cause}: {c['score']}; runs: {[r['ranking'] for r in c['runs']]}"


def test_null_run_blames_only_platform_interrupts(suite):
    """500 µs requests: the platform's interrupts are 1-4% of p99 as a rule, but the host
    sometimes holds the vCPU inside a softirq for 0.1-4 ms, and then softirq is the cause."""
    c = suite["causes"]["none"]
    assert c["passed"], f"null run: {c['score']}; runs: {[r['ranking'] for r in c['runs']]}"


def test_short_null_run_blames_only_platform_interrupts(suite):
    """The matched control: the lock and fault runs' 100 µs requests, nothing
    injected. The VM's timer ticks and reply softirqs may make its p99 (they
    do: 9-12%), but no scheduler, blocking or fault event may pass 10%."""
    c = suite["causes"]["none-short"]
    assert c["passed"], f"short null run: {c['score']}; runs: {[r['ranking'] for r in c['runs']]}"


def test_accounting_identity(suite):
    assert suite["accounting_passed"], f"median accounting error {suite['accounting_error_median']}"
