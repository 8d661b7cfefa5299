"""A bad configuration is refused: Envoy does not start, and the log names the field."""

import pytest

from harness.configs import render
from harness.envoy import Envoy
from harness.net import free_port

pytestmark = pytest.mark.integration

CASES: dict[str, tuple[dict | str, str]] = {
    "unknown field": ({"rules": [{"name": "default", "rate": "500/s", "colour": "red"}]},
                      "rules[0].colour: unknown field"),
    "negative burst": ({"rules": [{"name": "default", "rate": "500/s", "burst": -1}]},
                       "rules[0].burst: must be an integer from 0 to 1000000, got -1"),
    "rate fast": ({"rules": [{"name": "default", "rate": "fast"}]},
                  'rules[0].rate: expected "<n>/s", "<n>/m", "<n>/h" or a number per second, got "fast"'),
    "empty rules": ({"rules": []}, "rules: must contain at least one rule"),
    "not json": ("{rules", "(config): invalid JSON"),
    "delay out of range": ({"rules": [{"name": "default", "rate": "500/s", "max_queue_delay": "2h"}]},
                           'rules[0].max_queue_delay: must be from 0 to 1h, got "2h"'),
    "duplicate key": ('{"rules": [{"name": "default", "rate": "5/s", "rate": "500/s"}]}',
                      "rules[0].rate: duplicate field"),
    "quota above rate": ({"rules": [{"name": "t", "rate": "10/s", "key": {"header": "x-t"}, "key_quota": "20/s"}]},
                         "rules[0].key_quota: must not exceed `rate`"),
    "empty header name": ({"rules": [{"name": "h", "rate": 1, "match": {"headers": {"": True}}}]},
                          'rules[0].match.headers."": must be a header name'),
    "adaptive start below min": ({"rules": [{"name": "a", "rate": 5, "adaptive": {"min_rate": 10, "max_rate": 20}}]},
                                 "rules[0].adaptive.min_rate: must not exceed `rate` (the rate it starts at lies "
                                 "within its bounds)"),
    "adaptive mode": ({"rules": [{"name": "a", "rate": 10, "adaptive": {"min_rate": 1, "max_rate": 20,
                                                                          "mode": "learn"}}]},
                      'rules[0].adaptive.mode: must be one of "enforce", "observe", got "learn"'),
    "adaptive cluster": ({"engine": {"cluster": "throttle_engine"},
                          "rules": [{"name": "a", "rate": 10, "scope": "cluster",
                                     "adaptive": {"min_rate": 1, "max_rate": 20}}]},
                         'rules[0].adaptive: cannot be combined with `scope: "cluster"`'),
    "adaptive floor far below the rate": ({"rules": [{"name": "a", "rate": "100/s",
                                                      "adaptive": {"min_rate": "1/h", "max_rate": "1000/s"}}]},
                                          "rules[0].adaptive.min_rate: must be at least 1% of `rate` (100/s), got 1/h"),
    "class matching everything": ({"rules": [{"name": "a", "rate": 10,
                                              "classes": [{"name": "hi", "match": {}}, {"name": "rest"}]}]},
                                  "rules[0].classes[0].match: is empty: it fits every request"),
    "two classes with one match": ({"rules": [{"name": "a", "rate": 10, "classes": [
        {"name": "hi", "match": {"path_prefix": "/hi"}}, {"name": "hi2", "match": {"path_prefix": "/hi"}},
        {"name": "rest"}]}]}, 'rules[0].classes[1].match: the same as classes[0].match ("hi"), which fits first: '
                               'no request could ever take class "hi2"'),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_config_is_refused_naming_the_field(case, wasm, upstream):
    plugin, message = CASES[case]
    cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=upstream.port,
                 plugin=plugin, wasm=wasm)
    rc, log = Envoy(cfg).run_to_exit()
    assert rc not in (0, -1), "envoy started with a bad config"
    assert f"config refused: {message}" in log, log[-3000:]
    assert "panic" not in log


def test_a_good_config_is_logged_as_it_means(envoy_with):
    envoy = envoy_with({"rules": [{"name": "slow", "rate": "0.5/s", "max_queue_delay": "1h"}]})
    # 0.5/s is one per two seconds (it was logged as "1/1s"); 1h is accepted.
    assert "slow: rate 1/2s (interval 2000000000ns), burst 0, max_queue_delay 3600000ms" in envoy.log()
