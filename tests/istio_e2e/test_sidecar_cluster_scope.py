"""Cluster scope through a real istiod: `k8s/overlays/sidecar-throttle-cluster` applied as shipped.

productpage runs its 2 replicas, each with a sidecar; the engine runs as k8s/engine describes it
(ratelimit x2 and Redis, not in the mesh), reached by each sidecar's filter through the cluster
istiod generates for the Service (`outbound|8080||ratelimit.throttle-engine.svc.cluster.local`,
endpoints from the EndpointSlice). One rate holds at the two applications together. Then the
filter's metrics reach a real Prometheus through pilot-agent's merged endpoint (the pods'
prometheus.io annotations, Kubernetes service discovery against the API server, the shipped
k8s/monitoring/prometheus.yml), and every query of the Grafana throttle dashboard returns data.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from typing import Any

import pytest
import yaml

from harness import meshpatches
from harness.mesh import NAMESPACE
from harness.net import wait_until
from harness.procs import ROOT, stop
from tests.support import istio
from tests.support.repo import stat_features

pytestmark = pytest.mark.istio

URL = f"http://productpage.{NAMESPACE}.svc.cluster.local:9080/api/v1/products"
PLUGIN = "throttle-productpage"
RULE = "bookinfo-productpage"
ENGINE_CLUSTER = "outbound|8080||ratelimit.throttle-engine.svc.cluster.local"
RATE = 60
TOLERANCE = 0.05  # as in test_sidecar.py: the schedule is exact; the edges and the machine's load
DASH = ROOT / "k8s" / "monitoring" / "dashboards" / "throttle.json"


def test_engine_cluster_is_the_one_istiod_generates(cluster):
    """Each sidecar has the engine's cluster under the name the plugin names, with the two
    ratelimit pods as endpoints (EDS from the EndpointSlice)."""
    engine_ips = sorted(p.ip for p in cluster.pods["ratelimit"])
    for pod in cluster.pods["productpage-v1"]:
        status, body = pod.admin("/clusters?format=json")
        assert status == 200
        (c,) = [c for c in json.loads(body)["cluster_statuses"] if c["name"] == ENGINE_CLUSTER]
        hosts = sorted(h["address"]["socket_address"]["address"] for h in c.get("host_statuses", []))
        assert hosts == engine_ips, (pod.name, hosts, engine_ips)
        istio.wait_configured(pod, 0, f"{RULE}: rate 2000/1s")
        (wasm,) = [f for f in istio.ecds_wasm(pod) if PLUGIN in f["name"]]
        plugin = json.loads(wasm["typed_config"]["config"]["configuration"]["value"])
        assert plugin["engine"]["cluster"] == ENGINE_CLUSTER and plugin["rules"][0]["scope"] == "cluster", plugin


def test_one_rate_across_two_replicas(cluster, figures):
    """60/s for the Service: the client's sidecar spreads 200/s over both replicas; their apps
    together see 60/s, each filter having claimed its share from the engine. max_queue_delay 2 s
    (shipped: 500 ms) so that 16 waiting connections (~0.3 s at 60/s) stay well under it while
    shares move between the replicas."""
    pods = cluster.pods["productpage-v1"]
    before = [len(istio.configured_lines(p)) for p in pods]
    cluster.mesh.kube.apply([istio.with_rule(cluster.plugin(PLUGIN), rate=f"{RATE}/s", max_queue_delay="2s")])
    lines = [istio.wait_configured(p, n, f"{RULE}: rate {RATE}/1s") for p, n in zip(pods, before, strict=True)]
    # A proxy's first second of traffic on a new grid waits for its first grants (filters/throttle/
    # README.md "Cluster scope"): 3 s of load first, not measured.
    istio.load(cluster.client, URL, qps=200, connections=16, duration="3s")
    calls_before = [istio.rule_stats(p, RULE).get("engine_calls", 0) for p in pods]
    result = istio.load(cluster.client, URL, qps=200, connections=16, duration="12s")
    stamps = sorted(t for p in pods for t in p.arrival_times())
    rate = istio.rate_at_app(stamps, result["start"], result["end"], trim=2.0)
    each = [istio.rate_at_app(p.arrival_times(), result["start"], result["end"], trim=2.0) for p in pods]
    calls = [istio.rule_stats(p, RULE).get("engine_calls", 0) - c for p, c in zip(pods, calls_before, strict=True)]
    stats = [istio.rule_stats(p, RULE) for p in pods]
    failures = [st.get("engine_failures", 0) for st in stats]
    # Demand beyond what a proxy claimed waits for grants; a turn the line reckons beyond
    # max_queue_delay is refused at arrival. Known defect (issue 29, the line's cautious reckoning
    # at a small share per proxy): 0 to 12 of ~750 refused at arrival in 9 runs here on 2026-11-28
    # (load average 2-3), 20 (2.6 %) in one CI run. Over 2 % is printed as known; over 4 %, an
    # answer other than 200/429, or a request refused after it was held, fails.
    refused = result["codes"].get(429, 0)
    late = [st.get("queued", 0) - st.get("released", 0) - st.get("cancelled", 0) - st.get("gone", 0)
            - st.get("timed_out", 0) - st.get("held", 0) for st in stats]
    assert set(result["codes"]) <= {200, 429} and refused <= 0.04 * result["requests"], f"{result} {stats}"
    assert late == [0] * len(pods), f"refused after a hold, per replica: {late}; {stats}"
    if refused > 0.02 * result["requests"]:
        print(f"\n  KNOWN (issue 29): {refused} of {result['requests']} refused at arrival")
    assert all(c > 0 for c in calls), calls
    assert abs(rate - RATE) <= RATE * TOLERANCE, \
        f"{rate} {each} {stats} {istio.per_second(stamps, result['start'], result['end'])}"
    figures["cluster_scope"] = {"configured": lines[0], "rate_at_apps": round(rate, 2),
                                "rate_each": [round(r, 2) for r in each], "engine_calls": calls,
                                "engine_failures": failures, "codes": result["codes"]}


class Prometheus:
    """Prometheus (built with Kubernetes service discovery, `make istio-e2e-setup`) in the
    control-plane node, the shipped scrape configuration with the differences
    meshpatches.prometheus_config names; stopped by PID."""

    def __init__(self, mesh: Any):
        cp = mesh.cp
        self.cp = cp
        self.dir = cp.dir / "prometheus"
        self.dir.mkdir(exist_ok=True)
        token = self.dir / "token"
        token.write_text(cp.admin_token)
        shipped = yaml.safe_load((mesh.manifests / "k8s" / "monitoring" / "prometheus.yml").read_text())
        cfg = meshpatches.prometheus_config(shipped, f"https://127.0.0.1:{6443}", str(token))
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        binary = cp.tools["prometheus"]
        self.proc = cp.node.popen([binary, f"--config.file={self.dir / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={self.dir / 'data'}", "--web.listen-address=127.0.0.1:9090"],
                                  self.dir / "log")
        wait_until(lambda: self._get("/-/ready")[0] == 200, 60, "prometheus ready", interval=0.5)

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            return self.cp.get(9090, path, timeout=10)
        except OSError:
            if self.proc.poll() is not None:
                raise RuntimeError((self.dir / "log").read_text()[-3000:]) from None
            return 0, b""

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        q = urllib.parse.urlencode({"query": expr, **({"time": f"{at:.3f}"} if at else {})})
        status, body = self._get(f"/api/v1/query?{q}")
        assert status in (200, 400, 422), (status, body[:500])
        out: dict[str, Any] = json.loads(body)
        return out

    def stop(self) -> None:
        stop(self.proc)


@pytest.fixture(scope="module")
def prometheus(cluster):
    prom = Prometheus(cluster.mesh)
    yield prom
    prom.stop()


def test_metrics_reach_prometheus_and_the_dashboard(cluster, prometheus, figures):
    """Prometheus finds the sidecars by their annotations and scrapes pilot-agent's merged
    endpoint (:15020); the shipped relabeling turns throttle_rule_<rule>_<stat> into
    throttle_<stat>{throttle_rule=...}; every panel query of the throttle dashboard has data, but
    the priority classes' and those of stats of features the shipped rule lacks (a rule defines
    only the stats of its features: it is a cluster rule, without adaptive or concurrency)."""
    pods = cluster.pods["productpage-v1"]
    merged = pods[0].agent_get(15020, "/stats/prometheus")[1]
    mine = [ln for ln in merged.splitlines() if "throttle" in ln]
    assert any(re.match(rf"throttle_rule_{RULE.replace('-', '_')}_admitted[{{ ]", ln) for ln in mine), mine[:40]

    def targets_up() -> bool:
        r = prometheus.query('up{job="kubernetes-pods"} == 1')
        return {s["metric"].get("pod") for s in r["data"]["result"]} >= {p.name for p in pods}

    wait_until(targets_up, 60, "both productpage pods scraped", interval=1)
    istio.load(cluster.client, URL, qps=150, connections=16, duration="8s")
    rule = RULE.replace("-", "_")

    def scraped() -> bool:
        r = prometheus.query(f'sum(throttle_released{{throttle_rule="{rule}"}})')
        return bool(r["data"]["result"]) and float(r["data"]["result"][0]["value"][1]) > 0

    wait_until(scraped, 30, "throttle_released scraped", interval=1)
    time.sleep(3)
    at = time.time()
    dash = json.loads(DASH.read_text())
    feature = stat_features()
    features = {"core", "enforce", "cluster"}
    empty, answered, classes, other = [], 0, 0, 0
    for p in dash["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"].replace("$__rate_interval", "1m")
            for k, v in {"rule": rule, "class": ".*", "namespace": NAMESPACE, "configured_rate": str(RATE)}.items():
                expr = expr.replace(f"${k}", v)
            r = prometheus.query(expr, at)
            assert r["status"] == "success", (p["title"], expr, r)
            if "throttle_class_" in expr:
                # The priority classes' panels: series only for a rule with classes, and the
                # shipped cluster rule has none (tests/k8s/test_k8s_dashboards.py shows them).
                assert r["data"]["result"] == [], (p["title"], r["data"]["result"])
                classes += 1
                continue
            stats = re.findall(r"\bthrottle_(\w+?)(?:_bucket|_sum|_count)?\{", expr)
            if not all(feature[s] in features for s in stats):
                # A stat of another feature (adaptive, concurrency): not defined, no series.
                assert r["data"]["result"] == [], (p["title"], expr, r["data"]["result"])
                other += 1
                continue
            if not r["data"]["result"]:
                empty.append((p["title"], expr))
            answered += 1
    assert empty == [], empty
    pods_seen = prometheus.query(f'count by (pod) (throttle_admitted{{throttle_rule="{rule}"}})', at)
    figures["prometheus"] = {"panel_queries_with_data": answered, "class_queries_empty_as_expected": classes,
                             "other_feature_queries_empty_as_expected": other,
                             "pods": sorted(s["metric"]["pod"] for s in pods_seen["data"]["result"])}
