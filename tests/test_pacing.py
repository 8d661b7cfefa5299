"""Bursts of load through real Envoy (--concurrency 2) are paced to the rate,
process-wide, with no failures; requests within the rate are not delayed."""

import re

import pytest

from harness import fortio

pytestmark = pytest.mark.integration


def plugin(rate, max_queue_delay="1s", burst=0):
    return {"rules": [{"name": "default", "rate": rate, "burst": burst, "max_queue_delay": max_queue_delay,
                       "match": {"path_prefix": "/"}}]}


def worker_connections(envoy) -> list[int]:
    return list(envoy.stats_matching(r"^listener\.127\.0\.0\.1_\d+\.worker_\d+\.downstream_cx_total$").values())


@pytest.mark.parametrize("rate", [500, 200])
def test_burst_of_100_connections_is_paced_to_the_rate(envoy_with, rate):
    envoy = envoy_with(plugin(f"{rate}/s"))
    n = rate * 6  # about 6 s of load
    s = fortio.load(envoy.url + "/", connections=100, requests=n)
    stats = envoy.rule_stats()
    print(f"rate {rate}/s: achieved {s.qps:.2f} ({100 * (s.qps / rate - 1):+.2f}%), errors {s.errors}, "
          f"p50 {s.ms(50):.1f} ms p99 {s.ms(99):.1f} ms, stats {stats}")
    assert s.errors == 0, s.codes
    assert s.requests == n
    # Honest tolerance for a shared CI machine; the precise figure is in perf/.
    assert abs(s.qps / rate - 1) < 0.03, s.qps
    assert stats["admitted"] + stats["released"] == n
    assert stats["rejected"] == 0 and stats["cancelled"] == 0 and stats["gone"] == 0
    assert stats["held"] == 0
    # The rate is global: both workers served connections, yet the total stayed at the rate.
    per_worker = worker_connections(envoy)
    assert len(per_worker) == 2 and min(per_worker) > 0, per_worker
    # The metrics reach Prometheus with the rule as a label.
    prom = envoy.prometheus()
    assert re.search(rf'^throttle_released{{throttle_rule="default"}} {stats["released"]}$', prom, re.M), prom[-2000:]


def test_requests_within_the_rate_are_not_delayed(envoy_with):
    # A burst of 10 absorbs the client's own jitter: when Fortio falls behind its
    # 10 ms schedule on a loaded machine it sends a few requests back to back.
    envoy = envoy_with(plugin("1000/s", burst=10))
    # 100 req/s on one connection: 10 ms apart, ten times the 1 ms interval.
    s = fortio.load(envoy.url + "/", connections=1, requests=200, qps=100)
    stats = envoy.rule_stats()
    print(f"fast path: {stats}, p50 {s.ms(50):.2f} ms p99 {s.ms(99):.2f} ms max {s.max_ms:.2f} ms")
    assert s.errors == 0
    assert stats["admitted"] == 200 and stats["queued"] == 0
    # A held request waits at least for a tick (about 4 ms here); these are not held. The
    # median, not p90: with none held, p90 reached 4.1 ms once in CI (p50 1.8 ms) while the
    # same CI run's other jobs kept the 2 cores busy; a filter that delayed every request by
    # a tick would move the median past 3 ms.
    assert s.ms(50) < 3.0, s
