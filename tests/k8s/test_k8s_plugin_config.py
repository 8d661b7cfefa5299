"""Every shipped WasmPlugin and EnvoyFilter, through Istio's own code into a real
Envoy running the filter.

tools/istio/istiowasm builds, with Istio's code, the Envoy Wasm filter an Istio
proxy would get (WasmPlugin: pilot's TrafficExtensionWrapper.BuildHTTPWasmFilter;
EnvoyFilter: xds.BuildXDSObjectFromStruct), then runs istio-agent's ECDS
conversion (wasm.MaybeConvertWasmExtensionConfig + LocalFileCache): the module is
pulled from the local registry, its manifest digest checked against the pinned
sha256, and the code rewritten to the local file. That filter config replaces
the throttle's in envoy/demo.yaml and goes through `envoy --mode validate`
(which loads the module and runs the filter's on_configure), and one of them
serves traffic.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.configs import render, throttle_filter
from harness.engine import Engine
from harness.envoy import Envoy
from harness.net import free_port, http_get, wait_until
from tests.support.k8s import PLUGIN_KUSTOMIZATIONS, kustomize_build, plugin_configs, run

pytestmark = pytest.mark.k8s

CONFIGS = plugin_configs()
WHERE = [w for _, w, _ in CONFIGS]


def istiowasm(tools, registry, files: dict[Path, str], cache: Path) -> tuple[int, dict[str, dict], str]:
    r = run([tools["istiowasm"], "-registry", registry.host, "-cache", str(cache), *map(str, files)], timeout=180)
    out = {}
    for line in r.stdout.splitlines():
        d = json.loads(line)
        out[f"{files[Path(d['file'])]}:{d['kind']}/{d['name']}"] = d["config"]["config"]
    return r.returncode, out, r.stderr


@pytest.fixture(scope="module")
def rendered_plugins(tools, configured, tmp_path_factory) -> dict[Path, str]:
    """Each istio/ kustomization holding plugins, built from the configured copy:
    {rendered file: kustomization}."""
    built = kustomize_build(tools, configured, PLUGIN_KUSTOMIZATIONS, tmp_path_factory.mktemp("plugins"))
    return {f: k for k, f in built.items()}


@pytest.fixture(scope="module")
def istio_built(tools, registry, pushed, rendered_plugins, tmp_path_factory) -> dict[str, dict]:
    """{kustomization:Kind/name: the Wasm filter `config` Istio builds and istio-agent converts}."""
    rc, out, err = istiowasm(tools, registry, rendered_plugins, tmp_path_factory.mktemp("agent-cache"))
    assert rc == 0, err[-3000:]
    return out


def with_istio_filter(config: dict, wasm: Path, upstream_port: int, engine_cluster: dict | None = None) -> dict:
    cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=upstream_port, wasm=wasm)
    hf = throttle_filter(cfg)
    assert hf is not None, "envoy/demo.yaml has no throttle filter"
    hf["typed_config"]["config"] = config
    if engine_cluster is not None:
        cfg["static_resources"]["clusters"].append(engine_cluster)
    return cfg


def plain_envoy_cluster(istio_cluster: dict, port: int) -> dict:
    """The cluster istiod builds for the engine (tools/istio/istioclusters), for a plain Envoy
    reaching the engine on 127.0.0.1:`port`. Same name and settings (connect timeout, load
    balancing, circuit breakers, metadata); changed only where an Istio proxy differs from a
    plain one: the endpoints come from EDS over ADS there (static here); the
    `istio.metadata_exchange` upstream filter exists only in Istio's Envoy build; the transport
    socket matches need istio-agent's SDS and choose plain text for endpoints outside the mesh,
    as the shipped engine is (tests/k8s/test_k8s_cluster_scope.py checks the cluster itself)."""
    c = {k: v for k, v in istio_cluster.items()
         if k not in ("type", "eds_cluster_config", "filters", "transport_socket_matches")}
    assert istio_cluster["type"] == "EDS", istio_cluster["type"]
    assert [f["name"] for f in istio_cluster.get("filters", [])] in ([], ["istio.metadata_exchange"])
    assert "transport_socket" not in c and "load_assignment" not in c
    c["type"] = "STATIC"
    c["load_assignment"] = {"cluster_name": c["name"], "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
        "socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}
    return c


def istio_engine_cluster(engine_clusters: dict[str, dict[str, dict[str, dict]]], name: str) -> dict:
    """The cluster istiod builds under `name` on a proxy of a shipped overlay."""
    found = [clusters[name] for by_proxy in engine_clusters.values() for clusters in by_proxy.values()
             if name in clusters]
    assert found, f"no proxy of any overlay has a cluster {name!r}"
    return found[0]


def test_every_kind_has_configs():
    kinds = {w.split(":")[1].split("/")[0] for w in WHERE}
    assert kinds == {"WasmPlugin", "EnvoyFilter"}
    assert len(CONFIGS) >= 5


def test_istio_builds_every_plugin(istio_built, pushed, wasm):
    assert set(istio_built) == set(WHERE)
    _, digest = pushed
    for where, config in istio_built.items():
        local = Path(config["vm_config"]["code"]["local"]["filename"])
        assert local.name == digest.removeprefix("sha256:") + ".wasm", where  # pinned digest, verified by the agent
        assert local.read_bytes() == wasm.read_bytes(), where
        # The shipped failStrategy (istio/README.md "Which failStrategy"), as Istio maps it.
        assert config["failure_policy"] == "FAIL_OPEN", where


@pytest.mark.parametrize("where, plugin", [(w, c) for _, w, c in CONFIGS], ids=WHERE)
def test_plugin_config_accepted_by_the_filter(where, plugin, istio_built, engine_clusters, wasm, upstream):
    """The filter Istio builds passes `envoy --mode validate`; a cluster-scope plugin's Envoy
    has the engine's cluster, as istiod builds it for that plugin's proxy."""
    config = istio_built[where]
    # the string the filter's on_configure receives is the configuration as written
    assert json.loads(config["configuration"]["value"]) == plugin
    engine = plugin.get("engine")
    cluster = plain_envoy_cluster(istio_engine_cluster(engine_clusters, engine["cluster"]), free_port()) \
        if engine else None
    cfg = with_istio_filter(config, wasm, upstream.port, cluster)
    rc, out = Envoy(cfg, concurrency=1).validate()
    assert rc == 0, f"{where}: refused:\n{out[-3000:]}"
    assert "OK" in out
    if engine:
        assert engine["cluster"] in [c["name"] for c in cfg["static_resources"]["clusters"]]


@pytest.fixture
def engine():
    """The real engine: Redis and envoyproxy/ratelimit on loopback (harness/engine.py)."""
    with Engine() as e:
        yield e


@pytest.mark.parametrize("kustomization", ["istio/wasmplugin-sidecar-cluster", "istio/wasmplugin-waypoint-cluster"])
def test_istio_built_cluster_scope_filter_reaches_the_engine(kustomization, istio_built, engine_clusters, engine,
                                                             wasm, upstream):
    """A cluster-scope WasmPlugin exactly as Istio builds it, in a real Envoy whose engine cluster
    is the one istiod builds for its proxy (pointed at the real engine on loopback): every
    request is served, the filter's calls reach the service through that cluster by its Istio
    name, and the grants come back from Redis."""
    (where,) = [w for w in istio_built if w.startswith(kustomization + ":")]
    config = istio_built[where]
    plugin = json.loads(config["configuration"]["value"])
    name = plugin["engine"]["cluster"]
    (rule,) = plugin["rules"]
    cluster = plain_envoy_cluster(istio_engine_cluster(engine_clusters, name), engine.port)
    n = 40
    with Envoy(with_istio_filter(config, wasm, upstream.port, cluster), concurrency=2) as envoy:
        codes = [http_get(f"{envoy.url}/productpage")[0] for _ in range(n)]
        assert codes == [200] * n, codes
        stats = wait_until(lambda: (s := envoy.rule_stats(rule["name"]))["engine_calls"] > 0 and s, 10,
                           "an engine call counted")
        # Istio sets alt_stat_name, the prefix of the cluster's stats in Envoy.
        upstream_rq = envoy.stats(f"cluster.{cluster.get('alt_stat_name', name)}.upstream_rq_", settle=False)
    # Every request took a slot of the shared grid (the first ones were held until the
    # proxy's first grants came, then released). No call failed, no fallback.
    assert stats["requests"] == n and stats["slots_taken"] == n, stats
    assert stats["slots_granted"] >= n and stats["engine_failures"] == 0 and stats["fallback_ms"] == 0, stats
    # Envoy's own stats of the cluster named as in Istio: the calls went through it, all 200.
    assert upstream_rq.get("200", 0) >= stats["engine_calls"] > 0, upstream_rq
    assert engine.redis_stats()["incrby"] > 0


def test_istio_built_filter_serves(istio_built, wasm, upstream):
    """The WasmPlugin for details, exactly as Istio builds it, throttling in a real Envoy."""
    (where,) = [w for w in istio_built if w.startswith("istio/wasmplugin-sidecar:") and w.endswith("/throttle-details")]
    with Envoy(with_istio_filter(istio_built[where], wasm, upstream.port), concurrency=2) as envoy:
        codes = [http_get(f"{envoy.url}/details/0")[0] for _ in range(20)]
        assert codes == [200] * 20
        stats = envoy.rule_stats("details")
    assert stats["admitted"] + stats["released"] == 20, stats


@pytest.mark.parametrize("strategy, fallback", [("FAIL_OPEN", "allow"), ("FAIL_RELOAD", "deny")])
def test_stale_pin_falls_back_to_an_rbac_filter(strategy, fallback, tools, registry, pushed, rendered_plugins,
                                                  tmp_path):
    """With a sha256 that is not the image's, istio-agent does not run the module: it puts an
    RBAC filter in its place, allow-all for FAIL_OPEN (the service stays up, unthrottled),
    deny-all for every other strategy (every request 403). The same happens when the image
    cannot be fetched at all."""
    (src,) = [f for f, k in rendered_plugins.items() if k == "istio/wasmplugin-sidecar"]
    stale = tmp_path / "wasmplugin.yaml"
    text = re.sub(r"sha256: [0-9a-f]{64}", "sha256: " + "ab" * 32, src.read_text())
    stale.write_text(re.sub(r"failStrategy: \w+", f"failStrategy: {strategy}", text))
    rc, out, err = istiowasm(tools, registry, {stale: "stale"}, tmp_path / "cache")
    assert rc != 0 and not out
    assert "checksum" in err and f"applying {fallback} RBAC filter" in err, err[-2000:]


def test_the_check_can_fail(wasm):
    """A broken copy of a shipped plugin config is refused by the filter, naming the field."""
    _, _, plugin = CONFIGS[0]
    broken = json.loads(json.dumps(plugin))
    broken["rules"][0]["rate"] = "fast"
    cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=free_port(),
                 plugin=broken, wasm=wasm)
    rc, out = Envoy(cfg, concurrency=1).validate()
    assert rc != 0, out[-2000:]
    assert "rules[0].rate" in out, out[-3000:]


def test_sidecar_wasmplugin_and_envoyfilter_agree():
    """The EnvoyFilter alternative and the waypoint WasmPlugins configure each service like the sidecar WasmPlugins."""
    by_file: dict[str, dict[str, dict]] = {}
    for f, where, cfg in CONFIGS:
        by_file.setdefault(f, {})[where.rsplit("/", 1)[1]] = cfg
    wp = by_file["istio/wasmplugin-sidecar"]
    assert by_file["istio/envoyfilter-sidecar"] == wp
    assert by_file["istio/wasmplugin-waypoint"] == wp


def test_rule_names_unique_per_waypoint():
    """Istio leaves vm_id empty and proxy-wasm shared data is scoped by vm_id, so all
    throttle plugins on one waypoint share the schedule keys: rule names must differ."""
    names = [r["name"] for f, _, cfg in CONFIGS if f == "istio/wasmplugin-waypoint"
             for r in cfg["rules"]]
    assert len(names) == len(set(names)), names
