"""The load scenarios and mesh configurations of the comparison, as data.

Loads follow Istio's published ambient-vs-no-mesh study: 100 RPS over 10
connections to details (keep-alive, then `Connection: close`), 1000 RPS / 100
connections and 4000 RPS / 400 connections to productpage.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Load:
    name: str
    url: str
    qps: int
    connections: int
    duration: str = "60s"
    headers: tuple[str, ...] = field(default_factory=tuple)

    def fortio_request(self) -> dict:
        """Body of a Fortio REST API run (/fortio/rest/run), JSON result."""
        body: dict[str, dict[str, str | list[str]]] = {"metadata": {"url": self.url, "qps": str(self.qps), "c": str(self.connections),
                             "t": self.duration, "p": "50,75,90,99,99.9", "timeout": "10s",
                             "labels": self.name}}
        if self.headers:
            body["metadata"]["headers"] = list(self.headers)
        if any(h.lower() == "connection: close" for h in self.headers):
            # and never reuse a connection on the client side either: one request per connection
            body["metadata"]["connection-reuse"] = "1:1"
        return body


DETAILS = "http://details.bookinfo:9080/details/0"
PRODUCTPAGE = "http://productpage.bookinfo:9080/productpage"

LOADS = (
    Load("details-100rps-10c", DETAILS, 100, 10),
    Load("details-100rps-10c-close", DETAILS, 100, 10, headers=("Connection: close",)),
    Load("productpage-1000rps-100c", PRODUCTPAGE, 1000, 100),
    Load("productpage-4000rps-400c", PRODUCTPAGE, 4000, 400),
)

# Overlays under k8s/overlays, in run order; the first is the baseline of every table.
CONFIGS = (
    "nomesh",
    "sidecar",
    "sidecar-throttle",
    "ambient",
    "ambient-waypoint",
    "ambient-waypoint-throttle",
)
BASELINE = "nomesh"
