"""Cluster scope at other numbers (issue 29): red team 3's findings 2-6
(../shared/reviews/redteam-2026-11-28.md) at the report's own numbers, against
the real engine (envoyproxy/ratelimit + Redis, harness/engine.py) and real
Envoys (harness/cluster.py), asserting the issue's targets ("Targets"). Measured
at the upstream's own arrival times, Envoy's own timing of each 429 (an access
log, `ClusterLab(refusal_log=True)`), the clients' latencies and the filter's
`x-throttle-wait-ms`, and the proxies' statistics and logs. Needs `make
setup-engine`; the clock test uses the test-only `test-clock` build
(tests/cluster/conftest.py).

Each test says what it costs (wall time on this 2-core machine, shared); the
file takes about 2 minutes (+ ~25 s to build the test-clock .wasm if
test_holds.py has not). Each scenario is a function that returns the figures it
printed and what broke (`Outcome`), so that its control (the same loads where
the defect cannot occur: process scope, one cluster rule, no skew) runs the
same checks: `python -m tests.cluster.controls` (CI runs the tests only).

Tolerances, and why (each assertion repeats its reason), in the house style of
test_holds.py and test_cluster_scope.py:
- A time above a limit counts only if this process was not held up for as
  long as the excess meanwhile (harness/stalls.py: the clients, Fortio, Envoy
  and the upstream share 2 cores; a stall of the machine lands on whatever is
  in flight). 429s are timed by Envoy itself (from its first byte in to its
  last byte out), so the client's own scheduling is left out: the measured
  client saw a 27 ms 429 in the process-scope control that Envoy answered in
  under 1 ms. A sporadic request is the filter's doing only if the filter held
  it (`x-throttle-wait-ms`): in one process-scope control run, with nothing
  held, four took 87-158 ms at load average 5.6 while this process saw stalls
  of 1-9 ms.
- A 429 over 10 ms is also excused up to the longest iteration of its proxy's
  event loops in the run (Envoy's dispatcher statistics, `measure_loops`): a
  request that comes in during one waits for its filters that long. A sleeping
  Python thread is woken first, so it does not see how long a busy worker
  waits for a core: CI saw 429s of 17 and 19 ms (2026-11-28, 2026-11-29) with
  stalls of 5 ms here; a quiet run has 3-14 ms ones while worker iterations
  reach 12-24 ms. A refusal after a hold comes at the deadline (1 s) or, for
  a class, when displaced: the rule's counters catch both, whatever the timing.
- JITTER_S = 70 ms of release jitter (worker ticks, Envoy's and Python's
  scheduling: `make perf-cluster`, see test_cluster_scope.py): a window may
  hold up to rate x JITTER_S releases due just outside it.
- A count over a window may be one slot off at each edge (the window's edges
  cut the release stream anywhere).
- A failed engine call loses the slots it claimed (engine/README.md: "the
  claims it carried were lost"): a total may fall short by one epoch's slots
  (rate x 100 ms) per failed call of the rule. Calls time out (50 ms) when the
  shared cores are busy: in one control run at load average 6.9, 4 failed
  calls left beta 20 slots short of 150/s x 7.5 s, with one rule alone.
- A class floor is a share of the releases (`min_share`): a window that
  released fewer than the rate (a stall, a failed call) owes the floor's share
  of what it released.
- The issue's own figures otherwise (10 ms, 1%, 15%, 20 ms, 90%).
"""

from __future__ import annotations

import contextlib
import http.client
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from harness import fortio, windows
from harness.cluster import Answer, ClusterLab, uniform_load
from harness.envoy import longest_between
from harness.net import wait_until
from harness.stalls import StallMonitor

pytestmark = pytest.mark.integration

JITTER_S = 0.070
# Every 429 within this long of the request's arrival (the target).
REFUSE_MS = 10.0
# Sporadic requests within the rate: none slower than this (the target).
SPORADIC_MS = 20.0
# What becomes of a held request (filters/throttle/README.md, "Invariants").
HELD_FATES = ("released", "cancelled", "gone", "timed_out", "held")
COUNTERS = ("requests", "queued", "rejected", "engine_failures", *HELD_FATES)
EPOCH_S = 0.1
CATCH_UP_S = 0.050  # CATCH_UP_NS (core/src/rate/mod.rs): slots due in a hold-up this long still leave


# -- helpers ------------------------------------------------------------------------------------------

def load_average() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def cluster_rule(name: str, rate: str, *, prefix: str = "/", mqd: str = "1s", replicas: int = 3,
                 **extra: Any) -> dict[str, Any]:
    return {"name": name, "rate": rate, "burst": 0, "max_queue_delay": mqd, "match": {"path_prefix": prefix},
            "scope": "cluster", "expected_replicas": replicas, "on_engine_failure": "local_share", **extra}


def process_rule(rule: dict[str, Any], rate: str) -> dict[str, Any]:
    """The same rule in process scope at `rate` (each proxy its own schedule): the control
    where nothing of the grid can happen."""
    out = {k: v for k, v in rule.items() if k not in ("scope", "expected_replicas", "on_engine_failure")}
    out["rate"] = rate
    return out


def plugin(rules: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"rules": rules, "max_held_per_worker": 10000, "reject_status": 429}
    if any(r.get("scope") == "cluster" for r in rules):
        out["engine"] = {"cluster": "throttle_engine", "timeout": "50ms", "fallback_after": "250ms"}
    return out


@contextmanager
def running(loads: list[fortio.Running]) -> Iterator[list[fortio.Running]]:
    try:
        yield loads
    finally:
        for r in loads:
            r.kill()


def not_answered(clients: Sequence[fortio.Result]) -> int:
    """Requests answered with neither 200 nor 429 (or not at all)."""
    return sum(c.requests - c.codes.get(200, 0) - c.codes.get(429, 0) for c in clients)


def slowest_refusal_ms(result: fortio.Result) -> float:
    """The slowest answer other than 200 of a Fortio load (its `ErrorsDurationHistogram`:
    here the 429s, every other answer being checked for separately), ms; 0 if none."""
    h = result.raw.get("ErrorsDurationHistogram") or {}
    return 1000 * float(h.get("Max") or 0) if h.get("Count") else 0.0


def rule_counters(lab: ClusterLab, rule: str, names: Sequence[str] = COUNTERS) -> list[dict[str, int]]:
    """Each proxy's counters of one rule, once nothing is held any more (its `held`
    gauge at 0), read after Envoy's flush (`settle`: the filter hands its counters
    over every ~0.1 s)."""
    wait_until(lambda: all(lab.rule_stats(i, rule).get("held", 0) == 0 for i in range(lab.n)), 10,
               f"rule {rule}: nothing held")
    return [{k: v for k, v in lab.proxies[i].rule_stats(rule).items() if k in names or k.startswith("class.")}
            for i in range(lab.n)]


def delta(after: list[dict[str, int]], before: list[dict[str, int]], name: str) -> list[int]:
    return [a.get(name, 0) - b.get(name, 0) for a, b in zip(after, before, strict=True)]


def unaccounted(after: list[dict[str, int]], before: list[dict[str, int]]) -> list[int]:
    """Per proxy, requests held that were neither released, cancelled, gone, timed out
    nor still held: held, then refused (queued = released + cancelled + gone +
    timed_out + held breaks by exactly that many)."""
    q = delta(after, before, "queued")
    fates = [delta(after, before, f) for f in HELD_FATES]
    return [q[i] - sum(f[i] for f in fates) for i in range(len(q))]


@dataclass(frozen=True)
class Timed:
    sent: float  # monotonic s
    status: int  # -1: no answer
    ms: float
    held_ms: int | None = None  # the filter's `x-throttle-wait-ms`: it held the request that long


def timed_get(url: str, headers: dict[str, str] | None = None) -> Timed:
    """One GET on a new connection: when it was sent, its status, how long it took, and
    how long the filter held it (if it did)."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    path = "/" + url.removeprefix("http://").split("/", 1)[1]
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    t = time.monotonic()
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        held = resp.getheader("x-throttle-wait-ms")
        return Timed(t, resp.status, 1000 * (time.monotonic() - t), None if held is None else int(held))
    except OSError:
        return Timed(t, -1, 1000 * (time.monotonic() - t))
    finally:
        conn.close()


def too_slow(samples: Sequence[Timed], limit_ms: float, stalls: StallMonitor) -> list[tuple[float, int, float]]:
    """(ms, ms held by the filter, worst stall ms while it was out) of each request slower
    than `limit_ms` that the filter held, and that no stall of this process as long as
    the excess explains. A request the filter did not hold (no `x-throttle-wait-ms`)
    spent its time outside the filter: in the machine's scheduling of the client, Envoy
    and the upstream."""
    out = []
    for s in samples:
        if s.ms > limit_ms and s.held_ms is not None:
            stall_ms = 1000 * stalls.worst(s.sent, s.sent + s.ms / 1000)
            if s.ms - limit_ms > stall_ms:
                out.append((round(s.ms, 1), s.held_ms, round(stall_ms, 1)))
    return out


def paced_client(url: str, *, start: float, end: float, every_s: float, out: list[Timed], lock: threading.Lock,
                 headers: dict[str, str] | None = None) -> threading.Thread:
    """A thread sending one request every `every_s` from monotonic `start` until `end`
    (the load itself: its pauses are the offered pattern, not a synchronisation)."""

    def run() -> None:
        next_at = start
        while next_at < end:
            time.sleep(max(0.0, next_at - time.monotonic()))
            got = timed_get(url, headers)
            with lock:
                out.append(got)
            next_at += every_s

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def quantiles(ms: Sequence[float]) -> str:
    if not ms:
        return "none"
    xs = sorted(ms)
    q = [xs[min(len(xs) - 1, int(f * len(xs)))] for f in (0.1, 0.5, 0.9)]
    return f"p10 {q[0]:.0f}, p50 {q[1]:.0f}, p90 {q[2]:.0f}, max {xs[-1]:.0f} ms"


@dataclass
class Outcome:
    """What a scenario showed: its figures (printed) and what broke (each with its figures)."""

    report: str
    problems: list[str] = field(default_factory=list)
    # The lab itself did not do what the scenario needs (e.g. it did not overload the rule):
    # then the run tests nothing, which is not the filter's failure.
    lab_problems: list[str] = field(default_factory=list)
    # Figures a test judges further (e.g. "total": the rate at the upstream, /s).
    figures: dict[str, float] = field(default_factory=dict)


def check(outcome: Outcome, what: str) -> None:
    print("\n  " + outcome.report)
    assert not outcome.lab_problems, (
        "the lab did not do what the scenario needs (the machine may be too busy: " + load_average() + "):\n  "
        + "\n  ".join(outcome.lab_problems) + "\n  all: " + outcome.report)
    assert not outcome.problems, what + ":\n  " + "\n  ".join(outcome.problems) + "\n  all: " + outcome.report


# -- 1. Held, then refused (finding 2) ------------------------------------------------------------------

LATE_RATE = 100
LATE_SECS = 9.0
# (case, each proxy offered /s): 1.35 x and 1.1 x the rate over three proxies, plus
# the measured client on p0 (5 threads, one request every 0.5 s each: 10/s).
LATE_CASES = [pytest.param(45.0, id="1.35x"), pytest.param(37.0, id="1.1x")]
MEASURED_THREADS, MEASURED_EVERY_S = 5, 0.5


def late_refusals(lab: ClusterLab, rule: str, per_proxy_qps: float, *, rate: float = LATE_RATE,
                  secs: float = LATE_SECS, headers: Sequence[str] = (), refuse_ms: float = REFUSE_MS) -> Outcome:
    """Each proxy offered `per_proxy_qps` of the rule for `secs`, and a measured client on
    p0 (5 threads, one request every 0.5 s each, from 2 s to 1 s before the end); every
    429 must be answered at arrival (within 10 ms, Envoy's own timing) and the rule's
    counters must add up. `lab` logs its refusals (`refusal_log`)."""
    before = rule_counters(lab, rule)
    loops_before = lab.loop_histograms()
    lab.upstream.clear()
    samples: list[Timed] = []
    lock = threading.Lock()
    hdrs = dict(h.split(": ", 1) for h in headers)
    with StallMonitor() as stalls:
        t0, wall0 = time.monotonic(), time.time()
        loads = [uniform_load(p.url + "/x", qps=per_proxy_qps, duration_s=secs, max_queue_delay_s=1.0,
                              headers=headers).start() for p in lab.proxies]
        with running(loads):
            threads = [paced_client(lab.proxies[0].url + "/m", start=t0 + 2 + 0.1 * k, end=t0 + secs - 1,
                                    every_s=MEASURED_EVERY_S, out=samples, lock=lock, headers=hdrs)
                       for k in range(MEASURED_THREADS)]
            clients = [r.result() for r in loads]
            for t in threads:
                t.join(30)
        after = rule_counters(lab, rule)
        rejected = delta(after, before, "rejected")

        def logged() -> list[list[Answer]]:
            return [[a for a in lab.refusals(i) if a.arrived >= wall0 - 0.5] for i in range(lab.n)]

        # Envoy writes its access logs out every 100 ms here: wait until each proxy's 429s are all there.
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: [len(x) for x in logged()] == rejected, 5, "every 429 in the access logs")
        refusals = logged()
    # The longest event-loop iteration of each proxy's workers in the run (Envoy's own timing):
    # a request that came in during it waited for the filter that long, whoever held the worker.
    held_up = [longest_between(b, a) / 1000 for b, a in zip(loops_before, lab.loop_histograms(), strict=True)]
    stamps = lab.arrivals(t0, t0 + secs + 2)
    total = windows.rate(stamps, t0 + 2, t0 + secs - 0.5)
    late = []  # (proxy, Envoy's ms, worst stall ms while it was in Envoy)
    over = 0  # 429s over refuse_ms, excused or not
    for i, answers in enumerate(refusals):
        for a in answers:
            if a.ms > refuse_ms:
                over += 1
                arrived = t0 + (a.arrived - wall0)
                stall_ms = max(1000 * stalls.worst(arrived, arrived + (a.ms + 1) / 1000), held_up[i])
                if a.ms - refuse_ms > stall_ms:
                    late.append((lab.tag(i), a.ms, round(stall_ms)))
    envoy_ms = [a.ms for x in refusals for a in x]
    refused = [s.ms for s in samples if s.status == 429]
    lost = unaccounted(after, before)
    displaced = {k: delta(after, before, k) for k in after[0] if k.endswith(".displaced")}
    report = (f"each proxy offered {per_proxy_qps:g}/s (+10/s measured on p0) of {rate:g}/s: total at the upstream "
              f"{total:.1f}/s; 429s per proxy {rejected} (in the access logs {[len(x) for x in refusals]}), Envoy's "
              f"time to answer them {quantiles(envoy_ms)}, over {refuse_ms:g} ms {over}, of them beyond any "
              f"stall {len(late)}: "
              f"{late[:10]}{' ...' if len(late) > 10 else ''}; the measured client (the report's view) "
              f"{sum(s.status == 200 for s in samples)} x 200, {len(refused)} x 429 in {quantiles(refused)}; "
              f"Fortio's slowest 429 per proxy {[round(slowest_refusal_ms(c)) for c in clients]} ms; Fortio answers "
              f"{[c.codes for c in clients]}; queued {delta(after, before, 'queued')}, released "
              f"{delta(after, before, 'released')}, held then refused (queued - released - cancelled - gone - "
              f"timed_out - held) {lost}; displaced {displaced}; worst stall "
              f"{1000 * stalls.worst(t0, t0 + secs):.0f} ms; longest event loop per proxy at least "
              f"{[round(h, 1) for h in held_up]} ms; {load_average()}")
    out = Outcome(report, figures={"total": total})
    if late:
        out.problems.append(f"{len(late)} of {len(envoy_ms)} 429s answered later than {refuse_ms:g} ms after "
                            f"arrival (Envoy's own time), beyond any stall of this process meanwhile and its "
                            f"proxy's longest event loop: (proxy, ms, stall ms) {late[:20]}")
    if any(lost):
        out.problems.append(f"queued = released + cancelled + gone + timed_out + held breaks by {lost} per proxy "
                            f"(requests held, then refused)")
    if any(x for v in displaced.values() for x in v):
        out.problems.append(f"class requests displaced {displaced}: only the top class is in use")
    if not_answered(clients) or any(s.status not in (200, 429) for s in samples):
        out.problems.append(f"answers other than 200/429: {[c.codes for c in clients]}, measured "
                            f"{sorted({s.status for s in samples})}")
    # A failed engine call costs the fleet its proxy's share of one epoch (a timeout the engine
    # counted: nobody gets those slots).
    failed = sum(delta(after, before, "engine_failures"))
    if total * (secs - 2.5) < 0.97 * rate * (secs - 2.5) - failed * rate * EPOCH_S / lab.n:
        out.lab_problems.append(f"the loads did not saturate the rule: {total:.1f}/s at the upstream for {rate:g}/s "
                                f"({failed} failed engine calls)")
    if [len(x) for x in refusals] != rejected or not sum(rejected):
        out.lab_problems.append(f"the access logs hold {[len(x) for x in refusals]} 429s for {rejected} rejected: "
                                f"every 429 must be timed, and some must happen")
    return out


@pytest.fixture(scope="module")
def late_lab(wasm: Path) -> Iterator[ClusterLab]:
    with ClusterLab(plugin([cluster_rule("orders", f"{LATE_RATE}/s")]), wasm=wasm, refusal_log=True,
                    loops=True) as lab:
        yield lab
        assert not lab.panics(), lab.panics()


@pytest.mark.parametrize("per_proxy_qps", LATE_CASES)
def test_overload_is_refused_at_arrival_never_after_a_hold(late_lab: ClusterLab, per_proxy_qps: float) -> None:
    """Finding 2. Three proxies share a 100/s rule (max_queue_delay 1 s), each
    offered 45/s (1.35 x) or 37/s (1.1 x) for 9 s, plus a measured client on
    p0 (5 threads, one request every 0.5 s each). Every 429 is answered at
    arrival: within 10 ms by Envoy's own timing (the issue's target; a slower
    one only as far as a stall of this process meanwhile explains), and the
    rule's counters add up: queued = released + cancelled + gone + timed_out +
    held on every proxy. On main (the report) every 429 came after 0.7-1.0 s
    and queued - released = rejected exactly; the control (process scope at
    33.3/s a proxy): every 429 in 0-1 ms by Envoy's timing, 1-2 ms at the
    measured client. One lab for both cases; costs ~11 s a case + ~5 s of
    lab."""
    check(late_refusals(late_lab, "orders", per_proxy_qps),
          "under overload a request is refused at arrival, never after it was held (0 late refusals), and "
          "queued = released + cancelled + gone + timed_out + held")


# The engine's blips (CI 2026-11-29: one late 429 on the proxy with 2 failed calls): the fault
# proxy forwards each call, then answers 80 ms late (past the 50 ms timeout: the engine counted
# what it never told) for 40, 90 and 140 ms, at these seconds of the run: one to three calls.
BLIPS = ((3.0, 0.04), (5.0, 0.09), (7.0, 0.14))


@pytest.fixture(scope="module")
def blip_lab(wasm: Path) -> Iterator[ClusterLab]:
    with ClusterLab(plugin([cluster_rule("orders", f"{LATE_RATE}/s")]), wasm=wasm, refusal_log=True,
                    loops=True, fault_proxy=True) as lab:
        yield lab
        assert not lab.panics(), lab.panics()


def test_engine_blips_under_overload_refuse_nobody_after_a_hold(blip_lab: ClusterLab) -> None:
    """As the 1.35 x case above, with the engine's calls timing out for a moment three
    times (BLIPS: shorter than fallback_after, so no proxy falls back). A failed call cost
    its proxy the shares its held requests' turns were reckoned on; they are forgiven
    (`slots_forgiven`), so every 429 is still answered at arrival (within 100 ms, where one
    after a hold comes at 1 s) and the counters add up.
    The fleet's total stays within 1% (+ one slot at each edge of the window) plus what was
    forgiven. The blips must fail some calls (else the run tests nothing). Fleet sweep:
    `late-refusals-blips`. ~16 s."""
    kinds = ("failures_transport", "failures_timeout", "failures_status", "failures_nonsense")
    names = (*COUNTERS, "slots_forgiven", *kinds)
    before = rule_counters(blip_lab, "orders", names)

    engine = blip_lab.engine
    assert engine is not None

    def blips(start: float) -> None:
        for at, length in BLIPS:
            time.sleep(max(0.0, start + at - time.monotonic()))
            engine.slow(80)
            time.sleep(length)
            engine.healthy()

    thread = threading.Thread(target=blips, args=(time.monotonic(),), daemon=True)
    thread.start()
    try:
        # A refusal after a hold comes at the deadline (1 s): 100 ms tells it from one at arrival.
        # How fast Envoy answers a refusal at arrival is the 1.35 x case's subject (10 ms).
        out = late_refusals(blip_lab, "orders", 45.0, refuse_ms=100.0)
    finally:
        thread.join(15)
        engine.healthy()
    after = rule_counters(blip_lab, "orders", names)
    failed, forgiven = delta(after, before, "engine_failures"), delta(after, before, "slots_forgiven")
    by_kind = {k.removeprefix("failures_"): delta(after, before, k) for k in kinds}
    out.report += f"; engine calls failed per proxy {failed} (by kind {by_kind}), slots forgiven {forgiven}"
    if not sum(failed):
        out.lab_problems.append(f"the blips failed no engine call: {failed}")
    span = LATE_SECS - 2.5  # late_refusals' window: from 2 s to 0.5 s before the end
    if out.figures["total"] * span > LATE_RATE * span * 1.01 + 2 + sum(forgiven):
        out.problems.append(f"the total above the rate by more than 1% (+ one slot at each edge of the "
                            f"window) + the {sum(forgiven)} forgiven")
    check(out, "with the engine's calls timing out for a moment, a request is still refused at arrival, never "
               "after it was held (0 late refusals), and queued = released + cancelled + gone + timed_out + held")


# -- 2. Two cluster rules in one Envoy (finding 3) --------------------------------------------------------

TWO_SECS = 11.0
TWO_SPAN = (3.0, 10.5)  # measured from 3 s (the grid settled) to 0.5 s before the end


def two_rules(lab: ClusterLab, alpha: float, beta: float, *, cluster: Sequence[str] = ("alpha", "beta"),
              secs: float = TWO_SECS) -> Outcome:
    """Rule alpha (/a/) offered 2 x its rate evenly, beta (/b/) 2 x its rate split
    1:2:3(:4) over the proxies; the rules named in `cluster` are judged (the others
    run in process scope in a control): each within 1% of its rate, alpha's proxies
    (equal demand) within 15% of each other, beta's in proportion to demand (15%)."""
    n = lab.n
    weights = [(i + 1) / sum(range(1, n + 1)) for i in range(n)]
    rates = {"alpha": alpha, "beta": beta}
    offered = {"alpha": [2 * alpha / n] * n, "beta": [2 * beta * w for w in weights]}
    names = ("engine_calls", "engine_failures", "rejected", "slots_unused", "grid_mismatch", "slots_granted",
             "slots_forgiven", "failures_clock", "clock_offset_ms")
    before = {r: [lab.rule_stats(i, r) for i in range(n)] for r in rates}
    loops_before = lab.loop_histograms() if lab.loops else []
    lab.upstream.clear()
    with StallMonitor() as stalls:
        t0 = time.monotonic()
        loads = [uniform_load(lab.proxies[i].url + f"/{r[0]}/x", qps=offered[r][i], duration_s=secs,
                              max_queue_delay_s=1.0).start() for r in rates for i in range(n)]
        with running(loads):
            clients = [x.result() for x in loads]
    # A proxy's slots that come due while Envoy itself is held up leave at once after it, up to
    # the 50 ms catch-up; beyond that they are lost (as in test_cluster_scope.py). CI once: beta
    # 30 short of 1125 with one failed call, a window of 120, both rules short in that second.
    held_s = max((longest_between(b, a) / 1e6 for b, a in zip(loops_before, lab.loop_histograms(), strict=True)),
                 default=0.0) if lab.loops else 0.0
    beyond_s = max(0.0, held_s - CATCH_UP_S)
    m0, m1 = t0 + TWO_SPAN[0], t0 + TWO_SPAN[1]
    span = m1 - m0
    out = Outcome("")
    lines = []
    for r, rate in rates.items():
        each = [len(lab.arrivals(m0, m1, tag=lab.tag(i), prefix=f"/{r[0]}/")) for i in range(n)]
        total = sum(each)
        stamps = lab.arrivals(t0, t0 + secs + 2, prefix=f"/{r[0]}/")
        st = [lab.rule_stats(i, r) for i in range(n)]
        counters = {k: delta(st, before[r], k) for k in names}
        line = (f"{r} ({rate:g}/s, {'cluster' if r in cluster else 'process'}): {total / span:.2f}/s over "
                f"{span:g} s ({total} for {rate * span:.0f}), 1 s windows "
                f"{windows.window_counts(stamps, m0, m1, 1.0)}, per proxy {[round(x / span, 2) for x in each]}/s "
                f"for {[round(q, 1) for q in offered[r]]}/s offered; {counters}")
        lines.append(line)
        if r not in cluster:
            continue
        failed = sum(counters["engine_failures"])
        if abs(total - rate * span) > 0.01 * rate * span + 2 + rate * (EPOCH_S * failed + beyond_s):
            out.problems.append(f"{r}: the total off its rate by more than 1% (+ one slot at each edge of the "
                                f"window, + one epoch's slots per failed engine call, + the slots of Envoy's "
                                f"longest hold-up beyond the catch-up, {1000 * held_s:.0f} ms): {line}")
        if r == "alpha":
            if max(each) - min(each) > 0.15 * min(each) + 2:
                out.problems.append(f"alpha: proxies of equal demand not within 15% of each other (+ one slot at "
                                    f"each edge of the window): {each} in {span:g} s: {line}")
        else:
            fair = [rate * span * w for w in weights]
            if any(abs(x - f) > 0.15 * f + 2 for x, f in zip(each, fair, strict=True)):
                out.problems.append(f"beta: shares not in proportion to demand within 15% (+ one slot at each edge "
                                    f"of the window): {each} for {[round(f) for f in fair]}: {line}")
    out.report = ("\n  ".join(lines) + f"\n  answers {[c.codes for c in clients]}; worst stall "
                  f"{1000 * stalls.worst(m0, m1):.0f} ms; Envoy's longest hold-up {1000 * held_s:.0f} ms; "
                  f"{load_average()}")
    if not_answered(clients):
        out.problems.append(f"answers other than 200/429: {[c.codes for c in clients]}")
    return out


def test_two_cluster_rules_keep_each_rate_and_share(wasm: Path) -> None:
    """Finding 3. Three proxies carry two cluster rules: alpha 30/s offered
    60/s evenly, beta 150/s offered 300/s split 1:2:3, max_queue_delay 1 s,
    for 11 s. Over [3 s, 10.5 s): each rule's total within 1% of its rate (the
    issue's target; + one slot at each edge of the window, + one epoch's slots
    per failed engine call), alpha's proxies (equal demand) within 15% of each
    other and beta's shares in proportion to demand within 15% (the issue's
    figure; + one slot at each edge): a second cluster rule changes no figure
    of the first. On main (the report)
    alpha delivered 23.5-24.7/s with proxies at 2.9 / 20.0 / 0.7 per s in 4 of
    5 runs; each rule as the only cluster rule (the control): 30.00/s at 9.9 /
    10.0 / 10.1 per s, beta 150.00/s at 25.1 / 50.0 / 74.9. Costs ~15 s.

    The report's four-proxy case (alpha 7/s, beta 450/s) is not here: its
    control, alpha the only cluster rule, gave 13 / 18 / 8 / 14 in 7.5 s (equal
    demand at 1.75/s a proxy is not shared within 15% over so short a window
    even by one rule), so it could not tell the defect apart, at 900/s of
    Fortio on the shared cores."""
    rules = [cluster_rule("alpha", "30/s", prefix="/a/"), cluster_rule("beta", "150/s", prefix="/b/")]
    with ClusterLab(plugin(rules), wasm=wasm, loops=True) as lab:
        outcome = two_rules(lab, 30.0, 150.0)
        panics = lab.panics()
    check(outcome, "two cluster rules in one Envoy: each within 1% of its rate, shares as each would have alone")
    assert not panics, panics


# -- 3. A 2-vs-2 clock split (finding 4) -----------------------------------------------------------------

SKEW_RATE = 100
SKEW_SECS = 14.0
SKEW_MS = -900
SKEW_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\].*clock is about (\d+) ms (\w+)")


def clock_moves(lab: ClusterLab, i: int, to_monotonic: Callable[[float], float]) -> list[tuple[float, str]]:
    """(monotonic time, "<n> ms ahead|behind") of each move proxy i logged."""
    out = []
    for line in lab.proxies[i].log().splitlines():
        m = SKEW_LINE.search(line)
        if m:
            when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()  # Envoy logs local time
            out.append((to_monotonic(when), f"{m.group(2)} ms {m.group(3)}"))
    return out


def clock_split(lab: ClusterLab, skews: Sequence[int], *, secs: float = SKEW_SECS) -> Outcome:
    """Every proxy offered half the rate for `secs`; from 2 s after the first move (or
    from the start if none) every 1 s window within the stated bound, at most one move
    per proxy, none of "0 ms"."""
    rate = SKEW_RATE
    lab.upstream.clear()
    with StallMonitor() as stalls:
        t0 = time.monotonic()
        wall0 = time.time()
        loads = [uniform_load(p.url + "/x", qps=rate / 2, duration_s=secs, max_queue_delay_s=1.0).start()
                 for p in lab.proxies]
        with running(loads):
            clients = [r.result() for r in loads]
    moves = [clock_moves(lab, i, lambda w: t0 + (w - wall0)) for i in range(lab.n)]
    counted = [lab.rule_stats(i, "skew").get("failures_clock", 0) for i in range(lab.n)]
    offsets = [lab.rule_stats(i, "skew").get("clock_offset_ms", 0) for i in range(lab.n)]
    first = min((t for m in moves for t, _ in m), default=None)
    start = t0 if first is None else first + 2.0
    end = t0 + secs - 0.3
    stamps = lab.arrivals(t0 - 1, t0 + secs + 2)
    bound = windows.bound(rate, 1.0) + lab.n + math.ceil(rate * JITTER_S - 1e-9)  # 7, not 7.000000000000001
    worst, worst_at = windows.busiest_window(stamps, 1.0, start, end) if end - start >= 1 else (0, float("nan"))
    report = (f"skews {list(skews)} ms, each proxy offered {rate / 2:g}/s of {rate}/s: 1 s windows from the start "
              f"{windows.window_counts(stamps, t0, t0 + secs, 1.0)}; first move at "
              f"{'none' if first is None else f'{first - t0:.2f} s'}; from {start - t0:.2f} s to {end - t0:.2f} s the "
              f"busiest 1 s {worst} (at {worst_at - t0:.2f} s; bound {bound} = rate + burst + 2 + one per proxy "
              f"ahead + rate x {1000 * JITTER_S:.0f} ms), total {windows.rate(stamps, start, end):.1f}/s; moves "
              f"logged per proxy {[[(round(t - t0, 2), what) for t, what in m] for m in moves]}; failures_clock "
              f"{counted}; clock_offset_ms {offsets}; answers {[c.codes for c in clients]}; worst stall "
              f"{1000 * stalls.worst(t0, end):.0f} ms; {load_average()}")
    out = Outcome(report)
    if end - start < 3:
        out.problems.append(f"the first move came too late to judge 3 s after it: {report}")
    if worst > bound:
        out.problems.append(f"from 2 s after the first move a 1 s window of {worst} releases, over the bound {bound}")
    # Known defect (issue 29, cause not found): now and then (1 run of 4 here, 2026-11-28,
    # load average 2-4) one proxy *in step* moves to the half behind about 0.1 s after that
    # half moved forward, and back about 1.5 s later (logged "0 ms"), ending on its own clock;
    # the bound above held in that run (busiest 102 of 113). One such proxy is printed as
    # known, not failed; a second, or any other extra move, fails.
    undone = [i for i, (m, c, o, s) in enumerate(zip(moves, counted, offsets, skews, strict=True))
              if s == 0 and o == 0 and len(m) == c == 2 and m[1][1].startswith("0 ms")]
    if len(undone) == 1:
        print(f"\n  KNOWN (issue 29): proxy {lab.tag(undone[0])}, in step, moved and moved back: "
              f"{moves[undone[0]]}")
    known = set(undone) if len(undone) == 1 else set()
    if any(max(len(m), c) > 1 for i, (m, c) in enumerate(zip(moves, counted, strict=True)) if i not in known):
        out.problems.append(f"more than one move on a proxy: logged {[len(m) for m in moves]}, failures_clock "
                            f"{counted}")
    zero = [(lab.tag(i), round(t - t0, 2)) for i, m in enumerate(moves) for t, what in m
            if what.startswith("0 ms") and i not in known]
    if zero:
        out.problems.append(f"moves of 0 ms logged: {zero}")
    if not_answered(clients):
        out.problems.append(f"answers other than 200/429: {[c.codes for c in clients]}")
    return out


def test_a_two_two_clock_split_stays_within_the_bound_and_moves_once(wasm: Path, clock_wasm: Path) -> None:
    """Finding 4. Four proxies share a 100/s rule (max_queue_delay 1 s,
    expected_replicas 4), two on the shipped build and two on the test-clock
    build with their wall clocks 900 ms behind; each offered 50/s for 14 s.
    From 2 s after the first move (logged "clock is about ...", or from the
    start if nobody moves) to the end, the busiest 1 s window within the stated
    bound: rate x 1 s + burst + 2, one per proxy ahead, + rate x 70 ms of
    release jitter (engine/README.md, test_cluster_scope.py) = 113; at most one
    move per proxy (its log lines and failures_clock), none of "0 ms". On main
    (the report) all four moved, 2-9 times each, with busiest seconds of 115 to
    155 and moves of "0 ms"; one of four skewed moved only itself, once.
    Costs ~18 s (+ ~25 s to build the test-clock .wasm once)."""
    rule = cluster_rule("skew", f"{SKEW_RATE}/s", replicas=4)
    with ClusterLab(plugin([rule]), proxies=2, wasm=wasm) as lab:
        for _ in range(2):
            lab.add_proxy(wasm=clock_wasm, vm_env={"THROTTLE_TEST_WALL_OFFSET_MS": str(SKEW_MS)})
        outcome = clock_split(lab, [0, 0, SKEW_MS, SKEW_MS])
        panics = lab.panics()
    check(outcome, "a 2-vs-2 clock split: within the bound from 2 s after detection, at most one move per proxy, "
          "none of 0 ms")
    assert not panics, panics


# -- 4. Sporadic requests at a low rate (finding 5) ------------------------------------------------------

SPORADIC_RATE, SPORADIC_EVERY_S, SPORADIC_SECS = 7, 1.3, 12.0


def sporadic(lab: ClusterLab, *, secs: float = SPORADIC_SECS) -> Outcome:
    """One request per proxy every 1.3 s, the proxies staggered, for `secs`: none
    slower than 20 ms beyond a stall of this process while it was out."""
    samples: list[Timed] = []
    lock = threading.Lock()
    before = [lab.rule_stats(i, "sporadic") for i in range(lab.n)]
    with StallMonitor() as stalls:
        t0 = time.monotonic() + 0.1
        threads = [paced_client(lab.proxies[i].url + "/s", start=t0 + i * SPORADIC_EVERY_S / lab.n,
                                end=t0 + i * SPORADIC_EVERY_S / lab.n + secs, every_s=SPORADIC_EVERY_S,
                                out=samples, lock=lock) for i in range(lab.n)]
        for t in threads:
            t.join(secs + 30)
    after = [lab.rule_stats(i, "sporadic") for i in range(lab.n)]
    over = too_slow(samples, SPORADIC_MS, stalls)
    slow = [(round(s.ms, 1), s.held_ms) for s in samples if s.ms > SPORADIC_MS]
    report = (f"{len(samples)} requests (one per proxy every {SPORADIC_EVERY_S:g} s, {lab.n} proxies, rate "
              f"{SPORADIC_RATE}/s): {quantiles([s.ms for s in samples])}; over {SPORADIC_MS:g} ms {len(slow)}: (ms, "
              f"ms held by the filter) {slow}; of them held and beyond any stall of this process while out "
              f"{len(over)}: (ms, held ms, stall ms) {over}; held by the filter (x-throttle-wait-ms) "
              f"{sorted(s.held_ms for s in samples if s.held_ms is not None)} ms; statuses "
              f"{sorted({s.status for s in samples})}; held {delta(after, before, 'queued')}, ahead or on credit "
              f"{delta(after, before, 'slots_ahead')}; worst stall {1000 * stalls.worst(t0, time.monotonic()):.0f} "
              f"ms; {load_average()}")
    out = Outcome(report)
    if over:
        out.problems.append(f"{len(over)} of {len(samples)} sporadic requests held by the filter and slower than "
                            f"{SPORADIC_MS:g} ms beyond any stall: (ms, held ms, stall ms) {over}")
    # A 429 answered at arrival (not held, within the 20 ms) is the cluster line's cautious
    # reckoning at under 2 slots a second per proxy (issue 29: a proxy whose credit is spent and
    # whose next owned slot lies beyond what it may reckon refuses): seen once in 40 on Envoy 1.36
    # (one run of many; 0 in five runs since). One is tolerated and reported; a second, a 429
    # after a hold, or any other status is a failure.
    refused = [s for s in samples if s.status == 429]
    late = [s for s in refused if s.held_ms is not None or s.ms > SPORADIC_MS]
    if len(refused) > 1 or late or any(s.status not in (200, 429) for s in samples):
        out.problems.append(f"statuses other than 200: {sorted(s.status for s in samples if s.status != 200)}; "
                            f"429s after a hold or slower than {SPORADIC_MS:g} ms: {late}")
    elif refused:
        print(f"\n  KNOWN COST (issue 29): one sporadic request refused at arrival: {refused}")
    if any(t.is_alive() for t in threads) or len(samples) < 4 * lab.n:
        out.lab_problems.append(f"the clients did not finish their {len(samples)} requests in time")
    return out


def test_sporadic_requests_at_a_low_rate_do_not_wait(wasm: Path) -> None:
    """Finding 5. Four proxies share a 7/s rule (max_queue_delay 3 s); each
    gets one request every 1.3 s (3.1/s in all, 44% of the rate), the proxies
    staggered, for 12 s: 40 requests, none answered later than 20 ms (the
    issue's target), all 200 but at most one 429 at arrival (see `sporadic`). A slower one counts if the filter held it
    (`x-throttle-wait-ms`) and no stall of this process as long as the excess
    was seen meanwhile (test_holds.py's sporadic test allows the worst stall
    likewise); one the filter did not hold lost its time to the machine (see
    the module's note). On main (the report) 4-8 of 40 took over 20 ms, the
    slowest 92-784 ms; process scope (the control): none held, 0 of 40 over
    20 ms in two runs out of three. Costs ~16 s."""
    rule = cluster_rule("sporadic", f"{SPORADIC_RATE}/s", mqd="3s", replicas=4)
    with ClusterLab(plugin([rule]), proxies=4, wasm=wasm) as lab:
        outcome = sporadic(lab)
        panics = lab.panics()
    check(outcome, "sporadic requests within the rate go at once (0 of 40 over 20 ms)")
    assert not panics, panics


# -- 5. Class floors in cluster scope (finding 6), and the top class alone (finding 2) -------------------

CLASS_RATE = 100
CRITICAL = "x-priority: critical"
CLASSES = [{"name": "critical", "match": {"headers": {"x-priority": "critical"}}},
           {"name": "batch", "min_share": 0.2, "max_queue_delay": "3s"}]
FLOOR_SECS = 14.0
BATCH_ASKED = ("class.batch.admitted", "class.batch.queued", "class.batch.rejected")


def report_load(url: str, *, qps: float, duration_s: float, max_queue_delay_s: float,
                headers: Sequence[str]) -> fortio.Load:
    """The report's own load for its class runs (rt/c.py `exp_classes`): Fortio `-t`, evenly
    (`-uniform`), 1.6 x qps x max_queue_delay + 6 connections. With harness.cluster's
    `uniform_load` (`-n`, 1.5 x + a whole number of calls each) three runs here gave batch
    28-35 every second on main: the floor's failure shows with this one."""
    return fortio.Load(url, connections=int(qps * max_queue_delay_s * 1.6) + 6, qps=qps, duration_s=duration_s,
                       uniform=True, allow_initial_errors=True, request_timeout_s=10, headers=tuple(headers))


def class_floor(lab: ClusterLab, *, secs: float = FLOOR_SECS) -> Outcome:
    """p0 critical 120/s, p1 batch 60/s, p2 critical 30/s + batch 30/s (over one proxy in
    the control: all four loads on it); batch at least 90% of its floor in every 1 s
    window after the first 2 s, the total within 1% of the rate."""
    rate = CLASS_RATE
    floor = 0.2 * rate
    on = [0, 1, 2, 2] if lab.n == 3 else [0, 0, 0, 0]
    plan = [(on[0], "/c/x", 1.2 * rate, 1.0, (CRITICAL,)), (on[1], "/b/x", 0.6 * rate, 3.0, ()),
            (on[2], "/c/x", 0.3 * rate, 1.0, (CRITICAL,)), (on[3], "/b/x", 0.3 * rate, 3.0, ())]
    before = rule_counters(lab, "orders")
    lab.upstream.clear()
    with StallMonitor() as stalls, lab.counter_trace("orders", BATCH_ASKED) as asked:
        t0 = time.monotonic()
        loads = [report_load(lab.proxies[i].url + path, qps=q, duration_s=secs, max_queue_delay_s=mqd,
                             headers=h).start() for i, path, q, mqd, h in plan]
        with running(loads):
            clients = [r.result() for r in loads]
    after = rule_counters(lab, "orders")
    m0, m1 = t0 + 2, t0 + secs - 0.5
    stamps = lab.arrivals(t0, t0 + secs + 5)
    batch = lab.arrivals(t0, t0 + secs + 5, prefix="/b/")
    per_s = windows.window_counts(batch, m0, m1, 1.0)
    totals = windows.window_counts(stamps, m0, m1, 1.0)
    # Batch requests that reached any proxy in each window (admitted, held or refused,
    # read every 0.2 s, so a window counts what came within 0.2 s of its edges too).
    # A floor is owed to a class with demand (invariant 6): the report's load offers
    # none for seconds (Fortio `-t` spreads each connection's calls over the run: at
    # 60/s on 294 connections, 2 calls each, 9.8 s apart).
    offered = [asked.increase(m0 + k, min(m0 + k + 1, m1)) for k in range(len(per_s))]
    # The floor is a share of the releases (min_share): 90% of 20% of what the window
    # released, and never more than the 18.
    needed = [min(math.ceil(0.9 * floor), math.ceil(0.9 * 0.2 * t - 1e-9)) if o else 0
              for t, o in zip(totals, offered, strict=True)]
    short = [(k + 2, c, n) for k, (c, n) in enumerate(zip(per_s, needed, strict=True)) if c < n]
    total = windows.count_between(stamps, m0, m1)
    span = m1 - m0
    failed = sum(delta(after, before, "engine_failures"))
    allowance = 0.01 * rate * span + 2 + rate * EPOCH_S * failed
    displaced = {k: delta(after, before, k) for k in after[0] if k.endswith(".displaced")}
    report = (f"critical 150/s + batch 90/s offered ({rate}/s, batch's floor {floor:g}/s): total "
              f"{total / span:.2f}/s over {span:g} s, 1 s windows {totals}; batch 1 s windows from 2 s {per_s} "
              f"({windows.rate(batch, m0, m1):.1f}/s; needed {needed}; batch requests reaching the proxies {offered}), critical "
              f"{windows.window_counts(lab.arrivals(t0, t0 + secs + 5, prefix='/c/'), m0, m1, 1.0)}; displaced "
              f"{displaced}; engine calls failed {failed}; answers {[c.codes for c in clients]}; worst stall "
              f"{1000 * stalls.worst(m0, m1):.0f} ms; {load_average()}")
    out = Outcome(report)
    if short:
        out.problems.append(f"batch under 90% of its floor (18 a second, or 90% of 20% of what the window released "
                            f"if fewer than 100) in (second, count, needed) {short}")
    if abs(total - rate * span) > allowance:
        out.problems.append(f"the total off the rate by more than 1% (+ one slot at each edge, + one epoch's slots "
                            f"per failed engine call): {total} in {span:g} s for {rate * span:.0f}")
    if not_answered(clients):
        out.problems.append(f"answers other than 200/429: {[c.codes for c in clients]}")
    return out


@pytest.fixture(scope="module")
def classes_lab(wasm: Path) -> Iterator[ClusterLab]:
    rule = cluster_rule("orders", f"{CLASS_RATE}/s", classes=CLASSES)
    with ClusterLab(plugin([rule]), wasm=wasm, refusal_log=True, loops=True) as lab:
        yield lab
        assert not lab.panics(), lab.panics()


def test_the_top_class_alone_is_never_displaced(classes_lab: ClusterLab) -> None:
    """Finding 2 with classes. The classes below on a 100/s rule, only the top
    class in use: each proxy offered critical 50/s (1.5 x in all) for 9 s,
    plus the measured client on p0 sending critical requests. No
    class.critical.displaced (nobody is above the top class), every 429 at
    arrival (within 10 ms by Envoy's timing, with the stalls' allowance of
    test 1), and queued = released + cancelled + gone + timed_out + held. On
    main (the report) p0/p1/p2 counted 127/101/106 of ~660 as displaced;
    process scope (the control): none, every 429 within 5 ms. Shares its lab
    with the next test; costs ~11 s + ~5 s of lab."""
    check(late_refusals(classes_lab, "orders", 0.5 * CLASS_RATE, rate=CLASS_RATE, headers=(CRITICAL,)),
          "the top class alone: never displaced, refused at arrival only, the counters add up")


# Seen 2026-11-28 and 2026-11-30 (issue 29, per-proxy counters sampled every 0.5-0.9 s): the
# report's load offers no batch at all for ~4 s in the middle of the run (Fortio `-t` spreads
# each connection's calls over the run: 2 calls per connection, 9.8 s apart; process scope
# covers that gap with its 3 s line, cluster scope reckons its line only ~600 ms past the slots
# it owns while the fleet is over the rate). Those windows owe no floor and are not counted.
# What fails is the second in which batch comes back (2026-11-30, four runs: 28-55 batch
# requests reached the proxies, 1-4 were released; twice the next second too, 4-6): p1, with only batch, drew no share while it was idle and
# gets one only a lead later, and p2 gives batch 20% of its own slots, not of the rule's
# (filters/throttle/core/tests/cluster_floors.rs; the fleet-wide floor is designed in
# engine/README.md, "Class floors across the fleet").
# Not strict: after the debt change (2026-11-30) it held in 1 of 6 runs, so a strict marker
# would fail CI at random; the strict records of this defect are the ignored tests of
# filters/throttle/core/tests/cluster_floors.rs and sweep-known.txt (floors).
@pytest.mark.xfail(strict=False, reason=(
    "known defect, not fixed (issue 29): floors are chosen per proxy from the slots it owns, so when batch "
    "returns after a pause on a proxy that drew no share while idle it gets 1-5 in that second (17-50 asked); "
    "held in 1 of 6 runs on 2026-11-30"))
def test_a_class_floor_holds_every_second(classes_lab: ClusterLab) -> None:
    """Finding 6. Three proxies, a 100/s rule (max_queue_delay 1 s) with
    classes critical (header x-priority: critical) and batch (min_share 0.2,
    max_queue_delay 3 s); p0 offered critical 120/s, p1 batch 60/s, p2
    critical 30/s + batch 30/s, for 14 s with the report's Fortio loads
    (`report_load`). From 2 s to 0.5 s before the end: batch gets at least 90%
    of its floor, 18, in every 1 s window in which batch requests reached a
    proxy (the issue's target where a floor is owed; 90% of 20% of what the
    window released if it released fewer than 100), and the total is
    within 1% of the rate (+ one slot at each edge, + one epoch's slots per
    failed engine call). On main (the report) batch got 0-8 a second for 2-4
    s at a time; process scope, all four loads through one proxy (the
    control): 19-21 every second. Costs ~18 s (the lab of the previous
    test)."""
    check(class_floor(classes_lab), "a class floor in cluster scope holds in every 1 s window")
