"""The kernel events tailscope ranks, derived from the requests table's columns.

| event                     | label                 | unit  | derived from                                   |
|---------------------------|-----------------------|-------|------------------------------------------------|
| runnable_wait_ns          | runnable wait         | ns    | runnable_wait_ns                               |
| blocked_wait_ns           | blocked wait          | ns    | blocked_wait_ns                                |
| irq_ns                    | hard-irq time         | ns    | irq_ns                                         |
| softirq_ns                | softirq time          | ns    | softirq_ns                                     |
| own_cpu_ns                | on-CPU (own work)     | ns    | max(on_cpu_ns − irq_ns − softirq_ns, 0)        |
| fault_user_count          | page faults (user)    | count | fault_user_count                               |
| fault_kernel_count        | page faults (kernel)  | count | fault_kernel_count                             |
| migration_count           | CPU migrations        | count | migration_count                                |
| involuntary_switch_count  | preemptions           | count | involuntary_switch_count                       |
| voluntary_switch_count    | voluntary switches    | count | voluntary_switch_count                         |
| runnable_wait_count       | runnable waits        | count | runnable_wait_count                            |
| blocked_wait_count        | blocked waits         | count | blocked_wait_count                             |
| irq_count                 | hard irqs             | count | irq_count                                      |
| softirq_count             | softirqs              | count | softirq_count                                  |

on_cpu_ns includes irq and softirq time taken on the thread's CPU (schema doc), so the
request's own work is on_cpu_ns − irq_ns − softirq_ns, clamped at 0 against counter skew.
Lengths and counts of the same phenomenon are both kept; the causality table
(`causality.py`) folds a count into its length when the count adds nothing.

An event is recorded for a request when counters_valid is true and none of its source
columns is null for that row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Event:
    name: str
    label: str
    unit: str  # "ns" or "count"
    sources: tuple[str, ...]

    @property
    def is_length(self) -> bool:
        return self.unit == "ns"


EVENTS: tuple[Event, ...] = (
    Event("runnable_wait_ns", "runnable wait", "ns", ("runnable_wait_ns",)),
    Event("blocked_wait_ns", "blocked wait", "ns", ("blocked_wait_ns",)),
    Event("irq_ns", "hard-irq time", "ns", ("irq_ns",)),
    Event("softirq_ns", "softirq time", "ns", ("softirq_ns",)),
    Event("own_cpu_ns", "on-CPU (own work)", "ns", ("on_cpu_ns", "irq_ns", "softirq_ns")),
    Event("fault_user_count", "page faults (user)", "count", ("fault_user_count",)),
    Event("fault_kernel_count", "page faults (kernel)", "count", ("fault_kernel_count",)),
    Event("migration_count", "CPU migrations", "count", ("migration_count",)),
    Event("involuntary_switch_count", "preemptions", "count", ("involuntary_switch_count",)),
    Event("voluntary_switch_count", "voluntary switches", "count", ("voluntary_switch_count",)),
    Event("runnable_wait_count", "runnable waits", "count", ("runnable_wait_count",)),
    Event("blocked_wait_count", "blocked waits", "count", ("blocked_wait_count",)),
    Event("irq_count", "hard irqs", "count", ("irq_count",)),
    Event("softirq_count", "softirqs", "count", ("softirq_count",)),
)
EVENTS_BY_NAME = {e.name: e for e in EVENTS}

# Columns the analysis reads (everything else in the schema is left on disk).
BASE_COLUMNS = ("start_ns", "latency_ns", "counters_valid", "kind")
COUNTER_COLUMNS = tuple(dict.fromkeys(c for e in EVENTS for c in e.sources))
ANALYSIS_COLUMNS = BASE_COLUMNS + COUNTER_COLUMNS

# Components of a request's time, for "where the time went" (lengths only, disjoint).
TIME_COMPONENTS = ("own_cpu_ns", "irq_ns", "softirq_ns", "runnable_wait_ns", "blocked_wait_ns")


def event_values(event: Event, columns: dict[str, np.ndarray]) -> np.ndarray:
    """The event's per-request values (meaningless where not recorded), in the column's own
    integer dtype (no copy) or int64 for the derived own_cpu_ns:
    own_cpu_ns = max(on_cpu_ns − irq_ns − softirq_ns, 0); every other event is its column."""
    if event.name == "own_cpu_ns":
        own = _i64(columns["on_cpu_ns"]) - _i64(columns["irq_ns"])
        own -= _i64(columns["softirq_ns"])
        return np.maximum(own, 0, out=own)
    return columns[event.sources[0]]


def _i64(a: np.ndarray) -> np.ndarray:
    return a.view(np.int64) if a.dtype == np.uint64 else a.astype(np.int64)


def recorded_mask(event: Event, counters_valid: np.ndarray, nulls: dict[str, np.ndarray]) -> np.ndarray:
    """Requests that recorded the event: counters_valid & no source column null."""
    mask = counters_valid.astype(bool, copy=True)
    for col in event.sources:
        if col in nulls:
            mask &= ~nulls[col]
    return mask
