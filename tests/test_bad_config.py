"""A bad configuration is refused: Envoy does not start, and the log names the field."""

import pytest

from harness.procs import Envoy, free_port, render

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
