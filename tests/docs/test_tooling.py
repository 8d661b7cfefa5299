"""The test vocabulary is written once and used the same way everywhere: the markers of
pyproject.toml, the tiers the conftest guard knows, the `PURE` expression of the Makefile
(what `make check` runs), and the marker expressions of the make targets."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.support.tiers import TIERS

ROOT = Path(__file__).resolve().parent.parent.parent


def declared_markers() -> set[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {m.split(":")[0] for m in cfg["tool"]["pytest"]["ini_options"]["markers"]}


def makefiles() -> str:
    return "\n".join(p.read_text() for p in [ROOT / "Makefile", *sorted((ROOT / "mk").glob("*.mk"))])


def test_the_guard_knows_every_tier_marker():
    assert set(TIERS) | {"slow"} == declared_markers()


def test_pure_excludes_exactly_the_tiers():
    (pure,) = re.findall(r"^PURE := (.+)$", makefiles(), re.M)
    assert set(re.findall(r"[a-z][a-z0-9]*", pure)) - {"not", "or", "and"} == set(TIERS), pure


def test_make_targets_select_by_declared_markers_only():
    exprs = re.findall(r"\$\(PYTEST\)[^\n]*?-m (\"[^\"]+\"|\S+)", makefiles())
    assert len(exprs) >= 6, exprs
    for e in exprs:
        words = set(re.findall(r"[a-z][a-z0-9]*", e)) - {"not", "or", "and"}
        assert words <= declared_markers(), e
    # and never by path or environment, the ways the tests used to be chosen
    assert not re.search(r"pytest[^\n]*\btests/(k8s|reliability|meshlab)\b|K8S_CHECK|THROTTLE_RELIABILITY", makefiles())
