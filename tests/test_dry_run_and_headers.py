"""Dry-run decides and counts without holding or rejecting; held requests say
how long they waited; rejections and (optionally) every response carry
rate-limit headers."""

import pytest

from harness.procs import http_get
from tests.support.clients import burst

pytestmark = pytest.mark.integration


def test_dry_run_holds_and_rejects_nothing_but_says_what_it_would_do(envoy_with):
    envoy = envoy_with({"dry_run": True, "rules": [{"name": "d", "rate": "10/s", "max_queue_delay": "500ms"}]})
    replies = burst(envoy.port, 20)
    notes = [r.headers.get("x-throttle-dry-run") for r in replies]
    stats = envoy.rule_stats("d")
    print(f"dry-run notes {sorted(map(str, notes))}, stats {stats}")
    assert [r.status for r in replies] == [200] * 20
    assert max(r.latency_ms for r in replies) < 200  # nothing held
    queued = [n for n in notes if n and n.startswith("queued")]
    rejected = [n for n in notes if n and n.startswith("rejected")]
    # 10/s, 500 ms of queue: 1 at once, 5 would wait, the rest would be rejected.
    assert len(queued) >= 5 and len(rejected) >= 8 and len(queued) + len(rejected) <= 19
    assert all(n == "rejected; status=429; retry_after=1" for n in rejected)
    assert stats["queued"] == 0 and stats["rejected"] == 0 and stats["held"] == 0
    assert stats["would_queue"] == len(queued) and stats["would_reject"] == len(rejected)


def test_held_requests_carry_their_wait(envoy_with):
    envoy = envoy_with({"rules": [{"name": "w", "rate": "20/s", "max_queue_delay": "1s"}]})
    replies = sorted(burst(envoy.port, 6), key=lambda r: r.latency_ms)
    waits = [r.headers.get("x-throttle-wait-ms") for r in replies]
    print(f"waits {waits}, latencies {[round(r.latency_ms) for r in replies]}")
    assert waits[0] is None  # the first continued at once
    held = [int(w or -1) for w in waits[1:]]  # -1: no header, fails below
    # 50 ms apart; the tick fires up to a few ms late.
    for i, w in enumerate(held, start=1):
        assert 50 * i - 5 <= w <= 50 * i + 30, (i, w)


def test_rate_limit_headers(envoy_with):
    envoy = envoy_with({"rate_limit_headers": True,
                        "rules": [{"name": "r", "rate": "30/m", "burst": 2, "max_queue_delay": "0s"}]})
    seen = []
    for _ in range(4):
        status, headers, _ = http_get(envoy.url + "/")
        h = {k.lower(): v for k, v in headers.items()}
        seen.append((status, h.get("x-ratelimit-limit"), h.get("x-ratelimit-remaining"), h.get("x-ratelimit-reset"),
                     h.get("retry-after")))
    print(seen)
    # 30/m with burst 2: three at once (remaining 2, 1, 0), then a rejection.
    assert [s[:3] for s in seen] == [(200, "30", "2"), (200, "30", "1"), (200, "30", "0"), (429, "30", "0")]
    assert seen[0][3] == "2" and seen[2][3] == "6"  # the schedule is 2 s, then 6 s ahead
    assert seen[3][4] == "2"  # retry once the next 2 s slot is free
