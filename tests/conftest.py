"""Fixtures: the built .wasm, a real upstream, and real Envoys started per test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.procs import WASM, Envoy, FortioServer, free_port, render  # noqa: E402
from harness.upstream import Upstream  # noqa: E402


@pytest.fixture(scope="session")
def wasm() -> Path:
    """The release .wasm, built once per session if missing (make test builds it first).

    THROTTLE_WASM names another .wasm to test (the Bazel test wrappers pass the Bazel-built one)."""
    override = os.environ.get("THROTTLE_WASM")
    if override:
        path = Path(override).absolute()
        if not path.is_file():
            raise FileNotFoundError(f"THROTTLE_WASM={override}: no such file")
        return path
    if not WASM.exists():
        subprocess.run(["cargo", "build", "--release", "--target", "wasm32-wasip1", "-p", "throttle-wasm"],
                       cwd=ROOT, check=True)
    return WASM


@pytest.fixture(scope="session")
def upstream():
    with FortioServer() as server:
        yield server


@pytest.fixture
def app():
    """The counting upstream (harness/upstream.py): requests in flight, slow, errors, resets."""
    with Upstream() as server:
        yield server


@pytest.fixture
def envoy_with(wasm, upstream):
    """Starts Envoy from a shipped config with a given plugin config; stopped after the test."""
    started: list[Envoy] = []

    def start(plugin: dict | str | None = None, base: str = "demo.yaml", concurrency: int = 2,
              upstream_port: int | None = None, mutate=None) -> Envoy:
        """`mutate(cfg)` may change the rendered Envoy config before it starts."""
        cfg = render(base, listen_port=free_port(), admin_port=free_port(),
                     upstream_port=upstream_port or upstream.port, plugin=plugin, wasm=wasm)
        if mutate:
            mutate(cfg)
        envoy = Envoy(cfg, concurrency=concurrency)
        started.append(envoy)
        return envoy.start()

    yield start
    for e in started:
        e.stop()
