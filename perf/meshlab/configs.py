"""Envoy configurations written by hand for the mesh lab: only the node proxy, standing in for
ztunnel (ambient mode's node proxy, which is not obtainable here). Sidecars and the waypoint take
their configuration from a real istiod (perf/meshlab/istiod.py).

- node_proxy   captured TCP in on 15001, HBONE out [ztunnel outbound]; HBONE in on 15008, TCP to
               the app [ztunnel inbound]

HBONE = HTTP/2 CONNECT over mutual TLS 1.3 on port 15008, the :authority naming the destination:
the pod's address, or the Service's address when the tunnel goes to the Service's waypoint.
"""

from __future__ import annotations

import copy
from pathlib import Path

from harness.configs import load_config

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
TCP_PROXY = "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
ROUTER = {"name": "envoy.filters.http.router",
          "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
HTTP_OPTS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
HBONE_PORT = 15008
# ztunnel speaks TLS 1.3 only, and Istio's waypoint refuses TLS 1.2 from its clients.
TLS13 = {"tls_minimum_protocol_version": "TLSv1_3", "tls_maximum_protocol_version": "TLSv1_3"}


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
    ctx["tls_params"] = TLS13
    return {"name": "envoy.transport_sockets.tls",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                             "require_client_certificate": True, "common_tls_context": ctx}}


def upstream_tls(ident: dict, alpn: list[str], peer_san: str, sni: str) -> dict:
    ctx = _tls_certificate(ident)
    ctx["validation_context"] = _validation(ident, peer_san)
    ctx["alpn_protocols"] = alpn
    ctx["tls_params"] = TLS13
    return {"name": "envoy.transport_sockets.tls",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                             "sni": sni, "common_tls_context": ctx}}


def _addr(host: str, port: int) -> dict:
    return {"socket_address": {"address": host, "port_value": port}}


def _cluster(name: str, host: str | list[str], port: int, transport_socket: dict | None = None, h2: bool = False) -> dict:
    hosts = [host] if isinstance(host, str) else host
    c: dict = {"name": name, "type": "STATIC", "connect_timeout": "2s",
               "load_assignment": {"cluster_name": name,
                                   "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _addr(h, port)}}
                                                                   for h in hosts]}]},
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


# --- ambient: node proxies (Envoy speaking HBONE, standing in for ztunnel) -----------------

ORIGINAL_DST = {"name": "envoy.filters.listener.original_dst", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}}


def node_proxy(admin: Path, certs: dict, me: str, addr: str, routes: dict[str, tuple[str, str | list[str], str]],
               inbound: bool, out_port: int = 15001, app_port: int = 9080) -> dict:
    """A node's proxy in ambient mode (ztunnel's two halves):
    - outbound capture on 127.0.0.1:`out_port`: the iptables REDIRECT sends the workload's connections
      here; `original_dst` recovers where each was going, and a filter chain per destination turns it
      into one HTTP/2 CONNECT stream (HBONE, mTLS on 15008) to that workload's node proxy, or to its
      waypoint. `routes` = {service: (the address the caller dials, which is also the tunnel's
      :authority, HBONE peer address (or addresses: a waypoint's replicas, taken in turn per
      connection), HBONE peer SAN)};
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
