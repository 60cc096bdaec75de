"""Synthetic recordings with a planted cause, for tests and the analysis benchmark.

`write_recording(dir, n, cause=...)` writes a schema-valid recording (meta.json +
requests/part-*.parquet). Each request's latency is the sum of its parts, as the agent
measures them: own on-CPU work + irq + softirq + runnable wait + blocked wait + a little
untracked time. A planted cause adds `extra_ns` of one kind of time to a `fraction` of the
requests (the latency grows by the same amount):

| cause     | what the planted requests get                                           |
|-----------|-------------------------------------------------------------------------|
| runnable  | one long runnable wait (preempted by a hog): runnable_wait_ns, +1 preemption |
| irq       | a burst of hard irqs: irq_ns (+ irq_count)                              |
| softirq   | a burst of softirq work: softirq_ns (+ softirq_count)                   |
| blocked   | one long sleep (lock or I/O): blocked_wait_ns (+1 voluntary switch)    |
| faults    | many user page faults, handled on-CPU: fault_user_count and on_cpu_ns   |
| None      | nothing: a null recording                                               |
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tailscope.schema import load_schema

CAUSES = ("runnable", "irq", "softirq", "blocked", "faults")
FAULT_COST_NS = 4_000


def synth_columns(
    n: int,
    *,
    cause: str | None = "runnable",
    fraction: float = 0.02,
    extra_ns: float = 800_000,
    duration_s: float = 60.0,
    seed: int = 1,
    invalid_fraction: float = 0.0,
    window: tuple[float, float] | None = None,
    kinds: tuple[str, ...] = ("GET",),
) -> dict[str, np.ndarray]:
    """Columns of a synthetic requests table (see the module docstring). `window` = (a, b) in
    [0, 1] confines the planted cause to that part of the recording's time span."""
    if cause is not None and cause not in CAUSES:
        raise ValueError(f"unknown cause {cause!r}; one of {CAUSES} or None")
    rng = np.random.default_rng(seed)
    u64, u32 = np.uint64, np.uint32
    gaps = rng.exponential(duration_s * 1e9 / max(n, 1), n)
    start = (1_000_000_000_000 + np.cumsum(gaps)).astype(u64)
    own = rng.lognormal(np.log(50_000), 0.25, n)
    irq_n = rng.poisson(0.3, n)
    irq = irq_n * rng.uniform(1_000, 3_000, n)
    soft_n = rng.poisson(0.2, n)
    soft = soft_n * rng.uniform(2_000, 6_000, n)
    # background kernel noise of a quiet machine: short waits, well under the request's work
    run_n = rng.binomial(1, 0.3, n)
    run = run_n * rng.exponential(3_000, n)
    blk_n = rng.binomial(1, 0.1, n)
    blk = blk_n * rng.exponential(4_000, n)
    faults = rng.poisson(0.2, n)
    kfaults = rng.poisson(0.05, n)
    migr = rng.binomial(1, 0.01, n)
    inv = run_n.copy()
    vol = blk_n.copy()
    if cause is not None:
        hit = rng.random(n) < fraction
        if window is not None:
            pos = np.linspace(0.0, 1.0, n)
            hit &= (pos >= window[0]) & (pos < window[1])
        extra = extra_ns * rng.uniform(0.8, 1.2, n) * hit
        if cause == "runnable":
            run = run + extra
            run_n = run_n + hit
            inv = inv + hit
        elif cause == "irq":
            burst = hit * 40
            irq = irq + extra
            irq_n = irq_n + burst
        elif cause == "softirq":
            soft = soft + extra
            soft_n = soft_n + hit * 20
        elif cause == "blocked":
            blk = blk + extra
            blk_n = blk_n + hit
            vol = vol + hit
        elif cause == "faults":
            nf = np.round(extra / FAULT_COST_NS).astype(np.int64) * hit
            faults = faults + nf
            own = own + nf * FAULT_COST_NS
    other = rng.uniform(500, 2_000, n)
    latency = own + irq + soft + run + blk + other
    valid = rng.random(n) >= invalid_fraction
    kind_idx = rng.integers(0, len(kinds), n)
    cols = {
        "request_id": np.arange(1, n + 1, dtype=u64),
        "pid": np.full(n, 4242, dtype=u32),
        "tid": (4242 + rng.integers(0, 4, n)).astype(u32),
        "kind": np.asarray(kinds, dtype=object)[kind_idx],
        "start_ns": start,
        "latency_ns": latency.astype(u64),
        "on_cpu_ns": (own + irq + soft).astype(u64),
        "runnable_wait_ns": run.astype(u64),
        "blocked_wait_ns": blk.astype(u64),
        "irq_ns": irq.astype(u64),
        "softirq_ns": soft.astype(u64),
        "runnable_wait_count": run_n.astype(u32),
        "blocked_wait_count": blk_n.astype(u32),
        "irq_count": irq_n.astype(u32),
        "softirq_count": soft_n.astype(u32),
        "fault_user_count": faults.astype(u32),
        "fault_kernel_count": kfaults.astype(u32),
        "migration_count": migr.astype(u32),
        "voluntary_switch_count": vol.astype(u32),
        "involuntary_switch_count": inv.astype(u32),
        "cpu": rng.integers(0, 2, n).astype(u32),
        "sampled": np.ones(n, dtype=bool),
        "inferred": np.zeros(n, dtype=bool),
        "counters_valid": valid,
    }
    # Rows without counters carry latency only: zero their counters, as the agent does.
    for name in list(cols)[6:20]:
        cols[name] = np.where(valid, cols[name], 0).astype(cols[name].dtype)
    return cols


def default_meta(n: int, duration_s: float, **overrides) -> dict:
    schema = load_schema()
    meta = {
        "schema_version": schema.schema_version,
        "tailscope_version": "0.1.0",
        "host": "synthetic",
        "kernel": "6.0.0-synthetic",
        "target": {"pid": 4242, "comm": "synth-server"},
        "mode": "marker",
        "sampling": {"rate": 1.0},
        "drops": {"ring_full": 0, "writer_backlog": 0},
        "start_unix_ns": 1_700_000_000_000_000_000,
        "duration_s": duration_s,
        "requests_recorded": n,
        "clock": {"monotonic_to_unix_ns": 1_699_999_000_000_000_000},
        "finalised_by": "synthetic",
        "cost": {"agent_cpu_pct": 0.4},
    }
    meta.update(overrides)
    return meta


def write_table(directory: Path, columns: dict[str, np.ndarray], parts: int = 1) -> list[Path]:
    """Write columns as requests/part-NNNNN.parquet with the schema's exact types."""
    schema = load_schema()
    req = directory / schema.requests_dir
    req.mkdir(parents=True, exist_ok=True)
    arrow_schema = pa.schema([(c, schema.arrow_type(c)) for c in schema.request_columns])
    n = len(columns["latency_ns"])
    bounds = np.linspace(0, n, max(parts, 1) + 1).astype(int)
    paths = []
    for i in range(max(parts, 1)):
        a, b = bounds[i], bounds[i + 1]
        arrays = [pa.array(columns[c][a:b], type=arrow_schema.field(c).type) for c in schema.request_columns]
        path = req / f"part-{i:05d}.parquet"
        pq.write_table(pa.Table.from_arrays(arrays, schema=arrow_schema), path, compression="zstd")
        paths.append(path)
    return paths


def write_recording(
    directory: str | Path,
    n: int = 50_000,
    *,
    cause: str | None = "runnable",
    parts: int = 2,
    duration_s: float = 60.0,
    meta: dict | None = None,
    **kwargs,
) -> Path:
    """Write a complete synthetic recording; returns its directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cols = synth_columns(n, cause=cause, duration_s=duration_s, **kwargs)
    write_table(directory, cols, parts=parts if n else 0)
    (directory / load_schema().meta_file).write_text(json.dumps(default_meta(n, duration_s, **(meta or {})), indent=2))
    return directory
