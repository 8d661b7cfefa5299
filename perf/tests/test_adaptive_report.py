"""A run's report is there and can be read: summary, HTML, a non-blank chart per
scenario, figures per phase for every arm that ran, the refusal for an arm the
filter refused. With PERF_ADAPTIVE_DIR (make perf-adaptive, perf-adaptive-quick
set it: perf/reports/adaptive/latest) that run is checked; without, a small synthetic one is rendered (to test
the report only: those figures are not measurements)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from PIL import Image

from perf.adaptive import report

pytestmark = pytest.mark.perf


def _synthetic(out: Path) -> Path:
    (out / "runs").mkdir(parents=True)
    t = [round(0.1 * (k + 1), 1) for k in range(50)]
    for arm, adm in (("none", 200.0), ("throttle-low", 100.0)):
        phase = {"at_s": 0.0, "end_s": 5.0, "capacity": 250.0, "offered": 200.0, "target": 200.0,
                 "attempts_per_s": 200.0, "admitted_per_s": adm, "goodput_per_s": adm, "goodput_share": adm / 200,
                 "ok": int(adm * 5), "local_429": 0, "upstream_429": 0, "e503": 0, "e504": 0, "other_5xx": 0,
                 "no_answer": 0, "p50_ms": 100.0, "p99_ms": 190.0, "upstream_concurrency_max": 22,
                 "time_to_adapt_s": 0.0, "overshoot": 0}
        run = {"scenario": "S0", "arm": arm, "what": "synthetic", "arm_what": arm, "offered": 200.0,
               "duration": 5.0, "phases": [phase], "requests": 1000, "attempts": 1000,
               "series": {"t": t, "admitted": [adm] * 50, "goodput": [adm] * 50, "capacity": [250.0] * 50}}
        (out / "runs" / f"S0--{arm}.json").write_text(json.dumps(run))
    refused = {"scenario": "S0", "arm": "throttle-adaptive", "what": "synthetic", "arm_what": "adaptive",
               "refused": "rules[0].adaptive: not supported by this build yet"}
    (out / "runs" / "S0--throttle-adaptive.json").write_text(json.dumps(refused))
    return out


def test_the_report_is_complete_and_the_charts_are_not_blank():
    given = os.environ.get("PERF_ADAPTIVE_DIR")
    out = Path(given) if given else _synthetic(Path(tempfile.mkdtemp(prefix="adaptive-report-")))
    if not given:
        report.render(out)
    summary = (out / "summary.md").read_text()
    assert (out / "report.html").stat().st_size > 1000
    runs = report.load_runs(out)
    assert runs, "no runs"
    for r in runs:
        if "refused" in r:
            assert "rules[0].adaptive" in r["refused"], r["refused"]
            assert f"refused: {r['refused']}" in summary
            continue
        for p in r["phases"]:
            assert p["admitted_per_s"] >= 0 and 0 <= p["goodput_share"] <= 2, p
        assert f"| {r['arm']} " in summary
    for scenario in {r["scenario"] for r in runs}:
        with Image.open(out / f"{scenario}.png") as img:
            colours = img.convert("L").getcolors(maxcolors=1 << 16)
            assert colours is None or len(colours) > 10, f"{scenario}.png looks blank"
