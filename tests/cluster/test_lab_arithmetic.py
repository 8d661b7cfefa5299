"""The cluster lab's arithmetic and configuration builders (pure: no Envoy, no
engine): windows over arrival times, the stated bound, recovery times, the
load plan, and the Envoy configurations it renders."""

from __future__ import annotations

import pytest

from harness import windows
from harness.cluster import (
    LAB_HEADER,
    NATIVE_KEY,
    fortio_plan,
    log_5xx,
    log_refusals,
    native_ratelimit_config,
    plugin_config,
    proxy_config,
    split,
    uniform_load,
)
from harness.engine import hits
from harness.net import wait_until
from harness.stalls import StallMonitor


def test_count_and_rate_use_half_open_windows():
    stamps = [0.0, 0.1, 0.2, 0.3]
    assert windows.count_between(stamps, 0.1, 0.3) == 2  # 0.1 and 0.2; 0.3 is the next window's
    assert windows.rate(stamps, 0.0, 0.4) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="empty span"):
        windows.rate(stamps, 1.0, 1.0)


def test_window_counts_leave_out_a_partial_last_window():
    stamps = [0.05, 0.5, 1.2, 1.7, 2.5]
    assert windows.window_counts(stamps, 0.0, 2.6, 1.0) == [2, 2]


def test_the_busiest_window_is_found_wherever_it_starts():
    # 10 evenly spaced, then 4 bunched within 30 ms straddling a fixed 100 ms boundary.
    stamps = [i * 0.01 for i in range(10)] + [0.185, 0.195, 0.205, 0.215]
    n, at = windows.busiest_window(stamps, 0.1)
    assert n == 10 and at == 0.0
    # Inside [0.12, 0.3): only the bunch, wherever the fixed windows would cut it.
    n, at = windows.busiest_window(stamps, 0.1, 0.12, 0.3)
    assert (n, at) == (4, 0.185)
    # A window must lie inside the span: none of width 0.1 fits in [0.2, 0.25).
    assert windows.busiest_window(stamps, 0.1, 0.2, 0.25)[0] == 0


def test_the_stated_bound():
    assert windows.bound(300, 0.1) == 32
    assert windows.bound(300, 0.1, burst=5) == 37
    assert windows.bound(1000, 1.0) == 1002


def test_recovered_at_finds_when_the_rate_came_back():
    # 100/s until 1.0, nothing until 1.5, then 100/s again.
    stamps = [i / 100 for i in range(100)] + [1.5 + i / 100 for i in range(100)]
    t = windows.recovered_at(stamps, 1.0, 100.0, width=0.2, fraction=0.9)
    assert t is not None and 1.47 <= t <= 1.5
    assert windows.recovered_at(stamps[:100], 1.0, 100.0) is None


def test_the_load_plan_offers_the_rate_with_enough_connections():
    for qps, mqd, duration in ((540, 1.0, 10), (90, 1.0, 10), (30, 2.0, 8), (1800, 1.0, 10), (5, 0.5, 3)):
        conns, calls = fortio_plan(qps, mqd, duration)
        assert calls % conns == 0, "a remainder would go to one connection, which then runs long"
        assert conns >= 1.5 * qps * mqd, "each connection's interval must exceed the longest hold"
        assert abs(calls / qps - duration) <= max(duration * 0.1, conns / qps), (qps, conns, calls)
    assert split(900, [60, 30, 10]) == pytest.approx([540, 270, 90])
    with pytest.raises(ValueError, match="weights"):
        split(900, [0, 0])


def test_plugin_configs():
    c = plugin_config("300/s", expected_replicas=3, on_engine_failure="deny")
    assert c["engine"] == {"cluster": "throttle_engine", "timeout": "50ms", "fallback_after": "250ms"}
    assert c["rules"][0] == {"name": "orders", "rate": "300/s", "burst": 0, "max_queue_delay": "1s",
                                  "match": {"path_prefix": "/"}, "scope": "cluster", "expected_replicas": 3,
                                  "on_engine_failure": "deny"}
    p = plugin_config("100/s", scope="process")
    assert "engine" not in p and "scope" not in p["rules"][0]
    with pytest.raises(ValueError, match="scope"):
        plugin_config("1/s", scope="global")


def test_proxy_configs_carry_the_engine_cluster_and_tag_requests():
    engine = {"name": "throttle_engine", "type": "STATIC"}
    cfg = proxy_config(plugin_config("300/s"), upstream_port=9, tag="p1", engine_cluster=engine)
    clusters = {c["name"]: c for c in cfg["static_resources"]["clusters"]}
    assert clusters["throttle_engine"] == engine
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["route_config"]["request_headers_to_add"][0]["header"] == {"key": LAB_HEADER, "value": "p1"}


def test_the_refusal_log_is_added_beside_the_5xx_log(tmp_path):
    cfg = proxy_config(plugin_config("300/s"), upstream_port=9, tag="p1")
    log_5xx(cfg, tmp_path / "5xx.log")
    log_refusals(cfg, tmp_path / "429.log")
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert [a["typed_config"]["path"] for a in hcm["access_log"]] == [str(tmp_path / "5xx.log"),
                                                                      str(tmp_path / "429.log")]
    refusals = hcm["access_log"][1]
    assert refusals["filter"]["status_code_filter"]["comparison"]["op"] == "EQ"
    assert refusals["filter"]["status_code_filter"]["comparison"]["value"]["default_value"] == 429
    fmt = refusals["typed_config"]["log_format"]["text_format_source"]["inline_string"]
    assert fmt == "%START_TIME(%s.%3f)% %DURATION% %REQ(:PATH)%\n"  # what ClusterLab.refusals splits


def test_a_uniform_load_carries_its_headers(tmp_path):
    load = uniform_load("http://127.0.0.1:9/c", qps=50, duration_s=4, max_queue_delay_s=1.0,
                        headers=["x-priority: critical"])
    argv = load.argv(tmp_path / "out.json", "fortio")
    assert argv[argv.index("-H") + 1] == "x-priority: critical"


def test_native_config_sends_the_rate_as_its_descriptor():
    cfg = native_ratelimit_config(upstream_port=9, grpc_port=10, rate=300, tag="p0")
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert [f["name"] for f in hcm["http_filters"]] == ["envoy.filters.http.ratelimit", "envoy.filters.http.router"]
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route["rate_limits"] == [{"actions": [{"generic_key": {"descriptor_key": NATIVE_KEY,
                                                                   "descriptor_value": "300"}}]}]
    with pytest.raises(ValueError, match="whole rate"):
        native_ratelimit_config(upstream_port=9, grpc_port=10, rate=2.5, tag="p0")


def test_stall_monitor_worst_counts_the_wake_up_that_ends_the_span():
    m = StallMonitor()
    m.times = [1.0, 1.1, 1.2, 1.5]
    m.lateness = [0.001, 0.002, 0.003, 0.25]
    assert m.worst(1.05, 1.25) == 0.25  # the wake-up at 1.5 was due inside the span: 250 ms late
    assert m.worst(0.0, 1.05) == 0.002
    assert m.worst(2.0, 3.0) == 0.0
    with StallMonitor(period_s=0.001) as live:
        wait_until(lambda: len(live.times) >= 3, 2, "three wake-ups")
    assert all(x >= 0 for x in live.lateness)


def test_the_service_calls_are_read_from_its_prometheus_text():
    text = ("# HELP ratelimit_service_rate_limit_total_hits Metric autogenerated by statsd_exporter.\n"
            "# TYPE ratelimit_service_rate_limit_total_hits counter\n"
            'ratelimit_service_rate_limit_total_hits{domain="envoy_throttle",key1="throttle_members"} 7\n'
            'ratelimit_service_rate_limit_total_hits{domain="envoy_throttle",key1="native_rl_300"} 5\n'
            'ratelimit_service_rate_limit_total_hits{domain="other",key1="throttle_members"} 100\n'
            "# TYPE ratelimit_service_rate_limit_over_limit counter\n"
            'ratelimit_service_rate_limit_over_limit{domain="envoy_throttle",key1="throttle_members"} 50\n')
    assert (hits(text, "throttle_members"), hits(text, "native_rl"), hits("", "native_rl")) == (7, 5, 0)

