"""Pure arithmetic over arrival timestamps (seconds, any clock): rates over a
span, counts per consecutive window, the busiest window of a given width
anywhere in a run, and when a rate came back after a disturbance.

Used by the cluster-scope demo, tests and benchmark (harness/cluster.py) and the
benchmarks' pacing figures, on the upstream's own arrival times. Windows are half-open,
`[start, start + width)`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


def count_between(stamps: Sequence[float], start: float, end: float) -> int:
    """Arrivals in `[start, end)`; `stamps` sorted."""
    return bisect.bisect_left(stamps, end) - bisect.bisect_left(stamps, start)


def rate(stamps: Sequence[float], start: float, end: float) -> float:
    """Arrivals per second in `[start, end)`; `stamps` sorted."""
    if end <= start:
        raise ValueError(f"rate: empty span [{start}, {end})")
    return count_between(stamps, start, end) / (end - start)


def window_counts(stamps: Sequence[float], start: float, end: float, width: float) -> list[int]:
    """Counts in consecutive windows `[start + k*width, start + (k+1)*width)` that
    end at or before `end` (a last, partial window is left out); `stamps` sorted."""
    if width <= 0:
        raise ValueError(f"window width must be > 0, got {width}")
    n = math.floor((end - start) / width + 1e-9)
    return [count_between(stamps, start + k * width, start + (k + 1) * width) for k in range(max(n, 0))]


def window_rates(stamps: Sequence[float], window: float, start: float | None = None) -> list[float]:
    """Requests per second in consecutive `window`-second windows from `start` (default:
    the first timestamp); the last, partial window is dropped; `stamps` in any order.

    With timestamps truncated to whole milliseconds (nginx `$msec`) and windows that start
    on a whole millisecond and last a whole number of milliseconds, every count is exact:
    floor(t) lies in [b, b + w) exactly when t does, for integer b and w (tested). A stamp
    on a boundary belongs to the later window, within 1e-9 of a window's width."""
    if len(stamps) < 2:
        return []
    s = sorted(stamps)
    t0 = s[0] if start is None else start
    n = int((s[-1] - t0) / window + 1e-9)
    counts = [0] * n
    for t in s:
        k = int((t - t0) / window + 1e-9)
        if 0 <= k < n:
            counts[k] += 1
    return [c / window for c in counts]


def span_rate(stamps: Sequence[float]) -> float | None:
    """(n - 1) / (last - first): the rate a series of arrivals shows by itself."""
    if len(stamps) < 2:
        return None
    span = max(stamps) - min(stamps)
    return (len(stamps) - 1) / span if span > 0 else None


def busiest_window(stamps: Sequence[float], width: float, start: float | None = None,
                   end: float | None = None) -> tuple[int, float]:
    """The most arrivals in any window `[t, t + width)` lying inside `[start, end)`
    (default: the whole run), wherever it starts, and where it starts (the
    busiest window always starts at an arrival). `stamps` sorted."""
    if width <= 0:
        raise ValueError(f"window width must be > 0, got {width}")
    lo = bisect.bisect_left(stamps, start) if start is not None else 0
    hi = bisect.bisect_left(stamps, end) if end is not None else len(stamps)
    best, at, j = 0, float("nan"), lo
    for i in range(lo, hi):
        t = stamps[i]
        if end is not None and t + width > end:
            break
        j = max(j, i)
        while j < hi and stamps[j] < t + width:
            j += 1
        if j - i > best:
            best, at = j - i, t
    return best, at


def bound(rate_per_s: float, width: float, burst: int = 0) -> int:
    """The filter's stated bound: over any window of `width` seconds, all
    proxies together release at most `rate x width + burst + 2`
    (filters/throttle/README.md, "Cluster scope")."""
    return math.floor(rate_per_s * width + 1e-9) + burst + 2


def recovered_at(stamps: Sequence[float], after: float, rate_per_s: float, *, width: float = 0.2,
                 fraction: float = 0.9, step: float = 0.01, until: float | None = None) -> float | None:
    """The first time `t >= after` (in steps of `step`) from which a window of
    `width` holds at least `fraction` of `rate_per_s x width` arrivals: when the
    rate came back. None if it never did before `until` (default: the last
    arrival). `stamps` sorted."""
    if not stamps:
        return None
    last = stamps[-1] if until is None else until
    need = fraction * rate_per_s * width
    t = after
    while t + width <= last + 1e-9:
        if count_between(stamps, t, t + width) >= need:
            return t
        t += step
    return None
