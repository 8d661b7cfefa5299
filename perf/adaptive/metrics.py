"""The figures of one run (one arm, one scenario), from what the clients saw (their
attempts) and what the backend recorded (its 100 ms windows). Pure: no process.

Per phase (between two changes of the backend): offered and admitted rates,
goodput (2xx within the 1 s SLO per second), errors by code, 2xx p50/p99, the
backend's concurrency, time to adapt and overshoot. Definitions as issue 21 and
the anchors' §6.1 state them; see perf/adaptive/README.md."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness.vegeta import Hit

SLO_S = 1.0
WINDOW_S = 0.1
HOLD_S = 5.0
BAND = 0.10


@dataclass(frozen=True)
class Attempt:
    """One request as its client saw it, times in seconds from the backend's start."""

    start: float
    latency: float
    code: int  # 0: no answer (timeout, reset)
    shed_upstream: bool  # the backend's own 429 (its x-emulator: shed header came through)
    request: int  # which client request (retries share it)
    attempt: int  # 0 first, 1.. retries


def from_vegeta(requests: Sequence[Hit], t0: float) -> list[Attempt]:
    """Vegeta's requests as attempts (`t0`: wall-clock time of the backend's start)."""
    return [Attempt(r.sent - t0, r.latency_s, r.code, "x-emulator" in r.headers, r.seq, 0) for r in requests]


@dataclass
class PhaseFigures:
    at_s: float
    end_s: float
    capacity: float
    offered: float
    target: float
    attempts_per_s: float
    admitted_per_s: float
    goodput_per_s: float
    goodput_share: float
    ok: int
    local_429: int
    upstream_429: int
    e503: int
    e504: int
    other_5xx: int
    no_answer: int
    p50_ms: float | None
    p99_ms: float | None
    upstream_concurrency_max: int
    time_to_adapt_s: float | None
    overshoot: int

    def errors(self) -> int:
        return self.local_429 + self.upstream_429 + self.e503 + self.e504 + self.other_5xx + self.no_answer

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of `values`, or None if empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def phases(schedule: list[dict[str, Any]], duration: float) -> list[tuple[float, float, float]]:
    """(start, end, capacity) of each phase of a schedule of backend settings."""
    state: dict[str, Any] = {"workers": 0, "service_ms": 100.0, "limit": None}
    out = []
    steps = sorted(schedule, key=lambda s: float(s["at"]))
    for i, step in enumerate(steps):
        state.update({k: v for k, v in step.items() if k != "at"})
        end = float(steps[i + 1]["at"]) if i + 1 < len(steps) else duration
        cap = state["workers"] * 1000.0 / state["service_ms"] if state["service_ms"] else math.inf
        if state["limit"] is not None:
            cap = min(cap, float(state["limit"]))
        out.append((float(step["at"]), end, cap))
    return out


class Run:
    """The attempts and the backend's windows of one run, indexed for window queries."""

    def __init__(self, attempts: list[Attempt], windows: list[dict[str, Any]], duration: float):
        self.attempts = sorted(attempts, key=lambda x: x.start)
        self.starts = [x.start for x in self.attempts]
        self.windows = windows
        self.duration = duration

    def admitted(self, a: float, b: float) -> float:
        """Requests that reached the backend per second over [a, b)."""
        i, j = round(a / WINDOW_S), round(b / WINDOW_S)
        n = sum(w["arrivals"] for w in self.windows[max(0, i):max(0, j)])
        return n / max(b - a, 1e-9)

    def in_window(self, a: float, b: float) -> list[Attempt]:
        return self.attempts[bisect.bisect_left(self.starts, a):bisect.bisect_left(self.starts, b)]

    def ok_latencies(self, a: float, b: float) -> list[float]:
        return [x.latency for x in self.in_window(a, b) if 200 <= x.code < 300]

    def goodput(self, a: float, b: float) -> float:
        good = sum(1 for x in self.in_window(a, b) if 200 <= x.code < 300 and x.latency <= SLO_S)
        return good / max(b - a, 1e-9)

    def time_to_adapt(self, at: float, target: float, end: float) -> float | None:
        """Seconds from `at` until every 1 s window (sliding by 100 ms) for HOLD_S
        (or to `end`) has the admitted rate within ±10% of `target` and the 2xx p99
        within the SLO; None if that never happens before `end`."""
        starts = [at + k * WINDOW_S for k in range(round((end - 1.0 - at) / WINDOW_S) + 1)]

        def good(u: float) -> bool:
            p99 = quantile(self.ok_latencies(u, u + 1.0), 0.99)
            return abs(self.admitted(u, u + 1.0) - target) <= BAND * target and p99 is not None and p99 <= SLO_S

        oks = [good(u) for u in starts]
        hold = round(HOLD_S / WINDOW_S)
        for k in range(len(starts)):
            if all(oks[k:k + hold + 1]):
                return round(starts[k] - at, 1)
        return None

    def overshoot(self, at: float, capacity: float) -> int:
        """Requests the backend received above its capacity in the 5 s after `at`."""
        i = round(at / WINDOW_S)
        per = capacity * WINDOW_S
        return int(sum(max(0.0, w["arrivals"] - per) for w in self.windows[i:i + int(HOLD_S / WINDOW_S)]))

    def phase(self, at: float, end: float, capacity: float, offered: float) -> PhaseFigures:
        xs = self.in_window(at, end)
        span = max(end - at, 1e-9)
        oks = [x.latency for x in xs if 200 <= x.code < 300]
        i, j = round(at / WINDOW_S), round(end / WINDOW_S)
        conc = max((w["busy_max"] + w["waiting_max"] for w in self.windows[i:j]), default=0)
        target = min(capacity, offered)
        return PhaseFigures(
            at_s=at, end_s=end, capacity=capacity, offered=offered, target=target,
            attempts_per_s=len(xs) / span,
            admitted_per_s=self.admitted(at, end),
            goodput_per_s=self.goodput(at, end),
            goodput_share=self.goodput(at, end) / target if target else 0.0,
            ok=len(oks),
            local_429=sum(1 for x in xs if x.code == 429 and not x.shed_upstream),
            upstream_429=sum(1 for x in xs if x.code == 429 and x.shed_upstream),
            e503=sum(1 for x in xs if x.code == 503),
            e504=sum(1 for x in xs if x.code == 504),
            other_5xx=sum(1 for x in xs if x.code >= 500 and x.code not in (503, 504)),
            no_answer=sum(1 for x in xs if x.code == 0),
            p50_ms=_ms(quantile(oks, 0.5)),
            p99_ms=_ms(quantile(oks, 0.99)),
            upstream_concurrency_max=conc,
            time_to_adapt_s=self.time_to_adapt(at, target, end),
            overshoot=self.overshoot(at, capacity),
        )

    def series(self) -> dict[str, list[float]]:
        """Per 100 ms: admitted and goodput over the 1 s window ending there, and capacity."""
        n = len(self.windows)
        adm, good, cap = [], [], []
        for k in range(n):
            b = (k + 1) * WINDOW_S
            a = max(0.0, b - 1.0)
            adm.append(self.admitted(a, b))
            good.append(self.goodput(a, b))
            cap.append(float(self.windows[k].get("capacity", 0.0)))
        return {"t": [round((k + 1) * WINDOW_S, 1) for k in range(n)], "admitted": adm, "goodput": good,
                "capacity": cap}


ERROR_KEYS = ("local_429", "upstream_429", "e503", "e504", "other_5xx", "no_answer")


def errors(phase: dict[str, Any]) -> int:
    """Every error the clients saw in a phase (as `PhaseFigures.as_dict` keeps it)."""
    return sum(int(phase[k]) for k in ERROR_KEYS)


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)


def recovery(run: Run, at: float, offered: float, end: float) -> float | None:
    """S9: seconds from `at` until the goodput of every 1 s window stays at 90% of
    the offered rate or more for HOLD_S (or to `end`)."""
    steps = round((end - 1.0 - at) / WINDOW_S) + 1
    oks = [run.goodput(at + k * WINDOW_S, at + k * WINDOW_S + 1.0) >= 0.9 * offered for k in range(steps)]
    hold = round(HOLD_S / WINDOW_S)
    for k in range(steps):
        if all(oks[k:k + hold + 1]):
            return round(k * WINDOW_S, 1)
    return None
