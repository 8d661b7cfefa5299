"""Where the harness finds the tools it runs: only in build/bin/ of this checkout.

Every tool (Fortio, Vegeta, the rate limit service, Redis, nginx, HAProxy, ...) is a row of
tools/tools.tsv, which tools/install.sh installs into build/bin/ (`make tool-<row>`): Go tools
are built there, Debian's are linked there. Nothing else is searched: not ~/go/bin, not PATH.
So a make target that runs a tool without depending on its install fails on a warm machine
exactly as it would on a fresh one, and CI from a clean clone sees it.

A pure test (no tier marker: `make check`) never runs a tool; the root conftest.py makes a
lookup from one an error, so argv builders take the tool's path as a parameter."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tools" / "tools.tsv"


class PureTestLookup(RuntimeError):
    """A pure test asked for a tool: it would pass only where the tool happens to be installed."""


# The node id of the pure test running now (set by the root conftest.py), else None.
pure_test: str | None = None


def bin_dir() -> Path:
    """build/bin/ of this checkout, or $THROTTLE_TOOLS_BIN (Bazel's sandboxed tests)."""
    return Path(os.environ.get("THROTTLE_TOOLS_BIN") or ROOT / "build" / "bin")


def rows() -> dict[str, list[str]]:
    """tools/tools.tsv: name -> [how, source, version, binaries, service]."""
    out = {}
    for line in TABLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, *rest = line.split()
            out[name] = rest
    return out


def row_of(binary: str) -> str:
    """The table row that installs `binary` (a row may install several)."""
    for name, (_how, _source, _version, binaries, _service) in rows().items():
        if binary in (b.split("=")[-1] for b in binaries.split(",")):
            return name
    raise KeyError(f"{binary} is no binary of {TABLE.relative_to(ROOT)}")


def version(name: str) -> str:
    """The pinned version of a table row (Go tools)."""
    return rows()[name][2]


def path(binary: str) -> str:
    """The path of a tool's binary, installed by its row of tools/tools.tsv."""
    if pure_test is not None:
        raise PureTestLookup(f"{pure_test} is pure (no tier marker) but looked up the tool {binary!r}: pass the "
                             "path in as a parameter, or mark the test with the tier that installs the tool")
    found = bin_dir() / binary
    if not found.exists():
        row = row_of(binary)
        raise FileNotFoundError(f"{binary} is not installed in this checkout ({found}): the make target that runs "
                                f"it must depend on `tool-{row}` (or run `make tool-{row}`)")
    return str(found)
