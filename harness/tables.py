"""Tables of the reports: Markdown through `tabulate` (GitHub style), one number
formatter, and the fixed-column CSV files the runners write."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

#: A table as (headers, rows of cells already formatted).
Table = tuple[list[str], list[list[str]]]


def num(value: Any, spec: str | None = None, missing: str = "") -> str:
    """The one number formatter: `value` in format `spec` (`".2f"`, `"+.1f"`, `",.0f"`, ...),
    by default a float with one decimal and an int as it is; `missing` for None or an
    empty CSV cell; text is kept as it is."""
    if value is None or value == "":
        return missing
    if isinstance(value, str):
        return value
    return format(value, spec or (".1f" if isinstance(value, float) else "d"))


def markdown(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table; cells are written as given (no number parsing)."""
    return tabulate([["" if c is None else str(c) for c in r] for r in rows], headers=list(headers),
                    tablefmt="github", disable_numparse=True)


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[dict[str, Any]], spec: str = ".3f") -> None:
    """One row per dict, exactly `columns` (other keys are left out), floats in `spec`."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: num(v, spec) if isinstance(v := r.get(k), float) else "" if v is None else str(v)
                        for k in columns})


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
