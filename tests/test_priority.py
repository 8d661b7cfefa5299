"""Priority classes in real Envoy with two workers (--concurrency 2, connections
balanced exactly over them): a critical request leaves before the batch requests
held on either worker; the rule's total rate stays exact whatever the mix; batch
keeps its floor while critical alone exceeds the rate; a batch request pushed past
its delay is displaced and counted. Timing figures are measured at the upstream,
which records every arrival with its class (harness/upstream.py)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from harness import fortio
from harness.envoy import longest_between, measure_loops
from harness.net import wait_until
from harness.upstream import Upstream

pytestmark = pytest.mark.integration

CRITICAL = ["x-priority: critical"]
CATCH_UP_S = 0.050  # CATCH_UP_NS (core/src/rate/mod.rs): slots due in a hold-up this long still leave


def classes_rule(rate: str, *, batch_share: float = 0.0, batch_delay: str = "5s", delay: str = "5s") -> dict:
    batch: dict[str, Any] = {"name": "batch", "max_queue_delay": batch_delay}
    if batch_share:
        batch["min_share"] = batch_share
    return {"rules": [{"name": "api", "rate": rate, "max_queue_delay": delay,
                       "classes": [{"name": "critical", "match": {"headers": {"x-priority": "critical"}}},
                                   batch]}]}


def exact_balance(cfg: dict) -> None:
    """Connections spread evenly over the workers (Envoy's exact_balance)."""
    for listener in cfg["static_resources"]["listeners"]:
        listener["connection_balance_config"] = {"exact_balance": {}}


def worker_connections(envoy: Any) -> list[int]:
    return list(envoy.stats_matching(r"^listener\.127\.0\.0\.1_\d+\.worker_\d+\.downstream_cx_total$").values())


def in_parallel(*loads: fortio.Load) -> list[fortio.Result]:
    """The loads side by side, each started 0.3 s after the one before (batch first, so
    that its requests are already waiting)."""
    running = []
    for load in loads:
        running.append(load.start())
        time.sleep(0.3)
    return [r.result(120) for r in running]


def test_critical_leaves_before_batch_held_on_either_worker(envoy_with):
    """50/s, strict priority: 40 batch connections keep ~40 batch requests waiting
    (0.8 s each); 4 critical connections at 10/s in all (within the rate, staggered)
    wait only for the next slot, on whichever worker they are."""
    envoy = envoy_with(classes_rule("50/s"), mutate=exact_balance)
    batch, critical = in_parallel(
        fortio.Load(envoy.url + "/", connections=40, duration_s=4),
        fortio.Load(envoy.url + "/", connections=4, qps=10, duration_s=3, uniform=True, headers=CRITICAL))
    stats = envoy.rule_stats("api")
    per_worker = worker_connections(envoy)
    print(f"batch {batch.codes} p50 {batch.ms(50):.0f} ms; critical {critical.codes} "
          f"p50 {critical.ms(50):.0f} ms p90 {critical.ms(90):.0f} ms max {critical.max_ms:.0f} ms; "
          f"workers {per_worker}; {stats}")
    # Both workers held requests of both classes (exact balance: 20 + 2 connections each).
    assert len(per_worker) == 2 and min(per_worker) >= 20, per_worker
    assert critical.errors == 0 and batch.errors == 0, (critical.codes, batch.codes)
    assert stats["class.critical.rejected"] == 0 and stats["class.critical.displaced"] == 0, stats
    # Batch waits behind ~40 of its own (0.8 s); critical waits for one slot (20 ms) plus the
    # holder's tick (about 4 ms here, more on a loaded machine). 100 ms leaves room for a
    # stalled tick on a busy CI box and is still an eighth of batch's wait.
    assert batch.ms(50) > 600, batch
    assert critical.ms(90) < 100, critical
    assert critical.max_ms < batch.ms(50), (critical, batch)


def arrivals_by_class(app: Upstream, start: float, end: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"critical": [], "batch": []}
    for t, tag in zip(list(app.arrivals), list(app.tags), strict=False):
        if start <= t < end:
            out["critical" if tag == "critical" else "batch"].append(t)
    return out


def test_the_total_rate_is_exact_and_batch_keeps_its_floor(envoy_with):
    """200/s, batch floor 20%: critical alone offers more than the rate (64 connections
    against a 250 ms delay: at most ~40 of them fit in critical's 160/s), batch keeps 40
    requests waiting. Over the steady 5 s, the upstream sees 200/s within 0.5%, a fifth
    of it batch, less the slots due in a hold-up of Envoy's workers beyond the catch-up."""
    def mutate(cfg: dict) -> None:
        exact_balance(cfg)
        measure_loops(cfg)

    with Upstream(tag_header="x-priority") as app:
        envoy = envoy_with(classes_rule("200/s", batch_share=0.2, batch_delay="10s", delay="250ms"),
                           upstream_port=app.port, mutate=mutate)
        loops_before = envoy.loop_histograms()
        t0 = time.monotonic()
        batch, critical = in_parallel(
            fortio.Load(envoy.url + "/", connections=40, duration_s=7),
            fortio.Load(envoy.url + "/", connections=64, duration_s=7, headers=CRITICAL,
                        allow_initial_errors=True))
        stats = envoy.rule_stats("api")
        held_s = longest_between(loops_before, envoy.loop_histograms()) / 1e6
        seen = arrivals_by_class(app, t0 + 1.5, t0 + 6.5)
    both = sorted(seen["critical"] + seen["batch"])
    span = both[-1] - both[0]
    rate = (len(both) - 1) / span
    share = len(seen["batch"]) / len(both)
    # A slot due while the workers are held up longer than the catch-up is forfeited (CI,
    # 2026-11-30: 198.81/s, ~13,000 rejections a second on two cores): at most this much
    # lower, if the hold-up fell in the window (Envoy's loop histograms give the longest).
    lost = 200 * max(0.0, held_s - CATCH_UP_S) / span
    print(f"upstream {rate:.2f}/s ({100 * (rate / 200 - 1):+.2f}%), batch share {share:.3f}; "
          f"longest hold-up {1000 * held_s:.0f} ms (allows {lost:.2f}/s less); "
          f"critical {critical.codes} p99 {critical.ms(99):.0f} ms; batch {batch.codes}; {stats}")
    # The rule's schedule is exact in virtual time; the only error is the jitter of the two
    # ticks at the ends of the window (a few ms over 5 s, < 0.2%), and the hold-up's loss.
    assert 200 * 0.995 - lost < rate < 200 * 1.005, (
        f"{rate:.2f}/s at the upstream, configured 200/s (hold-up {1000 * held_s:.0f} ms allows {lost:.2f}/s less)")
    # Batch gets at least its floor (20% of the releases), critical takes the rest; the
    # floor slots stray from their share by a few slots over 1000 (discrepancy < 0.5%).
    assert 0.19 <= share <= 0.23, f"batch got {share:.3f} of the releases, its floor is 0.2"
    # Critical's overflow (1.5x the rate less the floor) is rejected at once, not displaced.
    # Known (issue 29): here, at ~13,000 rejections a second on two cores, one critical request
    # in ~1,200 released is still held to its deadline and refused, in about a third of the
    # runs (0 or 1 in each of 12 runs on 2026-11-28, with the admission race that the core's
    # test `a_grant_between_the_schedule_and_the_tickets_never_admits_too_many` names fixed;
    # not the forfeit of a late tick: the same with CATCH_UP_NS at 250 ms). More than one in
    # 1,000 fails.
    released = stats["class.critical.released"] + stats["class.critical.admitted"]
    assert stats["class.critical.rejected"] > 0, stats
    assert stats["class.critical.displaced"] <= released // 1000, stats
    if stats["class.critical.displaced"]:
        print(f"KNOWN (issue 29): {stats['class.critical.displaced']} critical request(s) held, then refused")
    assert stats["held"] == 0, stats


def test_a_batch_request_pushed_past_its_delay_is_displaced(envoy_with):
    """50/s: 60 batch requests wait (turns within 1.2 s of their 2 s delay); 0.3 s later
    100 critical requests arrive at once (2 s of slots, all ahead of batch): the turns
    of the batch requests still waiting move past their delay, so they are answered
    429 at once and counted displaced."""
    envoy = envoy_with(classes_rule("50/s", batch_delay="2s"), mutate=exact_balance)
    batch, critical = in_parallel(
        fortio.Load(envoy.url + "/", connections=60, requests=60, allow_initial_errors=True),
        fortio.Load(envoy.url + "/", connections=100, requests=100, headers=CRITICAL))
    stats = envoy.rule_stats("api")
    print(f"batch {batch.codes} max {batch.max_ms:.0f} ms; critical {critical.codes}; {stats}")
    assert critical.errors == 0, critical.codes
    displaced = stats["class.batch.displaced"]
    assert displaced > 0 and batch.codes.get(429, 0) == displaced, (batch.codes, stats)
    # Displaced at the first check after critical arrived, not after waiting its whole delay.
    assert batch.max_ms < 1500, batch
    assert stats["rejected"] == displaced + stats["class.batch.rejected"], stats
    wait_until(lambda: envoy.rule_stats("api", settle=False)["held"] == 0, 5, "nothing held")


def test_class_metrics_reach_prometheus_with_their_labels(envoy_with):
    envoy = envoy_with(classes_rule("50/s"))
    s = fortio.load(envoy.url + "/", connections=2, requests=10, headers=CRITICAL)
    assert s.errors == 0
    envoy.rule_stats("api")  # waits out the metrics' flush
    prom = envoy.prometheus()
    # Envoy's tag extractors (envoy/demo.yaml) give the rule and the class as labels.
    assert re.search(r'^throttle_class_admitted\{throttle_rule="api",throttle_class="critical"\} (\d+)$', prom, re.M), \
        [m for m in prom.splitlines() if m.startswith("throttle_class_")]
    assert re.search(r'^throttle_requests\{throttle_rule="api"\} 10$', prom, re.M), prom[-3000:]


def test_dry_run_counts_what_the_class_order_would_do_and_holds_nothing(envoy_with):
    """The displacement scenario above under `dry_run`: every request goes on at once,
    and the class counters tell what the line would have done. 60 batch requests at
    once (one admitted, 59 would wait: turns within 1.2 s of batch's 2 s), 0.3 s later
    100 critical at once (2 s of slots, all ahead of batch): the batch tickets still in
    the line are counted displaced, critical's released at their turns, each class's
    `queued` = `released` + `displaced` once the line has run out."""
    plugin = classes_rule("50/s", batch_delay="2s")
    plugin["rules"][0]["dry_run"] = True
    envoy = envoy_with(plugin, mutate=exact_balance)
    batch, critical = in_parallel(
        fortio.Load(envoy.url + "/", connections=60, requests=60),
        fortio.Load(envoy.url + "/", connections=100, requests=100, headers=CRITICAL))

    def settled() -> bool:
        s = envoy.rule_stats("api", settle=False)
        return all(s[f"class.{c}.queued"] == s[f"class.{c}.released"] + s[f"class.{c}.displaced"]
                   for c in ("critical", "batch"))

    # Critical's 100 tickets take 2 s of slots from their arrival; the loads ended at once.
    wait_until(settled, 6, "each class's dry tickets granted or displaced")
    stats = envoy.rule_stats("api")
    print(f"batch {batch.codes} max {batch.max_ms:.0f} ms; critical {critical.codes} max "
          f"{critical.max_ms:.0f} ms; {stats}")
    # Nothing held or refused: every answer is the upstream's, at once. Enforced, critical's
    # last would wait 2 s and batch's displaced 0.3 s or more; 250 ms leaves room for 100
    # connections opening at once on a busy 2-core machine.
    assert batch.codes == {200: 60} and critical.codes == {200: 100}, (batch.codes, critical.codes)
    assert max(batch.max_ms, critical.max_ms) < 250, (batch, critical)
    # A dry-run rule does not define the statistics of holding and rejecting (`queued`,
    # `rejected`, `held`, ...); its classes define all of theirs.
    rule_stats = {k for k in stats if not k.startswith("class.")}
    assert rule_stats == {"requests", "admitted", "contention", "would_queue", "would_reject"}, stats
    # Each request counted once at arrival.
    assert stats["admitted"] + stats["would_queue"] + stats["would_reject"] == 160, stats
    # The line ran as it would have: critical's queued tickets all released (its turns come
    # within its 5 s), batch's pushed past its 2 s by critical's 2 s of slots displaced. The
    # batch tickets released are those whose slot came in the ~0.3 s before critical arrived
    # (about 15 at 50/s): the rest of its 59, at least 20 even if the second Fortio started
    # late, are displaced.
    assert stats["class.critical.queued"] >= 99, stats
    assert stats["class.critical.released"] == stats["class.critical.queued"], stats
    assert stats["class.critical.displaced"] == 0, stats
    assert stats["class.batch.queued"] == 59 and stats["class.batch.displaced"] >= 20, stats
