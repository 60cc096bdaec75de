"""Thread model: each thread's role and trigger, and clusters of similar threads.

Role (from the syscall profile of the loaded window): `acceptor` (accepts on the listening
socket), `worker` (reads requests from connections; `acceptor+worker` when one thread does
both), `timer` (sleeps in nanosleep/clock_nanosleep between wakeups), `waiter` (blocks in
futex and is woken by others), `idle` (made no syscall in the window: blocked for the
process lifetime).

Clustering (Ditto §4.3.2 uses tree-edit distance between call graphs and agglomerative
clustering). We use the simpler distance 1 - weighted Jaccard similarity of the threads'
sampled call edges (caller>callee pairs from `perf record -e cpu-clock -g`), which like the
tree-edit distance is 0 for identical call graphs and 1 for disjoint ones, but costs O(edges)
instead of O(n^3). Threads with too few samples to compare (< 10) are compared by their
syscall profiles (cosine distance of log counts). Threads of different roles are never
merged. Average-linkage agglomerative clustering, merging while the distance is < 0.5.
The validation report (clone-report's HTML) draws the measured matrix; docs/ditto.md ("Thread
clustering") gives its range on memcached and why the worker clusters are pooled.
"""

from __future__ import annotations

import math

MIN_SAMPLES = 10
CUTOFF = 0.5


def role(calls: dict[str, int]) -> str:
    acc = sum(v for k, v in calls.items() if k.startswith(("accept4:", "accept:")))
    data = sum(
        v
        for k, v in calls.items()
        if k.split(":")[1:] == ["conn"] and k.split(":")[0] in ("read", "recvfrom", "recvmsg", "readv")
    )
    sleeps = sum(v for k, v in calls.items() if k.startswith(("nanosleep:", "clock_nanosleep:")))
    futex = sum(v for k, v in calls.items() if k.startswith("futex:"))
    if acc and data:
        return "acceptor+worker"
    if acc:
        return "acceptor"
    if data:
        return "worker"
    if sleeps:
        return "timer"
    if futex:
        return "waiter"
    return "idle" if sum(calls.values()) == 0 else "other"


def jaccard_distance(a: dict[str, int], b: dict[str, int]) -> float:
    keys = set(a) | set(b)
    if not keys:
        return 0.0
    ta, tb = sum(a.values()) or 1, sum(b.values()) or 1
    num = sum(min(a.get(k, 0) / ta, b.get(k, 0) / tb) for k in keys)
    den = sum(max(a.get(k, 0) / ta, b.get(k, 0) / tb) for k in keys)
    return 1.0 - (num / den if den else 1.0)


def cosine_distance(a: dict[str, int], b: dict[str, int]) -> float:
    keys = set(a) | set(b)
    va = [math.log1p(a.get(k, 0)) for k in keys]
    vb = [math.log1p(b.get(k, 0)) for k in keys]
    na, nb = math.sqrt(sum(x * x for x in va)), math.sqrt(sum(x * x for x in vb))
    if na == 0 and nb == 0:
        return 0.0
    if na == 0 or nb == 0:
        return 1.0
    return 1.0 - sum(x * y for x, y in zip(va, vb, strict=True)) / (na * nb)


def distance_matrix(
    tids: list[int], roles: dict[int, str], stacks: dict[int, dict[str, int]], calls: dict[int, dict[str, int]]
) -> list[list[float]]:
    n = len(tids)
    d = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            a, b = tids[i], tids[j]
            if roles[a] != roles[b]:
                v = 1.0
            elif sum(stacks.get(a, {}).values()) >= MIN_SAMPLES and sum(stacks.get(b, {}).values()) >= MIN_SAMPLES:
                v = jaccard_distance(stacks[a], stacks[b])
            else:
                v = cosine_distance(calls.get(a, {}), calls.get(b, {}))
            d[i][j] = d[j][i] = round(v, 4)
    return d


def agglomerate(d: list[list[float]], cutoff: float = CUTOFF) -> list[list[int]]:
    """Average-linkage agglomerative clustering; returns lists of indexes."""
    clusters = [[i] for i in range(len(d))]
    while len(clusters) > 1:
        best = None
        for x in range(len(clusters)):
            for y in range(x + 1, len(clusters)):
                s = [d[i][j] for i in clusters[x] for j in clusters[y]]
                v = sum(s) / len(s)
                if best is None or v < best[0]:
                    best = (v, x, y)
        if best is None or best[0] >= cutoff:
            break
        _, x, y = best
        clusters[x] = clusters[x] + clusters[y]
        del clusters[y]
    return sorted(clusters, key=min)
