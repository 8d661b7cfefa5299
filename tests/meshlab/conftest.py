"""Fixtures of the mesh-lab tests: per-session certificates, and a lab (root + `ip netns` only)."""

from __future__ import annotations

import pytest

from harness.procs import go_bin
from perf.meshlab.certs import make_certs
from perf.meshlab.lab import AppServer, Lab, LabUnavailable, check_available


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("meshlab-certs"), ("client", "app", "waypoint"))


@pytest.fixture(scope="session")
def lab_ok():
    try:
        check_available()
    except LabUnavailable as e:
        pytest.skip(f"mesh lab needs network namespaces: {e}")


@pytest.fixture(scope="module")
def lab(lab_ok):
    with Lab() as lab:
        AppServer(lab["app"], go_bin("fortio")).start()
        yield lab
    assert lab.leftover_namespaces() == []
