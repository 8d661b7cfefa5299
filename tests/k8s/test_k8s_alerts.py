"""The alert rules of cluster scope (k8s/monitoring/alerts.yml).

- promtool (the pinned build of tools/setup-k8s.sh) checks them, loads them
  through the shipped prometheus.yml, and runs their unit tests
  (alerts.test.yml); the same tests fail when a threshold is changed.
- A real Prometheus (Debian's, on loopback) with the shipped relabelling and the
  shipped rules scrapes a real Envoy whose cluster-scope rule talks to the real
  engine under a wrong `engine.domain` (every answer is for no counter of the
  throttle): the engine-failure and misconfiguration alerts go pending for that
  rule. ThrottleClusterFallback's 2-minute window would keep it under its
  threshold for a minute of scraping, too long for this tier: promtool's unit
  tests cover it.
"""

from __future__ import annotations

import shutil

import pytest

from harness import fortio
from harness.configs import render
from harness.engine import Engine
from harness.envoy import Envoy
from harness.net import free_port, wait_until
from tests.k8s.test_k8s_dashboards import Prometheus, prometheus_config
from tests.support.k8s import ROOT, run

pytestmark = pytest.mark.k8s

MONITORING = ROOT / "k8s" / "monitoring"
ALERTS = MONITORING / "alerts.yml"
ALERT_TESTS = MONITORING / "alerts.test.yml"


def test_promtool_checks_the_rules(tools):
    r = run([tools["promtool"], "check", "rules", str(ALERTS)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 7 rules found" in r.stdout + r.stderr


def test_shipped_config_loads_the_rules(tools):
    """Without --syntax-only promtool reads the rule files prometheus.yml names (beside it,
    as in the ConfigMap)."""
    r = run([tools["promtool"], "check", "config", str(MONITORING / "prometheus.yml")])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 1 rule files found" in r.stdout + r.stderr


def test_alert_unit_tests_pass(tools):
    r = run([tools["promtool"], "test", "rules", str(ALERT_TESTS)])
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("old,new", [("/ 1000 > 0.5", "/ 1000 > 2"), ("> 0.05", "> 1.5"),
                                     ("throttle_clock_offset_ms >= 100", "throttle_clock_offset_ms >= 1000"),
                                     ("for: 10m", "for: 20m")])
def test_alert_unit_tests_fail_on_a_changed_rule(tools, tmp_path, old, new):
    text = ALERTS.read_text()
    assert old in text, old
    (tmp_path / "alerts.yml").write_text(text.replace(old, new, 1))
    shutil.copy(ALERT_TESTS, tmp_path / "alerts.test.yml")
    r = run([tools["promtool"], "test", "rules", str(tmp_path / "alerts.test.yml")])
    assert r.returncode != 0, f"the unit tests still pass with {old!r} -> {new!r}"


PLUGIN = {"engine": {"cluster": "throttle_engine", "timeout": "50ms", "domain": "wrong_domain"},
          "rules": [{"name": "shared", "rate": "100/s", "max_queue_delay": "200ms", "scope": "cluster",
                     "expected_replicas": 1, "match": {"path_prefix": "/"}}]}
WANT = {"ThrottleEngineFailing", "ThrottleEngineMisconfigured"}


def test_real_prometheus_raises_the_engine_alerts(wasm, upstream, tmp_path):
    with Engine() as engine:
        cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=upstream.port,
                     plugin=PLUGIN, wasm=wasm)
        cfg["static_resources"]["clusters"].append(engine.envoy_cluster())
        with Envoy(cfg, concurrency=2) as envoy:
            prom_cfg = prometheus_config(envoy.admin_port)
            prom_cfg["rule_files"] = [str(ALERTS)]
            with Prometheus(prom_cfg) as prom:
                # 20/s for at most 40 s; stopped as soon as the alerts are seen.
                load = fortio.Load(envoy.url, connections=2, qps=20, duration_s=40, allow_initial_errors=True).start()
                try:
                    def pending() -> set[str]:
                        alerts = prom.api("alerts")["data"]["alerts"]
                        return {a["labels"]["alertname"] for a in alerts
                                if a["labels"].get("throttle_rule") == "shared" and a["state"] in ("pending", "firing")}

                    wait_until(lambda: pending() >= WANT, 35, f"alerts {sorted(WANT)} pending")
                    stats = envoy.rule_stats("shared")
                finally:
                    load.kill()
                alerts = prom.api("alerts")["data"]["alerts"]
    assert stats["engine_calls"] > 0 and stats["failures_config"] == stats["engine_calls"] > 0, stats
    got = {a["labels"]["alertname"]: a for a in alerts}
    for name in WANT:
        a = got[name]
        assert a["labels"]["severity"] in ("warning", "critical"), a
        assert "shared" in a["annotations"]["summary"], a
    # The others stay quiet: the clocks agree, there is one rate under the name.
    assert not {"ThrottleClockOffset", "ThrottleGridMismatch"} & set(got), sorted(got)
