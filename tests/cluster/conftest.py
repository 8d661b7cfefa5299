"""Fixtures of the cluster-scope tests: the `test-clock` build of the filter."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.procs import ROOT

CLOCK_WASM = ROOT / "target" / "test-clock" / "wasm32-wasip1" / "release" / "throttle.wasm"


@pytest.fixture(scope="session")
def clock_wasm() -> Path:
    """The filter built with the test-only `test-clock` feature (its wall clock
    moved by THROTTLE_TEST_WALL_OFFSET_MS from the VM's environment), in its own
    target directory so the release .wasm stays the shipped one. Built once per
    session (cargo's own check when it is up to date: about a second)."""
    subprocess.run(["cargo", "build", "--release", "--target", "wasm32-wasip1", "-p", "throttle-wasm",
                    "--features", "test-clock", "--target-dir", "target/test-clock"], cwd=ROOT, check=True)
    assert CLOCK_WASM.is_file(), CLOCK_WASM
    return CLOCK_WASM
