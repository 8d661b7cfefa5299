"""Configuration reload while requests are held, with Envoy fed by
file-based dynamic configuration (LDS from a watched file, replaced by an
atomic rename).

What Envoy does (1.36 and 1.40 alike, seen in these tests): a changed filter
configuration makes a new listener configuration; the old filter chain drains.
Its streams, held ones included, keep the old plugin, whose root context in
the same VM keeps ticking and releases them on the old schedule. The new
plugin gets a new root context (same VM, same shared data) for new
connections. So no held request is stranded, as long as Envoy's drain time
(`--drain-time-s`, default 600 s; Istio `drainDuration`) exceeds
`max_queue_delay`; otherwise Envoy closes the old connections at the end of
the drain (last test)."""

from __future__ import annotations

import asyncio
import time

import pytest

from harness.net import http_get, wait_until
from harness.rawhttp import request_bytes
from tests.support.clients import Crowd
from tests.support.dynamic import with_plugin

pytestmark = pytest.mark.reliability


def codes_of(answers) -> dict:
    out: dict = {}
    for a in answers:
        out[a.status] = out.get(a.status, 0) + 1
    return out


def rule(name: str, rate: str, delay: str = "10s", prefix: str | None = None) -> dict:
    r: dict[str, object] = {"name": name, "rate": rate, "max_queue_delay": delay}
    if prefix:
        r["match"] = {"path_prefix": prefix}
    return r


async def start_crowd(port: int, n: int, path: str = "/echo", timeout: float = 30) -> Crowd:
    crowd = Crowd(port, n, request_bytes(path), timeout=timeout)
    await crowd.connect()
    await crowd.send()
    return crowd


async def wait_held(envoy, at_least: int, rule_name: str = "default", timeout: float = 5,
                    exactly: bool = False) -> None:
    """Polls the held gauge until it reaches `at_least` (or equals it, `exactly`), within `timeout`."""
    t0 = time.monotonic()

    def reached(held: int) -> bool:
        return held == at_least if exactly else held >= at_least

    while not reached(envoy.rule_stats(rule_name).get("held", 0)):
        assert time.monotonic() - t0 < timeout, envoy.rule_stats(rule_name)
        await asyncio.sleep(0.02)


def span(answers) -> float:
    done = sorted(a.done_at for a in answers)
    return done[-1] - done[0]


def test_rate_change_while_held(dynamic_envoy):
    """10/s -> 50/s with 30 requests held: all held ones answered on the old
    schedule; new requests paced at the new rate, after the old schedule
    (same rule name: same shared schedule, so the reload causes no burst)."""
    envoy = dynamic_envoy({"rules": [rule("default", "10/s")]})

    async def run():
        t0 = time.monotonic()
        a = await start_crowd(envoy.port, 30)
        await wait_held(envoy, 20)
        outcome = envoy.update(with_plugin(envoy.listener, {"rules": [rule("default", "50/s")]}))
        b = await start_crowd(envoy.port, 100)
        return t0, outcome, await a.wait(), await b.wait()

    t0, outcome, a, b = asyncio.run(run())
    stats = wait_until(lambda: (s := envoy.rule_stats()) and s["held"] == 0 and s, 15, "held back to 0")
    a_last = max(x.done_at for x in a) - t0
    print(f"\nrate change 10/s -> 50/s: update {outcome}, {envoy.lds()}; held crowd {codes_of(a)} last at "
          f"{a_last:.2f} s; new crowd {codes_of(b)} over {span(b):.2f} s; stats {stats}")
    assert outcome == "accepted"
    assert codes_of(a) == {200: 30} and codes_of(b) == {200: 100}
    # The held ones kept the old pace (30 at 10/s: about 2.9 s), none hung.
    assert 2.5 <= a_last <= 2.9 + 2.0
    # The new rate applies: 100 at 50/s span about 2 s (at the old rate: 10 s).
    assert 0.9 * 99 / 50 <= span(b) <= 99 / 50 + 1.5
    # Nothing lost: every request accounted for.
    assert stats["admitted"] + stats["released"] == 130 and stats["cancelled"] == stats["gone"] == 0


def test_rule_change_while_held(dynamic_envoy):
    """One rule -> two new rules (path match, new names) with requests held:
    the held ones finish on the old rule; new requests follow the new rules,
    each on its own schedule."""
    envoy = dynamic_envoy({"rules": [rule("default", "10/s")]})
    new = {"rules": [rule("api", "100/s", prefix="/api"), rule("rest", "20/s")]}

    async def run():
        a = await start_crowd(envoy.port, 30)
        await wait_held(envoy, 20)
        outcome = envoy.update(with_plugin(envoy.listener, new))
        api = await start_crowd(envoy.port, 50, "/api/echo")
        rest = await start_crowd(envoy.port, 20, "/echo")
        return outcome, await a.wait(), await api.wait(), await rest.wait()

    outcome, a, api, rest = asyncio.run(run())
    wait_until(lambda: envoy.rule_stats("default")["held"] == 0, 15, "old rule drained")
    old, s_api, s_rest = envoy.rule_stats("default"), envoy.rule_stats("api"), envoy.rule_stats("rest")
    print(f"\nrule change: update {outcome}; held crowd {codes_of(a)}; /api {codes_of(api)} over {span(api):.2f} s; "
          f"/ {codes_of(rest)} over {span(rest):.2f} s; stats default {old} api {s_api} rest {s_rest}")
    assert outcome == "accepted"
    assert codes_of(a) == {200: 30} and codes_of(api) == {200: 50} and codes_of(rest) == {200: 20}
    assert old["admitted"] + old["released"] == 30 and old["held"] == 0
    assert s_api["admitted"] + s_api["queued"] == 50 and s_rest["admitted"] + s_rest["queued"] == 20
    # Each new rule paces at its own rate: 50 at 100/s ~ 0.5 s, 20 at 20/s ~ 0.95 s.
    assert 0.9 * 49 / 100 <= span(api) <= 49 / 100 + 1.0
    assert 0.9 * 19 / 20 <= span(rest) <= 19 / 20 + 1.0


def test_bad_config_is_refused_and_the_old_keeps_serving(dynamic_envoy):
    """A bad new configuration is refused (LDS update rejected, the log names the
    field); the held requests and new ones are served by the old one."""
    envoy = dynamic_envoy({"rules": [rule("default", "50/s")]})

    async def run():
        a = await start_crowd(envoy.port, 50)
        await wait_held(envoy, 30)
        outcome = envoy.update(with_plugin(envoy.listener, {"rules": [rule("default", "fast")]}))
        answers_a = await a.wait()
        await wait_held(envoy, 0, exactly=True)  # the old schedule has nothing left: B starts on an idle one
        b = await start_crowd(envoy.port, 100)
        return outcome, answers_a, await b.wait()

    outcome, a, b = asyncio.run(run())
    stats = envoy.rule_stats()
    print(f"\nbad config: update {outcome}, {envoy.lds()}; held crowd {codes_of(a)}; "
          f"later crowd {codes_of(b)} over {span(b):.2f} s; stats {stats}")
    assert outcome == "rejected"
    assert "config refused: rules[0].rate" in envoy.log()
    assert codes_of(a) == {200: 50} and codes_of(b) == {200: 100}
    # Still throttled by the old configuration: 100 at 50/s span about 2 s.
    assert 0.9 * 99 / 50 <= span(b) <= 99 / 50 + 1.5
    assert stats["admitted"] + stats["released"] == 150 and stats["held"] == 0
    # And a good update after the bad one still applies.
    assert envoy.update(with_plugin(envoy.listener, {"rules": [rule("default", "100/s")]})) == "accepted"
    assert http_get(envoy.url + "/echo", timeout=10)[0] == 200


def test_drain_shorter_than_the_hold_closes_held_connections(dynamic_envoy):
    """Documents Envoy's limit: with --drain-time-s 1 and requests held for up
    to 6 s, Envoy closes the old listener's connections after 1 s. The filter
    sees the streams end (cancelled), strands nothing, and does not crash; the
    clients get no answer. Hence: drain time > max_queue_delay."""
    envoy = dynamic_envoy({"rules": [rule("default", "5/s")]}, drain_time_s=1)

    async def run():
        t0 = time.monotonic()
        a = await start_crowd(envoy.port, 30)
        await wait_held(envoy, 25)
        outcome = envoy.update(with_plugin(envoy.listener, {"rules": [rule("default", "100/s")]}))
        return t0, outcome, await a.wait()

    t0, outcome, a = asyncio.run(run())
    stats = wait_until(lambda: (s := envoy.rule_stats()) and s["held"] == 0 and s, 10, "held back to 0")
    last = max(x.done_at for x in a) - t0
    cut = [x for x in a if x.status == 0]
    print(f"\ndrain 1 s < hold: update {outcome}; crowd {codes_of(a)} (0 = closed without answer), "
          f"last at {last:.2f} s; stats {stats}")
    assert outcome == "accepted"
    assert len(cut) >= 15  # held beyond the drain: closed by Envoy
    # Every cut client is accounted for; one released at the very instant the
    # drain closed its connection counts as released, not cancelled (a race
    # seen once in many runs), so allow a couple of those.
    assert len(cut) - 2 <= stats["cancelled"] + stats["gone"] <= len(cut), (stats, len(cut))
    assert stats["held"] == 0
    assert last <= 5.0  # closed at the end of the drain, not left hanging
    assert envoy.proc.poll() is None
