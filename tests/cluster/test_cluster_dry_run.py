"""Dry-run in cluster scope with the real engine (envoyproxy/ratelimit + Redis,
harness/engine.py) and real Envoys (harness/cluster.py): a dry-run cluster rule
over its rate holds and rejects nothing, and counts what an enforcing rule of
the same configuration does. Needs `make setup-engine`.

One lab, side by side in the same run: two proxies (`--concurrency 2`) with
two cluster rules of the same configuration (100/s over `expected_replicas` 2,
burst 0, `max_queue_delay` 500 ms), `enforced` on /e/ and `dry` on /d/
(`dry_run`); each proxy is offered 75/s of each (1.5 x each rule's rate) for
8 s with the lab's even loads. The enforcing rule holds its line and refuses
what cannot be served within 500 ms (about a third at 1.5 x); the dry-run rule
must answer everything 200 at once and count `would_queue` and `would_reject`
as the enforcing rule counts `queued` and `rejected`.

Tolerances, and why (each assertion repeats its reason):
- Shares of the rule's requests, 5 points apart at most: the two rules claim
  their grids separately from one engine, each proxy's share follows its own
  demand epoch by epoch, and the loads start and stop a few ms apart on 2
  shared cores, so the two lines do not see the same grants at the same
  instant. In the 5 runs that set this (2026-11-29, load average 2-3) the two
  rules' shares differed by at most 0.2 points; the 5 points still tell
  the defect this test was written for apart (on the code before the dry
  ticket, the dry-run rule counted 0.25% `would_reject` and 97.8%
  `would_queue` where the enforcing rule rejected 31.3% and held 68.8%).
- "At once": every dry-run answer within 100 ms (Fortio's p99 and, for the
  max, 250 ms: half of `max_queue_delay`, as the machine's stalls land on
  whatever is in flight); the enforcing rule's held requests wait up to
  500 ms, so a hold would show.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import fortio
from harness.cluster import ClusterLab, uniform_load

pytestmark = pytest.mark.integration

RATE = 100
MQD_S = 0.5
PER_PROXY = 75.0  # each rule, each of the two proxies: 1.5 x the rate in all
SECS = 8.0
SHARE_TOLERANCE = 0.05


def rule(name: str, prefix: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "rate": f"{RATE}/s", "burst": 0, "max_queue_delay": f"{int(MQD_S * 1000)}ms",
            "match": {"path_prefix": prefix}, "scope": "cluster", "expected_replicas": 2,
            "on_engine_failure": "local_share", **extra}


PLUGIN = {"rules": [rule("enforced", "/e/"), rule("dry", "/d/", dry_run=True)], "max_held_per_worker": 10000,
          "reject_status": 429,
          "engine": {"cluster": "throttle_engine", "timeout": "50ms", "fallback_after": "250ms"}}


@pytest.fixture
def lab(wasm: Path) -> Iterator[ClusterLab]:
    with ClusterLab(PLUGIN, proxies=2, wasm=wasm) as lab:
        yield lab
        assert not lab.panics(), lab.panics()


def totals(lab: ClusterLab, name: str) -> dict[str, int]:
    """A rule's counters and gauges summed over the proxies (read after Envoy's flush)."""
    out: dict[str, int] = {}
    for p in lab.proxies:
        for k, v in p.rule_stats(name).items():
            out[k] = out.get(k, 0) + v
    return out


def side_by_side(lab: ClusterLab) -> tuple[list[fortio.Result], dict, dict]:
    """The same load on the enforcing rule (/e/) and the dry-run one (/d/) of every proxy:
    the clients' results (enforcing ones first), then each rule's counters."""
    loads = [uniform_load(p.url + path, qps=PER_PROXY, duration_s=SECS, max_queue_delay_s=MQD_S).start()
             for path in ("/e/x", "/d/x") for p in lab.proxies]
    try:
        results: list[fortio.Result] = [r.result() for r in loads]
    finally:
        for r in loads:
            r.kill()
    return results, totals(lab, "enforced"), totals(lab, "dry")


def test_a_dry_run_cluster_rule_counts_what_enforcement_holds_and_rejects(lab: ClusterLab) -> None:
    """Side by side, 1.5 x the rate: the dry-run rule answers every request 200
    within 100 ms (p99) and holds none; its `would_queue` and `would_reject`
    shares of its requests are within 5 points of the enforcing rule's
    `queued` and `rejected`, and its counters add up (requests = admitted +
    would_queue + would_reject). On the code before the dry ticket (no ticket
    when a request would join the line) this failed: would_queue 97.8%
    against queued 68.7%, would_reject 0.25% against rejected 31.3%."""
    results, enforced, dry = side_by_side(lab)
    e_codes = [r.codes for r in results[:2]]
    d_res = results[2:]
    share = {k: dry.get(k, 0) / max(1, dry["requests"]) for k in ("admitted", "would_queue", "would_reject")}
    e_share = {k: enforced.get(k, 0) / max(1, enforced["requests"]) for k in ("admitted", "queued", "rejected")}
    print(f"\n  enforced {enforced}\n  dry {dry}\n  enforced shares {e_share}\n  dry shares {share}\n"
          f"  enforced answers {e_codes}; dry answers {[r.codes for r in d_res]}, p99 "
          f"{[r.percentiles.get(99.0) for r in d_res]} ms, max {[r.max_ms for r in d_res]} ms; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    # The lab did what the comparison needs: the enforcing rule held and refused.
    assert enforced.get("queued", 0) > 0.3 * enforced["requests"], f"the enforcing rule barely held: {enforced}"
    assert enforced.get("rejected", 0) > 0.1 * enforced["requests"], f"the enforcing rule barely refused: {enforced}"
    # Nothing held or refused under dry-run: every answer 200, at once.
    assert all(set(r.codes) == {200} for r in d_res), [r.codes for r in d_res]
    assert "held" not in dry and "queued" not in dry and "rejected" not in dry, f"defines only dry-run stats: {dry}"
    p99 = max(r.percentiles.get(99.0, 0.0) for r in d_res)
    worst = max(r.max_ms for r in d_res)
    assert p99 < 100 and worst < 250, f"dry-run answers at once (p99 {p99:.0f} ms, max {worst:.0f} ms)"
    # The counters add up, and count what enforcement did (shares within 5 points: see the docstring).
    assert dry["requests"] == dry.get("admitted", 0) + dry.get("would_queue", 0) + dry.get("would_reject", 0), dry
    for d, e in (("would_queue", "queued"), ("would_reject", "rejected"), ("admitted", "admitted")):
        assert abs(share[d] - e_share[e]) <= SHARE_TOLERANCE, (
            f"dry-run {d} {share[d]:.1%} vs enforced {e} {e_share[e]:.1%} (within {SHARE_TOLERANCE:.0%})")


CLASSES = [{"name": "critical", "match": {"headers": {"x-priority": "critical"}}}, {"name": "batch"}]
CLASS_PLUGIN = {**PLUGIN, "rules": [rule("enforced", "/e/", classes=CLASSES),
                                    rule("dry", "/d/", dry_run=True, classes=CLASSES)]}


@pytest.fixture
def class_lab(wasm: Path) -> Iterator[ClusterLab]:
    with ClusterLab(CLASS_PLUGIN, proxies=2, wasm=wasm) as lab:
        yield lab
        assert not lab.panics(), lab.panics()


def test_a_dry_run_cluster_class_rule_counts_what_enforcement_holds_and_rejects(class_lab: ClusterLab) -> None:
    """The same side by side with priority classes (every request of the default
    class, batch): the dry-run rule's line is its tickets only (nothing held,
    every answer 200 at once); its `would_queue` share is within 5 points of
    the enforcing rule's `queued`, and its would-be refusals (`would_reject` at
    arrival plus batch's `displaced` tickets) of the enforcing rule's
    `rejected` (which counts the displaced too). A parity check, not the
    defect's test: before issue 30's fix the dry-run rule's proxies claimed as
    if nobody waited, yet at this even load (both proxies alike) the shares
    came out the same (would_queue 67.8% vs queued 68.5%, refusals 33.0% vs
    31.8%): the shortfall in claims shows in the core test
    `cluster::tests::a_dry_run_class_rule_claims_as_its_enforcing_twin`."""
    lab = class_lab
    results, enforced, dry = side_by_side(lab)
    d_res = results[2:]
    n_d, n_e = max(1, dry["requests"]), max(1, enforced["requests"])
    share = {"queued": dry.get("would_queue", 0) / n_d,
             "refused": (dry.get("would_reject", 0) + dry.get("class.batch.displaced", 0)) / n_d}
    e_share = {"queued": enforced.get("queued", 0) / n_e, "refused": enforced.get("rejected", 0) / n_e}
    print(f"\n  enforced {enforced}\n  dry {dry}\n  enforced shares {e_share}\n  dry shares {share}\n"
          f"  dry answers {[r.codes for r in d_res]}, p99 {[r.percentiles.get(99.0) for r in d_res]} ms; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    assert enforced.get("queued", 0) > 0.3 * enforced["requests"], f"the enforcing rule barely held: {enforced}"
    assert enforced.get("rejected", 0) > 0.1 * enforced["requests"], f"the enforcing rule barely refused: {enforced}"
    assert all(set(r.codes) == {200} for r in d_res), [r.codes for r in d_res]
    p99 = max(r.percentiles.get(99.0, 0.0) for r in d_res)
    assert p99 < 100, f"dry-run answers at once (p99 {p99:.0f} ms)"
    for k in ("queued", "refused"):
        assert abs(share[k] - e_share[k]) <= SHARE_TOLERANCE, (
            f"dry-run {k} {share[k]:.1%} vs enforced {e_share[k]:.1%} (within {SHARE_TOLERANCE:.0%})")
