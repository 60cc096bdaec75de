"""Working sets from cache-size sweeps (Ditto §4.4.4-4.4.5).

H(S) is the number of hits in a cache of S bytes; N(S) = H(S) - H(S/2) is then the number of
accesses whose working set is S: they hit at size S and miss at S/2. One valgrind run per size
S (64-byte lines, 8-way below 1 MiB and 16-way from 1 MiB, as in the paper) simulates an I1 and
a D1 of that size at once. Valgrind's smallest cache is 128 B (two lines), so the first bin is
"<= 128 B" (N(128) = H(128)); accesses that miss even at the largest size form the last bin.
"""

from __future__ import annotations

MIN_SIZE = 128


def sizes(max_bytes: int) -> list[int]:
    out = [MIN_SIZE]
    while out[-1] < max_bytes:
        out.append(out[-1] * 2)
    return out


def cache_arg(size: int) -> str:
    assoc = min(size // 64, 8 if size < (1 << 20) else 16)
    return f"{size},{assoc},64"


# a size inside each octave bin (S, 2S]: the same sets as S's 8-way cache with 11 ways, 1.375 x S
# (log2 0.46 of the way: near the bin's log-middle, which a power-of-two size cannot be with whole
# ways and a power-of-two number of sets); swept for S from MID_FROM up to MID_UNTIL
MID_WAYS = 11
MID_FROM = 4096
MID_UNTIL = 1 << 20


def mid_size(s: int) -> int:
    """The mid size of the bin (S, 2S]: S x 11 / 8 (S's 8-way sets, MID_WAYS ways)."""
    return s * MID_WAYS // 8


def mid_sizes(size_list: list[int]) -> list[int]:
    """The mid-bin sizes for the swept sizes S (MID_FROM <= S < MID_UNTIL, 8-way)."""
    return [mid_size(s) for s in size_list if MID_FROM <= s < MID_UNTIL and s // 64 >= 8]


def mid_cache_arg(size: int) -> str:
    return f"{size},{MID_WAYS},64"


def lower_share(size_list: list[int], hits: list[float], mids: dict[int, float]) -> dict[int, float]:
    """Per bin (S, 2S] with a mid size measured: the share of the bin's accesses that hit at the
    mid size (reuse distances in its lower part), from hits per access unit at S, 2S and the mid
    size; bins with (almost) nothing in them are left out (the walkers split them evenly)."""
    out = {}
    for i in range(len(size_list) - 1):
        s, s2 = size_list[i], size_list[i + 1]
        m = mid_size(s)
        if m not in mids:
            continue
        span = hits[i + 1] - hits[i]
        if span <= 1e-9 * max(1.0, abs(hits[i + 1])):
            continue
        out[s2] = min(1.0, max(0.0, (mids[m] - hits[i]) / span))
    return out


def bins(size_list: list[int], hits: list[float], accesses: float) -> list[tuple[int, float]]:
    """(size, N(size)) for each swept size plus (2*max, misses at max): per access unit given.

    Hits are made monotone first (a larger cache never hits less in LRU; simulation noise and
    associativity can make it dip slightly).
    """
    mono = []
    best = 0.0
    for h in hits:
        best = max(best, h)
        mono.append(min(best, accesses))
    out = []
    prev = 0.0
    for s, h in zip(size_list, mono, strict=True):
        out.append((s, max(0.0, h - prev)))
        prev = h
    out.append((size_list[-1] * 2, max(0.0, accesses - prev)))
    return out


def misses_at(bin_list: list[tuple[int, float]], size: int) -> float:
    """Misses in a cache of `size` bytes predicted by the bins (all bins with S > size)."""
    return sum(n for s, n in bin_list if s > size)


def footprint_crossing(bin_list: list[tuple[int, float]], line: int = 64) -> float:
    """The cache size S at which the misses per event, as bytes of lines, equal S.

    Code (or data) that an event runs every time is reused at the distance of everything the
    event touches: its footprint F. In a cache smaller than F every one of its F/64 lines
    misses, in a larger one none does, so a stream of such code has misses(S) x 64 = F exactly
    at S = F. Measured curves fall through that diagonal once (misses x 64 falls, S grows); the
    crossing (log-interpolated between swept sizes) is the footprint a clone must run per event
    for its step to sit where the original's curve falls. Returns 0 if the curve starts below."""
    import math

    pts = sorted(bin_list)
    prev = None
    for s, _ in pts:
        m = misses_at(pts, s)
        r = m * line / s
        if r <= 1.0:
            if prev is None:
                return 0.0
            s0, r0 = prev
            if r <= 0:
                return float(s)
            t = math.log(r0) / (math.log(r0) - math.log(r))
            return s0 * 2**t
        prev = (s, r)
    return float(pts[-1][0]) if pts else 0.0
