"""The test tiers (pytest markers, pyproject.toml) and the guard that keeps heavy fixtures out
of unmarked tests (tests/conftest.py runs it at collection)."""

from __future__ import annotations

import pytest

# The fixtures of the heavier tiers, by the conftest that defines them -> the
# markers of which a test using one must carry at least one.
ENVOY_TIERS = ("integration", "reliability", "k8s", "lab")
TIER_FIXTURES: dict[str, dict[str, tuple[str, ...]]] = {
    "tests.conftest": dict.fromkeys(("wasm", "upstream", "app", "envoy_with"), ENVOY_TIERS),
    "tests.cluster.conftest": {"clock_wasm": ENVOY_TIERS},
    "tests.reliability.conftest": dict.fromkeys(("envoy_to", "own_upstream", "dynamic_envoy"), ENVOY_TIERS),
    "tests.k8s.conftest": dict.fromkeys(("tools", "configured", "rendered", "schemas", "registry", "pushed",
                                           "engine_clusters"), ("k8s",)),
    "tests.meshlab.conftest": {"lab": ("lab",), "runtimes_ok": ("lab",), "lab_certs": ("lab",)},
    "tests.istio_e2e.conftest": dict.fromkeys(("mesh", "sidecar", "cluster", "waypoint", "figures"), ("istio",)),
}
TIERS = ("integration", "reliability", "k8s", "lab", "istio", "perf")


def _needed_tiers(item: pytest.Item, fixture: str) -> tuple[str, ...]:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.get(fixture, ()) if info is not None else ()
    module = getattr(defs[-1].func, "__module__", "") if defs else ""
    return TIER_FIXTURES.get(module, {}).get(fixture, ())


def tier_problems(items: list[pytest.Item]) -> list[str]:
    """Tests whose fixtures or markers need a tier marker they do not carry."""
    problems = []
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        for fixture in sorted(getattr(item, "fixturenames", ())):
            need = _needed_tiers(item, fixture)
            if need and not marks & set(need):
                problems.append(f"{item.nodeid}: uses fixture `{fixture}` but has none of the markers "
                                f"{', '.join(need)}")
        if "slow" in marks and not marks & set(TIERS):
            problems.append(f"{item.nodeid}: marked slow without a tier ({', '.join(TIERS)})")
    return problems
