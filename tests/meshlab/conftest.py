"""Fixtures of the mesh-lab tests: per-session certificates, a lab (root + `ip netns` + iptables only),
and the Bookinfo-shaped services on loopback (ruby, java, node and gunicorn only)."""

from __future__ import annotations

import shutil

import pytest

from perf.meshlab.certs import make_certs
from perf.meshlab.lab import ALL_NODES, BookinfoApp, Lab, LabUnavailable, check_available


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: needs root, `ip netns` and iptables (network namespaces); skips without")


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("meshlab-certs"), ALL_NODES)


@pytest.fixture(scope="session")
def lab_ok():
    try:
        check_available()
    except LabUnavailable as e:
        pytest.skip(f"mesh lab needs network namespaces: {e}")


@pytest.fixture(scope="session")
def runtimes_ok():
    missing = [t for t in ("ruby", "java", "javac", "node") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"the Bookinfo-shaped services need {', '.join(missing)}: run `make setup-meshlab`")


@pytest.fixture(scope="module")
def lab(lab_ok, runtimes_ok):
    """A lab with every node and the application running (as in a measured run)."""
    from perf.bookinfo.services import build_reviews

    build_reviews()
    with Lab() as lab:
        lab.app = BookinfoApp(lab).start()
        yield lab
    assert lab.leftover_namespaces() == []
