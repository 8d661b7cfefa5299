"""One rate per Service on a waypoint with 3 replicas, through a real istiod:
`k8s/overlays/ambient-waypoint-throttle-cluster` applied as shipped (the cluster-scope WasmPlugin
`istio/wasmplugin-waypoint-cluster`, the EnvoyFilter `istio/engine-waypoint` that gives the waypoint
the engine's cluster, the engine of `k8s/engine` run by the harness: ratelimit x2 and Redis).

productpage and the Fortio client are in ambient mode; the client's ztunnel stand-in picks the
waypoint pods 6:3:1 per connection (conftest.WAYPOINT_WEIGHTS), so the replicas see uneven loads.
Every rate is measured at the application, from its own arrival times.

Tolerances, and why (each assertion repeats its reason):
- the Service's rate over a run within 2 % (the issue's figure);
- windows against the stated bound of engine/README.md: any 1 s window holds at most
  `rate + burst + 2` on the grid, plus `burst + 1` per proxy that may go ahead of its grants, plus
  `rate x JITTER_S` for release jitter: held requests leave on worker ticks (~4 ms; the caller VM
  ticks every 20 ms) and reach the app through two more Envoys (the waypoint's HBONE out, the
  app's ztunnel stand-in) and Python's scheduling on 2 shared cores. JITTER_S = 70 ms, as in
  tests/cluster (measured there: a process-scope control whose schedule is exact showed 33 ms).
  The busiest 1 s window anywhere (sliding) also gets `rate x` the worst stall of this machine
  around it (harness/stalls.py): what was due while everything was held up reaches the app
  together after it (seen here: consecutive seconds of 88 and 96, then 127 in a window across them);
- a fault (a replica killed, then restarted) against the fault bound of engine/README.md: over
  [t - 1 s, t + 3 s) at most `rate x (fallback_after + one epoch) + burst + 2` above 4 x rate,
  and no 1 s window above `rate + 2` plus that, plus the same jitter allowance.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness import tools, windows
from harness.mesh import NAMESPACE
from harness.net import wait_until
from harness.stalls import StallMonitor
from tests.istio_e2e.conftest import WAYPOINT_DRAIN, Phase
from tests.support import istio

pytestmark = pytest.mark.istio

URL = f"http://productpage.{NAMESPACE}.svc.cluster.local:9080/api/v1/products"
PLUGIN = "throttle-productpage"
RULE = "bookinfo-productpage"
ENGINE_CLUSTER = "outbound|8080||ratelimit.throttle-engine.svc.cluster.local"
RATE = 100
BURST = 0
MQD_S = 2.0
REPLICAS = 3
JITTER_S = 0.070
FALLBACK_AFTER_S = 0.25  # engine.fallback_after's default (the shipped plugin does not set it)
# The shipped 50 ms is meant for a cluster; on this shared 2-core machine (load average 5-10 while
# other jobs run) the engine's answers through the waypoint's Envoy took longer at times (seen:
# "HTTP 504 from the rate limit service", 4-9 failed calls per replica in 15 s, the rule in its
# fallback). What a slow or failing engine does is tested in tests/cluster with 50 ms.
ENGINE_TIMEOUT = "250ms"
EPOCH_S = 0.1
# Offered: 2 x the rate on 30 connections, ~18/9/3 of them on the three replicas.
OFFERED = 2 * RATE
CONNECTIONS = 30


class Stalls:
    """harness.stalls.StallMonitor for the module, on the clock of the app's arrival times."""

    def __init__(self) -> None:
        self.monitor = StallMonitor().start()
        self.offset = time.time() - time.monotonic()

    def worst(self, start: float, end: float) -> float:
        return self.monitor.worst(start - self.offset, end - self.offset)


@pytest.fixture(scope="module")
def stalls() -> Iterator[Stalls]:
    s = Stalls()
    yield s
    s.monitor.stop()


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def grid_bound(rate: float, width: float = 1.0) -> int:
    """engine/README.md: on the grid at most rate x W + burst + 2 in any window of W; each proxy may
    be `burst + 1` ahead of its grants."""
    return windows.bound(rate, width, BURST) + REPLICAS * (BURST + 1)


def fault_bound(rate: float) -> int:
    """engine/README.md "When the engine fails": at most rate x (fallback_after + one epoch) + burst
    above the rate over an episode (+2 on the grid)."""
    return math.floor(rate * (FALLBACK_AFTER_S + EPOCH_S)) + BURST + 2


def replicas(phase: Phase) -> list[istio.Pod]:
    pods = phase.pods["waypoint"]
    assert [p.name for p in pods] == [f"waypoint-{i}" for i in range(REPLICAS)], [p.name for p in pods]
    return pods


def apply_rule(phase: Phase, rate: float, plugin: dict[str, Any] | None = None) -> dict[str, tuple[str, float]]:
    """kubectl apply of the shipped WasmPlugin with its rule at `rate` (burst 0, max_queue_delay 2 s,
    expected_replicas 3): per replica, its new 'configured' line and the seconds from the apply to
    that line in its log."""
    pods = replicas(phase)
    base = plugin if plugin is not None else phase.plugin(PLUGIN)
    new = istio.with_rule(base, rate=f"{rate:g}/s", burst=BURST, max_queue_delay=f"{MQD_S:g}s",
                          expected_replicas=REPLICAS)
    new["spec"]["pluginConfig"]["engine"]["timeout"] = ENGINE_TIMEOUT
    needle = f"{RULE}: rate {rate:g}/1s"
    live = phase.mesh.kube.run("get", "wasmplugin", new["metadata"]["name"], "-n", NAMESPACE, "-o", "json", check=False)
    if live.returncode == 0 and json.loads(live.stdout)["spec"] == new["spec"]:
        # Applied already (an unchanged apply makes no new configuration): the line each replica runs.
        return {p.name: (istio.wait_configured(p, 0, needle), 0.0) for p in pods}
    before = {p.name: len(istio.configured_lines(p)) for p in pods}
    applied = time.time()
    phase.mesh.kube.apply([new])
    out: dict[str, tuple[str, float]] = {}

    def seen() -> bool:
        for p in pods:
            if p.name not in out:
                hit = [ln for ln in istio.configured_lines(p)[before[p.name]:] if needle in ln]
                if hit:
                    out[p.name] = (hit[-1], time.time() - applied)
        return len(out) == len(pods)

    wait_until(seen, 90, f"'{needle}' on every waypoint replica", interval=0.1)
    return out


def stats(phase: Phase) -> list[dict[str, int]]:
    return [istio.rule_stats(p, RULE) for p in replicas(phase)]


def delta(after: list[dict[str, int]], before: list[dict[str, int]], name: str) -> list[int]:
    return [a.get(name, 0) - b.get(name, 0) for a, b in zip(after, before, strict=True)]


def arrivals(phase: Phase) -> list[float]:
    return sorted(t for p in phase.pods["productpage-v1"] for t in p.arrival_times())


def test_every_replica_runs_the_shipped_plugin_with_the_engines_cluster(waypoint_cluster, mesh, figures):
    """Each of the 3 waypoint pods ACKed everything istiod sent, runs the shipped cluster-scope rule,
    and has the engine's cluster (from istio/engine-waypoint) with the two ratelimit pods."""
    pods = replicas(waypoint_cluster)
    istio.wait_acked(mesh.cp, [p.proxy_id for p in pods])
    engine_ips = sorted(p.ip for p in waypoint_cluster.pods["ratelimit"])
    seen = {}
    for p in pods:
        assert "config rejected" not in p.log(), p.log()[-3000:]
        line = istio.wait_configured(p, 0, f"{RULE}: rate 2000/1s")
        assert istio.cluster_hosts(p, ENGINE_CLUSTER) == engine_ips, (p.name, istio.cluster_hosts(p, ENGINE_CLUSTER))
        seen[p.name] = line
    figures["waypoint_cluster_replicas"] = {"configured": seen, "engine_endpoints": engine_ips}


def test_one_rate_for_the_service_across_three_replicas(waypoint_cluster, stalls, figures):
    """100/s for productpage, whatever replica a request reaches: 200/s offered on 30 connections,
    spread 6:3:1 over the replicas. At the app: the rate over the run within 2 %, and no 1 s
    window above the stated bound."""
    lines = apply_rule(waypoint_cluster, RATE)
    # A proxy's first second on a new grid waits for its first grants: 3 s of load first, not measured.
    istio.load(waypoint_cluster.client, URL, qps=OFFERED, connections=CONNECTIONS, duration="3s")
    before = stats(waypoint_cluster)
    run = istio.load(waypoint_cluster.client, URL, qps=OFFERED, connections=CONNECTIONS, duration="15s")
    after = stats(waypoint_cluster)
    stamps = arrivals(waypoint_cluster)
    start, end = run["start"] + 1.0, run["end"] - 1.0
    rate = windows.rate(stamps, start, end)
    per_s = windows.window_counts(stamps, start, end, 1.0)
    busiest, at = windows.busiest_window(stamps, 1.0, start, end)
    stall = stalls.worst(at - 1, at + 1)
    requests = delta(after, before, "requests")
    taken = delta(after, before, "slots_taken")
    calls = delta(after, before, "engine_calls")
    failures = delta(after, before, "engine_failures")
    allowance = math.ceil(RATE * JITTER_S)
    stalled = math.ceil(RATE * (JITTER_S + stall))
    report = (f"rate {rate:.2f}/s; 1 s windows {per_s}; busiest 1 s anywhere {busiest} (bound {grid_bound(RATE)} + "
              f"{allowance}, + {stalled - allowance} for a stall of {1000 * stall:.0f} ms around it); requests per "
              f"replica {requests}; slots taken {taken}; engine calls {calls}, failures {failures}; codes "
              f"{run['codes']}; {load()}")
    print("\n  " + report)
    assert set(run["codes"]) <= {200, 429}, "only 200 and 429 (beyond max_queue_delay): " + report
    assert requests[0] > requests[1] > requests[2] > 0, "the load spread unevenly over the 3 replicas: " + report
    assert abs(rate - RATE) <= 0.02 * RATE, "the Service's rate within 2 % over the run (the issue's figure): " + report
    assert busiest <= grid_bound(RATE) + stalled, (
        f"every 1 s window (the busiest anywhere, sliding) within the stated bound rate + burst + 2 + (burst + 1) x "
        f"{REPLICAS} proxies = {grid_bound(RATE)}, + rate x ({JITTER_S * 1000:.0f} ms of release jitter + the worst "
        "stall of the machine around it): " + report)
    assert all(c > 0 for c in calls), "every replica claimed its slots from the engine: " + report
    figures["waypoint_cluster_rate"] = {
        "configured": {k: v[0] for k, v in lines.items()}, "rate_at_app": round(rate, 2),
        "error_pct": round(100 * (rate / RATE - 1), 2), "windows_1s": per_s, "busiest_1s": busiest,
        "bound_1s": grid_bound(RATE), "jitter_allowance": allowance, "stall_ms": round(1000 * stall), "requests_per_replica": requests,
        "slots_taken_per_replica": taken, "engine_calls": calls, "engine_failures": failures,
        "codes": run["codes"], "loadavg": os.getloadavg()}


def test_a_replica_killed_and_restarted_keeps_the_fault_bound(waypoint_cluster, stalls, figures):
    """Under the same load, the busiest replica's proxy (pilot-agent and Envoy) is killed with
    SIGKILL 6 s in, and restarted in the same pod 3 s later (a container crash and the kubelet's
    restart). Around each event the app sees at most the fault bound above the rate; the others
    take the killed replica's share back. Its requests in flight are lost with it."""
    kubelet = waypoint_cluster.kubelet
    pods = replicas(waypoint_cluster)
    victim = pods[0]  # weight 6 of 10: the most connections, the largest share
    apply_rule(waypoint_cluster, RATE)
    istio.load(waypoint_cluster.client, URL, qps=OFFERED, connections=CONNECTIONS, duration="2s")
    run = istio.Background(waypoint_cluster.client, URL, qps=OFFERED, connections=CONNECTIONS, duration="20s")
    wait_until(lambda: time.time() - run.start >= 6, 10, "6 s of load")
    held = istio.rule_stats(victim, RULE).get("held", 0)
    killed = time.time()
    pids = kubelet.kill_proxy(victim)
    lines_before = len(istio.configured_lines(victim))
    wait_until(lambda: time.time() - killed >= 3, 5, "3 s with the replica down")
    restarting = time.time()
    kubelet.restart_proxy(victim)
    ready = time.time()
    configured = istio.wait_configured(victim, lines_before, f"{RULE}: rate {RATE}/1s")
    result = run.result()
    stamps = arrivals(waypoint_cluster)
    bound = fault_bound(RATE)
    events = {"killed": killed, "restarted": restarting, "ready": ready}
    lines, problems = [], []
    for what, t in events.items():
        around = windows.count_between(stamps, t - 1, t + 3)
        worst, _ = windows.busiest_window(stamps, 1.0, t - 1, t + 4)
        excess = around - 4 * RATE
        stall = stalls.worst(t - 1, t + 4)
        allowance = math.ceil(RATE * (JITTER_S + stall))
        line = (f"{what}: 1 s windows from t-2 {windows.window_counts(stamps, t - 2, t + 4, 1.0)}, busiest 1 s "
                f"{worst}, in [t-1, t+3) {around} ({excess:+d} over 4 x rate; bound +{bound} + {allowance} for "
                f"jitter and a stall of {1000 * stall:.0f} ms)")
        lines.append(line)
        if excess > bound + allowance or worst > RATE + 2 + bound + allowance:
            problems.append(line)
    back = windows.recovered_at(stamps, killed, RATE, width=0.2, fraction=0.9, until=restarting)
    before = windows.rate(stamps, run.start + 1, killed)
    down = windows.rate(stamps, killed, restarting)
    after = windows.rate(stamps, ready + 1, result["end"] - 1)
    lost = result["requests"] - result["codes"].get(200, 0) - result["codes"].get(429, 0)
    report = ("\n  ".join(lines) + f"\n  rate before {before:.1f}/s, while down {down:.1f}/s, from 1 s after ready "
              f"{after:.1f}/s; back to 90 % of the rate {'never' if back is None else f'{back - killed:.2f} s'} "
              f"after the kill; restart to ready {ready - restarting:.1f} s; held at the victim before the kill "
              f"{held}; codes {result['codes']}; {load()}")
    print("\n  " + report)
    assert not problems, ("a replica killed and restarted keeps the fault bound of engine/README.md, rate x "
                          f"(fallback_after + one epoch) + burst + 2 = {bound} over 4 x rate, and rate + 2 + that in "
                          "any 1 s (+ rate x (70 ms + the worst stall around it) for release jitter and releases "
                          "due during a stall):\n  " + "\n  ".join(problems) + "\n  all: " + report)
    assert back is not None and back - killed <= 1.5, (
        "the other replicas take the killed one's share back within 1.5 s (its clients reconnect to them; "
        "shares follow demand ~0.6 s late, engine/README.md): " + report)
    assert abs(after - RATE) <= 0.05 * RATE, (
        "with the replica back, the rate within 5 % (2 % is the issue's figure for a whole run; this span is "
        "shorter and starts while the new replica's share grows): " + report)
    # Requests in flight at the killed replica are lost with it (their connections reset): at most
    # what it held plus one per connection it had (6 of 10 of them).
    assert lost <= held + CONNECTIONS, f"only the killed replica's requests in flight are lost: {lost}; " + report
    figures["waypoint_cluster_kill"] = {
        "victim": victim.name, "pids_killed": pids, "configured_after_restart": configured,
        "restart_to_ready_s": round(ready - restarting, 2),
        "recovered_s": None if back is None else round(back - killed, 2), "rate_before": round(before, 2),
        "rate_while_down": round(down, 2), "rate_after": round(after, 2), "fault_bound_excess": bound,
        "events": lines, "held_at_kill": held, "codes": result["codes"], "loadavg": os.getloadavg()}


def test_a_new_rate_takes_effect_on_every_replica(waypoint_cluster, figures):
    """kubectl apply of 50/s while 100/s is held under load: each replica logs the new rate (the
    same Envoy processes: ECDS, no restart), and the app sees 50/s once the last one has it."""
    pods = replicas(waypoint_cluster)
    apply_rule(waypoint_cluster, RATE)
    pids = {p.name: p.envoy_pids() for p in pods}
    run = istio.Background(waypoint_cluster.client, URL, qps=OFFERED, connections=CONNECTIONS, duration="15s")
    wait_until(lambda: time.time() - run.start >= 6, 10, "6 s of load")
    applied = time.time()
    lines = apply_rule(waypoint_cluster, RATE / 2)
    result = run.result()
    stamps = arrivals(waypoint_cluster)
    last = applied + max(s for _, s in lines.values())
    first = applied + min(s for _, s in lines.values())
    before = windows.rate(stamps, run.start + 2, applied)
    after = windows.rate(stamps, last + 1, result["end"] - 1)
    between = windows.count_between(stamps, first, last)
    report = (f"new rate in each replica's log after {({k: round(v[1], 2) for k, v in lines.items()})} s; "
              f"{before:.1f}/s before, {after:.1f}/s from 1 s after the last; {between} arrivals while the "
              f"replicas differed ({last - first:.2f} s); 1 s windows {windows.window_counts(stamps, run.start, result['end'], 1.0)}; "
              f"codes {result['codes']}; {load()}")
    print("\n  " + report)
    assert {p.name: p.envoy_pids() for p in pods} == pids, "the same Envoy processes (ECDS, no restart)"
    assert set(result["codes"]) <= {200, 429}, report
    assert abs(before - RATE) <= 0.05 * RATE, report
    assert abs(after - RATE / 2) <= 0.05 * RATE / 2, (
        "50/s on every replica: one rate at the app within 5 % (a shorter span than the 2 % run): " + report)
    figures["waypoint_cluster_new_rate"] = {
        "seconds_to_each_replica": {k: round(v[1], 2) for k, v in lines.items()}, "rate_before": round(before, 2),
        "rate_after": round(after, 2), "replicas_differed_s": round(last - first, 2), "codes": result["codes"],
        "loadavg": os.getloadavg()}


def sidecar_client(phase: Phase) -> dict[str, Any]:
    """The Fortio client's Deployment as `fortio-sidecar`: the same, with Istio's sidecar injected
    (`sidecar.istio.io/inject: "true"` in the ambient namespace)."""
    dep = istio.find(phase.docs, "Deployment", "fortio")
    labels = {"app": "fortio-sidecar", "version": "v1", "sidecar.istio.io/inject": "true"}
    dep["metadata"] = {"name": "fortio-sidecar", "namespace": NAMESPACE, "labels": {"app": "fortio-sidecar"}}
    dep["spec"] = {**dep["spec"], "replicas": 1, "selector": {"matchLabels": {"app": "fortio-sidecar"}},
                   "template": {**dep["spec"]["template"], "metadata": {"labels": labels}}}
    return dep


def callers_plugin(phase: Phase, rate: float) -> dict[str, Any]:
    """The waypoint's cluster-scope rule, also on the sidecar clients' outbound (`match: CLIENT`
    on port 9080, `selector` of the callers): the same rule name, rate and engine, so the same
    grid; `match.authority` keeps it to calls to productpage."""
    wp = istio.with_rule(phase.plugin(PLUGIN), rate=f"{rate:g}/s", burst=BURST, max_queue_delay=f"{MQD_S:g}s",
                         expected_replicas=REPLICAS + 1)
    wp["spec"]["pluginConfig"]["engine"]["timeout"] = ENGINE_TIMEOUT
    (rule,) = wp["spec"]["pluginConfig"]["rules"]
    rule["match"] = {**rule.get("match", {}), "authority": f"productpage.{NAMESPACE}.svc.cluster.local"}
    spec = {k: v for k, v in wp["spec"].items() if k != "targetRefs"}
    spec["selector"] = {"matchLabels": {"app": "fortio-sidecar"}}
    spec["match"] = [{"mode": "CLIENT", "ports": [{"number": 9080}]}]
    return {"apiVersion": wp["apiVersion"], "kind": "WasmPlugin",
            "metadata": {"name": "throttle-productpage-callers", "namespace": NAMESPACE}, "spec": spec}


def test_sidecar_clients_bypass_the_waypoint_unless_their_sidecar_joins_the_grid(waypoint_cluster, mesh, figures):
    """A client with a sidecar: istiod sends its calls to productpage's pods, not to the waypoint,
    even with the one setting Istio has for this (`istio.io/ingress-use-waypoint` on the Service,
    which only gateways honour: pilot/pkg/xds/endpoints/endpoint_builder.go). So it bypasses the
    waypoint's throttle. The same cluster rule in its sidecar (CLIENT) joins the waypoints' grid:
    one rate for the Service again."""
    kube, kubelet = mesh.kube, waypoint_cluster.kubelet
    pods = replicas(waypoint_cluster)
    apply_rule(waypoint_cluster, RATE)
    kube.apply([sidecar_client(waypoint_cluster)])
    kube.run("label", "service", "productpage", "-n", NAMESPACE, "--overwrite", "istio.io/ingress-use-waypoint=true")
    cluster = f"outbound|9080||productpage.{NAMESPACE}.svc.cluster.local"
    try:
        (client,) = kubelet.start_deployment(NAMESPACE, "fortio-sidecar", 1)
        assert client.mode == "sidecar", client.mode
        istio.wait_acked(mesh.cp, [client.proxy_id], timeout=60)
        app = waypoint_cluster.pods["productpage-v1"][0]
        endpoints = istio.cluster_endpoints(client, cluster)
        assert endpoints and all(app.ip in e for e in endpoints), (
            f"istiod gives the sidecar productpage's pod, not the waypoint ({[p.ip for p in pods]}): {endpoints}")
        before = stats(waypoint_cluster)
        bypass = istio.load(client, URL, qps=OFFERED, connections=CONNECTIONS, duration="6s")
        after = stats(waypoint_cluster)
        stamps = arrivals(waypoint_cluster)
        bypass_rate = windows.rate(stamps, bypass["start"] + 1, bypass["end"] - 1)
        seen = delta(after, before, "requests")
        report = (f"sidecar client alone: {bypass_rate:.1f}/s at the app, codes {bypass['codes']}, requests seen "
                  f"by the waypoints {seen}; its endpoints for productpage {endpoints}; {load()}")
        print("\n  " + report)
        assert sum(seen) == 0 and bypass_rate > 1.5 * RATE, (
            "the sidecar client's calls bypass the waypoints and their throttle (200/s offered): " + report)

        plugin = callers_plugin(waypoint_cluster, RATE)
        before_lines = len(istio.configured_lines(client))
        kube.apply([plugin])
        istio.wait_configured(client, before_lines, f"{RULE}: rate {RATE}/1s")
        istio.load(waypoint_cluster.client, URL, qps=OFFERED / 2, connections=CONNECTIONS // 2, duration="2s")
        both = [istio.Background(waypoint_cluster.client, URL, qps=OFFERED / 2, connections=CONNECTIONS // 2,
                                 duration="10s"),
                istio.Background(client, URL, qps=OFFERED / 2, connections=CONNECTIONS // 2, duration="10s")]
        results = [b.result() for b in both]
        stamps = arrivals(waypoint_cluster)
        start, end = max(r["start"] for r in results) + 2, min(r["end"] for r in results) - 1
        joint = windows.rate(stamps, start, end)
        report += (f"\n  with the callers' plugin: {joint:.1f}/s at the app from both clients; codes ambient "
                   f"{results[0]['codes']}, sidecar {results[1]['codes']}; {load()}")
        print("\n  " + report)
        for r in results:
            assert set(r["codes"]) <= {200, 429}, report
            assert r["codes"].get(200, 0) > 0, "each client gets its share: " + report
        assert abs(joint - RATE) <= 0.05 * RATE, (
            "the sidecar's own cluster rule (same name, rate and engine) makes one rate with the waypoints' "
            "(5 %: two clients started apart, a shorter span): " + report)
        figures["waypoint_cluster_sidecar_clients"] = {
            "endpoints_of_sidecar": endpoints, "bypass_rate": round(bypass_rate, 2), "waypoint_requests": seen,
            "joint_rate": round(joint, 2), "codes": [r["codes"] for r in results], "loadavg": os.getloadavg()}
    finally:
        for p in [p for p in kubelet.pods.values() if p.deployment == "fortio-sidecar"]:
            kubelet.stop_pod(p)
        kube.delete("deployment", "fortio-sidecar", NAMESPACE)
        kube.delete("wasmplugin", "throttle-productpage-callers", NAMESPACE)
        kube.run("label", "service", "productpage", "-n", NAMESPACE, "istio.io/ingress-use-waypoint-")


def grids(phase: Phase, rule: str, since: float) -> dict[int, list[tuple[float, int]]]:
    """A cluster rule's grids as the engine's Redis holds them: {interval (ns): [(epoch start, slots
    claimed in it)]} for the epochs from `since` on (the key
    `<domain>_throttle_slots_<rule>:<interval ns>:<epoch>_<hour>`, epochs of 100 ms:
    filters/throttle/core/src/cluster/grid.rs `counter_key`)."""
    (redis,) = phase.pods["redis"]

    def cli(*args: str) -> list[str]:
        out = redis.node.run([tools.path("redis-cli"), "-p", "6379", *args], timeout=60, check=True).stdout
        return out.split()

    parsed: list[tuple[int, float, str]] = []
    for key in cli("--scan", "--pattern", f"*_throttle_slots_{rule}:*"):
        interval, epoch = key.split("_throttle_slots_", 1)[1].rsplit("_", 1)[0].split(":")[1:]
        start = int(epoch) * EPOCH_S
        if start >= since:
            parsed.append((int(interval), start, key))
    out: dict[int, list[tuple[float, int]]] = {}
    values = cli("mget", *[k for _, _, k in parsed]) if parsed else []
    for (t_ns, start, _), v in zip(parsed, values, strict=True):
        out.setdefault(t_ns, []).append((start, int(v)))
    return {t: sorted(v) for t, v in out.items()}


def replace_plugin(phase: Phase, name: str, rate: float, rule: str) -> dict[str, Any]:
    """The shipped WasmPlugin under another name, its rule at `rate` and named `rule`."""
    new = istio.with_rule(phase.plugin(PLUGIN), name=rule, rate=f"{rate:g}/s", burst=BURST,
                          max_queue_delay=f"{MQD_S:g}s", expected_replicas=REPLICAS)
    new["spec"]["pluginConfig"]["engine"]["timeout"] = ENGINE_TIMEOUT
    new["metadata"] = {**new["metadata"], "name": name}
    return new


def lds_change(phase: Phase, old: str, new: dict[str, Any], needle: str, old_rule: str) -> dict[str, Any]:
    """Under load, the WasmPlugin `old` replaced by `new` (kubectl apply, then delete: another filter
    in the waypoints' listener, so LDS; the old filter chain drains). The client is Go's net/http
    (Fortio's -stdclient): it closes a connection whose answer says `connection: close` (what Envoy's
    drain says) and opens another, as HTTP clients do. Returns when
    the change was made, when `needle` (the new rule's line) was in each replica's log, the sum over
    the replicas of `old_rule`'s requests every 0.2 s (a measurement interval, not a wait), Fortio's
    result and the app's arrivals."""
    pods = replicas(phase)
    kube = phase.mesh.kube
    run = istio.Background(phase.client, URL, qps=OFFERED, connections=CONNECTIONS, duration="16s",
                           std_client=True)
    wait_until(lambda: time.time() - run.start >= 4, 8, "4 s of load")
    before = {p.name: len(istio.configured_lines(p)) for p in pods}
    changed = time.time()
    kube.apply([new])
    kube.delete("wasmplugin", old, NAMESPACE)
    seen: dict[str, float] = {}
    samples: list[tuple[float, int]] = []
    while run.running.proc.poll() is None:
        for p in pods:
            if p.name not in seen and any(needle in ln for ln in istio.configured_lines(p)[before[p.name]:]):
                seen[p.name] = time.time()
        samples.append((time.time(), sum(istio.rule_stats(p, old_rule).get("requests", 0) for p in pods)))
        time.sleep(0.2)
    result = run.result()
    assert len(seen) == len(pods), f"'{needle}' on every replica: {seen}"
    return {"changed": changed, "seen": seen, "samples": samples, "result": result, "stamps": arrivals(phase)}


def last_increase(samples: list[tuple[float, int]]) -> float:
    """When a sampled counter last grew."""
    return max((t for (t, v), (_, before) in zip(samples[1:], samples, strict=False) if v > before),
               default=samples[0][0])


def drained(phase: Phase) -> bool:
    """No replica has a filter chain draining (Envoy's listener_manager.total_filter_chains_draining)."""
    for p in replicas(phase):
        status, body = p.admin("/stats?filter=^listener_manager.total_filter_chains_draining$")
        if status != 200 or not body.strip().endswith(": 0"):
            return False
    return True


def test_an_lds_rate_change_drains(waypoint_cluster, figures):
    """A rate changed through LDS rather than ECDS: the WasmPlugin replaced by one of another name
    (another filter in the waypoints' listener). Kept-alive connections leave the old filter chain
    at their next answer (pilot-agent runs Envoy with `--drain-strategy immediate`): with a new rule
    name the old filter's last request comes within max_queue_delay of the change, and then the new
    rate holds alone. Under the same rule name, the old filter's instance lives on for Envoy's drain
    time (ProxyConfig drainDuration) and, sharing the rule's cells in the process (keyed by the
    name), keeps claiming on the old grid for the new one's demand: the two rates add up, for at
    most that long (measured, and bounded here)."""
    drain = float(WAYPOINT_DRAIN.removesuffix("s"))
    apply_rule(waypoint_cluster, RATE)
    wait_until(lambda: drained(waypoint_cluster), drain + 5, "no filter chain draining", interval=0.5)
    out: dict[str, Any] = {}
    steps = (("same rule name", PLUGIN, (RULE, RATE), f"{PLUGIN}-next", (RULE, RATE / 2)),
             ("new rule name", f"{PLUGIN}-next", (RULE, RATE / 2), PLUGIN, (f"{RULE}-next", RATE)))
    for what, old_name, (old_rule, old_rate), new_name, (new_rule, new_rate) in steps:
        new = replace_plugin(waypoint_cluster, new_name, new_rate, new_rule)
        change = lds_change(waypoint_cluster, old_name, new, f"{new_rule}: rate {new_rate:g}/1s", old_rule)
        since = change["changed"] - 1
        old_grid = grids(waypoint_cluster, old_rule, since).get(round(1e9 / old_rate), [])
        new_grid = grids(waypoint_cluster, new_rule, since).get(round(1e9 / new_rate), [])
        assert old_grid and new_grid, (what, old_grid[-3:], new_grid[:3])
        new_start = new_grid[0][0]
        old_end = old_grid[-1][0] + EPOCH_S
        stamps, result = change["stamps"], change["result"]
        both = old_end - new_start
        seen = change["seen"]
        # The new rate alone: from a second after the old grid's last claim to a second before
        # the load ends (None if that leaves less than a second: under the same rule name the
        # old grid may be claimed for Envoy's whole drain time).
        after = (max(old_end, new_start) + 1, result["end"] - 1)
        out[what] = {"new_rate": new_rate,
                     "seconds_to_each_replica": {k: round(v - change["changed"], 2) for k, v in seen.items()},
                     "replicas_apart_s": round(max(seen.values()) - min(seen.values()), 2),
                     "old_grid_claimed_after_new_started_s": round(both, 2),
                     # With another rule name, the old rule's own counter: its last request after the change.
                     "old_filter_last_request_s": None if old_rule == new_rule else round(
                         last_increase(change["samples"]) - change["changed"], 2),
                     "rate_at_app_meanwhile": round(windows.rate(stamps, new_start, old_end), 1) if both >= 1 else None,
                     "rate_at_app_after": round(windows.rate(stamps, *after), 1) if after[1] - after[0] >= 1 else None,
                     "codes": result["codes"],
                     "windows_1s": windows.window_counts(stamps, result["start"], result["end"], 1.0)}
        print(f"\n  LDS change, {what}: {out[what]}; {load()}")
        wait_until(lambda: drained(waypoint_cluster), drain + 10, "the old filter chains drained", interval=0.5)
    kube = waypoint_cluster.mesh.kube
    kube.apply([istio.with_rule(waypoint_cluster.plugin(PLUGIN))])  # the shipped rule again (ECDS only)
    same, fresh = out["same rule name"], out["new rule name"]
    figures["waypoint_cluster_lds_drain"] = {**out, "drain_duration_s": drain, "loadavg": os.getloadavg()}
    # Grids are claimed up to k = 5 epochs ahead (engine.timeout 250 ms: engine/README.md), so the old
    # grid's last claims lie up to 0.5 s past its last use; and the replicas take the change apart.
    ahead = 5 * EPOCH_S
    assert same["old_grid_claimed_after_new_started_s"] <= drain + same["replicas_apart_s"] + ahead + 1, (
        f"under the same rule name, the old grid for Envoy's drain time ({drain:g} s) at most (+ the replicas' "
        f"updates apart, + {ahead:g} s of claims ahead, + 1 s): {out}")
    reached = max(fresh["seconds_to_each_replica"].values())
    assert fresh["old_filter_last_request_s"] <= reached + MQD_S + 1, (
        f"with a new rule name, the connections leave the old filter chain at their next answer (pilot-agent "
        f"runs Envoy with --drain-strategy immediate): the old filter's last request within max_queue_delay "
        f"({MQD_S:g} s: the longest a held request waits for its answer) + 1 s of the change reaching the last "
        f"replica: {out}")
    assert fresh["old_grid_claimed_after_new_started_s"] <= fresh["replicas_apart_s"] + MQD_S + ahead + 1, (
        f"and its grid claimed no longer, + {ahead:g} s of claims ahead: {out}")
    assert set(fresh["codes"]) <= {200, 429} and set(same["codes"]) <= {200, 429}, out
    assert fresh["rate_at_app_after"] is not None and abs(fresh["rate_at_app_after"] - RATE) <= 0.05 * RATE, (
        f"then the new rate alone, within 5 % (a short span): {out}")
