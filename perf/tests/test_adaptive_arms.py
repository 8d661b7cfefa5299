"""The arms' Envoy configurations and the benchmark's data file (pure)."""

from __future__ import annotations

import json

import pytest
import yaml

from harness.configs import hcm, plugin_json, throttle_filter
from perf.adaptive.arms import ROUTE_TIMEOUT, envoy_config
from perf.adaptive.run import SPEC, SpecError, load_spec


def filters(cfg: dict) -> list[str]:
    return [f["name"] for f in hcm(cfg)["http_filters"]]


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
        routes = hcm(cfg)["route_config"]["virtual_hosts"][0]["routes"]
        assert {r["route"]["timeout"] for r in routes} == {ROUTE_TIMEOUT}


def test_throttle_arms_carry_their_rule():
    spec = load_spec()
    cfg = envoy_config(spec["arms"]["throttle-adaptive"], listen_port=1, admin_port=2, upstream_port=3,
                       max_queue_delay="1500ms")
    assert throttle_filter(cfg) is not None
    assert json.loads(plugin_json(cfg)) == {"rules": [{
        "name": "api", "max_queue_delay": "1500ms", "rate": "250/s",
        "adaptive": {"min_rate": "10/s", "max_rate": "1000/s"}}]}


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s["sets"]["full"]["arms"].append("fast"), "scenarios.yaml: sets.full.arms: unknown fast"),
    (lambda s: s["scenarios"]["S1"]["phases"].append({"at": 99}),
     "scenarios.yaml: scenarios.S1.phases: must start at 0, in order, within the duration (45 s)"),
    (lambda s: s["scenarios"]["S1"].update(offered=0), "scenarios.yaml: scenarios.S1.offered: 0 is less than the minimum of 1"),
    (lambda s: s["arms"]["none"].update(filter="admission_control"),
     "scenarios.yaml: arms.none: either `filter` with its `config`, or `throttle`, or neither"),
    (lambda s: s["arms"]["throttle-low"]["throttle"].update(rate=100),
     "scenarios.yaml: arms['throttle-low'].throttle.rate: 100 is not of type 'string'"),
    (lambda s: s["scenarios"]["A503"]["attack"].update(to=99),
     "scenarios.yaml: scenarios.A503.attack: from < to <= the duration (30 s)"),
    (lambda s: s["scenarios"]["A503"]["attack"].update(path="/work"),
     r"scenarios.yaml: scenarios.A503.attack.path: '/work' does not match '^/_fail/\\d{3}(\\?retry_after=\\d+)?$'"),
])
def test_a_bad_data_file_is_refused_naming_the_field(tmp_path, change, message):
    spec = yaml.safe_load(SPEC.read_text())
    change(spec)
    bad = tmp_path / "scenarios.yaml"
    bad.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as e:
        load_spec(bad)
    assert str(e.value) == message


def test_the_first_cut_after_each_change_is_read_from_the_learners_log():
    from perf.adaptive.run import first_cuts
    lines = ["   3.000 'api': adaptive rate 250.0/s -> 300.0/s (probe; ...)",
             "  15.340 'api': adaptive rate 250.0/s -> 110.0/s (queue; ...)",
             "  16.000 'api': adaptive rate 110.0/s -> 90.0/s (shed, retry_after; ...)"]
    phases = [{"at": 0}, {"at": 15}, {"at": 30}]
    assert first_cuts(lines, phases) == {"15": 0.34, "30": None}
