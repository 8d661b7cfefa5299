"""Envoy's timeouts and held requests, as the filter's README describes them:
the route `timeout` starts only when a held request is released, so it does
not cut a hold; a `stream_idle_timeout` shorter than the hold answers held
requests with Envoy's own 504, counted apart as `timed_out`."""

import pytest

from tests.support.clients import burst

pytestmark = pytest.mark.integration


def hcm(cfg) -> dict:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def test_the_route_timeout_starts_at_release(envoy_with):
    def short_route_timeout(cfg):
        hcm(cfg)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["timeout"] = "0.5s"

    envoy = envoy_with({"rules": [{"name": "r", "rate": "4/s", "max_queue_delay": "2s"}]},
                       mutate=short_route_timeout)
    replies = burst(envoy.port, 8)
    longest = max(r.latency_ms for r in replies)
    print(sorted(round(r.latency_ms) for r in replies), envoy.rule_stats("r"))
    # Turns 250 ms apart: the last is held 1.75 s, far beyond the 0.5 s route timeout.
    assert [r.status for r in replies] == [200] * 8
    assert longest > 1500


def test_a_short_stream_idle_timeout_answers_held_requests_and_is_counted_apart(envoy_with):
    envoy = envoy_with({"rules": [{"name": "r", "rate": "2/s", "max_queue_delay": "3s"}]},
                       mutate=lambda cfg: hcm(cfg).update(stream_idle_timeout="0.3s"))
    replies = burst(envoy.port, 4)
    stats = envoy.rule_stats("r")
    print(sorted((r.status, round(r.latency_ms)) for r in replies), stats)
    # The first goes at once; the other three are held 0.5, 1 and 1.5 s, and
    # Envoy answers them itself after 0.3 s with a bare 504.
    assert sorted(r.status for r in replies) == [200, 504, 504, 504]
    assert all(250 < r.latency_ms < 1000 for r in replies if r.status == 504)
    assert (stats["timed_out"], stats["cancelled"], stats["held"]) == (3, 0, 0), stats
