"""Did every hop of a request really happen? Per-hop evidence from the proxies' own counters and the
services' own request counts, compared before and after a measured run.

For each call of the Bookinfo graph (client -> productpage -> details, reviews -> ratings), with n
the requests Fortio recorded (every one made the whole fan-out):
- every service: its own count grew by >= n; without a mesh none of them came from loopback, with
  a mesh >= n did (they came through the service's local proxy, not straight from the caller);
- sidecar: the caller's sidecar sent >= n requests on `outbound|9080||<callee>...`, and the callee's
  sidecar received >= n on its inbound HCM (istiod's names);
- ambient: the caller's node proxy tunnelled the call (`tcp.outbound_<callee>`: a connection, and
  >= n x MIN_REQUEST_BYTES received from the caller during the run: L4 sees bytes, not requests),
  and the callee's node proxy terminated HBONE (a CONNECT stream) and sent >= n x
  MIN_REQUEST_BYTES to its app during the run;
- waypoint: additionally, calls to the target went through the waypoint's HCM and its cluster for
  the target's Service (>= n requests) and on to the target's node over HBONE (a tunnel, and the
  bytes); with replicas (`waypoints`), the same summed over them (a run of few connections may
  put them all on one replica: each of the node proxy's 2 workers takes the replicas in turn on
  its own).
Pooled connections and tunnels are made during the warm-up, so their counts are checked as totals.
"""

from __future__ import annotations

from perf.meshlab.lab import NAMESPACE
from perf.meshlab.topologies import WAYPOINT_REPLICAS, edges

STATS_REGEX = (r"(upstream_rq_total|downstream_rq_total|downstream_cx_total|downstream_cx_rx_bytes_total"
               r"|upstream_cx_tx_bytes_total)$")
MIN_REQUEST_BYTES = 16  # "GET / HTTP/1.1\r\n" alone: a lower bound on any request's bytes
# The stat names of istiod's configurations: Istio ends each stat prefix with ";" (its tag
# extraction's separator). A sidecar's cluster for a Service port; its inbound HTTP stats (and the
# waypoint's, for the Service it serves); the waypoint's cluster for the Service, and its HBONE out.
INBOUND_STAT = "inbound_0.0.0.0_9080;"


def outbound_cluster_name(service: str) -> str:
    return f"outbound|9080||{service}.{NAMESPACE}.svc.cluster.local;"


def waypoint_cluster_name(service: str) -> str:
    return f"inbound-vip|9080|http|{service}.{NAMESPACE}.svc.cluster.local;"


def deltas(before: dict, after: dict) -> dict:
    """after - before for every app counter and every proxy counter."""
    apps = {svc: {k: v - before["apps"].get(svc, {}).get(k, 0) for k, v in c.items()}
            for svc, c in after["apps"].items()}
    proxies = {name: {k: v - before["proxies"].get(name, {}).get(k, 0) for k, v in st.items()}
               for name, st in after["proxies"].items()}
    return {"apps": apps, "proxies": proxies}


def check(mode: str, target: str, before: dict, after: dict, n: int) -> list[str]:
    """Problems (empty = every hop of the `mode` topology happened for each of the n requests)."""
    d = deltas(before, after)
    apps, px = d["apps"], d["proxies"]
    problems: list[str] = []

    def need(proxy: str | list[str], stat: str, at_least: int, what: str, total: bool = False) -> None:
        # Connections and HBONE tunnels are pooled: made during the warm-up, they carry the measured
        # run without a new one, so their counts are checked as totals; requests and bytes as growth.
        # A list of proxies (a waypoint's replicas): their counters summed.
        names = [proxy] if isinstance(proxy, str) else proxy
        values = [(after["proxies"] if total else px).get(name, {}).get(stat) for name in names]
        missing = [name for name, v in zip(names, values, strict=True) if v is None]
        got = sum(v for v in values if v is not None)
        if missing:
            problems.append(f"{what}: {', '.join(missing)} has no counter {stat}")
        elif got < at_least:
            problems.append(f"{what}: {' + '.join(names)} {stat} grew by {got}, expected >= {at_least}")

    for src, dst in edges(target):
        hop = f"hop {src} -> {dst}"
        got = apps.get(dst, {})
        if got.get("requests", 0) < n:
            problems.append(f"{hop}: {dst} served {got.get('requests', 0)} requests, expected >= {n}")
        if mode == "nomesh":
            if got.get("from_loopback", 0):
                problems.append(f"{hop}: {dst} got {got['from_loopback']} requests from loopback without a mesh")
            continue
        if got.get("from_loopback", 0) < n:
            problems.append(f"{hop}: {dst} got {got.get('from_loopback', 0)} of its requests through its local "
                            f"proxy, expected >= {n} (the call bypassed the mesh)")
        if mode == "sidecar":
            need(f"sidecar-{src}", f"cluster.{outbound_cluster_name(dst)}.upstream_rq_total", n,
                 f"{hop} (caller's sidecar outbound)")
            need(f"sidecar-{dst}", f"http.{INBOUND_STAT}.downstream_rq_total", n,
                 f"{hop} (callee's sidecar inbound)")
        elif mode in ("ambient", "waypoint", "waypoints"):
            need(f"node-{src}", f"tcp.outbound_{dst}.downstream_cx_total", 1, f"{hop} (caller's node proxy)",
                 total=True)
            need(f"node-{src}", f"tcp.outbound_{dst}.downstream_cx_rx_bytes_total", n * MIN_REQUEST_BYTES,
                 f"{hop} (caller's node proxy, bytes from the caller)")
            if mode in ("waypoint", "waypoints") and dst == target:
                wps: str | list[str] = "waypoint" if mode == "waypoint" else \
                    [f"waypoint-{i}" for i in range(WAYPOINT_REPLICAS)]
                need(wps, f"http.{INBOUND_STAT}.downstream_rq_total", n, f"{hop} (waypoint HCM)")
                need(wps, f"cluster.{waypoint_cluster_name(dst)}.upstream_rq_total", n,
                     f"{hop} (waypoint -> {dst})")
                need(wps, "cluster.connect_originate;.upstream_rq_total", 1,
                     f"{hop} (waypoint -> {dst}'s node, HBONE)", total=True)
                need(wps, "cluster.connect_originate;.upstream_cx_tx_bytes_total", n * MIN_REQUEST_BYTES,
                     f"{hop} (waypoint -> {dst}'s node, bytes)")
            need(f"node-{dst}", "http.inbound_hbone.downstream_rq_total", 1, f"{hop} (callee's node proxy, HBONE)",
                 total=True)
            need(f"node-{dst}", "cluster.inbound_app.upstream_cx_tx_bytes_total", n * MIN_REQUEST_BYTES,
                 f"{hop} (callee's node proxy, bytes to its app)")
        else:
            raise KeyError(mode)
    return problems
