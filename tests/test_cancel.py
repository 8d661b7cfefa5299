"""Clients that give up while held: no crash, counted as cancelled, the held
gauge returns to 0, and later requests are served."""

import time

import pytest

from harness.net import http_get, wait_until
from harness.rawhttp import open_held, request_bytes

pytestmark = pytest.mark.integration


def test_clients_disconnecting_while_held(envoy_with):
    # 20/s, hold up to 10 s: 40 requests queue for up to 2 s.
    envoy = envoy_with({"rules": [{"name": "default", "rate": "20/s", "max_queue_delay": "10s"}]})
    socks = open_held(envoy.port, 40, request_bytes())
    wait_until(lambda: envoy.rule_stats().get("held", 0) >= 30, 5, "requests held")
    for s in socks:
        s.close()
    stats = wait_until(lambda: (st := envoy.rule_stats()) and st["held"] == 0 and st, 10, "held back to 0")
    print(f"after abandoning 40: {stats}")
    assert stats["cancelled"] >= 30
    assert stats["admitted"] + stats["released"] + stats["cancelled"] + stats["gone"] == 40
    # Removed from the queue when the stream ended, not found gone at their turn.
    assert stats["gone"] == 0
    # Later requests are served (the spent slots end within ~2 s).
    t0 = time.monotonic()
    status, _, _ = http_get(envoy.url + "/", timeout=15)
    assert status == 200
    assert time.monotonic() - t0 < 5
    assert envoy.proc.poll() is None
    assert "panic" not in envoy.log()
