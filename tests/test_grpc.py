"""gRPC calls the throttle rejects get RESOURCE_EXHAUSTED (8), which gRPC
clients and Istio's default retry policy do not retry at once, with a clean
`grpc-message`; and behind an Envoy with Istio's default retry policy, 10
calls reach the throttle 10 times (with UNAVAILABLE, 14, they were 16)."""

from __future__ import annotations

import urllib.parse

import pytest

from harness.envoy import Envoy
from harness.net import free_port
from tests.support.clients import GRPC_EMPTY_MESSAGE, grpc_headers, h2c

pytestmark = pytest.mark.integration


def test_rejected_grpc_calls_are_resource_exhausted_with_a_clean_message(envoy_with):
    envoy = envoy_with({"rules": [{"name": "g", "rate": "1/h", "max_queue_delay": "0s"}]})
    answers = h2c(envoy.port, [(grpc_headers(envoy.port), GRPC_EMPTY_MESSAGE)] * 3)
    rejected = [a for a in answers if a.all("grpc-status") == ["8"]]
    print([(a.status, a.headers, a.trailers) for a in answers])
    assert len(rejected) == 2, answers
    for a in rejected:
        # A trailers-only gRPC answer: HTTP 200, grpc-status 8, the message
        # without the trailing newline an HTTP body has.
        assert a.status == 200
        assert [urllib.parse.unquote(m) for m in a.all("grpc-message")] == ["throttled: retry later"]
        assert 3599 <= int(a.all("retry-after")[0]) <= 3600, a.headers  # its turn is an hour away
    assert envoy.rule_stats("g")["rejected"] == 2


def istio_like_client_proxy(target_port: int) -> dict:
    """An Envoy in front of the throttle with Istio's default retry policy
    (2 attempts on connect-failure, refused-stream, unavailable, cancelled,
    retriable-status-codes 503), speaking HTTP/2 to it, as a client sidecar."""
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": free_port()}}},
        "static_resources": {
            "listeners": [{
                "name": "outbound",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": free_port()}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "outbound",
                        "codec_type": "AUTO",
                        "route_config": {"virtual_hosts": [{
                            "name": "all", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"}, "route": {
                                "cluster": "throttled",
                                "retry_policy": {
                                    "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
                                    "num_retries": 2,
                                    "retriable_status_codes": [503],
                                }}}]}]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                    }}]}],
            }],
            "clusters": [{
                "name": "throttled",
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}}}},
                "load_assignment": {"cluster_name": "throttled", "endpoints": [{"lb_endpoints": [{"endpoint": {
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": target_port}}}}]}]},
            }],
        },
    }


def test_istios_default_retry_policy_does_not_multiply_rejected_calls(envoy_with):
    throttle = envoy_with({"rules": [{"name": "g", "rate": "1/h", "max_queue_delay": "0s"}]})
    with Envoy(istio_like_client_proxy(throttle.port)) as client:
        answers = h2c(client.port, [(grpc_headers(client.port), GRPC_EMPTY_MESSAGE)] * 10)
        stats = throttle.rule_stats("g")
        retries = client.stats("cluster.throttled.upstream_rq_retry")
    statuses = [a.all("grpc-status") for a in answers]
    print(f"grpc-status {statuses}; throttle {stats}; client retries {retries}")
    assert statuses.count(["8"]) == 9, statuses
    # Each call reached the throttle once: no retries of RESOURCE_EXHAUSTED.
    assert stats["admitted"] + stats["rejected"] == 10, stats
    assert retries.get("", 0) == 0, retries
