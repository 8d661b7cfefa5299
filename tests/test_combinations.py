"""Every combination of where a rule's slots come from, who gets them, and whether it acts
(issue 30): {static rate, learned rate, the fleet's grid} x {FIFO, priority classes} x
{enforce, dry-run}, with and without a key quota, each on real Envoy with one burst.

The burst: 30 requests of user `heavy` (class batch) at once, then 0.3 s later 4 of user
`light` marked critical, on a 20/s rule with 2 s of queue. Every combination must keep
what each of its parts promises:

- **the rate**: at the upstream, no 1 s window holds more than the rate allows over
  the second and 70 ms of release jitter (process scope: `+ 1`, the burst of 0 plus
  one; the grid: `+ 5`, its `burst + 2` on the grid plus `burst + 3` a proxy may be
  ahead, engine/README.md "Invariants" 1; a learned rule: at the highest rate it
  learned in the run, `+ 2`, one more for its re-timing);
- **refusals at arrival**: every 429 within 150 ms of its request (a refusal after a hold
  comes at the 2 s deadline; 150 ms is Envoy's tick and two shared cores, with room);
- **the counters add up**: each request counted once at arrival; `queued = released +
  displaced + cancelled + gone + timed_out + held` once the line is empty;
- **the order**: with classes, critical jumps the batch line (its last answer within its
  own slots and 0.35 s of scheduling); FIFO without a quota keeps it behind the ~24 batch
  requests still waiting (over 0.8 s; on the grid it may be refused at arrival instead);
- **the grid holds a burst**: at least half of what its queue holds at the rate (it
  reckons turns a third slower than its expected share);
- **the quota**: `heavy` holds at most `5/s x 2 s + 1` places (+1 for the spread of its
  arrivals), the rest refused at once, and `light` passes whole;
- **dry-run**: nothing held or refused (every answer the upstream's, within 250 ms), and
  the would-be decisions counted.

The grid and a key (so a quota) do not combine: cluster scope keeps one rate per rule, and
per-key fleet rates are issue 32; a rate learned for the whole fleet is not designed
(the grid and the engine's counters are keyed by the interval). Both are refused, naming
the field."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import RULE, ClusterLab
from harness.configs import render
from harness.envoy import Envoy
from harness.net import free_port, http_get, wait_until
from harness.rawhttp import request_bytes
from tests.support.clients import Answer, Crowd

pytestmark = pytest.mark.integration

RATE = 20.0
MQD_S = 2.0
QUOTA = 5.0
HEAVY, LIGHT = 30, 4
LIGHT_AFTER_S = 0.3
AT_ARRIVAL_S = 0.150
SCHEDULING_S = 0.35
JITTER_S = 0.070

SOURCES = ("static", "learned", "grid")
ORDERS = ("fifo", "classes")
MODES = ("enforce", "dry_run")


def plugin(source: str, order: str, mode: str, quota: bool) -> dict[str, Any]:
    rule: dict[str, Any] = {"name": RULE, "rate": f"{RATE:g}/s", "max_queue_delay": f"{MQD_S:g}s",
                            "match": {"path_prefix": "/"}}
    out: dict[str, Any] = {"rules": [rule], "max_held_per_worker": 10000, "reject_status": 429}
    if order == "classes":
        rule["classes"] = [{"name": "critical", "match": {"headers": {"x-priority": "critical"}}},
                           {"name": "batch"}]
    if source in ("learned", "learned-grid"):
        rule["adaptive"] = {"min_rate": "10/s", "max_rate": "1000/s"}
    if source in ("grid", "learned-grid"):
        rule.update(scope="cluster", expected_replicas=1)
        out["engine"] = {"cluster": "throttle_engine"}
    if quota:
        rule["key"] = {"header": "x-user"}
        rule["key_quota"] = f"{QUOTA:g}/s"
    if mode == "dry_run":
        rule["dry_run"] = True
    return out


def cells() -> list[tuple[str, str, str, bool]]:
    return [(s, o, m, q) for s, o, m, q in itertools.product(SOURCES, ORDERS, MODES, (False, True))
            if not (s == "grid" and q)]


def send(port: int) -> tuple[list[Answer], list[Answer]]:
    """The burst: HEAVY requests of `heavy` at once, LIGHT critical ones of `light` later."""
    heavy = Crowd(port, HEAVY, request_bytes("/b", headers={"x-user": "heavy"}), timeout=MQD_S + 10)
    light = Crowd(port, LIGHT, request_bytes("/c", headers={"x-user": "light", "x-priority": "critical"}),
                  timeout=MQD_S + 10)

    async def go() -> tuple[list[Answer], list[Answer]]:
        await heavy.connect()
        await light.connect()
        await heavy.send()
        await asyncio.sleep(LIGHT_AFTER_S)
        await light.send()
        return await heavy.wait(), await light.wait()

    return asyncio.run(go())


class Learned:
    """The rule's learned rate (`adaptive_rate`, in 1/1000 per s), read every 50 ms while
    the block runs: the highest bounds what the upstream may see in a second."""

    def __init__(self, proxy: Envoy) -> None:
        self.proxy = proxy
        self.rates: list[float] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _read(self) -> None:
        rate = self.proxy.rule_stats(RULE, settle=False).get("adaptive_rate")
        if rate is not None:
            self.rates.append(rate / 1000)

    def _poll(self) -> None:
        while not self.done.wait(0.05):
            self._read()

    def __enter__(self) -> Learned:
        self._read()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(5)
        # The metrics reach Envoy within FLUSH_S: a last read after that.
        self.proxy.rule_stats(RULE)
        self._read()


def most_in_a_second(stamps: Sequence[float]) -> int:
    s = sorted(stamps)
    return max((sum(1 for t in s[i:] if t < start + 1.0) for i, start in enumerate(s)), default=0)


def codes(answers: Sequence[Answer]) -> dict[int, int]:
    out: dict[int, int] = {}
    for a in answers:
        out[a.status] = out.get(a.status, 0) + 1
    return out


@pytest.mark.parametrize(("source", "order", "mode", "quota"), cells(),
                         ids=[f"{s}-{o}-{m}{'-quota' if q else ''}" for s, o, m, q in cells()])
def test_every_combination_keeps_each_promise(wasm: Path, source: str, order: str, mode: str,
                                              quota: bool) -> None:
    with ClusterLab(plugin(source, order, mode, quota), proxies=1, wasm=wasm) as lab:
        proxy = lab.proxies[0]
        if source == "grid":
            # Until its first grants (k + 2 epochs), and until their totals settled (1 s
            # more), a proxy cannot know its share: 2 s of steady traffic at a quarter of the
            # rate first, as a proxy in service has.
            for _ in range(10):
                http_get(proxy.url + "/warm", timeout=5)
                time.sleep(0.2)
        before = proxy.rule_stats(RULE)
        lab.upstream.clear()
        t0 = time.monotonic()
        with Learned(proxy) as learned:
            heavy, light = send(proxy.port)

        def line_empty() -> bool:
            s = proxy.rule_stats(RULE, settle=False)
            return s.get("held", 0) == 0 and all(s.get(f"class.{c}.held", 0) == 0 for c in ("critical", "batch"))

        wait_until(line_empty, 10, "the line empty")
        stats = proxy.rule_stats(RULE)
        stamps = lab.arrivals(t0, t0 + 30)
        assert not lab.panics(), lab.panics()
    d = {k: v - before.get(k, 0) for k, v in stats.items()}
    rate = max([RATE, *learned.rates])
    heavy_ms = max(a.latency_ms for a in heavy)
    light_ms = max(a.latency_ms for a in light)
    report = (f"heavy {codes(heavy)} max {heavy_ms:.0f} ms, light {codes(light)} max {light_ms:.0f} ms; "
              f"most in 1 s {most_in_a_second(stamps)}, learned at most {rate:g}/s ({sorted(set(learned.rates))}); stats {d}")
    print(f"\n{source}-{order}-{mode}{'-quota' if quota else ''}: {report}")
    answers = heavy + light
    n = HEAVY + LIGHT
    assert all(a.status in (200, 429) for a in answers), report
    assert d["requests"] == n, report

    if mode == "dry_run":
        assert codes(answers) == {200: n}, "dry-run holds and refuses nothing: " + report
        assert max(heavy_ms, light_ms) < 250, "dry-run holds nothing: " + report
        assert d["admitted"] + d["would_queue"] + d["would_reject"] == n, report
        # 34 at once at 20/s: all but the first would wait or be refused; on the grid up
        # to `burst + 3` go ahead of the grants (engine/README.md, "Requests within the
        # rate"); the critical ones 0.3 s later may find a slot due (CI on Envoy 1.36: 4
        # at once on the grid).
        ahead = 4 if source == "grid" else 1
        assert d["would_queue"] + d["would_reject"] >= n - ahead - LIGHT, report
        return

    # Releases leave on a worker's tick and reach the upstream through its event loop:
    # JITTER_S late at most, never early (the cluster tests' figure; worker iterations
    # up to 30 ms measured here, 2026-11-30). A learned rule: one more. When the learner
    # speeds the schedule up, each worker re-times its held requests at its own next
    # tick, after the schedule's end moved, so the last held request and the first
    # admitted after it can come a little closer than one interval (seen: 25, once 26,
    # at a learned 24/s; not analysed further).
    extra = 5 if source == "grid" else 2 if source == "learned" else 1
    bound = math.floor(rate * (1 + JITTER_S)) + extra
    assert most_in_a_second(stamps) <= bound, f"at most {bound:g} in any 1 s at the upstream: " + report
    # A batch request displaced by a critical one that came while it waited is refused
    # then (engine/README.md, "Invariants" 2), and counted `displaced`; any other 429 is
    # answered at arrival.
    displaced = sum(v for k, v in d.items() if k.endswith(".displaced"))
    late = [a for a in answers if a.status == 429 and a.latency_s > AT_ARRIVAL_S]
    excused = [a for a in late if a in heavy and a.done_at - a.sent_at > LIGHT_AFTER_S]
    assert len(late) == len(excused) <= displaced, (
        f"every 429 at arrival (within {AT_ARRIVAL_S * 1000:.0f} ms) but batch displaced by critical: "
        f"{sorted(round(a.latency_ms) for a in late)} ms, {displaced} displaced; " + report)
    assert d["admitted"] + d["queued"] + d["rejected"] - displaced == n, report
    gone = sum(d.get(k, 0) for k in ("released", "cancelled", "gone", "timed_out")) + displaced
    assert d["queued"] == gone and d.get("held", 0) == 0, (
        "queued = released + displaced + cancelled + gone + timed_out: " + report)
    if quota:
        heavy_ok = codes(heavy).get(200, 0)
        assert heavy_ok <= QUOTA * MQD_S + 2, f"heavy within its quota's places: {heavy_ok}; " + report
        assert codes(light) == {200: LIGHT}, "light passes whole: " + report
    if order == "classes":
        own = (LIGHT - 1) / (QUOTA if quota else rate)
        assert codes(light) == {200: LIGHT}, "critical never refused behind batch: " + report
        assert light_ms <= 1000 * (own + SCHEDULING_S), (
            f"critical jumps the batch line: its last within {own * 1000:.0f} ms of its own slots + "
            f"{SCHEDULING_S * 1000:.0f} ms: " + report)
    elif not quota:
        waited = [round(a.latency_ms) for a in light if a.status == 200]
        assert all(ms > 800 for ms in waited), "FIFO: critical waits behind the batch line: " + report
    if source == "grid":
        # The grid reckons a turn beyond its owned slots a third slower than the share it
        # expects (a lone proxy: the rate), over the queue less a margin: at least half of
        # what the queue holds at the rate. Until issue 30 the expected share fell with
        # the spare as soon as the burst's own demand counted: 13-16 of the 30 (the fleet
        # simulation's scenario `class-burst`).
        least = RATE * MQD_S / 2
        held = codes(heavy).get(200, 0)
        assert held >= least, f"the grid holds a burst within its queue: {held} of {HEAVY}, least {least:g}; " + report


REFUSED = {
    "grid with a key quota": (plugin("grid", "fifo", "enforce", True), "rules[0]"),
    "learned rate on the grid": (plugin("learned-grid", "fifo", "enforce", False), "rules[0]"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_combinations_not_designed_are_refused_naming_the_field(case: str, wasm: Path, upstream) -> None:
    config, field = REFUSED[case]
    cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=upstream.port,
                 plugin=config, wasm=wasm)
    rc, log = Envoy(cfg).run_to_exit()
    assert rc not in (0, -1), "envoy started with a combination that is not designed"
    refused = [line for line in log.splitlines() if "config refused:" in line]
    assert refused and all(field in line for line in refused), log[-3000:]
    print(f"\n{case}: {refused[0].split('config refused: ', 1)[1]}")
    assert "panic" not in log
