"""The topologies under comparison, on the Bookinfo-shaped application, and how each is brought up.

Proxies sit where Istio puts them. Every workload dials the services by name on port 9080; each
node's /etc/hosts gives the node's address, or the Service's where an istiod-configured proxy
expects it (as cluster DNS would). In the meshed topologies the calls are captured by iptables in
each calling node's namespace, as Istio does (Istio's own rules for sidecars).

- no mesh: the client and the services talk directly.
- sidecar: Istio's sidecar on every workload the request crosses (the client's too), configured by
  a real istiod (perf/meshlab/istiod.py): outbound on every call, inbound on every callee (mutual
  TLS, PeerAuthentication STRICT); the throttle a WasmPlugin on the target's inbound.
- ambient L4: one Envoy node proxy per node speaking HBONE (not ztunnel; configured by hand,
  perf/meshlab/configs.py): every call is an HTTP/2 CONNECT tunnel over mTLS from the caller's node
  proxy to the callee's.
- ambient + waypoint: as ambient, and calls to the target's Service go through its waypoint, an
  istiod-configured `pilot-agent proxy waypoint` on its own node (HBONE in, HTTP filters: the
  throttle as a WasmPlugin, HBONE out to the target's node proxy).
- ambient + 2 waypoint replicas: the same waypoint at 2 replicas on two nodes, the callers' node
  proxies taking them in turn per connection; the throttle's rule in cluster scope (one rate for
  the Service across both, through the engine: envoyproxy/ratelimit + Redis from k8s/engine, run
  as pods of the lab), as istio/wasmplugin-waypoint-cluster and istio/engine-waypoint ship it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.controlplane import SERVICE_CIDR
from perf.bookinfo.services import CALLS, PATHS, PORT
from perf.meshlab import configs
from perf.meshlab.istiod import IstiodProxy
from perf.meshlab.lab import OUTBOUND_PORT, Lab, Node, NodeEnvoy, service_host

AMBIENT_NOTE = "Envoy as HBONE node proxy, not ztunnel"
CLIENT = "client"


WAYPOINT_REPLICAS = 2  # the replicated waypoint's


@dataclass(frozen=True)
class Topology:
    key: str          # stable id: nomesh, sidecar, ambient, waypoint, waypoints (replicated, cluster scope)
    throttle: str     # "", "below", "above"

    @property
    def base_label(self) -> str:
        return {"nomesh": "no mesh", "sidecar": "sidecar (istiod)",
                "ambient": f"ambient L4 ({AMBIENT_NOTE})",
                "waypoint": f"ambient + waypoint (istiod) ({AMBIENT_NOTE})",
                "waypoints": f"ambient + {WAYPOINT_REPLICAS} waypoint replicas (istiod) ({AMBIENT_NOTE})"}[self.key]

    @property
    def cluster_scope(self) -> bool:
        """The throttle's rule holds one rate across the proxies (the replicated waypoint)."""
        return self.key == "waypoints"

    def rate(self, offered_qps: float) -> int | None:
        """Throttle rate: half the offered load (below) or twice it (above)."""
        if not self.throttle:
            return None
        return max(1, int(offered_qps * (0.5 if self.throttle == "below" else 2)))

    def burst(self, conns: int) -> int:
        """Above the offered load the throttle should admit everything; Fortio's connections fire
        in step, so a burst of one request per connection is allowed there (below: burst 0)."""
        return conns if self.throttle == "above" else 0

    def label(self, offered_qps: float, conns: int, target: str = "details") -> str:
        if not self.throttle:
            return self.base_label
        where = {"sidecar": f"{target} sidecar inbound", "waypoint": f"{target}'s waypoint",
                 "waypoints": f"{target}'s {WAYPOINT_REPLICAS} waypoints, cluster scope"}[self.key]
        burst = self.burst(conns)
        b = f" burst {burst}" if burst else ""
        return f"{self.base_label} + throttle in {where} {self.rate(offered_qps)}/s{b} ({self.throttle} offered)"


ALL = (Topology("nomesh", ""), Topology("sidecar", ""), Topology("sidecar", "below"), Topology("sidecar", "above"),
       Topology("ambient", ""), Topology("waypoint", ""), Topology("waypoint", "below"), Topology("waypoint", "above"),
       Topology("waypoints", ""), Topology("waypoints", "below"), Topology("waypoints", "above"))
SHORT = (Topology("nomesh", ""), Topology("sidecar", ""), Topology("sidecar", "below"), Topology("ambient", ""),
         Topology("waypoint", ""), Topology("waypoint", "below"), Topology("waypoints", "below"))
# The engine's HTTP port as istiod names its cluster (istio/wasmplugin-waypoint-cluster).
ENGINE_CLUSTER = "outbound|8080||ratelimit.throttle-engine.svc.cluster.local"


def plugin(rate: int, burst: int = 0, cluster: bool = False) -> dict:
    """The throttle's configuration: one rule, `default`; in cluster scope as the shipped waypoint
    plugin has it (the engine's cluster, its 50 ms timeout, `expected_replicas` = the replicas)."""
    rule: dict = {"name": "default", "rate": f"{rate}/s", "burst": burst, "max_queue_delay": "1s"}
    if not cluster:
        return {"rules": [rule]}
    rule.update({"scope": "cluster", "expected_replicas": WAYPOINT_REPLICAS, "on_engine_failure": "local_share"})
    return {"engine": {"cluster": ENGINE_CLUSTER, "timeout": "50ms"}, "rules": [rule]}


def edges(target: str) -> list[tuple[str, str]]:
    """The calls a request to `target` makes, as (caller, callee): the client's call first."""
    out, todo = [(CLIENT, target)], [target]
    while todo:
        svc = todo.pop(0)
        for callee in CALLS[svc]:
            out.append((svc, callee))
            todo.append(callee)
    return out


def involved(target: str) -> list[str]:
    return list(dict.fromkeys(n for e in edges(target) for n in e))


def callers_of(target: str) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for src, dst in edges(target):
        out.setdefault(dst, []).append(src)
    return {k: tuple(v) for k, v in out.items()}


def calls_of(target: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for src, dst in edges(target):
        out.setdefault(src, []).append(dst)
    return out


@dataclass
class Deployed:
    """Proxies and capture rules of one topology, running in the lab; `url` is what the client loads."""

    url: str
    proxies: list[NodeEnvoy | IstiodProxy]
    captured: list[Node] = field(default_factory=list)

    def stop(self) -> None:
        for n in self.captured:
            n.uncapture()
        for p in reversed(self.proxies):
            p.stop()

    def proxy(self, name: str) -> NodeEnvoy | IstiodProxy:
        return next(p for p in self.proxies if p.name == name)


def render(topo: Topology, target: str, lab_dir: Path, certs: dict, addrs: dict[str, str],
           vips: dict[str, str] | None = None, tag: str = "") -> list[tuple[str, str, dict]]:
    """(node, proxy name, Envoy config) for every hand-written proxy of a topology when `target` is
    loaded: the ambient node proxies. With a waypoint, the target's calls go to its Service address
    (`vips`) and on to the waypoint. Pure: used by the lab and by the `envoy --mode validate` test."""
    calls, callers = calls_of(target), callers_of(target)

    def sock(name: str) -> Path:
        return lab_dir / f"{name}{tag}.admin"

    out: list[tuple[str, str, dict]] = []
    if topo.key in ("nomesh", "sidecar"):
        return out
    if topo.key in ("ambient", "waypoint", "waypoints"):
        wp = topo.key in ("waypoint", "waypoints")
        if wp and not vips:
            raise ValueError("a waypoint topology needs the Services' addresses (vips)")
        waypoints: str | list[str] = addrs["waypoint"] if topo.key == "waypoint" else \
            [addrs[n] for n in waypoint_nodes(WAYPOINT_REPLICAS)]
        for node in involved(target):
            routes: dict[str, tuple[str, str | list[str], str]] = {}
            for c in calls.get(node, []):
                if wp and c == target:
                    assert vips is not None
                    routes[c] = (vips[c], waypoints, certs["waypoint"]["san"])
                else:
                    routes[c] = (addrs[c], addrs[c], certs[c]["san"])
            name = f"node-{node}"
            out.append((node, name, configs.node_proxy(sock(name), certs, node, addrs[node], routes,
                                                       inbound=node in callers, out_port=OUTBOUND_PORT,
                                                       app_port=PORT)))
        return out
    raise KeyError(topo.key)


def waypoint_nodes(replicas: int) -> list[str]:
    """The lab nodes the waypoint's replicas run on: `waypoint`, `waypoint2`, ..."""
    return ["waypoint" if i == 0 else f"waypoint{i + 1}" for i in range(replicas)]


def deploy(lab: Lab, topo: Topology, target: str, certs: dict, offered_qps: float, conns: int,
           concurrency: int = 2) -> Deployed:
    mesh = lab.mesh
    if mesh is None and topo.key in ("sidecar", "waypoint", "waypoints"):
        raise RuntimeError(f"topology {topo.key} needs the lab's control plane (perf/meshlab/istiod.py)")
    addrs = {name: lab.nodes[name].addr for name in ("client", *CALLS, *waypoint_nodes(WAYPOINT_REPLICAS))}
    rate = topo.rate(offered_qps)
    thr = plugin(rate, topo.burst(conns), cluster=topo.cluster_scope) if rate else None
    dep = Deployed(f"http://{service_host(target)}:{PORT}{PATHS[target]}", [])
    try:
        if mesh is not None and topo.key in ("nomesh", "ambient"):
            mesh.reset_names()
        if topo.key == "sidecar":
            assert mesh is not None
            dep.proxies.extend(mesh.sidecars(involved(target), target, thr))
            return dep
        vips = mesh.vips if mesh is not None else None
        for node, name, cfg in render(topo, target, lab.dir, certs, addrs, vips):
            dep.proxies.append(NodeEnvoy(lab[node], name, cfg, concurrency=concurrency).launch())
        for p in dep.proxies:
            assert isinstance(p, NodeEnvoy)
            p.wait_ready()
        if topo.key == "waypoint":
            assert mesh is not None
            dep.proxies.append(mesh.waypoint(target, thr))
        if topo.key == "waypoints":
            assert mesh is not None
            dep.proxies.extend(mesh.waypoints(target, thr, [lab[n] for n in waypoint_nodes(WAYPOINT_REPLICAS)]))
        if topo.key != "nomesh":
            for node in calls_of(target):  # every calling node, the client's included
                lab[node].capture(OUTBOUND_PORT, extra=(SERVICE_CIDR,) if topo.key in ("waypoint", "waypoints") else ())
                dep.captured.append(lab[node])
    except BaseException:
        dep.stop()
        raise
    return dep
