"""Reliability suite: faults, floods, reloads and bad input against real Envoy.

Runs only when asked for (`pytest tests/reliability`, `make reliability`), so
`make integration` (`pytest tests`) stays as it was. Long parts are marked
`slow` (`make reliability-slow`). Sizes come from the environment so CI can run
a bounded version: RELIABILITY_HELD (held connections, default 2000),
RELIABILITY_SOAK_S (soak seconds, default 30).
Envoy is `ENVOY_BIN` if set (see tools/setup-envoy-versions.sh), else .venv's."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness.procs import ROOT, Envoy, FortioServer, envoy_bin, free_port, render  # noqa: E402
from dynamic import DynamicEnvoy, dynamic_config  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long reliability runs (10,000 held connections, 10-minute soak)")


def pytest_collection_modifyitems(config, items):
    asked = any("reliability" in str(a) for a in config.args) or os.environ.get("THROTTLE_RELIABILITY")
    if asked:
        return
    mine = [i for i in items if HERE in Path(str(i.fspath)).parents]
    if mine:
        config.hook.pytest_deselected(items=mine)
        items[:] = [i for i in items if i not in mine]


def pytest_report_header(config):
    try:
        out = subprocess.run([envoy_bin(), "--version"], capture_output=True, text=True, timeout=30).stdout
        version = out.strip().split("version: ")[-1]
    except (OSError, subprocess.SubprocessError) as e:
        version = repr(e)
    return f"envoy: {envoy_bin()} ({version})"


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


@pytest.fixture
def own_upstream():
    """A Fortio upstream for this test only (fault tests stop and restart it)."""
    servers: list[FortioServer] = []

    def start(port: int | None = None) -> FortioServer:
        s = FortioServer(port=port).__enter__()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.__exit__(None, None, None)


@pytest.fixture
def envoy_to(envoy_with):
    """Starts Envoy (demo.yaml, a given plugin config) towards an upstream port
    (default: the session's Fortio server): tests/conftest.py's envoy_with."""

    def start(plugin, upstream_port: int | None = None, concurrency: int = 2, mutate=None) -> Envoy:
        return envoy_with(plugin, upstream_port=upstream_port, concurrency=concurrency, mutate=mutate)

    return start


@pytest.fixture
def dynamic_envoy(wasm, upstream):
    """Starts an Envoy whose listener (and so the throttle's config) comes from a watched LDS file."""
    started: list[DynamicEnvoy] = []

    def start(plugin, drain_time_s: int | None = None) -> DynamicEnvoy:
        lds_dir = Path(tempfile.mkdtemp(prefix="lds-"))
        boot, listener = dynamic_config(listen_port=free_port(), admin_port=free_port(), upstream_port=upstream.port,
                                        plugin=plugin, wasm=wasm, lds_dir=lds_dir)
        e = DynamicEnvoy(boot, listener, lds_dir, drain_time_s=drain_time_s)
        started.append(e)
        return e.start()

    yield start
    for e in started:
        e.stop()


__all__ = ["ROOT", "env_int"]
