"""Adaptive pacing in real Envoy against a client that steers it (red team 3, finding 1):
one client of the rule asks for something the backend always answers with an error (a
broken endpoint, its own bad requests, its own quota with `Retry-After: 3600`), about 20%
of the rule's traffic. The learner counts those errors against their path and client, not
as the upstream's overload: the well-behaved clients keep their goodput during the attack
and after it. A real drop of capacity under the same attacker is still cut at once.

Backend: perf/adaptive/emulator.py (`/_fail/<status>` answers at once, whatever the load).
Load: Vegeta, open loop. Each test is bounded: ~20 s of load."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from harness import vegeta
from harness.configs import render
from harness.envoy import Envoy
from harness.net import free_port, http_get
from perf.adaptive import emulator
from perf.adaptive.run import learner_lines

pytestmark = pytest.mark.integration

LEGIT = 150  # per second, for the whole run
ATTACK = 38  # per second: 20% of the rule's traffic while it lasts
PLUGIN = {"rules": [{"name": "api", "rate": "200/s", "max_queue_delay": "500ms",
                     "adaptive": {"min_rate": "20/s", "max_rate": "1000/s"}}]}


def start_envoy(port: int, wasm) -> Envoy:
    cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=port,
                 plugin=PLUGIN, wasm=wasm)
    envoy = Envoy(cfg, extra_args=["--component-log-level", "wasm:debug"])
    envoy.start()
    for _ in range(10):  # warm-up
        http_get(f"{envoy.url}/work", timeout=2)
    return envoy


def attack_later(url: str, delay_s: float, duration_s: float, box: dict) -> threading.Thread:
    def run() -> None:
        time.sleep(delay_s)
        box["hits"] = vegeta.Load(url, rate=ATTACK, duration_s=duration_s, timeout_s=2.0).run().hits
    t = threading.Thread(target=run)
    t.start()
    return t


def share_ok(hits, t0: float, a: float, b: float) -> tuple[float, int]:
    """Of the requests started in [a, b) s after t0: the share answered 200, and how many."""
    mine = [h for h in hits if a <= h.sent - t0 < b]
    return (sum(h.code == 200 for h in mine) / max(1, len(mine))), len(mine)


@pytest.mark.parametrize("fail", ["503", "500", "429?retry_after=3600"])
def test_an_attackers_errors_cost_the_others_nothing(wasm, fail):
    """Legit 150/s for 16 s; the attacker's 38/s to /_fail/<status> from 4 s to 10 s. On
    main the learner cut the rule toward its floor and 35-84% of the legit requests got 429
    (the red team's runs). Here: no cut for answers, no Retry-After hold, and the legit
    clients get at least 95% 200s before, during and after (the rest: Vegeta's own
    stalls on this shared machine, at most a few requests)."""
    schedule = [{"at": 0, "workers": 25, "service_ms": 20}]  # 1,250/s: capacity never limits
    with emulator.Process(schedule) as emu:
        envoy = start_envoy(emu.port, wasm)
        try:
            t0 = emu.begin()
            box: dict = {}
            attacker = attack_later(f"{envoy.url}/_fail/{fail}", 4, 6, box)
            legit = vegeta.Load(f"{envoy.url}/api/items", rate=LEGIT, duration_s=16, timeout_s=2.0).run()
            attacker.join(30)
            stats = envoy.rule_stats("api")
            log = envoy.log()
        finally:
            envoy.stop()
    phases = {name: share_ok(legit.hits, t0, a, b) for name, a, b in
              (("before", 0, 4), ("during", 4, 10), ("after", 10, 16))}
    attack_codes: dict[int, int] = {}
    for h in box.get("hits", ()):
        attack_codes[h.code] = attack_codes.get(h.code, 0) + 1
    moves = learner_lines(log, t0)
    print(f"\n  /_fail/{fail}: legit 200 share {phases}; attacker {attack_codes}; "
          f"adaptive {({k: v for k, v in stats.items() if k.startswith('adaptive')})}; "
          f"load {os.getloadavg()[0]:.1f}; learner moves {len(moves)}: {moves[:6]}")
    assert sum(attack_codes.values()) >= ATTACK * 6 * 0.8, attack_codes  # the attack happened
    assert stats["adaptive_shed"] + stats["adaptive_failed"] == 0, stats
    assert stats["adaptive_retry_after"] == 0, stats
    for name, (share, n) in phases.items():
        assert n >= LEGIT * 6 * 0.6 * (4 / 6 if name == "before" else 1), (name, n)
        assert share >= 0.95, f"{name}: {share:.1%} of {n} legit requests answered 200"
    assert stats["adaptive_rate"] >= 190_000, stats  # never cut below the start (200/s)


def test_a_real_drop_under_an_attacker_is_cut_at_once(wasm):
    """The same 503 attacker all along; at 6 s the backend's capacity falls from 200/s to
    80/s (10 -> 4 workers x 50 ms) under the 150/s legit load. The attacker alone moves
    nothing; the drop is cut within 500 ms (the issue's target; the assertion allows 1 s:
    a stall of this shared machine delays answers and ticks alike, measured up to ~0.7 s)."""
    drop_at = 6.0
    schedule: list[dict[str, Any]] = [{"at": 0, "workers": 10, "service_ms": 50}, {"at": drop_at, "workers": 4}]
    with emulator.Process(schedule) as emu:
        envoy = start_envoy(emu.port, wasm)
        try:
            t0 = emu.begin()
            box: dict = {}
            attacker = attack_later(f"{envoy.url}/_fail/503", 0, 12, box)
            vegeta.Load(f"{envoy.url}/work", rate=LEGIT, duration_s=12, timeout_s=2.0).run()
            attacker.join(30)
            log = envoy.log()
        finally:
            envoy.stop()
    moves = learner_lines(log, t0)
    cuts = [(float(line.split()[0]), line) for line in moves
            if any(f"({r}" in line for r in ("queue", "shed", "failed"))]
    # The attacker's signals are answers (its 503s): a cut for answers before the drop is its
    # doing, whenever it comes. A cut for a queue within the load's first second is not: as the
    # load starts, its quickest answers come first, so the latency seems to rise while requests
    # in flight fill up (seen once on Envoy 1.36: 200 -> 172/s at 0.29 s, "queue"); noted in
    # issue 31, printed here, not counted against the attacker.
    start = [c for c in cuts if c[0] < 1.0 and "(queue" in c[1]]
    before = [c for c in cuts if c[0] < drop_at and c not in start]
    after = [c for c in cuts if c[0] >= drop_at]
    print(f"\n  cuts before the drop {before[:3]}; first after it {after[:1]}; at the load's start {start}; "
          f"load {os.getloadavg()[0]:.1f}")
    assert not before, f"the attacker alone cut the rate: {before[:3]}"
    assert after, "the drop was never cut"
    assert after[0][0] - drop_at <= 1.0, f"first cut {after[0][0] - drop_at:.2f} s after the drop"
