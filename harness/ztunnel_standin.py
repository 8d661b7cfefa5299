"""A stand-in for ztunnel in one ambient pod: a plain Envoy with a hand-written configuration.

ztunnel (ambient mode's node proxy, written in Rust) is not available here. Its two halves, as the
waypoint and the pods see them, are reproduced with upstream Envoy: this is the only proxy of the
harness whose configuration does not come from istiod, and every report says so.

- outbound: the pod's iptables (nat OUTPUT, proxy's own uid excluded) redirect its connections to
  Service addresses to 127.0.0.1:15001; `original_dst` recovers the destination, and a filter chain
  per Service address:port sends the connection on as ztunnel would: to the Service's waypoint
  (HBONE: HTTP/2 CONNECT over mutual TLS 1.3 to its :15008, `:authority` = the Service address),
  to an ambient pod's own :15008 (HBONE, `:authority` = pod address:port), or, for a pod with a
  sidecar or outside the mesh, as plain TCP to the pod's address (ztunnel's passthrough);
- inbound: terminates HBONE on the pod's address :15008 (any identity of the trust domain, as
  ztunnel's default policy) and connects each tunnel to the application's port.

Its certificate is the pod's identity (`spiffe://<trust domain>/ns/<ns>/sa/<sa>`) signed with
istiod's CA key, as istiod would sign ztunnel's request for that pod.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
TCP_PROXY = "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
HTTP_OPTS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
TLS_UP = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
TLS_DOWN = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
ROUTER = {"name": "envoy.filters.http.router",
          "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
HBONE_PORT = 15008
OUTBOUND_PORT = 15001
ADMIN_PORT = 15000


@dataclass
class Route:
    """Where connections to one Service address:port go."""
    vip: str
    port: int
    kind: str  # "waypoint", "hbone" (ambient pods) or "plain" (sidecar or no mesh)
    endpoints: list[tuple[str, int]]  # (address, port): the waypoint's :15008, or the pods'
    peer_sans: list[str] = field(default_factory=list)  # identities the HBONE peer may present
    weights: list[int] | None = None  # per endpoint (a waypoint's pods): how often each is picked


def sign(directory: Path, name: str, spiffe: str, ca_cert: str, ca_key: str, days: int = 2) -> dict[str, str]:
    """A key and a certificate for `spiffe`, signed by the given CA (openssl CLI)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.pem").write_text(ca_cert)
    (directory / "ca-key.pem").write_text(ca_key)
    (directory / f"{name}.ext").write_text(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=critical,URI:{spiffe}\n")

    def openssl(*args: str) -> None:
        r = subprocess.run(["openssl", *args], cwd=directory, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"openssl {' '.join(args)}: {r.stderr.strip()}")

    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}-key.pem",
            "-out", f"{name}.csr", "-subj", "/O=cluster.local")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
            "-days", str(days), "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    (directory / "ca-key.pem").unlink()
    return {"cert": str(directory / f"{name}.pem"), "key": str(directory / f"{name}-key.pem"),
            "ca": str(directory / "ca.pem")}


def _common_tls(ident: dict[str, str], sans: list[str] | None, prefix: str) -> dict[str, Any]:
    matchers = ([{"san_type": "URI", "matcher": {"exact": s}} for s in sans] if sans
                else [{"san_type": "URI", "matcher": {"prefix": prefix}}])
    return {"tls_certificates": [{"certificate_chain": {"filename": ident["cert"]},
                                  "private_key": {"filename": ident["key"]}}],
            "validation_context": {"trusted_ca": {"filename": ident["ca"]},
                                   "match_typed_subject_alt_names": matchers},
            "alpn_protocols": ["h2"],
            # ztunnel speaks TLS 1.3 only; Istio's waypoint refuses 1.2 from it.
            "tls_params": {"tls_minimum_protocol_version": "TLSv1_3", "tls_maximum_protocol_version": "TLSv1_3"}}


def _cluster(name: str, endpoints: list[tuple[str, int]], tls: dict[str, Any] | None = None, h2: bool = False,
             weights: list[int] | None = None) -> dict[str, Any]:
    lb_endpoints: list[dict[str, Any]] = []
    for i, (a, p) in enumerate(endpoints):
        ep: dict[str, Any] = {"endpoint": {"address": {"socket_address": {"address": a, "port_value": p}}}}
        if weights is not None:
            ep["load_balancing_weight"] = weights[i]
        lb_endpoints.append(ep)
    c: dict[str, Any] = {
        "name": name, "type": "STATIC", "connect_timeout": "5s", "lb_policy": "ROUND_ROBIN",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": lb_endpoints}]},
        "circuit_breakers": {"thresholds": [{"max_connections": 100000, "max_pending_requests": 100000,
                                             "max_requests": 100000}]}}
    if tls is not None:
        c["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {"@type": TLS_UP, "common_tls_context": tls}}
    if h2:
        c["typed_extension_protocol_options"] = {HTTP_OPTS: {
            "@type": f"type.googleapis.com/{HTTP_OPTS}", "explicit_http_config": {"http2_protocol_options": {}}}}
    return c


def config(pod_ip: str, ident: dict[str, str], trust_domain: str, routes: list[Route],
           app_ports: list[int]) -> dict[str, Any]:
    """The stand-in's Envoy bootstrap for one pod (admin on the pod's 127.0.0.1:15000)."""
    listeners: list[dict[str, Any]] = []
    clusters: list[dict[str, Any]] = []
    chains = []
    for r in routes:
        name = f"{r.kind}_{r.vip}_{r.port}"
        match = {"prefix_ranges": [{"address_prefix": r.vip, "prefix_len": 32}], "destination_port": r.port}
        if r.kind == "plain":
            clusters.append(_cluster(name, r.endpoints))
            tp: dict[str, Any] = {"@type": TCP_PROXY, "stat_prefix": name, "cluster": name}
        else:
            tls = _common_tls(ident, r.peer_sans, f"spiffe://{trust_domain}/")
            clusters.append(_cluster(name, r.endpoints, tls, h2=True, weights=r.weights))
            # ztunnel's :authority: the Service address for a waypoint, the pod address otherwise
            # (one endpoint per route then: the caller picked it).
            authority = f"{r.vip}:{r.port}" if r.kind == "waypoint" else f"{r.endpoints[0][0]}:{r.port}"
            tp = {"@type": TCP_PROXY, "stat_prefix": name, "cluster": name,
                  "tunneling_config": {"hostname": authority}}
            if len(r.endpoints) > 1:
                # A waypoint pod whose proxy is down refuses the connection: try the next pod, as
                # ztunnel stops picking a pod once it is not ready (this configuration is static).
                tp["max_connect_attempts"] = len(r.endpoints)
        chains.append({"filter_chain_match": match,
                       "filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": tp}]})
    if chains:
        listeners.append({"name": "outbound_capture",
                          "address": {"socket_address": {"address": "127.0.0.1", "port_value": OUTBOUND_PORT}},
                          "listener_filters": [{"name": "envoy.filters.listener.original_dst", "typed_config": {
                              "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}}],
                          "filter_chains": chains})
    if app_ports:
        routes_in = []
        for port in app_ports:
            clusters.append(_cluster(f"inbound_{port}", [("127.0.0.1", port)]))
            routes_in.append({"match": {"connect_matcher": {},
                                        "headers": [{"name": ":authority",
                                                     "string_match": {"exact": f"{pod_ip}:{port}"}}]},
                              "route": {"cluster": f"inbound_{port}", "timeout": "0s",
                                        "upgrade_configs": [{"upgrade_type": "CONNECT", "connect_config": {}}]}})
        hcm = {"@type": HCM, "stat_prefix": "inbound_hbone", "codec_type": "HTTP2",
               "http2_protocol_options": {"allow_connect": True},
               "upgrade_configs": [{"upgrade_type": "CONNECT"}],
               "stream_idle_timeout": "0s", "request_timeout": "0s",
               "route_config": {"name": "inbound_hbone",
                                "virtual_hosts": [{"name": "hbone", "domains": ["*"], "routes": routes_in}]},
               "http_filters": [ROUTER]}
        tls = _common_tls(ident, None, f"spiffe://{trust_domain}/")
        listeners.append({"name": "inbound_hbone",
                          "address": {"socket_address": {"address": pod_ip, "port_value": HBONE_PORT}},
                          "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                          "typed_config": hcm}],
                                             "transport_socket": {"name": "envoy.transport_sockets.tls",
                                                                  "typed_config": {"@type": TLS_DOWN,
                                                                                   "require_client_certificate": True,
                                                                                   "common_tls_context": tls}}}]})
    return {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": ADMIN_PORT}}},
            "static_resources": {"listeners": listeners, "clusters": clusters}}
