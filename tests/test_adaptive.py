"""Adaptive pacing in real Envoy, against a backend whose capacity drops mid-run
(perf/adaptive/emulator.py: W workers, lognormal service time, its own record of
what reached it): the rate the filter lets through follows the new capacity, and
the clients see only 200s and the throttle's own 429s."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from harness import fortio, vegeta
from harness.configs import render
from harness.envoy import Envoy
from harness.net import free_port, http_get
from perf.adaptive import emulator
from perf.adaptive.run import learner_lines

pytestmark = pytest.mark.integration

OFFERED = 150  # per second, for DURATION s
DURATION = 20
# 10 workers x 50 ms = 200/s, then 4 workers = 80/s from DROP_AT on.
DROP_AT = 8
LOW = 80
SCHEDULE = [{"at": 0, "workers": 10, "service_ms": 50}, {"at": DROP_AT, "workers": 4}]
PLUGIN = {"rules": [{"name": "api", "rate": "150/s", "max_queue_delay": "300ms",
                     "adaptive": {"min_rate": "10/s", "max_rate": "1000/s"}}]}


def rate(windows: list[dict], from_s: float, to_s: float) -> float:
    """Requests per second that reached the backend in [from_s, to_s) (100 ms windows)."""
    chunk = windows[round(from_s * 10):round(to_s * 10)]
    return sum(w["arrivals"] for w in chunk) / (len(chunk) / 10)


@contextmanager
def dropping_backend(plugin: dict, wasm) -> Iterator[tuple[emulator.Process, Envoy, str]]:
    """The backend of SCHEDULE behind Envoy with `plugin`, warmed up (10 requests before the
    backend's record starts): (the backend, Envoy, the URL to load)."""
    with emulator.Process(SCHEDULE) as emu:
        cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=emu.port,
                     plugin=plugin, wasm=wasm)
        with Envoy(cfg) as envoy:
            url = f"{envoy.url}/work"
            for _ in range(10):
                http_get(url, timeout=2)
            emu.begin()
            yield emu, envoy, url


def test_the_admitted_rate_follows_a_capacity_drop(wasm):
    with dropping_backend(PLUGIN, wasm) as (emu, envoy, url):
        # 64 connections at 150/s in all: each waits at most for the hold (300 ms) and the
        # backend, so Fortio keeps the offered rate.
        got = fortio.load(url, connections=64, qps=OFFERED, duration_s=DURATION, uniform=True,
                          request_timeout_s=5, allow_initial_errors=True, timeout_s=DURATION + 30)
        record = emu.record()
        stats = envoy.rule_stats("api")
    windows = record["windows"]
    high, low = rate(windows, 2, DROP_AT), rate(windows, DROP_AT + 4, DURATION)
    tail_queue = max(w["waiting_max"] for w in windows[(DROP_AT + 4) * 10:DURATION * 10])
    print(f"codes {got.codes} ({got.requests} of {OFFERED * DURATION} sent), reached the backend {high:.0f}/s "
          f"before the drop, {low:.0f}/s from 4 s after it (capacity {LOW}/s), its queue at most {tail_queue} "
          f"then; stats {stats}")
    # Only answers from the backend (200) and the throttle's own 429: no timeout, no 5xx.
    assert set(got.codes) <= {200, 429}, got.codes
    # Fortio is a closed loop: show that holding did not lower the offered rate much. Each of
    # the 64 connections has 430 ms per request; one held 300 ms behind a slow answer starts its
    # next late, and ~2% fell behind in runs here: 90% leaves room for a busy machine.
    assert got.requests >= OFFERED * DURATION * 0.9, f"{got.requests} sent, meant {OFFERED * DURATION}"
    # Before the drop nothing needs holding back (150/s offered, 200/s capacity). A stall of
    # this shared machine reads as a drop and costs a second or two at a lower rate
    # (perf/adaptive/README.md): two thirds of the offered rate over those 6 s, not all of it.
    assert high >= OFFERED * 2 / 3, high
    # After the drop: what reaches the backend follows its capacity, from 4 s on: never more
    # than 15% above it on average (the probes go 25% above for 400 ms every few seconds),
    # nor less than half of it (the drain goes to half at worst).
    assert LOW * 0.5 <= low <= LOW * 1.15, low
    # ... and its queue stays short: about half a second of its capacity. The learner settles
    # within its band, up to ~2.5% above the capacity (81.9/s of 80 in CI), and the backend's
    # queue then grows by up to ~2 a second over the 6 s tail: 41-51 in about 1 run of 7
    # (CI 2026-11-29, and 2 of 10 runs before), so 0.65 s. A rate that does not follow the
    # capacity queues hundreds.
    assert tail_queue <= LOW * 0.65, tail_queue
    # The learner cut for the queue it saw (or sheds/failures), and paces within its bounds.
    assert stats["adaptive_queue"] + stats["adaptive_shed"] + stats["adaptive_failed"] >= 1, stats
    assert 10_000 <= stats["adaptive_rate"] <= OFFERED * 1000, stats
    assert stats["rejected"] > 0, stats


def test_a_configuration_change_keeps_the_rate_learned_unless_the_rule_changed(wasm, tmp_path):
    """Red team 3, finding 8: the docs said the learner restarts at `rate` after each
    configuration change, and the old listener's learner kept writing the rule's rate while
    it drained. Now: the newer configuration takes the rule's learning at once; a change that
    leaves the rule's `rate` and `adaptive` block alone (here its `max_queue_delay`) keeps
    the rate learned (the capacity behind did not change), one that changes `rate` starts
    there. Backend 4 workers x 50 ms = 80/s, `rate` 150/s, offered 120/s; the learner's
    moves are read from Envoy's debug log (each line says from which rate). ~20 s."""
    from tests.support.dynamic import DynamicEnvoy, dynamic_config, with_plugin

    def plug(rate: str, delay: str) -> dict:
        return {"rules": [{"name": "api", "rate": rate, "max_queue_delay": delay,
                           "adaptive": {"min_rate": "10/s", "max_rate": "1000/s"}}]}

    with emulator.Process([{"at": 0, "workers": 4, "service_ms": 50}]) as emu:
        boot, listener = dynamic_config(listen_port=free_port(), admin_port=free_port(), upstream_port=emu.port,
                                        plugin=plug("150/s", "300ms"), wasm=wasm, lds_dir=tmp_path)
        envoy = DynamicEnvoy(boot, listener, tmp_path)
        envoy.extra_args = [*envoy.extra_args, "--component-log-level", "wasm:debug"]
        envoy.start()
        try:
            t0 = emu.begin()
            load = vegeta.Load(f"{envoy.url}/work", rate=120, duration_s=18, timeout_s=2.0).start()
            time.sleep(6)
            learned = envoy.rule_stats("api")["adaptive_rate"]
            # Each change counts from when Envoy says it accepted it: the learner of the
            # configuration before may move while the update is on its way. (A CI run on
            # 2026-11-29, counting from when the update was written, read a first move from
            # 72.6/s; a move of the old learner after the acceptance still fails here.)
            assert envoy.update(with_plugin(listener, plug("150/s", "301ms"))) == "accepted"
            t_delay = time.time() - t0
            time.sleep(5)
            assert envoy.update(with_plugin(listener, plug("140/s", "301ms"))) == "accepted"
            t_rate = time.time() - t0
            time.sleep(3)
            load.result()
            log = envoy.log()
        finally:
            envoy.stop()
    moves = learner_lines(log, t0)

    def first_after(t: float) -> float:
        line = next(x for x in moves if float(x.split()[0]) > t + 0.05)
        return float(line.split("adaptive rate ")[1].split("/s")[0])

    after_delay, after_rate = first_after(t_delay), first_after(t_rate)
    print(f"\n  learned {learned / 1000:.0f}/s at 6 s; first move after the max_queue_delay change from "
          f"{after_delay}/s, after the rate change from {after_rate}/s; load {os.getloadavg()[0]:.1f}")
    assert learned < 120_000, "it learned the 80/s backend"
    assert after_delay < 120, f"kept what it learned: {after_delay}/s"
    assert abs(after_rate - 140) < 1, f"started again at the new rate: {after_rate}/s"


def test_priority_classes_are_released_at_the_learned_rate(wasm):
    """Adaptive pacing with priority classes (one schedule, the learned interval in the
    rule's rate cell, read by the classes' releases as by a rule without classes): the
    capacity drop of the first test, with 20/s of the 150/s offered marked critical.
    After the drop what reaches the backend follows its capacity, and the throttle (not
    the backend's queue) takes the cut: released at `rate`, the classes would hand the
    backend the excess. Critical, under the learned rate even at its lowest, is never
    refused; batch takes the whole cut."""
    plugin = {"rules": [{**PLUGIN["rules"][0], "classes": [
        {"name": "critical", "match": {"headers": {"x-priority": "critical"}}, "max_queue_delay": "1s"},
        {"name": "batch"}]}]}
    critical_qps = 20
    with dropping_backend(plugin, wasm) as (emu, envoy, url):
        def load(connections: int, qps: int, headers: list[str]) -> fortio.Load:
            return fortio.Load(url, connections=connections, qps=qps, duration_s=DURATION, uniform=True,
                               request_timeout_s=5, allow_initial_errors=True, headers=headers)

        running = [load(60, OFFERED - critical_qps, []).start(),
                   load(20, critical_qps, ["x-priority: critical"]).start()]
        batch, critical = (r.result(DURATION + 30) for r in running)
        record = emu.record()
        stats = envoy.rule_stats("api")
    windows = record["windows"]
    high, low = rate(windows, 2, DROP_AT), rate(windows, DROP_AT + 4, DURATION)
    tail_queue = max(w["waiting_max"] for w in windows[(DROP_AT + 4) * 10:DURATION * 10])
    print(f"batch {batch.codes} p50 {batch.ms(50):.0f} ms; critical {critical.codes} p50 {critical.ms(50):.0f} ms "
          f"p99 {critical.ms(99):.0f} ms; reached the backend {high:.0f}/s before the drop, {low:.0f}/s from 4 s "
          f"after it (capacity {LOW}/s), its queue at most {tail_queue} then; stats {stats}")
    assert set(batch.codes) <= {200, 429} and set(critical.codes) <= {200}, (batch.codes, critical.codes)
    # The same bounds as the first test, for the same reasons: the probes go 25% above for
    # 400 ms every few seconds; the drain goes to half at worst.
    assert LOW * 0.5 <= low <= LOW * 1.15, low
    assert high >= OFFERED * 2 / 3, high
    assert 10_000 <= stats["adaptive_rate"] < 150_000, stats
    # The throttle, not the backend, takes the cut: after the drop ~70/s more is offered than
    # the backend serves, ~840 requests over those 12 s, refused by the throttle (batch's)
    # when the classes are paced at the learned rate (884 and 902 in the runs read here). A
    # quarter of that leaves room for the learner's first seconds after the drop, the
    # closed-loop clients offering less, and the probes. Released at `rate` instead, the
    # classes hand the excess to the backend, whose queue slows the clients down (so `low`
    # alone would not tell): a build pacing the classes at `rate` refused 21 and 35 here,
    # its backend queue up to 60-76 (22-40 with the learned rate), critical's p50 918 ms.
    refused = stats["class.batch.rejected"] + stats["class.batch.displaced"]
    assert refused >= (OFFERED - LOW) * (DURATION - DROP_AT) / 4, refused
    # Critical (20/s, below the learned rate's floor after the drop, 40/s) waits at most for
    # the next slot or two: never refused at once nor at its 1 s deadline.
    assert stats["class.critical.rejected"] == 0 and stats["class.critical.displaced"] == 0, stats
    # Critical's 20 connections keep their 20/s (a second between a connection's requests,
    # against answers of a few hundred ms at most with the backend's queue): 90%, as for the
    # first test's offered rate.
    assert critical.requests >= critical_qps * DURATION * 0.9, critical.requests
