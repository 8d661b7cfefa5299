"""Fortio JSON results -> the study's tables (avg, p50, p75, p90, p99 and the
difference to the baseline in %), with harness.fortio.Result and
perf.study.table, so cluster runs print like local runs.

Results are files `<dir>/<config>/<load>.json` (what run.py writes).

    python -m perf.mesh.results DIR [--baseline nomesh]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from harness.fortio import Result
from perf.study import table

from .scenarios import BASELINE, CONFIGS, LOADS


class ResultError(ValueError):
    pass


def load_result(path: Path) -> dict:
    """One Fortio JSON result, checked for the fields the tables need."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ResultError(f"{path}: not JSON: {e}") from e
    for key in ("RetCodes", "DurationHistogram", "ActualQPS", "ActualDuration"):
        if key not in data:
            raise ResultError(f"{path}: not a Fortio HTTP result (no {key})")
    if not data["DurationHistogram"].get("Percentiles"):
        raise ResultError(f"{path}: no percentiles (run Fortio with -p 50,75,90,99)")
    return data


def collect(root: Path) -> dict[str, dict[str, dict]]:
    """{load: {config: summary}} for every result file under root."""
    out: dict[str, dict[str, dict]] = {}
    for f in sorted(root.glob("*/*.json")):
        config, load = f.parent.name, f.stem
        out.setdefault(load, {})[config] = Result.from_json(load_result(f)).summary()
    return out


def _order(names: Iterable[str], known: Iterable[str]) -> list[str]:
    return [n for n in known if n in names] + sorted(n for n in names if n not in known)


def tables(results: dict[str, dict[str, dict]], baseline: str = BASELINE) -> str:
    parts = []
    for load in _order(results, [x.name for x in LOADS]):
        by_config = results[load]
        rows = [(c, by_config[c]) for c in _order(by_config, CONFIGS)]
        parts.append(f"### {load}\n\n{table(rows, baseline)}\n")
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="Tables from Fortio JSON results")
    ap.add_argument("dir", type=Path)
    ap.add_argument("--baseline", default=BASELINE)
    a = ap.parse_args(argv)
    print(tables(collect(a.dir), a.baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
