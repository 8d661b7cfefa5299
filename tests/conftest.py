"""Fixtures: the built .wasm, a real upstream, and real Envoys started per test.

Also the guard of the test tiers (pyproject.toml's markers): a test that asks for
a fixture of a heavier tier (a real Envoy, the k8s tools, the mesh lab) without
carrying that tier's marker is a usage error, so `make check` (unmarked tests
only) can never start Envoy by accident."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.configs import render
from harness.envoy import Envoy
from harness.fortio import FortioServer
from harness.net import free_port
from harness.procs import ROOT, WASM, envoy_bin
from harness.upstream import Upstream
from tests.support.tiers import tier_problems


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = tier_problems(items)
    if problems:
        raise pytest.UsageError("test tiers (see tests/README.md):\n  " + "\n  ".join(problems))


def pytest_report_header(config: pytest.Config) -> str:
    try:
        binary = envoy_bin()
    except FileNotFoundError as e:
        return f"envoy: {e}"
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
        version = out.strip().split("version: ")[-1]
    except (OSError, subprocess.SubprocessError) as e:
        version = repr(e)
    return f"envoy: {binary} ({version})"


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
def upstream() -> Iterator[FortioServer]:
    with FortioServer() as server:
        yield server


@pytest.fixture
def app() -> Iterator[Upstream]:
    """The counting upstream (harness/upstream.py): requests in flight, slow, errors, resets."""
    with Upstream() as server:
        yield server


EnvoyStarter = Callable[..., Envoy]


@pytest.fixture
def envoy_with(wasm: Path, upstream: FortioServer) -> Iterator[EnvoyStarter]:
    """Starts Envoy from a shipped config with a given plugin config; stopped after the test."""
    started: list[Envoy] = []

    def start(plugin: dict | str | None = None, base: str = "demo.yaml", concurrency: int = 2,
              upstream_port: int | None = None, mutate: Callable[[dict[str, Any]], None] | None = None) -> Envoy:
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
