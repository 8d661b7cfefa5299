"""Fixtures of the mesh-lab tests: per-session certificates, and a lab.

Tests marked `lab` need root and `ip netns`; where those are missing they are
skipped with the reason (an environment the lab cannot run in, as `make
perf-mesh` prints SKIPPED), never deselected: selection is by marker only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.procs import go_bin
from perf.meshlab.certs import make_certs
from perf.meshlab.lab import AppServer, Lab, LabUnavailable, check_available


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("lab") is not None:
        try:
            check_available()
        except LabUnavailable as e:
            pytest.skip(f"mesh lab needs network namespaces: {e}")


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    return make_certs(tmp_path_factory.mktemp("meshlab-certs"), ("client", "app", "waypoint"))


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with Lab() as lab:
        AppServer(lab["app"], go_bin("fortio")).start()
        yield lab
    assert lab.leftover_namespaces() == []


