"""Fixtures of the end-to-end tests against a real istiod (marker `istio`; `make istio-e2e`).

One control plane for the session (harness/mesh.py: etcd, kube-apiserver, istiod, the registry with
the built filter pushed), and one *phase* per test module, each applying the project's own overlay
with `kubectl apply -k` as a user would and running the pods it needs (harness/kubelet.py):

- `sidecar`: k8s/overlays/sidecar-throttle; productpage scaled to 1 and the Fortio client, both
  with sidecars (REDIRECT capture, Istio's own iptables rules);
- `cluster`: k8s/overlays/sidecar-throttle-cluster; productpage at its 2 replicas, the engine
  (k8s/engine: ratelimit x2 and Redis, no sidecars), the Fortio client;
- `waypoint`: k8s/overlays/ambient-waypoint-throttle; the namespace in ambient mode, details and
  the Fortio client restarted without sidecars (ztunnel stand-ins), the waypoint;
- `waypoint_cluster`: k8s/overlays/ambient-waypoint-throttle-cluster; the waypoint at 3 replicas,
  productpage and the Fortio client in ambient (the client's stand-in picks the replicas 6:3:1),
  the engine (k8s/engine).

A phase stops the pods the previous one left that it does not use, so modules may run in any
order. These tests need root (network namespaces, iptables): without it they fail, naming it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness import meshpatches
from harness.kubelet import Kubelet, Pod
from harness.mesh import NAMESPACE, Mesh
from harness.netns import NetnsUnavailable
from harness.procs import ROOT
from tests.support import istio

FIGURES = ROOT / "build" / "istio-e2e" / "figures.json"
# How the ambient client's ztunnel stand-in spreads connections over the 3 waypoint pods.
WAYPOINT_WEIGHTS = {"waypoint-0": 6, "waypoint-1": 3, "waypoint-2": 1}
# The replicated waypoint's ProxyConfig drainDuration (Envoy's --drain-time-s; Istio's default 45s):
# how long a listener's replaced filter chain drains, shortened so that the LDS test ends sooner.
WAYPOINT_DRAIN = "10s"


@pytest.fixture(scope="session")
def mesh() -> Iterator[Mesh]:
    try:
        m = Mesh()
    except NetnsUnavailable as e:
        pytest.fail(f"make istio-e2e needs root and network namespaces: {e}")
    with m:
        yield m
    assert m.net.leftover() == [], "network namespaces left behind"


@pytest.fixture(scope="session")
def figures() -> Iterator[dict[str, Any]]:
    """What each test measured, written to build/istio-e2e/figures.json at the end."""
    out: dict[str, Any] = {}
    yield out
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"\nistio-e2e figures: {FIGURES}")
    for name, values in out.items():
        print(f"  {name}: {json.dumps(values)}")


@dataclass
class Phase:
    mesh: Mesh
    kubelet: Kubelet
    overlay: str
    docs: list[dict[str, Any]]  # the overlay as rendered (kustomize), what was applied
    pods: dict[str, list[Pod]] = field(default_factory=dict)

    def plugin(self, name: str) -> dict[str, Any]:
        return istio.find(self.docs, "WasmPlugin", name)

    @property
    def client(self) -> Pod:
        return self.pods["fortio"][0]

    def proxies(self) -> list[Pod]:
        return [p for ps in self.pods.values() for p in ps if p.mode in ("sidecar", "waypoint")]


def _phase(mesh: Mesh, overlay: str, want: dict[str, tuple[str, int, str]], extra: list[dict[str, Any]] | None = None,
           waypoint: bool = False, waypoints: int = 1, fresh: tuple[str, ...] = ()) -> Phase:
    """Applies `overlay`, then runs {deployment: (namespace, replicas, mode)}: pods of the wrong
    mode or count are stopped first (as a rollout would replace them), and those of the
    deployments in `fresh` in any case (an ambient client's ztunnel stand-in knows the waypoint
    pods that ran when it started). With `waypoint`, `waypoints` replicas of the namespace's
    waypoint run (more are stopped)."""
    kubelet = mesh.kubelet
    assert kubelet is not None
    rendered = mesh.kube.run("kustomize", str(mesh.manifests / overlay)).stdout
    mesh.apply_k(overlay)
    if extra:
        mesh.kube.apply(extra)
    for dep, (ns, replicas, _) in want.items():
        mesh.kube.run("scale", "deployment", dep, "-n", ns, f"--replicas={replicas}")
    for pod in list(kubelet.pods.values()):
        spec = want.get(pod.deployment)
        index = int(pod.name.rsplit("-", 1)[1])
        keep = (spec is not None and pod.namespace == spec[0] and pod.mode == spec[2] and index < spec[1]
                and pod.deployment not in fresh) or (waypoint and pod.mode == "waypoint" and index < waypoints
                                                     and pod.deployment not in fresh)
        if not keep:
            kubelet.stop_pod(pod)
    phase = Phase(mesh, kubelet, overlay, istio.rendered(rendered))
    if waypoint:
        kubelet.start_waypoints(NAMESPACE, replicas=waypoints)
    for dep, (ns, replicas, mode) in want.items():
        running = kubelet.start_deployment(ns, dep, replicas)
        assert all(p.mode == mode for p in running), [(p.name, p.mode) for p in running]
        phase.pods[dep] = running
    if waypoint:
        phase.pods["waypoint"] = kubelet.waypoint_pods(NAMESPACE, "waypoint")
    # Every proxy has taken the whole configuration istiod sent it.
    ids = [p.proxy_id for p in phase.proxies()]
    istio.wait_acked(mesh.cp, ids)
    return phase


@pytest.fixture(scope="module")
def sidecar(mesh: Mesh) -> Phase:
    return _phase(mesh, "k8s/overlays/sidecar-throttle",
                  {"productpage-v1": (NAMESPACE, 1, "sidecar"), "fortio": (NAMESPACE, 1, "sidecar")})


@pytest.fixture(scope="module")
def cluster(mesh: Mesh) -> Phase:
    return _phase(mesh, "k8s/overlays/sidecar-throttle-cluster",
                  {"redis": ("throttle-engine", 1, "none"), "ratelimit": ("throttle-engine", 2, "none"),
                   "productpage-v1": (NAMESPACE, 2, "sidecar"), "fortio": (NAMESPACE, 1, "sidecar")})


@pytest.fixture(scope="module")
def waypoint(mesh: Mesh) -> Phase:
    return _phase(mesh, "k8s/overlays/ambient-waypoint-throttle",
                  {"details-v1": (NAMESPACE, 1, "ambient"), "fortio": (NAMESPACE, 1, "ambient")},
                  extra=[meshpatches.waypoint_envoyfilter(NAMESPACE)], waypoint=True)


@pytest.fixture(scope="module")
def waypoint_cluster(mesh: Mesh) -> Iterator[Phase]:
    """k8s/overlays/ambient-waypoint-throttle-cluster: the waypoint at 3 replicas (started afresh,
    with drainDuration WAYPOINT_DRAIN), productpage and the Fortio client in ambient, the engine
    (k8s/engine); the client's ztunnel stand-in picks the waypoint pods 6:3:1 (WAYPOINT_WEIGHTS)."""
    kubelet = mesh.kubelet
    assert kubelet is not None
    kubelet.waypoint_weights = dict(WAYPOINT_WEIGHTS)
    proxy_config = kubelet.proxy_config
    kubelet.proxy_config = {**proxy_config, "drainDuration": WAYPOINT_DRAIN}
    try:
        yield _phase(mesh, "k8s/overlays/ambient-waypoint-throttle-cluster",
                     {"redis": ("throttle-engine", 1, "none"), "ratelimit": ("throttle-engine", 2, "none"),
                      "productpage-v1": (NAMESPACE, 1, "ambient"), "fortio": (NAMESPACE, 1, "ambient")},
                     extra=[meshpatches.waypoint_envoyfilter(NAMESPACE)], waypoint=True, waypoints=3,
                     fresh=("fortio", "waypoint"))
    finally:
        kubelet.waypoint_weights = {}
        kubelet.proxy_config = proxy_config


def pytest_configure(config: pytest.Config) -> None:
    Path(FIGURES).parent.mkdir(parents=True, exist_ok=True)
