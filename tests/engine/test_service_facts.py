"""The facts about envoyproxy/ratelimit that cluster scope relies on, checked
against the real service and Redis (engine/README.md cites the source).

Needs `make setup-engine` (redis-server, ratelimit)."""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import time
from typing import Any

import pytest

from harness.engine import DOMAIN, LIMIT, Engine, descriptor, post_json
from harness.net import wait_until

HOUR = 3600

# Real processes (Redis, the rate limit service) on loopback: the integration tier.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine():
    with Engine() as e:
        yield e


def away_from_hour_boundary(margin_s: float = 5.0) -> None:
    """Waits (at most margin_s) until the wall clock is margin_s away from an hour boundary,
    so every call of one test lands in the same window of the service."""
    wait_until(lambda: margin_s <= time.time() % HOUR <= HOUR - margin_s, margin_s * 2 + 1,
               "the wall clock away from an hour boundary")


def slots(value: str, hits: int | None) -> dict[str, Any]:
    return descriptor("throttle_slots", value, hits)


def remaining(status: dict[str, Any]) -> int:
    # proto3 JSON omits zero values: a missing limitRemaining is 0.
    return int(status.get("limitRemaining", 0))


def test_claims_are_fetch_and_add_and_remaining_reveals_the_counter(engine):
    away_from_hour_boundary()
    status, body = engine.claim([slots("facts:add", 5)])
    assert status == 200, body
    assert body["overallCode"] == "OK"
    [s] = body["statuses"]
    assert s["code"] == "OK"
    assert s["currentLimit"] == {"requestsPerUnit": LIMIT, "unit": "HOUR"}
    assert LIMIT - remaining(s) == 5
    status, body = engine.claim([slots("facts:add", 3), slots("facts:add", 7)])
    # Two descriptors on one key in one call: added in order, each sees its own total.
    assert [LIMIT - remaining(x) for x in body["statuses"]] == [8, 15]


def test_hits_addend_zero_looks_without_adding_and_unset_adds_one(engine):
    away_from_hour_boundary()
    engine.claim([slots("facts:look", 4)])
    _, body = engine.claim([slots("facts:look", 0), slots("facts:look", 0)])
    assert [LIMIT - remaining(x) for x in body["statuses"]] == [4, 4]
    # No per-descriptor hitsAddend and no request-level one: the service adds 1.
    _, body = engine.claim([slots("facts:look", None)])
    assert LIMIT - remaining(body["statuses"][0]) == 5
    # A never-seen value looked at: counter 0 (the look still creates the key).
    _, body = engine.claim([slots("facts:never", 0)])
    assert remaining(body["statuses"][0]) == LIMIT


def test_the_redis_key_is_domain_key_value_and_the_services_hour(engine):
    away_from_hour_boundary()
    before = time.time()
    _, body = engine.claim([slots("facts:key", 2)])
    after = time.time()
    hour = int(before) // HOUR * HOUR
    assert int(after) // HOUR * HOUR == hour
    key = f"{DOMAIN}_throttle_slots_facts:key_{hour}"
    assert engine.redis.command("GET", key).strip() == "2"
    # EXPIRE: one unit (3600 s) plus a jitter below EXPIRATION_JITTER_MAX_SECONDS (300).
    ttl = int(engine.redis.command("TTL", key))
    assert HOUR - 5 <= ttl <= HOUR + 300, ttl
    # durationUntilReset: whole seconds to the end of the service's hour.
    reset = int(body["statuses"][0]["durationUntilReset"].rstrip("s"))
    assert HOUR - int(after) % HOUR <= reset <= HOUR - int(before) % HOUR, reset


def test_a_descriptor_without_a_limit_answers_ok_without_a_limit(engine):
    # Neither an unknown key nor an unknown domain is an error: a bare OK, no
    # currentLimit and no limitRemaining. The filter must treat this as nonsense.
    _, body = engine.claim([descriptor("not_configured", "x", 1)])
    assert body == {"overallCode": "OK", "statuses": [{"code": "OK"}]}
    status, raw = post_json(engine.port, {"domain": "no_such_domain",
                                          "descriptors": [slots("x", 1)]})
    assert (status, json.loads(raw)) == (200, {"overallCode": "OK", "statuses": [{"code": "OK"}]})


def test_bad_requests_answer_400(engine):
    assert post_json(engine.port, {"domain": DOMAIN, "descriptors": []})[0] == 400
    assert post_json(engine.port, b"{not json")[0] == 400
    assert post_json(engine.port, {"domain": "", "descriptors": [slots("x", 1)]})[0] == 400


def test_over_the_limit_answers_429_and_still_adds(engine):
    away_from_hour_boundary()
    hour = int(time.time()) // HOUR * HOUR
    key = f"{DOMAIN}_throttle_slots_facts:over_{hour}"
    engine.redis.command("SET", key, str(LIMIT - 2))
    status, raw = post_json(engine.port, {"domain": DOMAIN, "descriptors": [slots("facts:over", 5)]})
    body = json.loads(raw)
    assert status == 429
    assert body["overallCode"] == "OVER_LIMIT"
    [s] = body["statuses"]
    assert s["code"] == "OVER_LIMIT" and "limitRemaining" not in s  # remaining 0: the counter is lost
    assert int(engine.redis.command("GET", key)) == LIMIT + 3, "the add happens even when over"


def test_concurrent_claims_hand_out_disjoint_positions(engine):
    away_from_hour_boundary(margin_s=15)
    n, per_call, threads = 400, 3, 4

    def claim(_: int) -> tuple[int, int]:
        _, body = engine.claim([slots("facts:race", per_call)])
        after = LIMIT - remaining(body["statuses"][0])
        return after - per_call, after

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        ranges = sorted(pool.map(claim, range(n)))
    # The ranges [before, after) tile [0, n*per_call) exactly: nothing granted twice, nothing lost.
    assert ranges[0][0] == 0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert ranges[-1][1] == n * per_call


def test_redis_down_answers_400_and_the_service_recovers_when_it_is_back():
    with Engine() as e:
        assert e.claim([slots("facts:redis", 1)])[0] == 200
        e.redis.kill()
        status, _ = post_json(e.port, {"domain": DOMAIN, "descriptors": [slots("facts:redis", 1)]}, timeout=5)
        assert status == 400, "a Redis error is answered 400 Bad Request (not 5xx)"
        e.redis.start()
        # radix reconnects on its own: the same service process answers again.
        wait_until(lambda: e.claim([slots("facts:redis", 1)])[0] == 200, 10, "the service to reach Redis again")
        assert e.service.running()


def test_the_service_exits_at_start_when_redis_is_unreachable():
    with Engine() as e:
        e.service.stop()
        e.redis.stop()
        with pytest.raises(RuntimeError, match=r"ratelimit on :\d+ exited with"):
            e.service.start()
        e.redis.start()
        e.service.start()
        assert e.claim([slots("facts:restart", 1)])[0] == 200


def test_the_fault_proxy_is_slow_or_answers_nonsense_on_demand():
    with Engine(fault_proxy=True) as e:
        assert e.claim([slots("facts:proxy", 1)])[0] == 200
        e.slow(300)
        t0 = time.monotonic()
        assert e.claim([slots("facts:proxy", 1)])[0] == 200
        assert time.monotonic() - t0 >= 0.3
        e.nonsense("garbage")
        assert e.claim([slots("facts:proxy", 1)]) == (200, b"<html>not json</html>")
        e.nonsense("wrong_count")
        assert len(e.claim([slots("facts:proxy", 1)])[1]["statuses"]) == 2
        e.healthy()
        _, body = e.claim([slots("facts:proxy", 0)])
        assert LIMIT - remaining(body["statuses"][0]) == 2, "nonsense answers never reached the service"
