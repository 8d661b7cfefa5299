"""Fixtures of the mesh-lab tests: per-session certificates, a lab (root + `ip netns` +
iptables) with its control plane (`make istio-e2e-setup`'s), and the Bookinfo-shaped services
(ruby, java, node and gunicorn).

Tests marked `lab` need root and `ip netns`; where those are missing they are
skipped with the reason (an environment the lab cannot run in, as `make
perf-mesh` prints SKIPPED), never deselected: selection is by marker only."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from perf.meshlab.certs import make_certs
from perf.meshlab.lab import ALL_NODES, BookinfoApp, Lab, LabUnavailable, check_available


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("lab") is not None:
        try:
            check_available()
        except LabUnavailable as e:
            pytest.skip(f"mesh lab needs network namespaces: {e}")


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    return make_certs(tmp_path_factory.mktemp("meshlab-certs"), ALL_NODES)


@pytest.fixture(scope="session")
def runtimes_ok() -> None:
    missing = [t for t in ("ruby", "java", "javac", "node") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"the Bookinfo-shaped services need {', '.join(missing)}: run `make setup-meshlab`")


@pytest.fixture(scope="module")
def lab(runtimes_ok: None) -> Iterator[Lab]:
    """A lab with every node, its control plane (istiod: perf/meshlab/istiod.py) and the
    application running (as in a measured run)."""
    from perf.bookinfo.services import build_reviews
    from perf.meshlab.run import lab_mesh

    build_reviews()
    with Lab() as lab, lab_mesh(lab):
        lab.app = BookinfoApp(lab).start()
        yield lab
    assert lab.leftover_namespaces() == []


@pytest.fixture(scope="module")
def lab_certs(lab: Lab) -> dict[str, dict[str, str]]:
    """The node proxies' certificates, signed by the lab's istiod (its waypoint trusts them)."""
    assert lab.mesh is not None
    return make_certs(lab.dir / "certs", ALL_NODES, ca=lab.mesh.ca)
