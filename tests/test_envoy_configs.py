"""Every shipped Envoy config passes `envoy --mode validate` with the built .wasm
(validate mode loads the module and runs the plugin's on_configure)."""

from pathlib import Path

import pytest

from harness.configs import load_config, render
from harness.envoy import Envoy
from harness.procs import ROOT

pytestmark = pytest.mark.integration

CONFIGS = sorted(p.name for p in (ROOT / "envoy").glob("*.yaml"))


def test_there_are_configs():
    assert {"demo.yaml", "baseline.yaml"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_config_validates(name, wasm):
    raw = load_config(name)
    port = lambda node: node["address"]["socket_address"]["port_value"]  # noqa: E731
    cfg = render(name, listen_port=port(raw["static_resources"]["listeners"][0]),
                 admin_port=raw["admin"]["address"]["socket_address"]["port_value"],
                 upstream_port=8080, wasm=wasm)
    rc, out = Envoy(cfg).validate()
    assert rc == 0, out[-3000:]
    assert "OK" in out


def test_shipped_wasm_path_is_the_release_build():
    """The demo refers to the .wasm that `make build` produces (relative to the repo root)."""
    hf = next(f for f in load_config("demo.yaml")["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
              ["typed_config"]["http_filters"] if f["name"] == "throttle")
    path = hf["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"]
    assert Path(ROOT / path) == ROOT / "target/wasm32-wasip1/release/throttle.wasm"
