"""Fixtures of the reliability suite (marker `reliability`; `make reliability`).

Sizes come from the environment so CI can run a bounded version:
RELIABILITY_HELD (held connections, default 2000), RELIABILITY_SOAK_S (soak
seconds, default 45), RELIABILITY_STORM (cancellation storm size, default 900);
see tests.support.env. Envoy is `ENVOY_BIN` if set (see
tools/setup-envoy-versions.sh), else .venv's."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.envoy import Envoy
from harness.fortio import FortioServer
from harness.net import free_port
from tests.support.dynamic import DynamicEnvoy, dynamic_config


@pytest.fixture
def own_upstream() -> Iterator[Callable[..., FortioServer]]:
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
def envoy_to(envoy_with: Callable[..., Envoy]) -> Callable[..., Envoy]:
    """Starts Envoy (demo.yaml, a given plugin config) towards an upstream port
    (default: the session's Fortio server): tests/conftest.py's envoy_with."""

    def start(plugin: dict | str, upstream_port: int | None = None, concurrency: int = 2,
              mutate: Callable[[dict[str, Any]], None] | None = None) -> Envoy:
        return envoy_with(plugin, upstream_port=upstream_port, concurrency=concurrency, mutate=mutate)

    return start


@pytest.fixture
def dynamic_envoy(wasm: Path, upstream: FortioServer) -> Iterator[Callable[..., DynamicEnvoy]]:
    """Starts an Envoy whose listener (and so the throttle's config) comes from a watched LDS file."""
    started: list[DynamicEnvoy] = []

    def start(plugin: dict | str, drain_time_s: int | None = None) -> DynamicEnvoy:
        lds_dir = Path(tempfile.mkdtemp(prefix="lds-"))
        boot, listener = dynamic_config(listen_port=free_port(), admin_port=free_port(), upstream_port=upstream.port,
                                        plugin=plugin, wasm=wasm, lds_dir=lds_dir)
        e = DynamicEnvoy(boot, listener, lds_dir, drain_time_s=drain_time_s)
        started.append(e)
        e.start()
        return e

    yield start
    for e in started:
        e.stop()
