"""The time correction and the figures of a run, pure (tested in perf/tests/test_icount.py).

Under valgrind a request takes milliseconds, so the work Envoy does by the clock (its
timers, the filter's flush tick) adds hundreds of instructions to each request and varies
with the machine's load. Each phase's count is fitted as `Ir = requests x c + seconds x r`
by least squares over a process's phases (as fast as possible and paced: their seconds per
request differ, which separates the two): c is the work per request, r per second of
traffic. Any per-phase figure (calls out of the Wasm code, a part's instructions) is fitted
the same way."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


class FitError(ValueError):
    pass


@dataclass(frozen=True)
class Fit:
    per_request: float   # c
    per_second: float    # r
    rms_pct: float       # root-mean-square residual, in % of the mean phase value


def fit(requests: Sequence[float], seconds: Sequence[float], values: Sequence[float]) -> Fit:
    """Least squares of `values = requests x c + seconds x r` (no constant term)."""
    if not (len(requests) == len(seconds) == len(values)):
        raise FitError("requests, seconds and values must have one entry per phase")
    if len(values) < 2:
        raise FitError(f"a fit of two unknowns needs at least 2 phases, got {len(values)}")
    snn = sum(n * n for n in requests)
    stt = sum(t * t for t in seconds)
    snt = sum(n * t for n, t in zip(requests, seconds, strict=True))
    sny = sum(n * y for n, y in zip(requests, values, strict=True))
    sty = sum(t * y for t, y in zip(seconds, values, strict=True))
    det = snn * stt - snt * snt
    # Phases in the same seconds-per-request ratio cannot separate c from r.
    if det <= 1e-9 * snn * stt:
        raise FitError("the phases' seconds per request are all alike: c and r cannot be told apart "
                       "(pace one phase)")
    c = (sny * stt - sty * snt) / det
    r = (sty * snn - sny * snt) / det
    res = [y - n * c - t * r for n, t, y in zip(requests, seconds, values, strict=True)]
    mean = sum(values) / len(values)
    rms = math.sqrt(sum(e * e for e in res) / len(res))
    return Fit(c, r, 100 * rms / mean if mean else math.nan)


def rel_range_pct(values: Sequence[float]) -> float:
    """(max - min) / |median|, in percent (the spread quoted with each figure)."""
    s = sorted(values)
    if not s:
        return math.nan
    mid = len(s) // 2
    med = s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
    return 100 * (s[-1] - s[0]) / abs(med) if med else math.nan
