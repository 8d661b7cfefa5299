"""Applies to every test (tests/ and perf/tests/): a pure test (no tier marker, what
`make check` runs) may not look up a tool (harness/tools.py), because it would then pass only
on a machine where the tool happens to be installed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness import tools
from tests.support.tiers import TIERS


@pytest.fixture(autouse=True)
def _pure_tests_look_up_no_tool(request: pytest.FixtureRequest) -> Iterator[None]:
    marks = {m.name for m in request.node.iter_markers()}
    tools.pure_test = None if marks & set(TIERS) else request.node.nodeid
    try:
        yield
    finally:
        tools.pure_test = None
