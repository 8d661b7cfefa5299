"""Tables of the reports: Markdown through `tabulate` (GitHub style), one number
formatter, and the fixed-column CSV files the runners write."""

from __future__ import annotations

import base64
import csv
import html
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import markdown as markdown_lib
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


CSS = ("body{font-family:sans-serif;margin:24px auto;max-width:1400px;color:#222}"
       "table{border-collapse:collapse;margin:8px 0 24px;font-size:13px}"
       "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f0f0f0}"
       "td:first-child,th:first-child{text-align:left}img{max-width:100%;margin:8px 0 24px}")


def html_page(title: str, md: str, images: Mapping[str, bytes] = {}) -> str:
    """A self-contained HTML page of a Markdown report (python-markdown, tables included);
    an image `![alt](name)` whose name is a key of `images` is embedded as PNG data."""
    for name, png in (images or {}).items():
        md = md.replace(f"]({name})", f"](data:image/png;base64,{base64.b64encode(png).decode()})")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n{markdown_lib.markdown(md, extensions=['tables'])}\n</body></html>\n")


def png(fig: Any) -> bytes:
    """A matplotlib figure as PNG (90 dpi, trimmed), the figure closed."""
    import matplotlib.pyplot as plt  # only the reports that draw need it

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[dict[str, Any]], spec: str = ".3f") -> None:
    """One row per dict, exactly `columns` (other keys are left out), floats in `spec`."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: num(v, spec) if isinstance(v := r.get(k), float) else "" if v is None else str(v)
                        for k in columns})


def numbers(rows: Iterable[dict[str, Any]], text: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Rows as read from CSV with every value a float (None for an empty cell) but in `text`."""
    return [{k: v if k in text else None if v in (None, "") else float(v) for k, v in r.items()} for r in rows]


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
