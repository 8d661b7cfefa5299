"""The topologies under comparison, and how each is brought up in a lab.

Where Istio would redirect the client's traffic with iptables, the client here
connects to its node's proxy on 127.0.0.1:15001 directly; everything after that
hop (mTLS, HBONE, the waypoint) crosses the lab's veth links between nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perf.meshlab import configs
from perf.meshlab.lab import AppServer, Lab, NodeEnvoy

AMBIENT_NOTE = "Envoy as HBONE node proxy, not ztunnel"
OUT_PORT = 15001
INBOUND_PORT = 15006
APP_PATH = "/echo?size=180"  # fortio server: 180-byte body, details-sized (like Istio's two-pod benchmarks)


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

    def label(self, offered_qps: float, conns: int) -> str:
        if not self.throttle:
            return self.base_label
        where = "server sidecar" if self.key == "sidecar" else "waypoint"
        burst = self.burst(conns)
        b = f" burst {burst}" if burst else ""
        return f"{self.base_label} + throttle in {where} {self.rate(offered_qps)}/s{b} ({self.throttle} offered)"


ALL = (Topology("nomesh", ""), Topology("sidecar", ""), Topology("sidecar", "below"), Topology("sidecar", "above"),
       Topology("ambient", ""), Topology("waypoint", ""), Topology("waypoint", "below"), Topology("waypoint", "above"))
SHORT = (Topology("nomesh", ""), Topology("sidecar", ""), Topology("sidecar", "below"), Topology("ambient", ""),
         Topology("waypoint", "below"))


def plugin(rate: int, burst: int = 0) -> dict:
    return {"rules": [{"name": "default", "rate": f"{rate}/s", "burst": burst, "max_queue_delay": "1s"}]}


class Deployed:
    """Proxies of one topology, running in the lab; `url` is what the client loads."""

    def __init__(self, url: str, proxies: list[NodeEnvoy]):
        self.url, self.proxies = url, proxies

    def stop(self) -> None:
        for p in reversed(self.proxies):
            p.stop()


def render(topo: Topology, lab_dir: Path, certs: dict, addrs: dict[str, str], offered_qps: float,
           conns: int, tag: str = "") -> list[tuple[str, str, dict]]:
    """(node, proxy name, Envoy config) for every proxy of a topology. Pure: used by the lab and by the
    `envoy --mode validate` test."""
    rate = topo.rate(offered_qps)
    thr = plugin(rate, topo.burst(conns)) if rate else None
    app, wp = addrs["app"], addrs.get("waypoint")
    authority = f"{app}:{AppServer.PORT}"

    def sock(name: str) -> Path:
        return lab_dir / f"{name}{tag}.admin"

    if topo.key == "nomesh":
        return []
    if topo.key == "sidecar":
        return [("app", "sidecar-inbound", configs.sidecar_inbound(sock("sidecar-inbound"), certs, app, INBOUND_PORT,
                                                                     AppServer.PORT, thr)),
                ("client", "sidecar-outbound", configs.sidecar_outbound(sock("sidecar-outbound"), certs, OUT_PORT, app,
                                                                        INBOUND_PORT))]
    if topo.key == "ambient":
        return [("app", "node-app", configs.node_inbound(sock("node-app"), certs, app, AppServer.PORT)),
                ("client", "node-client", configs.node_outbound(sock("node-client"), certs, OUT_PORT, app,
                                                                certs["app"]["san"], authority))]
    if topo.key == "waypoint":
        assert wp is not None, "the waypoint topology needs a waypoint node"
        return [("app", "node-app", configs.node_inbound(sock("node-app"), certs, app, AppServer.PORT)),
                ("waypoint", "waypoint", configs.waypoint(sock("waypoint"), certs, wp, app, authority, thr)),
                ("client", "node-client", configs.node_outbound(sock("node-client"), certs, OUT_PORT, wp,
                                                                certs["waypoint"]["san"], authority))]
    raise KeyError(topo.key)


def deploy(lab: Lab, topo: Topology, certs: dict, offered_qps: float, conns: int, concurrency: int = 2) -> Deployed:
    addrs = {name: node.addr for name, node in lab.nodes.items()}
    proxies: list[NodeEnvoy] = []
    try:
        for node, name, cfg in render(topo, lab.dir, certs, addrs, offered_qps, conns):
            proxies.append(NodeEnvoy(lab[node], name, cfg, concurrency=concurrency).start())
    except BaseException:
        for p in proxies:
            p.stop()
        raise
    if topo.key == "nomesh":
        url = f"http://{addrs['app']}:{AppServer.PORT}{APP_PATH}"
    else:
        url = f"http://127.0.0.1:{OUT_PORT}{APP_PATH}"
    return Deployed(url, proxies)
