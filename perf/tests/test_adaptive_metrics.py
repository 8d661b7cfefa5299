"""The adaptive benchmark's figures, on hand-made attempts and backend windows
(pure: no process)."""

from __future__ import annotations

import pytest

from perf.adaptive.metrics import Attempt, Run, errors, from_vegeta, phases, quantile, recovery


def windows(per_100ms: list[int], capacity: float = 100.0) -> list[dict]:
    return [{"arrivals": n, "ok": n, "shed": 0, "busy_max": n, "waiting_max": 0, "latency_ms_sum": 0.0,
             "capacity": capacity} for n in per_100ms]


def steady(rate: int, seconds: float, latency: float = 0.1, code: int = 200, start: float = 0.0) -> list[Attempt]:
    n = int(rate * seconds)
    return [Attempt(start + k / rate, latency, code, False, k, 0) for k in range(n)]


def test_phases_follow_the_schedule():
    sched: list[dict] = [{"at": 0, "workers": 25, "service_ms": 100, "limit": None}, {"at": 15, "workers": 10},
             {"at": 30, "service_ms": 250}, {"at": 40, "limit": 20}]
    assert phases(sched, 45) == [(0.0, 15.0, 250.0), (15.0, 30.0, 100.0), (30.0, 40.0, 40.0), (40.0, 45.0, 20.0)]


def test_quantile_is_nearest_rank():
    assert quantile([], 0.5) is None
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile(list(range(1, 101)), 0.99) == 99


def test_a_steady_run_adapts_at_once_and_counts_goodput():
    r = Run(steady(100, 10), windows([10] * 100), 10)
    p = r.phase(0, 10, 150, 100)
    assert p.target == 100 and p.admitted_per_s == pytest.approx(100)
    assert p.goodput_per_s == pytest.approx(100) and p.goodput_share == pytest.approx(1.0)
    assert p.time_to_adapt_s == 0.0
    assert (p.p50_ms, p.p99_ms) == (100.0, 100.0)
    assert p.errors() == 0 and p.overshoot == 0


def test_time_to_adapt_waits_for_the_band_and_the_slo_for_5_s():
    # 200/s for 2 s, then the 100/s target: [1.9, 2.9) holds 20 + 9 x 10 = 110,
    # the edge of ±10% (inclusive); [1.8, 2.8) holds 120.
    ws = windows([20] * 20 + [10] * 100)
    r = Run(steady(100, 12), ws, 12)
    assert r.time_to_adapt(0, 100, 12) == 1.9
    # Answers slower than the SLO from 3 s on: no 5 s without them, never.
    slow = [a if a.start < 3 else Attempt(a.start, 1.5, 200, False, a.request, 0) for a in steady(100, 12)]
    assert Run(slow, windows([10] * 120), 12).time_to_adapt(0, 100, 12) is None


def test_errors_are_told_apart_by_code_and_origin():
    xs = [Attempt(0.1, 0.001, 429, False, 1, 0), Attempt(0.2, 0.001, 429, True, 2, 0),
          Attempt(0.3, 0.5, 503, False, 3, 0), Attempt(0.4, 1.5, 504, False, 4, 0),
          Attempt(0.5, 2.0, 0, False, 5, 0), Attempt(0.6, 0.1, 500, False, 6, 0),
          Attempt(0.7, 1.2, 200, False, 7, 0)]
    p = Run(xs, windows([1] * 10), 1).phase(0, 1, 100, 10)
    assert (p.local_429, p.upstream_429, p.e503, p.e504, p.no_answer, p.other_5xx) == (1, 1, 1, 1, 1, 1)
    assert p.ok == 1 and p.goodput_per_s == 0, "a 2xx after 1.2 s is not goodput"


def test_overshoot_counts_what_came_above_capacity_in_5_s():
    r = Run([], windows([15] * 30 + [10] * 70), 10)
    assert r.overshoot(0, 100) == 150  # 30 windows of 5 above 10


def test_vegeta_requests_become_attempts_from_the_backends_start():
    from harness.vegeta import Hit, Result

    rows = Result.from_csv('1000000000500000000,429,2000000,0,2,,,,7,GET,http://x/w,eC1lbXVsYXRvcjogc2hlZA==\n'
                           '1000000001000000000,0,2000000000,0,0,"Get: timeout",,,8,GET,http://x/w,\n').hits
    assert rows[0] == Hit(1000000000500000000, 429, 2000000, headers="x-emulator: shed", seq=7)
    assert (rows[0].sent, rows[0].latency_s) == (1000000000.5, 0.002)
    a = from_vegeta(rows, t0=1000000000.0)
    assert (a[0].start, a[0].shed_upstream, a[1].code, a[1].shed_upstream) == (0.5, True, 0, False)


def test_errors_add_up_a_phase():
    assert errors({"local_429": 1, "upstream_429": 2, "e503": 3, "e504": 4, "other_5xx": 5, "no_answer": 6}) == 21


def test_recovery_is_when_goodput_stays_at_90_percent_of_offered():
    xs = steady(50, 3) + steady(100, 8, start=3)
    r = Run(xs, windows([5] * 30 + [10] * 80), 11)
    # [2.8, 3.8): 0.2 s at 50/s and 0.8 s at 100/s = 90, exactly 90%.
    assert recovery(r, 0, 100, 11) == 2.8
