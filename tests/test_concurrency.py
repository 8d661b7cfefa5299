"""Concurrency mode: at most N requests in flight to the upstream across the
whole Envoy process (--concurrency 2), the rest served in arrival order; no
slot leaks through upstream errors, resets or client cancels."""

import json
import socket
import threading
from functools import partial

import pytest

from harness import fortio
from harness.net import http_get, wait_until
from tests.support.clients import burst

pytestmark = pytest.mark.integration

N = 4


def gate_plugin(max_queue_delay="20s"):
    return {"rules": [{"name": "gate", "concurrency": N, "max_queue_delay": max_queue_delay}]}


def drive(envoy, path, requests, connections=40):
    return fortio.load(envoy.url + path, connections=connections, requests=requests)


def test_in_flight_never_exceeds_n_and_all_are_served(envoy_with, app):
    envoy = envoy_with(gate_plugin(), upstream_port=app.port)
    s = drive(envoy, "/slow?ms=20", 400)
    stats = envoy.rule_stats("gate")
    print(f"concurrency {N}: upstream max in flight {app.max_in_flight}, served {app.served}; "
          f"client {s.qps:.1f}/s (ideal {N / 0.020:.0f}/s) errors {s.errors}; {stats}")
    assert s.errors == 0
    assert app.max_in_flight == N
    assert app.served == 400
    assert stats["in_flight"] == 0 and stats["held"] == 0
    assert stats["admitted"] + stats["released"] == 400


def test_no_slot_leaks_through_errors_resets_and_cancels(envoy_with, app):
    envoy = envoy_with(gate_plugin(), upstream_port=app.port)
    # Upstream errors and resets (Envoy answers 503 for a reset upstream).
    errs = drive(envoy, "/status?code=500", 100)
    resets = drive(envoy, "/reset?ms=5", 100)
    assert errs.codes == {500: 100}, errs.codes
    assert set(resets.codes) == {503}, resets.codes
    # Client cancels: 30 clients send a slow request and leave, N while in
    # flight, the rest while waiting for a slot. The upstream holds each for
    # 3 s, far longer than the test takes to close them, so no waiter gets its
    # turn by a request finishing (with 300 ms, a busy CI machine took longer
    # than that to see the waiters and close: 8 went upstream, 18 cancelled).
    socks = []
    for _ in range(30):
        s = socket.create_connection(("127.0.0.1", envoy.port), timeout=5)
        s.sendall(b"GET /slow?ms=3000 HTTP/1.1\r\nhost: t\r\n\r\n")
        socks.append(s)
    wait_until(lambda: envoy.rule_stats("gate").get("held", 0) == 30 - N, 5, "clients waiting for slots")
    for s in socks:
        s.close()
    stats = wait_until(lambda: (st := envoy.rule_stats("gate")) and st["in_flight"] == 0 and st["held"] == 0 and st,
                       10, "gate drained")
    up = wait_until(lambda: (u := app.stats()) and u["in_flight"] == 0 and u, 10, "upstream idle")
    print(f"after errors, resets and cancels: {stats}, upstream {up}")
    # Nothing is stranded (held and in_flight back to 0, above) and no slow
    # request was answered. A slot freed by one close may be handed to a
    # waiter whose close Envoy has not read yet, which is then released (and
    # cut before or at the upstream): measured 18-26 of the 26 waiters
    # cancelled here, so at least half is asserted.
    assert up["served"] == 100 and up["aborted"] <= 30 - stats["cancelled"], (stats, up)
    assert stats["cancelled"] >= (30 - N) // 2, (stats, up)
    # Every slot came back: the gate still lets exactly N through.
    app.clear()
    s = drive(envoy, "/slow?ms=20", 200)
    assert s.errors == 0 and app.max_in_flight == N, (s.codes, app.stats())


def test_waiters_are_served_in_arrival_order(envoy_with, app):
    envoy = envoy_with({"rules": [{"name": "gate", "concurrency": 1, "max_queue_delay": "20s"}]},
                       upstream_port=app.port, concurrency=2)
    done: list[int] = []
    lock = threading.Lock()

    def one(i):
        status, _, _ = http_get(envoy.url + f"/slow?ms=50&i={i}", timeout=30)
        with lock:
            done.append(i if status == 200 else -i)

    def seen(n: int) -> bool:
        """The gate has decided n requests: given the slot at once, or put in the waiting room."""
        st = envoy.rule_stats("gate")
        return st.get("admitted", 0) + st.get("queued", 0) >= n

    threads = []
    for i in range(8):
        t = threading.Thread(target=one, args=(i,))
        t.start()
        threads.append(t)
        # The next request leaves only once the filter has this one (holding the slot, or
        # waiting for it): arrival order is the order of i, whatever the machine's load.
        wait_until(partial(seen, i + 1), 10, f"request {i} at the gate")
    for t in threads:
        t.join(30)
    print(f"completion order {done}")
    assert done == list(range(8))


def test_a_waiter_past_max_queue_delay_is_rejected_then(envoy_with, app):
    envoy = envoy_with({"rules": [{"name": "gate", "concurrency": 1, "max_queue_delay": "300ms"}]},
                       upstream_port=app.port)
    replies = burst(envoy.port, 4, path="/slow?ms=1000")
    statuses = sorted(r.status for r in replies)
    rejected = [r for r in replies if r.status == 429]
    print(f"statuses {statuses}, 429 after {[round(r.latency_ms) for r in rejected]} ms")
    assert statuses == [200, 429, 429, 429]
    assert all(250 < r.latency_ms < 1000 for r in rejected)
    assert all(r.headers.get("retry-after") == "1" for r in rejected)
    stats = wait_until(lambda: (st := envoy.rule_stats("gate")) and st["in_flight"] == 0 and st, 5, "slot back")
    assert stats["rejected"] == 3 and stats["held"] == 0
    # The abandoned tickets were accounted: the slot is usable again.
    assert http_get(envoy.url + "/slow?ms=10", timeout=5)[0] == 200


def test_rate_and_concurrency_together(envoy_with, app):
    envoy = envoy_with({"rules": [{"name": "both", "rate": "100/s", "concurrency": 2, "max_queue_delay": "5s"}]},
                       upstream_port=app.port)
    s = drive(envoy, "/slow?ms=40", 150, connections=20)
    print(f"rate 100/s + concurrency 2 with 40 ms responses: {s.qps:.1f}/s, max in flight {app.max_in_flight}")
    assert s.errors == 0 and app.max_in_flight <= 2
    # The concurrency cap binds first: 2 / 40 ms = 50/s at most.
    assert s.qps < 55


def test_upstream_stats_endpoint_is_not_counted(app):
    status, _, body = http_get(f"http://127.0.0.1:{app.port}/stats")
    assert status == 200 and json.loads(body)["in_flight"] == 0
