"""Upstream faults while requests are held: the upstream goes down (held
requests get Envoy's 503 after release, nothing hangs), comes back (service
resumes), or is slow (held and in-flight requests do not slow the releases)."""

from __future__ import annotations

import asyncio
import time

import pytest

from harness.net import http_get, wait_until
from harness.procs import stop
from harness.rawhttp import request_bytes
from tests.support.clients import Crowd

pytestmark = pytest.mark.reliability


def codes_of(answers) -> dict:
    out: dict = {}
    for a in answers:
        out[a.status] = out.get(a.status, 0) + 1
    return out


def test_upstream_down_while_held_then_back(envoy_to, own_upstream):
    up = own_upstream()
    n, rate = 40, 20
    envoy = envoy_to({"rules": [{"name": "default", "rate": f"{rate}/s", "max_queue_delay": "5s"}]},
                     upstream_port=up.port)
    assert http_get(envoy.url + "/echo", timeout=10)[0] == 200

    async def run():
        crowd = Crowd(envoy.port, n, request_bytes("/echo"), timeout=30)
        await crowd.connect()
        t0 = time.monotonic()
        await crowd.send()
        while envoy.rule_stats().get("held", 0) < 0.7 * n and time.monotonic() - t0 < 5:
            await asyncio.sleep(0.02)
        stop(up.proc)  # the upstream dies while most requests are held
        down_at = time.monotonic() - t0
        answers = await crowd.wait()
        return answers, down_at, t0

    answers, down_at, t0 = asyncio.run(run())
    codes = codes_of(answers)
    last = max(a.done_at for a in answers) - t0
    stats = envoy.rule_stats()
    body_503 = next((a.body for a in answers if a.status == 503), b"")
    print(f"\nupstream down at {down_at:.2f} s: codes {codes}, last answer at {last:.2f} s, stats {stats}, "
          f"503 body {body_503[:60]!r}")
    # Every request is answered: 200 before the upstream died, Envoy's 503 after.
    assert set(codes) <= {200, 503} and sum(codes.values()) == n, codes
    assert codes.get(503, 0) >= 0.5 * n
    assert all(a.error is None for a in answers), [a.error for a in answers if a.error][:3]
    # Nothing hangs: all answered by the end of the schedule (+ connect timeout 1 s + slack).
    assert last <= n / rate + 3.0
    assert stats["released"] == stats["queued"] and stats["held"] == 0

    # The upstream comes back on the same port: service resumes.
    back = own_upstream(port=up.port)
    status = wait_until(lambda: http_get(envoy.url + "/echo", timeout=10)[0] == 200, 15, "200 again")
    assert status
    replies = asyncio.run(_crowd(envoy.port, 20, "/echo"))
    print(f"upstream back on :{back.port}: {codes_of(replies)}")
    assert codes_of(replies) == {200: 20}
    assert envoy.proc.poll() is None


async def _crowd(port: int, n: int, path: str, timeout: float = 30):
    crowd = Crowd(port, n, request_bytes(path), timeout=timeout)
    await crowd.connect()
    await crowd.send()
    return await crowd.wait()


def test_slow_upstream_does_not_slow_the_releases(envoy_to, upstream):
    """The upstream takes 1 s per request; 40 requests held at 20/s are still
    released every 50 ms (many in flight upstream at once), not one per second."""
    n, rate, delay = 40, 20, 1.0
    envoy = envoy_to({"rules": [{"name": "default", "rate": f"{rate}/s", "max_queue_delay": "5s"}]})
    t0 = time.monotonic()
    answers = asyncio.run(_crowd(envoy.port, n, f"/echo?delay={int(delay * 1000)}ms"))
    done = sorted(a.done_at - t0 for a in answers)
    stats = envoy.rule_stats()
    print(f"\nslow upstream ({delay} s): codes {codes_of(answers)}, first answer {done[0]:.2f} s, "
          f"last {done[-1]:.2f} s (schedule {(n - 1) / rate:.2f} s + {delay} s), stats {stats}")
    assert codes_of(answers) == {200: n}
    assert done[0] >= delay * 0.95
    # Releases kept the pace while earlier requests were still upstream.
    assert done[-1] <= (n - 1) / rate + delay + 1.5
    assert done[-1] - done[0] >= (n - 1) / rate * 0.9
    assert stats["released"] == stats["queued"] and stats["held"] == 0
