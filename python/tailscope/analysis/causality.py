"""Which kernel event can cause which: VarMRI's Rule 1 and Rule 2 (§5.2), adapted from CPU
counter groups (INST > CACHE > CYCLE) to per-request kernel events.

Rule 1 (here): if E1 may cause E2 and their high sets overlap, E2's impact is partly E1's:
    Impact'(E2) = Impact(E2) − max_{E1 → E2} Jaccard(H1, H2) · Impact(E1).
The edges are data, below, one comment per edge. The graph is acyclic, so a cause is never
also deducted from its own effect.

Rule 2 (here): a count and a length of the same phenomenon (irq_count and irq_ns) are one
cause. When count = k·length with R² > 0.99 (every irq costs the same), the count adds
nothing and is folded into the length (dropped from the ranking, listed as folded). When it
is not proportional, the count stays, but as an *effect* of its length (an edge in CAUSES):
a count only hurts latency through the time it adds, and the length measures that time
directly, so the length is what to optimise.
"""

from __future__ import annotations

# (cause, effect, why). Read: "cause can make effect high in the same request".
CAUSE_EDGES: tuple[tuple[str, str, str], ...] = (
    # -- a count is the symptom, its length the quantity (Rule 2 when not proportional) --
    (
        "runnable_wait_ns",
        "runnable_wait_count",
        "each runnable wait adds to the runnable-wait length; the length is what delays the request",
    ),
    (
        "runnable_wait_ns",
        "involuntary_switch_count",
        "a preemption leaves the thread runnable; its cost is the runnable wait that follows",
    ),
    ("blocked_wait_ns", "blocked_wait_count", "each sleep adds to the blocked-wait length"),
    ("blocked_wait_ns", "voluntary_switch_count", "a voluntary switch is the start of a blocked wait"),
    ("irq_ns", "irq_count", "each hard irq adds to hard-irq time"),
    ("softirq_ns", "softirq_count", "each softirq adds to softirq time"),
    # -- interrupts --
    (
        "irq_ns",
        "softirq_ns",
        "hard-irq handlers raise softirqs (NET_RX after a NIC irq, TIMER after the tick) that run "
        "on irq exit on the same CPU",
    ),
    (
        "irq_ns",
        "runnable_wait_ns",
        "an irq can wake a competing thread that preempts this one, and the scheduler tick is "
        "where a preemption is decided",
    ),
    ("softirq_ns", "runnable_wait_ns", "heavy softirq load is deferred to ksoftirqd, which then competes for the CPU"),
    # -- scheduling --
    (
        "blocked_wait_ns",
        "runnable_wait_ns",
        "every wakeup is followed by a wait for a CPU: more sleeps, more wakeup waits",
    ),
    # Not an edge: own_cpu_ns → runnable_wait_ns (long requests meet more slice ends). It
    # would close the cycle runnable wait → migration → own work → runnable wait, and it would
    # discount real preemption by a CPU hog in CPU-heavy services.
    (
        "runnable_wait_ns",
        "migration_count",
        "load balancing pulls a thread that waits in a busy run queue to another CPU",
    ),
    ("blocked_wait_ns", "migration_count", "a woken thread may be placed on another CPU (wakeup placement)"),
    # -- memory --
    ("fault_user_count", "blocked_wait_ns", "a major fault sleeps on I/O (swap-in, file read) as a blocked wait"),
    (
        "fault_kernel_count",
        "blocked_wait_ns",
        "a kernel-mode fault on a user buffer can sleep on I/O like a user fault",
    ),
    ("fault_user_count", "own_cpu_ns", "fault handling runs in the thread's context and counts as its on-CPU time"),
    ("fault_kernel_count", "own_cpu_ns", "fault handling runs in the thread's context and counts as its on-CPU time"),
    ("fault_user_count", "migration_count", "NUMA-balancing hinting faults move tasks towards their memory"),
    (
        "migration_count",
        "own_cpu_ns",
        "after a migration the thread runs with cold caches and TLB, so its own work takes longer",
    ),
)

# Rule 2 candidates: (child count, its parent: the length, or the other count).
# Folded when child ≈ k·parent with R² > RULE2_R2.
COUNT_OF_LENGTH: tuple[tuple[str, str], ...] = (
    ("runnable_wait_count", "runnable_wait_ns"),
    ("blocked_wait_count", "blocked_wait_ns"),
    ("irq_count", "irq_ns"),
    ("softirq_count", "softirq_ns"),
    # counts of the same switches seen from two tracepoints: a voluntary switch starts a
    # blocked wait, a preemption starts a runnable wait
    ("voluntary_switch_count", "blocked_wait_count"),
    ("involuntary_switch_count", "runnable_wait_count"),
)
RULE2_R2 = 0.99


def causes_of() -> dict[str, list[str]]:
    """effect → [causes], from CAUSE_EDGES."""
    out: dict[str, list[str]] = {}
    for cause, effect, _ in CAUSE_EDGES:
        out.setdefault(effect, []).append(cause)
    return out


def edge_reason(cause: str, effect: str) -> str:
    for c, e, why in CAUSE_EDGES:
        if c == cause and e == effect:
            return why
    return ""


def is_acyclic(edges: tuple[tuple[str, str, str], ...] = CAUSE_EDGES) -> bool:
    """True when the cause graph has no cycle (Kahn's algorithm)."""
    nodes = {n for c, e, _ in edges for n in (c, e)}
    indeg = dict.fromkeys(nodes, 0)
    for _, e, _ in edges:
        indeg[e] += 1
    ready = [n for n, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for c, e, _ in edges:
            if c == n:
                indeg[e] -= 1
                if indeg[e] == 0:
                    ready.append(e)
    return seen == len(nodes)
