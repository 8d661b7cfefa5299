"""Cluster scope in the mesh: every cluster-scope WasmPlugin names, in `engine.cluster`, a
cluster that the proxy it runs on will have, according to Istio's own cluster generation.

tools/istio/istioclusters runs pilot's discovery server (Kubernetes registry over a fake API
server, ambient index, Gateway API controller, EnvoyFilter handling) on the rendered overlay
and builds the clusters of a productpage sidecar or of the namespace's waypoint, as istiod
would push them. The checks fail when the name is wrong, when the waypoint lacks the
EnvoyFilter that makes istiod build the engine's cluster for it, when a Sidecar resource
hides the engine, and when the cluster would speak HTTP/2 to the service's HTTP/1.1 port.
The Istio-built filter with that cluster runs against the real engine in
test_k8s_plugin_config.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.engine import CONFIG_FILE
from tests.support.k8s import OVERLAYS, cluster_scope_plugins, docs, istio_clusters

pytestmark = pytest.mark.k8s

CLUSTER_OVERLAYS = [f"k8s/overlays/{o}" for o in OVERLAYS if o.endswith("-cluster")]
ENGINE_HOST = "ratelimit.throttle-engine.svc.cluster.local"


def engine_cluster_problems(files: list[Path], clusters: dict[str, dict[str, dict]] | None = None,
                            tools: dict[str, str] | None = None) -> list[str]:
    """What is wrong with the engine clusters of the cluster-scope plugins in `files`: a
    plugin whose `engine.cluster` its proxy will not have, or a cluster that would not speak
    HTTP/1.1 to the service. `clusters` as from istio_clusters (computed when not given)."""
    plugins = [p for f in files for p in cluster_scope_plugins(f)]
    assert plugins, f"no cluster-scope WasmPlugin in {files}"
    if clusters is None:
        assert tools is not None
        clusters = istio_clusters(tools, files, sorted({proxy for _, proxy, _ in plugins}))
    problems = []
    for name, proxy, cfg in plugins:
        want = cfg["engine"]["cluster"]
        have = clusters[proxy]
        if want not in have:
            near = sorted(c for c in have if c.startswith("outbound|"))
            problems.append(f"WasmPlugin {name}: engine.cluster {want!r} is not a cluster of {proxy} "
                            f"(its outbound clusters: {near})")
            continue
        if "http2_protocol_options" in json.dumps(have[want]):
            problems.append(f"WasmPlugin {name}: {want} on {proxy} speaks HTTP/2; the service's /json port is "
                            f"HTTP/1.1 only (name the Service port http-...)")
    return problems


def without(path: Path, out: Path, kind: str, name: str) -> Path:
    kept = [d for d in docs(path) if not (d["kind"] == kind and d["metadata"]["name"] == name)]
    assert len(kept) == len(docs(path)) - 1, f"no {kind}/{name} in {path}"
    out.write_text(yaml.safe_dump_all(kept))
    return out


def edited(path: Path, out: Path, kind: str, name: str, edit) -> Path:
    all_docs = docs(path)
    (target,) = [d for d in all_docs if d["kind"] == kind and d["metadata"]["name"] == name]
    edit(target)
    out.write_text(yaml.safe_dump_all(all_docs))
    return out


def test_every_overlay_with_cluster_rules_is_checked(rendered):
    with_rules = {k for k, f in rendered.items() if cluster_scope_plugins(f)}
    assert with_rules == set(CLUSTER_OVERLAYS) and len(CLUSTER_OVERLAYS) == 2, with_rules


@pytest.mark.parametrize("k", CLUSTER_OVERLAYS)
def test_engine_cluster_exists_on_the_proxy(k, rendered, engine_clusters):
    assert engine_cluster_problems([rendered[k]], engine_clusters[k]) == []


@pytest.mark.parametrize("k", CLUSTER_OVERLAYS)
def test_engine_cluster_is_istios_cluster_of_the_engine_service(k, rendered, engine_clusters):
    """The name follows Istio's BuildSubsetKey (outbound|<port>|<subset>|<host>) for the engine's
    Service port, and the cluster istiod builds under it is that Service's."""
    (svc,) = [d for d in docs(rendered[k]) if d["kind"] == "Service" and d["metadata"]["name"] == "ratelimit"]
    (port,) = svc["spec"]["ports"]
    host = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
    assert host == ENGINE_HOST
    for name, proxy, cfg in cluster_scope_plugins(rendered[k]):
        assert cfg["engine"]["cluster"] == f"outbound|{port['port']}||{host}", name
        cluster = engine_clusters[k][proxy][cfg["engine"]["cluster"]]
        assert cluster["type"] == "EDS"
        (meta,) = cluster["metadata"]["filter_metadata"]["istio"]["services"]
        assert (meta["host"], meta["namespace"]) == (host, "throttle-engine"), meta


def test_sidecar_and_waypoint_plugins_configure_alike():
    """The same rule in both cluster-scope examples: the same engine cluster name on both kinds
    of proxy (a waypoint gets the sidecar's cluster through istio/engine-waypoint)."""
    from tests.support.k8s import plugin_configs

    by_file = {f: cfg for f, _, cfg in plugin_configs() if f.endswith("-cluster")}
    assert set(by_file) == {"istio/wasmplugin-sidecar-cluster", "istio/wasmplugin-waypoint-cluster"}
    assert by_file["istio/wasmplugin-sidecar-cluster"] == by_file["istio/wasmplugin-waypoint-cluster"]


def test_rendered_configmap_is_the_engine_configuration(rendered):
    (cm,) = [d for d in docs(rendered["k8s/engine"]) if d["kind"] == "ConfigMap"
             and d["metadata"]["name"].startswith("ratelimit-config-")]
    assert cm["data"] == {CONFIG_FILE.name: CONFIG_FILE.read_text()}
    (dep,) = [d for d in docs(rendered["k8s/engine"]) if d["kind"] == "Deployment"
              and d["metadata"]["name"] == "ratelimit"]
    (vol,) = dep["spec"]["template"]["spec"]["volumes"]
    assert vol["configMap"]["name"] == cm["metadata"]["name"], "the Deployment mounts the generated ConfigMap"


# ---- the check fails when the proxy will not have the cluster

def test_a_wrong_cluster_name_is_caught(tools, rendered, tmp_path):
    """engine.cluster naming the engine in the wrong namespace: no proxy has that cluster."""
    wrong = "outbound|8080||ratelimit.bookinfo.svc.cluster.local"

    def edit(wp: dict) -> None:
        wp["spec"]["pluginConfig"]["engine"]["cluster"] = wrong

    f = edited(rendered["k8s/overlays/sidecar-throttle-cluster"], tmp_path / "wrong.yaml", "WasmPlugin",
               "throttle-productpage", edit)
    (problem,) = engine_cluster_problems([f], tools=tools)
    assert f"engine.cluster {wrong!r} is not a cluster of sidecar:bookinfo/productpage" in problem, problem
    assert f"outbound|8080||{ENGINE_HOST}" in problem, "the message lists the clusters the proxy does have"


def test_a_waypoint_has_no_engine_cluster_without_the_envoyfilter(tools, rendered, tmp_path):
    """istiod builds a waypoint's outbound clusters only for Services something references;
    without istio/engine-waypoint's EnvoyFilter the waypoint has no cluster for the engine."""
    f = without(rendered["k8s/overlays/ambient-waypoint-throttle-cluster"], tmp_path / "no-ef.yaml",
                "EnvoyFilter", "throttle-engine")
    (problem,) = engine_cluster_problems([f], tools=tools)
    assert "is not a cluster of waypoint:bookinfo/waypoint" in problem, problem


def test_a_cluster_patch_does_not_reach_a_waypoint(tools, rendered, tmp_path):
    """Why istio/engine-waypoint references the Service instead of adding a cluster: an
    EnvoyFilter CLUSTER patch (ADD) attached to the waypoint adds nothing in this Istio
    (EnvoyFilter is not implemented for waypoints; only a patch matching SIDECAR_INBOUND
    slips through the inbound patcher, by accident of code reuse)."""
    base = without(rendered["k8s/overlays/ambient-waypoint-throttle-cluster"], tmp_path / "no-ef.yaml",
                   "EnvoyFilter", "throttle-engine")
    cluster = {"name": "throttle_engine", "type": "STRICT_DNS", "connect_timeout": "1s",
               "load_assignment": {"cluster_name": "throttle_engine", "endpoints": [{"lb_endpoints": [
                   {"endpoint": {"address": {"socket_address": {"address": ENGINE_HOST, "port_value": 8080}}}}]}]}}
    patch = {"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
             "metadata": {"name": "add-engine", "namespace": "bookinfo"},
             "spec": {"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "waypoint"}],
                      "configPatches": [{"applyTo": "CLUSTER", "patch": {"operation": "ADD", "value": cluster}}]}}
    ef = tmp_path / "add.yaml"
    ef.write_text(yaml.safe_dump(patch))
    got = istio_clusters(tools, [base, ef], ["waypoint:bookinfo/waypoint"])["waypoint:bookinfo/waypoint"]
    assert "throttle_engine" not in got and f"outbound|8080||{ENGINE_HOST}" not in got, sorted(got)
    assert "main_internal" in got, "the waypoint's own clusters are there: Istio did build it"


def test_a_sidecar_resource_can_hide_the_engine(tools, rendered, tmp_path):
    """A Sidecar resource limiting egress hosts removes the engine's cluster from the sidecar
    unless it lists the engine (istio/README.md "Cluster scope in the mesh")."""
    base = rendered["k8s/overlays/sidecar-throttle-cluster"]

    def sidecar(hosts: list[str]) -> Path:
        f = tmp_path / f"sidecar-{len(hosts)}.yaml"
        f.write_text(yaml.safe_dump({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                                     "metadata": {"name": "default", "namespace": "bookinfo"},
                                     "spec": {"egress": [{"hosts": hosts}]}}))
        return f

    (problem,) = engine_cluster_problems([base, sidecar(["./*", "istio-system/*"])], tools=tools)
    assert "is not a cluster of sidecar:bookinfo/productpage" in problem, problem
    assert engine_cluster_problems([base, sidecar(["./*", "istio-system/*", f"throttle-engine/{ENGINE_HOST}"])],
                                   tools=tools) == []


def test_a_grpc_named_port_would_make_the_cluster_http2(tools, rendered, tmp_path):
    """The Service port's name decides the protocol of Istio's cluster; the service's /json
    listener speaks HTTP/1.1 only."""
    def edit(svc: dict) -> None:
        svc["spec"]["ports"][0]["name"] = "grpc-ratelimit"

    f = edited(rendered["k8s/overlays/sidecar-throttle-cluster"], tmp_path / "grpc.yaml", "Service", "ratelimit",
               edit)
    (problem,) = engine_cluster_problems([f], tools=tools)
    assert "speaks HTTP/2" in problem, problem
