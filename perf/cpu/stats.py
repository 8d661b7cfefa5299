"""Pure statistics of the side-by-side benchmark (perf/cpu/run.py): medians and
spreads over rounds, the rotated order of interleaved rounds, CPU per
request, and the pairing of freed concurrency slots with the requests they
let go (window rates: harness/windows.py). No I/O: tested in perf/tests/test_cpu.py."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def rotated(names: list[T], r: int) -> list[T]:
    """Round r's order: every name once, the list rotated by r, so that each
    name runs first (and right after each other name) equally often."""
    if not names:
        return []
    k = r % len(names)
    return names[k:] + names[:k]


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default,
    'inclusive'): quantile([1, 2, 3, 4], 0.5) == 2.5."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1], got {q}")
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class Spread:
    """Median and spread of one figure over rounds."""
    n: int
    median: float
    lo: float       # min
    hi: float       # max
    q1: float
    q3: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def range_pct(self) -> float:
        """(max - min) / median, in percent."""
        return 100 * (self.hi - self.lo) / self.median if self.median else math.nan

    @property
    def iqr_pct(self) -> float:
        return 100 * self.iqr / self.median if self.median else math.nan


def spread(values: list[float]) -> Spread:
    if not values:
        raise ValueError("spread of no values")
    return Spread(n=len(values), median=quantile(values, 0.5), lo=min(values), hi=max(values),
                  q1=quantile(values, 0.25), q3=quantile(values, 0.75))


def us_per_request(cpu_s: float, requests: int) -> float:
    """CPU microseconds per request."""
    if requests <= 0:
        raise ValueError(f"requests must be > 0, got {requests}")
    return cpu_s * 1e6 / requests


def stdev(values: list[float]) -> float:
    """Population standard deviation (the windows are the whole run, not a sample of it)."""
    return statistics.pstdev(values) if values else math.nan


@dataclass(frozen=True)
class Handoff:
    """One request that took a freed slot: when the slot freed, when the
    request went upstream, and the workers of both."""
    freed_at: float
    released_at: float
    from_worker: int
    to_worker: int

    @property
    def gap_ms(self) -> float:
        return (self.released_at - self.freed_at) * 1000


def pair_handoffs(frees: list[tuple[float, int]], waits: list[tuple[float, int]]) -> list[Handoff]:
    """Pairs freed slots with the waiting requests they let go, in time order.

    `frees`: (time a slot freed, worker) for every request that held a slot;
    `waits`: (time released upstream, worker) for every request that waited
    for a slot. A gate hands slots out first come first served, so the k-th
    release after a run of frees belongs to the earliest unpaired free
    before it. A release with no earlier unpaired free (a slot that was
    free anyway) is not a hand-off and is skipped."""
    events = sorted([(t, 0, w) for t, w in frees] + [(t, 1, w) for t, w in waits])
    pending: list[tuple[float, int]] = []
    out: list[Handoff] = []
    head = 0
    for t, kind, w in events:
        if kind == 0:
            pending.append((t, w))
        elif head < len(pending):
            ft, fw = pending[head]
            head += 1
            out.append(Handoff(freed_at=ft, released_at=t, from_worker=fw, to_worker=w))
    return out


def handoff_summary(handoffs: list[Handoff]) -> dict:
    """Cross-worker share and the gap from a freed slot to the next release:
    of all hand-offs, and of those that crossed workers and those that did not."""
    out: dict = {"handoffs": len(handoffs),
                 "cross_pct": 100 * sum(1 for h in handoffs if h.from_worker != h.to_worker) / len(handoffs)
                 if handoffs else None}
    groups = {"": handoffs, "cross_": [h for h in handoffs if h.from_worker != h.to_worker],
              "same_": [h for h in handoffs if h.from_worker == h.to_worker]}
    for prefix, hs in groups.items():
        gaps = [h.gap_ms for h in hs]
        for q in (50, 90, 99):
            out[f"{prefix}gap_p{q}_ms"] = quantile(gaps, q / 100) if gaps else None
        out[f"{prefix}gap_max_ms"] = max(gaps) if gaps else None
    return out


def block_order(by_worker: dict[int, list], block: int, total: int) -> list:
    """`total` items taken in blocks of `block` from each worker in turn
    (w0 x block, w1 x block, w0 x block, ...). With a gate of `block` slots,
    a closed loop of connections in this order keeps its order, and the
    request that takes a freed slot is always `block` places behind the one
    that freed it: on the other worker."""
    workers = sorted(by_worker)
    if not workers:
        raise ValueError("no workers")
    if total % (block * len(workers)):
        raise ValueError(f"total {total} is not a multiple of block {block} x {len(workers)} workers")
    need = total // len(workers)
    for w in workers:
        if len(by_worker[w]) < need:
            raise ValueError(f"worker {w} has {len(by_worker[w])} items, need {need}")
    out: list = []
    taken = dict.fromkeys(workers, 0)
    while len(out) < total:
        for w in workers:
            out.extend(by_worker[w][taken[w]:taken[w] + block])
            taken[w] += block
    return out
