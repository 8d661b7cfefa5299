"""The arms' Envoy configurations and the benchmark's data file (pure)."""

from __future__ import annotations

import json

from harness.procs import plugin_config, throttle_filter
from perf.adaptive.arms import ROUTE_TIMEOUT, envoy_config
from perf.adaptive.run import load_spec


def filters(cfg: dict) -> list[str]:
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return [f["name"] for f in hcm["http_filters"]]


def test_each_arm_has_its_one_filter_and_the_route_timeout():
    spec = load_spec()
    want = {"none": [], "ac-default": ["envoy.filters.http.adaptive_concurrency"],
            "ac-tuned": ["envoy.filters.http.adaptive_concurrency"],
            "admission": ["envoy.filters.http.admission_control"],
            "throttle-high": ["throttle"], "throttle-low": ["throttle"], "throttle-adaptive": ["throttle"]}
    assert set(spec["arms"]) == set(want)
    for name, arm in spec["arms"].items():
        cfg = envoy_config(arm, listen_port=1, admin_port=2, upstream_port=3)
        assert filters(cfg) == [*want[name], "envoy.filters.http.router"], name
        routes = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
            "route_config"]["virtual_hosts"][0]["routes"]
        assert {r["route"]["timeout"] for r in routes} == {ROUTE_TIMEOUT}


def test_throttle_arms_carry_their_rule():
    spec = load_spec()
    cfg = envoy_config(spec["arms"]["throttle-adaptive"], listen_port=1, admin_port=2, upstream_port=3,
                       max_queue_delay="1500ms")
    assert throttle_filter(cfg) is not None
    assert json.loads(plugin_config(cfg)) == {"rules": [{
        "name": "api", "max_queue_delay": "1500ms", "rate": "250/s",
        "adaptive": {"min_rate": "10/s", "max_rate": "1000/s"}}]}


def test_sets_name_existing_scenarios_and_arms():
    spec = load_spec()
    for s in spec["sets"].values():
        assert set(s["scenarios"]) <= set(spec["scenarios"])
        assert set(s["arms"]) <= set(spec["arms"])
    for name, sc in spec["scenarios"].items():
        assert sc["phases"][0]["at"] == 0, name
        assert all(p["at"] < sc["duration"] for p in sc["phases"]), name
