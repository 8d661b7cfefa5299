"""Envoy configuration templates for the mesh lab, one function per proxy role.

Roles (Istio names in brackets):
- sidecar            a workload's sidecar: captured HTTP in on 15001, mTLS (HTTP/1.1) out to the
                     callee's sidecar [virtualOutbound]; mTLS in on 15006, optional throttle, app
                     [virtualInbound]
- node_proxy         ambient node proxy: captured TCP in on 15001, HBONE out [ztunnel outbound];
                     HBONE in on 15008, TCP to the app [ztunnel inbound]
- waypoint           HBONE in (15008) -> internal listener with HCM (+ throttle) -> HBONE out
                     [Istio waypoint: connect_terminate -> main_internal -> connect_originate]

HBONE = HTTP/2 CONNECT over mutual TLS on port 15008, the :authority naming the
destination. The node proxies here are Envoy, not ztunnel.

Every timeout on a throttled path exceeds the throttle's max_queue_delay
(route timeout 15 s, no request timeout), as filters/throttle/README.md requires.
"""

from __future__ import annotations

import copy
from pathlib import Path

from harness.configs import load_config, throttle_http_filter

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
TCP_PROXY = "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
ROUTER = {"name": "envoy.filters.http.router",
          "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
HTTP_OPTS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
HBONE_PORT = 15008


def _base(admin_sock: Path) -> dict:
    demo = load_config("demo.yaml")
    return {"admin": {"address": {"pipe": {"path": str(admin_sock)}}},
            "stats_config": copy.deepcopy(demo["stats_config"]),  # throttle_rule tag, as in envoy/demo.yaml
            "static_resources": {"listeners": [], "clusters": []}}


def _tls_certificate(ident: dict) -> dict:
    return {"tls_certificates": [{"certificate_chain": {"filename": ident["cert"]},
                                  "private_key": {"filename": ident["key"]}}]}


def _validation(ident: dict, peer_san: str | list[str] | None) -> dict:
    vc: dict = {"trusted_ca": {"filename": ident["ca"]}}
    if peer_san:
        sans = [peer_san] if isinstance(peer_san, str) else peer_san
        vc["match_typed_subject_alt_names"] = [{"san_type": "URI", "matcher": {"exact": s}} for s in sans]
    else:  # any workload of the trust domain
        vc["match_typed_subject_alt_names"] = [{"san_type": "URI", "matcher": {"prefix": "spiffe://cluster.local/"}}]
    return vc


def downstream_tls(ident: dict, alpn: list[str], peer_san: str | list[str] | None = None) -> dict:
    ctx = _tls_certificate(ident)
    ctx["validation_context"] = _validation(ident, peer_san)
    ctx["alpn_protocols"] = alpn
    ctx["tls_params"] = {"tls_minimum_protocol_version": "TLSv1_2"}
    return {"name": "envoy.transport_sockets.tls",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                             "require_client_certificate": True, "common_tls_context": ctx}}


def upstream_tls(ident: dict, alpn: list[str], peer_san: str, sni: str) -> dict:
    ctx = _tls_certificate(ident)
    ctx["validation_context"] = _validation(ident, peer_san)
    ctx["alpn_protocols"] = alpn
    return {"name": "envoy.transport_sockets.tls",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                             "sni": sni, "common_tls_context": ctx}}


def _addr(host: str, port: int) -> dict:
    return {"socket_address": {"address": host, "port_value": port}}


def _cluster(name: str, host: str, port: int, transport_socket: dict | None = None, h2: bool = False) -> dict:
    c: dict = {"name": name, "type": "STATIC", "connect_timeout": "2s",
               "load_assignment": {"cluster_name": name,
                                   "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _addr(host, port)}}]}]},
               # The lab's load (up to 400 connections) must not hit Envoy's default breakers (1024).
               "circuit_breakers": {"thresholds": [{"max_connections": 100000, "max_pending_requests": 100000,
                                                    "max_requests": 100000}]}}
    if transport_socket:
        c["transport_socket"] = transport_socket
    if h2:
        c["typed_extension_protocol_options"] = {HTTP_OPTS: {
            "@type": f"type.googleapis.com/{HTTP_OPTS}",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return c


def _internal_cluster(name: str, listener: str) -> dict:
    return {"name": name, "connect_timeout": "2s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"envoy_internal_address": {"server_listener_name": listener}}}}]}]},
            "circuit_breakers": {"thresholds": [{"max_connections": 100000, "max_pending_requests": 100000,
                                                 "max_requests": 100000}]}}


def _hcm(stat_prefix: str, cluster: str, http_filters: list[dict]) -> dict:
    return {"name": "envoy.filters.network.http_connection_manager",
            "typed_config": {"@type": HCM, "stat_prefix": stat_prefix, "codec_type": "AUTO",
                             "stream_idle_timeout": "300s", "request_timeout": "0s",
                             "route_config": {"name": stat_prefix, "virtual_hosts": [{
                                 "name": "all", "domains": ["*"],
                                 "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "15s"}}]}]},
                             "http_filters": [*http_filters, ROUTER]}}


def _connect_terminate_hcm(stat_prefix: str, cluster: str) -> dict:
    """HCM that accepts HTTP/2 CONNECT (HBONE) and forwards the tunnel payload as raw TCP."""
    return {"name": "envoy.filters.network.http_connection_manager",
            "typed_config": {"@type": HCM, "stat_prefix": stat_prefix, "codec_type": "HTTP2",
                             "http2_protocol_options": {"allow_connect": True},
                             "upgrade_configs": [{"upgrade_type": "CONNECT"}],
                             "stream_idle_timeout": "0s", "request_timeout": "0s",
                             "route_config": {"name": stat_prefix, "virtual_hosts": [{
                                 "name": "hbone", "domains": ["*"],
                                 "routes": [{"match": {"connect_matcher": {}},
                                             "route": {"cluster": cluster, "timeout": "0s",
                                                       "upgrade_configs": [{"upgrade_type": "CONNECT",
                                                                            "connect_config": {}}]}}]}]},
                             "http_filters": [ROUTER]}}


def _tcp_tunnel(stat_prefix: str, cluster: str, authority: str) -> dict:
    """tcp_proxy that opens an HTTP/2 CONNECT stream (HBONE) per downstream connection."""
    return {"name": "envoy.filters.network.tcp_proxy",
            "typed_config": {"@type": TCP_PROXY, "stat_prefix": stat_prefix, "cluster": cluster,
                             "tunneling_config": {"hostname": authority}}}


def _listener(name: str, host: str, port: int, filters: list[dict], transport_socket: dict | None = None) -> dict:
    chain: dict = {"filters": filters}
    if transport_socket:
        chain["transport_socket"] = transport_socket
    return {"name": name, "address": _addr(host, port), "filter_chains": [chain]}


# --- sidecar (one Envoy per workload: outbound on 15001, inbound on 15006) ---------------------

SIDECAR_INBOUND_PORT = 15006
INBOUND_STAT = "inbound_0.0.0.0_9080"
OUTBOUND_STAT = "outbound_0.0.0.0_9080"


def outbound_cluster_name(service: str) -> str:
    return f"outbound|9080||{service}.default.svc.cluster.local"


def sidecar(admin: Path, certs: dict, me: str, addr: str, calls: dict[str, str], callers: tuple[str, ...],
            throttle: dict | None = None, out_port: int = 15001, app_port: int = 9080) -> dict:
    """A workload's sidecar, Istio's listeners in small:
    - outbound (if the workload calls anyone): HCM on 127.0.0.1:`out_port`, where the node's iptables
      REDIRECT sends the workload's connections; routes by Host (the service's address, as the app
      dials it) to `outbound|9080||<service>...` = mTLS (ALPN istio-http/1.1) to that workload's
      sidecar inbound port. `calls` = {service: its address};
    - inbound (if anyone calls it, `callers`): `virtualInbound` HCM on `addr`:15006, mutual TLS
      accepting only the callers' SPIFFE identities, the throttle if given, then the app on
      127.0.0.1:`app_port`."""
    cfg = _base(admin)
    ls, cs = cfg["static_resources"]["listeners"], cfg["static_resources"]["clusters"]
    if calls:
        vhosts = [{"name": f"{svc}.default.svc.cluster.local:9080",
                   "domains": [f"{a}:{app_port}", a, f"{svc}:{app_port}", svc],
                   "routes": [{"match": {"prefix": "/"}, "route": {"cluster": outbound_cluster_name(svc),
                                                                   "timeout": "15s"}}]}
                  for svc, a in calls.items()]
        hcm = _hcm(OUTBOUND_STAT, "", [])
        hcm["typed_config"]["route_config"] = {"name": "9080", "virtual_hosts": vhosts}
        ls.append(_listener("virtualOutbound", "127.0.0.1", out_port, [hcm]))
        for svc, a in calls.items():
            cs.append(_cluster(outbound_cluster_name(svc), a, SIDECAR_INBOUND_PORT,
                               upstream_tls(certs[me], ["istio-http/1.1", "istio"], certs[svc]["san"],
                                            f"outbound_.9080_._.{svc}.default.svc.cluster.local")))
    if callers:
        filters = [throttle_http_filter(throttle)] if throttle else []
        tls = downstream_tls(certs[me], ["istio-http/1.1", "istio"], [certs[c]["san"] for c in callers])
        ls.append(_listener("virtualInbound", addr, SIDECAR_INBOUND_PORT,
                            [_hcm(INBOUND_STAT, "inbound|9080||", filters)], tls))
        cs.append(_cluster("inbound|9080||", "127.0.0.1", app_port))
    return cfg


# --- ambient: node proxies (Envoy speaking HBONE, standing in for ztunnel) -----------------

ORIGINAL_DST = {"name": "envoy.filters.listener.original_dst", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}}


def node_proxy(admin: Path, certs: dict, me: str, addr: str, routes: dict[str, tuple[str, str, str]],
               inbound: bool, out_port: int = 15001, app_port: int = 9080) -> dict:
    """A node's proxy in ambient mode (ztunnel's two halves):
    - outbound capture on 127.0.0.1:`out_port`: the iptables REDIRECT sends the workload's connections
      here; `original_dst` recovers where each was going, and a filter chain per destination turns it
      into one HTTP/2 CONNECT stream (HBONE, mTLS on 15008) to that workload's node proxy, or to its
      waypoint. `routes` = {service: (service address, HBONE peer address, HBONE peer SAN)};
    - inbound (`inbound`): terminates HBONE on `addr`:15008 and connects each tunnel to the app on
      127.0.0.1:`app_port`."""
    cfg = _base(admin)
    ls, cs = cfg["static_resources"]["listeners"], cfg["static_resources"]["clusters"]
    if routes:
        chains = []
        for svc, (svc_addr, peer_addr, peer_san) in routes.items():
            chains.append({"filter_chain_match": {"prefix_ranges": [{"address_prefix": svc_addr, "prefix_len": 32}],
                                                  "destination_port": app_port},
                           "filters": [_tcp_tunnel(f"outbound_{svc}", f"hbone_{svc}", f"{svc_addr}:{app_port}")]})
            cs.append(_cluster(f"hbone_{svc}", peer_addr, HBONE_PORT,
                               upstream_tls(certs[me], ["h2"], peer_san, "hbone"), h2=True))
        ls.append({"name": "outbound_capture", "address": _addr("127.0.0.1", out_port),
                   "listener_filters": [copy.deepcopy(ORIGINAL_DST)], "filter_chains": chains})
    if inbound:
        ls.append(_listener("inbound_hbone", addr, HBONE_PORT, [_connect_terminate_hcm("inbound_hbone", "inbound_app")],
                            downstream_tls(certs[me], ["h2"])))
        cs.append(_cluster("inbound_app", "127.0.0.1", app_port))
    return cfg


def waypoint(admin: Path, certs: dict, addr: str, dest_node_addr: str, dest_san: str, authority: str,
             throttle: dict | None = None) -> dict:
    """Waypoint: HBONE in -> internal listener `main_internal` running the HTTP filters (the
    throttle) -> internal listener `connect_originate` -> HBONE to the destination node proxy."""
    cfg = _base(admin)
    cfg["bootstrap_extensions"] = [{"name": "envoy.bootstrap.internal_listener", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"}}]
    filters = [throttle_http_filter(throttle)] if throttle else []
    main = _hcm("main_internal", "connect_originate", filters)
    ls = cfg["static_resources"]["listeners"]
    ls.append(_listener("connect_terminate", addr, HBONE_PORT,
                        [_connect_terminate_hcm("connect_terminate", "main_internal")],
                        downstream_tls(certs["waypoint"], ["h2"])))
    ls.append({"name": "main_internal", "internal_listener": {}, "filter_chains": [{"filters": [main]}]})
    ls.append({"name": "connect_originate", "internal_listener": {},
               "filter_chains": [{"filters": [_tcp_tunnel("connect_originate", "hbone_dest", authority)]}]})
    cs = cfg["static_resources"]["clusters"]
    cs.append(_internal_cluster("main_internal", "main_internal"))
    cs.append(_internal_cluster("connect_originate", "connect_originate"))
    cs.append(_cluster("hbone_dest", dest_node_addr, HBONE_PORT,
                       upstream_tls(certs["waypoint"], ["h2"], dest_san, "hbone"), h2=True))
    return cfg
