"""The lab's control plane: a real istiod configures its sidecars and its waypoint.

One more node (`cp`, perf/meshlab/lab.py's CP_ADDR) runs etcd, kube-apiserver, istiod and the
registry (harness/controlplane.py); the lab's workload nodes become Pods of namespace `default`
(harness/kubelet.py `adopt`: their addresses, labels `app: <service>`, service accounts named after
them, so their SPIFFE identities are the ones the lab's certificates carry), behind Services with
cluster addresses. For a run of a topology:

- sidecar: Istio's iptables rules and `pilot-agent proxy sidecar` (upstream Envoy) on every node
  the request crosses, as the injector would; every workload dials the Services' addresses; the
  throttle is a WasmPlugin (`selector`, `match: SERVER 9080`) pulled from the registry;
- waypoint: the node proxies standing in for ztunnel stay hand-written (perf/meshlab/configs.py);
  the waypoint is `pilot-agent proxy waypoint` for a Gateway of class istio-waypoint, the loaded
  Service labelled `istio.io/use-waypoint`, its pod marked as ambient; the throttle a WasmPlugin
  with `targetRefs: Service`;
- 2 waypoint replicas: the same on the nodes `waypoint` and `waypoint2`, the rule in cluster
  scope; the engine (k8s/engine's manifests applied with kubectl: Redis and one ratelimit pod, run
  by harness/kubelet.py on nodes of their own) and the shipped `istio/engine-waypoint` EnvoyFilter,
  so that istiod gives the waypoints the engine's cluster.

Everything upstream Envoy forces is harness/meshpatches.py's, as in `make istio-e2e`; for the
lab, every proxy also keeps the counters the hop check reads (ProxyConfig `proxyStatsMatcher`:
Istio's default inclusion list drops them). PeerAuthentication STRICT: every hop is mutual TLS.
"""

from __future__ import annotations

import re
import shutil
import time
from typing import Any

import yaml

from harness import meshpatches
from harness.controlplane import ISTIOD_HOST, SERVICE_CIDR, ControlPlane
from harness.kubelet import Kubelet, Pod
from harness.mesh import LOCAL_ENGINE_DIGEST
from harness.net import wait_until
from harness.procs import ROOT, WASM
from perf.bookinfo.services import PORT, SERVICES
from perf.meshlab.lab import CP_ADDR, NAMESPACE, Lab, Node, service_host
from tools import engine_image, wasm_image

# The counters the hop check reads (perf/meshlab/hops.py), kept by every proxy of the lab.
STATS_INCLUSION = {"inclusionPrefixes": ["cluster.outbound|", "cluster.inbound-vip|", "http.inbound_",
                                         "http.outbound_", "http.connect_terminate", "cluster.connect_originate",
                                         "cluster.main_internal"]}
WAYPOINT = "waypoint"
ENGINE_NAMESPACE = "throttle-engine"


class IstiodProxy:
    """A proxy istiod configures (pilot-agent and its Envoy), as the run sees a proxy: a name, the
    Envoy's PID, its counters; stopped by PID."""

    def __init__(self, name: str, pod: Pod, stop_fn: Any):
        self.name, self.pod, self._stop = name, pod, stop_fn
        pids = pod.envoy_pids()
        if not pids:
            raise RuntimeError(f"{name}: no Envoy under pilot-agent:\n{pod.log()[-3000:]}")
        self.pid = pids[0]
        assert pod.proxy is not None
        self.agent_pid = pod.proxy.pid

    def stats_matching(self, regex: str) -> dict[str, int]:
        import urllib.parse

        status, body = self.pod.admin(f"/stats?filter={urllib.parse.quote(regex)}")
        if status != 200:
            raise RuntimeError(f"{self.name}: /stats {status}")
        out = {}
        for line in body.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def log(self) -> str:
        return self.pod.log()

    def stop(self) -> None:
        self._stop()


class LabMesh:
    """The control plane in the lab and the lab's nodes as Pods. Start after the lab is up (and
    before the application), stop before it goes down."""

    def __init__(self, lab: Lab):
        self.lab = lab
        node = lab.add("cp", CP_ADDR)
        self.cp = ControlPlane(lab, node=node)  # type: ignore[arg-type]  # the lab is the network
        self.kubelet: Kubelet | None = None
        self.pods: dict[str, Pod] = {}
        self.vips: dict[str, str] = {}
        self.image_url = ""
        self.image_sha256 = ""
        self.started_s = 0.0
        self.engine: list[Pod] = []

    def start(self) -> LabMesh:
        t0 = time.monotonic()
        self.lab.set_hosts({ISTIOD_HOST: self.cp.node.addr})  # every node reaches istiod (xDS, CA)
        self.cp.start()
        self.kubelet = Kubelet(self.cp, proxy_config={"proxyStatsMatcher": STATS_INCLUSION})
        kube = self.cp.kube
        kube.apply([meshpatches.TELEMETRY_NO_ISTIO_STATS, meshpatches.waypoint_envoyfilter(NAMESPACE, WAYPOINT),
                    {"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
                     "metadata": {"name": "default", "namespace": NAMESPACE}, "spec": {"mtls": {"mode": "STRICT"}}},
                    {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                     "metadata": {"name": WAYPOINT, "namespace": NAMESPACE},
                     "spec": {"gatewayClassName": "istio-waypoint",
                              "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}}])
        kube.apply([{"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": svc, "namespace": NAMESPACE, "labels": {"app": svc}},
                     "spec": {"selector": {"app": svc}, "ports": [{"name": "http", "port": PORT}]}}
                    for svc in SERVICES])
        for name in ("client", *SERVICES):
            node = self.lab[name]
            node.route(SERVICE_CIDR)
            self.pods[name] = self.kubelet.adopt(node, f"{name}-0", NAMESPACE, {"app": name, "version": "v1"},
                                                 name, [PORT] if name in SERVICES else [], mode="sidecar",
                                                 deployment=name)
        self.kubelet.sync_endpoints(NAMESPACE)
        self.vips = {svc: kube.get("service", svc, NAMESPACE)["spec"]["clusterIP"] for svc in SERVICES}
        pushed = wasm_image.push(f"{self.cp.registry_host_from_host}/envoy-throttle:lab", WASM, insecure=True)
        self.image_sha256 = pushed.removeprefix("sha256:")
        self.image_url = f"oci://{self.cp.registry_host}/envoy-throttle:lab"
        self.started_s = round(time.monotonic() - t0, 1)
        self.cp.log(f"the lab's control plane ready in {self.started_s} s; Services {self.vips}")
        return self

    def stop(self) -> None:
        if self.kubelet is not None:
            for pod in self.pods.values():
                if pod.proxy is not None:
                    self.kubelet.stop_sidecar(pod)
            for pod in [p for p in self.kubelet.pods.values() if p.mode == "waypoint"] + self.engine:
                self.kubelet.stop_pod(pod, delete=False)
        self.cp.stop()

    @property
    def ca(self) -> tuple[str, str]:
        return self.cp.ca_key_pair()

    # -- names ---------------------------------------------------------------------------
    def hosts(self, vip_for: set[str]) -> dict[str, str]:
        """The services' names: the Service address for `vip_for`, the node's for the others."""
        return {service_host(s): (self.vips[s] if s in vip_for else self.lab[s].addr) for s in SERVICES}

    # -- the throttle as a WasmPlugin ----------------------------------------------------------
    def plugin(self, target: str, plugin: dict[str, Any], on_waypoint: bool) -> dict[str, Any]:
        spec: dict[str, Any] = {"url": self.image_url, "sha256": self.image_sha256, "failStrategy": "FAIL_CLOSE",
                                "pluginConfig": plugin}
        if on_waypoint:
            spec["targetRefs"] = [{"kind": "Service", "group": "", "name": target}]
        else:
            spec["selector"] = {"matchLabels": {"app": target}}
            spec["match"] = [{"mode": "SERVER", "ports": [{"number": PORT}]}]
        return {"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
                "metadata": {"name": f"throttle-{target}", "namespace": NAMESPACE}, "spec": spec}

    def _apply_plugin(self, target: str, plugin: dict[str, Any] | None, on_waypoint: bool) -> None:
        kube = self.cp.kube
        for svc in SERVICES:
            if plugin is None or svc != target:
                kube.delete("wasmplugin", f"throttle-{svc}", NAMESPACE)
        if plugin is not None:
            kube.apply([self.plugin(target, plugin, on_waypoint)])

    @staticmethod
    def _wait_configured(proxy: IstiodProxy, plugin: dict[str, Any], timeout: float = 90) -> None:
        rate = plugin["rules"][0]["rate"].replace("/s", "/1s")
        want = re.compile(rf"configured 1 rule\(s\): default: rate {re.escape(rate)} ")
        wait_until(lambda: want.search(proxy.log()), timeout, f"the throttle configured in {proxy.name}", interval=0.3)

    def _wait_acked(self, pods: list[Pod], timeout: float = 90) -> None:
        ids = [p.proxy_id for p in pods]

        def acked() -> bool:
            rows = {r["proxy"]: r for r in self.cp.syncz()}
            return all(i in rows and all(rows[i].get(f"{t}_sent", "") == rows[i].get(f"{t}_acked", "")
                                         for t in ("cluster", "listener", "route", "endpoint", "extensionconfig"))
                       for i in ids)

        wait_until(acked, timeout, f"istiod: every xDS type ACKed by {ids}", interval=0.3)

    # -- topologies ---------------------------------------------------------------------------
    def sidecars(self, nodes: list[str], target: str, plugin: dict[str, Any] | None) -> list[IstiodProxy]:
        """Sidecars (and Istio's capture) on `nodes`, the throttle in `target`'s if `plugin`."""
        assert self.kubelet is not None
        kubelet = self.kubelet
        self.lab.set_hosts(self.hosts(set(SERVICES)))
        self._apply_plugin(target, plugin, on_waypoint=False)
        pods = [self.pods[n] for n in nodes]
        started: list[IstiodProxy] = []
        try:
            for pod in pods:
                kubelet.launch_sidecar(pod)
            for pod in pods:
                kubelet.wait_ready(pod)
                started.append(IstiodProxy(f"sidecar-{pod.deployment}", pod,
                                           lambda p=pod: kubelet.stop_sidecar(p)))
            self._wait_acked(pods)
            if plugin is not None:
                self._wait_configured(next(p for p in started if p.pod is self.pods[target]), plugin)
        except BaseException:
            for pod in pods:
                if pod.proxy is not None:
                    kubelet.stop_sidecar(pod)
            raise
        return started

    def waypoint(self, target: str, plugin: dict[str, Any] | None) -> IstiodProxy:
        """The waypoint for `target`'s Service on the waypoint node, the throttle on it if `plugin`."""
        assert self.kubelet is not None
        kube, kubelet = self.cp.kube, self.kubelet
        self.lab.set_hosts(self.hosts({target}))
        kube.run("label", "service", target, "-n", NAMESPACE, "--overwrite", f"istio.io/use-waypoint={WAYPOINT}")
        kube.run("annotate", "pod", self.pods[target].name, "-n", NAMESPACE, "--overwrite",
                 "ambient.istio.io/redirection=enabled")
        self._apply_plugin(target, plugin, on_waypoint=True)
        pod = kubelet.start_waypoint(NAMESPACE, WAYPOINT, node=self.lab["waypoint"])

        def stop_waypoint() -> None:
            kubelet.stop_pod(pod)
            kube.run("label", "service", target, "-n", NAMESPACE, "istio.io/use-waypoint-")
            kube.run("annotate", "pod", self.pods[target].name, "-n", NAMESPACE, "ambient.istio.io/redirection-")

        proxy = IstiodProxy(WAYPOINT, pod, stop_waypoint)
        try:
            self._wait_acked([pod])
            if plugin is not None:
                self._wait_configured(proxy, plugin)
        except BaseException:
            stop_waypoint()
            raise
        return proxy

    def start_engine(self) -> list[Pod]:
        """The engine of k8s/engine, once for the lab: its manifests (a copy with a stand-in image
        digest, as harness/mesh.py does) applied with kubectl, Redis and one ratelimit pod run by the
        kubelet (each on a node of its own, not in the mesh)."""
        assert self.kubelet is not None
        if self.engine:
            return self.engine
        copy = self.lab.dir / "manifests" / "k8s"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(ROOT / "k8s" / "engine", copy / "engine", ignore=shutil.ignore_patterns("__pycache__", "*.py"))
        engine_image.set_digest(LOCAL_ENGINE_DIGEST, env=copy / "engine" / "image.env")
        self.cp.kube.apply_k(copy / "engine")
        self.engine = [*self.kubelet.start_deployment(ENGINE_NAMESPACE, "redis", 1),
                       *self.kubelet.start_deployment(ENGINE_NAMESPACE, "ratelimit", 1)]
        self.cp.log(f"the engine: {[(p.name, p.ip) for p in self.engine]}")
        return self.engine

    def waypoints(self, target: str, plugin: dict[str, Any] | None, nodes: list[Node]) -> list[IstiodProxy]:
        """The waypoint for `target`'s Service at len(`nodes`) replicas, one per node, the throttle's
        cluster-scope rule on them if `plugin` (then with the engine, and the shipped
        istio/engine-waypoint EnvoyFilter giving them its cluster)."""
        assert self.kubelet is not None
        kube, kubelet = self.cp.kube, self.kubelet
        engine_filter = yaml.safe_load((ROOT / "istio" / "engine-waypoint" / "envoyfilter.yaml").read_text())
        engine_filter["metadata"]["namespace"] = NAMESPACE
        if plugin is not None:
            self.start_engine()
            kube.apply([engine_filter])
        self.lab.set_hosts(self.hosts({target}))
        kube.run("label", "service", target, "-n", NAMESPACE, "--overwrite", f"istio.io/use-waypoint={WAYPOINT}")
        kube.run("annotate", "pod", self.pods[target].name, "-n", NAMESPACE, "--overwrite",
                 "ambient.istio.io/redirection=enabled")
        self._apply_plugin(target, plugin, on_waypoint=True)
        started: list[Pod] = []

        def stop_waypoints() -> None:
            for pod in started:
                kubelet.stop_pod(pod)
            started.clear()
            kube.run("label", "service", target, "-n", NAMESPACE, "istio.io/use-waypoint-")
            kube.run("annotate", "pod", self.pods[target].name, "-n", NAMESPACE, "ambient.istio.io/redirection-")
            kube.delete("envoyfilter", engine_filter["metadata"]["name"], NAMESPACE)

        try:
            started.extend(kubelet.start_waypoints(NAMESPACE, WAYPOINT, len(nodes), nodes=nodes))
            proxies = [IstiodProxy(f"{WAYPOINT}-{i}", pod, stop_waypoints if i == 0 else (lambda: None))
                       for i, pod in enumerate(started)]
            self._wait_acked(started)
            if plugin is not None:
                for proxy in proxies:
                    self._wait_configured(proxy, plugin)
        except BaseException:
            stop_waypoints()
            raise
        return proxies

    def reset_names(self) -> None:
        """Every name back to its node's address (no mesh, ambient L4)."""
        self.lab.set_hosts(self.hosts(set()))

    def waypoint_san(self) -> str:
        return f"spiffe://cluster.local/ns/{NAMESPACE}/sa/{WAYPOINT}"

