"""The Envoy configuration of each arm (perf/adaptive/scenarios.yaml): the shipped
envoy/baseline.yaml (no filter) or envoy/demo.yaml (the throttle) through
`harness.configs.render`, with a 1.5 s route timeout and the arm's one filter before
the router."""

from __future__ import annotations

import json
from typing import Any

from harness.configs import hcm, render, throttle_filter

ROUTE_TIMEOUT = "1.5s"
NATIVE = {
    "adaptive_concurrency": (
        "envoy.filters.http.adaptive_concurrency",
        "type.googleapis.com/envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency",
    ),
    "admission_control": (
        "envoy.filters.http.admission_control",
        "type.googleapis.com/envoy.extensions.filters.http.admission_control.v3.AdmissionControl",
    ),
}


def throttle_plugin(arm: dict[str, Any], max_queue_delay: str) -> dict[str, Any]:
    """The throttle's plugin configuration of a throttle arm: one rule for every request."""
    rule: dict[str, Any] = {"name": "api", "max_queue_delay": max_queue_delay, **arm["throttle"]}
    return {"rules": [rule]}


def envoy_config(arm: dict[str, Any], *, listen_port: int, admin_port: int, upstream_port: int,
                 max_queue_delay: str = "300ms") -> dict[str, Any]:
    """The full Envoy configuration of an arm."""
    if "throttle" in arm:
        cfg = render("demo.yaml", listen_port=listen_port, admin_port=admin_port, upstream_port=upstream_port,
                     plugin=json.dumps(throttle_plugin(arm, max_queue_delay)))
    else:
        cfg = render("baseline.yaml", listen_port=listen_port, admin_port=admin_port, upstream_port=upstream_port)
    manager = hcm(cfg)
    for vh in manager["route_config"]["virtual_hosts"]:
        for route in vh["routes"]:
            route["route"]["timeout"] = ROUTE_TIMEOUT
    if "filter" in arm:
        name, type_url = NATIVE[arm["filter"]]
        manager["http_filters"].insert(0, {"name": name, "typed_config": {"@type": type_url, **arm["config"]}})
    elif "throttle" not in arm:
        pass
    elif throttle_filter(cfg) is None:
        raise ValueError("demo.yaml has no throttle filter")
    return cfg
