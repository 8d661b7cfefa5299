"""The topologies under comparison, on the Bookinfo-shaped application, and how each is brought up.

Proxies sit where Istio puts them. Every workload dials the services' real addresses on port 9080;
in the meshed topologies an iptables REDIRECT in each calling node's namespace sends those
connections to the node's proxy on 15001 (the load generator's too), as Istio captures them.

- no mesh: the client and the services talk directly.
- sidecar: one Envoy per workload (the client's too): outbound on every call, inbound on every
  callee (mTLS between them); the throttle in the target service's sidecar inbound.
- ambient L4: one Envoy node proxy per node speaking HBONE (not ztunnel): every call is an
  HTTP/2 CONNECT tunnel over mTLS from the caller's node proxy to the callee's.
- ambient + waypoint: as ambient, and calls to the target service go through a waypoint on its
  own node (HBONE in, HTTP filters: the throttle, HBONE out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perf.bookinfo.services import CALLS, PATHS, PORT
from perf.meshlab import configs
from perf.meshlab.lab import OUTBOUND_PORT, Lab, Node, NodeEnvoy

AMBIENT_NOTE = "Envoy as HBONE node proxy, not ztunnel"
CLIENT = "client"


@dataclass(frozen=True)
class Topology:
    key: str          # stable id: nomesh, sidecar, ambient, waypoint
    throttle: str     # "", "below", "above"

    @property
    def base_label(self) -> str:
        return {"nomesh": "no mesh", "sidecar": "sidecar",
                "ambient": f"ambient L4 ({AMBIENT_NOTE})",
                "waypoint": f"ambient + waypoint ({AMBIENT_NOTE})"}[self.key]

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
        where = f"{target} sidecar inbound" if self.key == "sidecar" else f"{target}'s waypoint"
        burst = self.burst(conns)
        b = f" burst {burst}" if burst else ""
        return f"{self.base_label} + throttle in {where} {self.rate(offered_qps)}/s{b} ({self.throttle} offered)"


ALL = (Topology("nomesh", ""), Topology("sidecar", ""), Topology("sidecar", "below"), Topology("sidecar", "above"),
       Topology("ambient", ""), Topology("waypoint", ""), Topology("waypoint", "below"), Topology("waypoint", "above"))
SHORT = (Topology("nomesh", ""), Topology("sidecar", ""), Topology("sidecar", "below"), Topology("ambient", ""),
         Topology("waypoint", ""), Topology("waypoint", "below"))


def plugin(rate: int, burst: int = 0) -> dict:
    return {"rules": [{"name": "default", "rate": f"{rate}/s", "burst": burst, "max_queue_delay": "1s"}]}


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
    proxies: list[NodeEnvoy]
    captured: list[Node] = field(default_factory=list)

    def stop(self) -> None:
        for n in self.captured:
            n.uncapture()
        for p in reversed(self.proxies):
            p.stop()

    def proxy(self, name: str) -> NodeEnvoy:
        return next(p for p in self.proxies if p.name == name)


def render(topo: Topology, target: str, lab_dir: Path, certs: dict, addrs: dict[str, str], offered_qps: float,
           conns: int, tag: str = "") -> list[tuple[str, str, dict]]:
    """(node, proxy name, Envoy config) for every proxy of a topology when `target` is loaded. Pure:
    used by the lab and by the `envoy --mode validate` test."""
    rate = topo.rate(offered_qps)
    thr = plugin(rate, topo.burst(conns)) if rate else None
    calls, callers = calls_of(target), callers_of(target)

    def sock(name: str) -> Path:
        return lab_dir / f"{name}{tag}.admin"

    out: list[tuple[str, str, dict]] = []
    if topo.key == "nomesh":
        return out
    if topo.key == "sidecar":
        for node in involved(target):
            name = f"sidecar-{node}"
            out.append((node, name, configs.sidecar(
                sock(name), certs, node, addrs[node], {c: addrs[c] for c in calls.get(node, [])},
                callers.get(node, ()), thr if node == target else None, out_port=OUTBOUND_PORT, app_port=PORT)))
        return out
    if topo.key in ("ambient", "waypoint"):
        wp = topo.key == "waypoint"
        for node in involved(target):
            routes = {}
            for c in calls.get(node, []):
                via_wp = wp and c == target
                routes[c] = (addrs[c], addrs["waypoint"] if via_wp else addrs[c],
                             certs["waypoint" if via_wp else c]["san"])
            name = f"node-{node}"
            out.append((node, name, configs.node_proxy(sock(name), certs, node, addrs[node], routes,
                                                       inbound=node in callers, out_port=OUTBOUND_PORT,
                                                       app_port=PORT)))
        if wp:
            out.append(("waypoint", "waypoint", configs.waypoint(
                sock("waypoint"), certs, addrs["waypoint"], addrs[target], certs[target]["san"],
                f"{addrs[target]}:{PORT}", thr)))
        return out
    raise KeyError(topo.key)


def deploy(lab: Lab, topo: Topology, target: str, certs: dict, offered_qps: float, conns: int,
           concurrency: int = 2) -> Deployed:
    addrs = {name: node.addr for name, node in lab.nodes.items()}
    dep = Deployed(f"http://{addrs[target]}:{PORT}{PATHS[target]}", [])
    try:
        for node, name, cfg in render(topo, target, lab.dir, certs, addrs, offered_qps, conns):
            dep.proxies.append(NodeEnvoy(lab[node], name, cfg, concurrency=concurrency).launch())
        for p in dep.proxies:
            p.wait_ready()
        if topo.key != "nomesh":
            for node in calls_of(target):  # every calling node, the client's included
                lab[node].capture(OUTBOUND_PORT)
                dep.captured.append(lab[node])
    except BaseException:
        dep.stop()
        raise
    return dep
