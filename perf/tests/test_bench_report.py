"""The benchmark report renders, and a person can look at it: headless
Chromium turns report.html into report.png, which must not be blank.

With PERF_RUN_DIR=perf/reports/<family>/<run-id> (make perf-quick sets it) the report
of that real run is rendered; without it, a small synthetic input is used
(to test the renderer only: these figures are not measurements)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from PIL import Image

from harness import tools
from perf.bench import report
from perf.bench.run import CSV_COLUMNS

pytestmark = pytest.mark.perf

RUN_DIR = os.environ.get("PERF_RUN_DIR")


def _synthetic(out: Path) -> dict[str, Path]:
    rows = []
    for label, tool, qps in (("http-c2-fortio", "fortio", 9000.0), ("throttle-off-c2-fortio", "fortio", 8800.0),
                             ("throttle-500-c2-fortio", "fortio", 499.8)):
        rows.append({"label": label, "tool": tool, "conns": "100", "offered_qps": "0", "achieved_qps": str(qps),
                     "errors": "0", "p50": "5.1", "p75": "7.0", "p90": "9.5", "p99": "20.2", "p99.9": "40.0",
                     "proxy_rss_mb": "70.5", "proxy_cpu_s": "3.2"})
    ts = {"throttle-500-c2-fortio": {"window_s": 0.1, "rates": [500.0 + (10 if i % 7 == 0 else 0) for i in range(100)],
                                     "setting_qps": 500.0, "upstream_qps": 500.1},
          "http-c2-fortio": {"window_s": 0.1, "rates": [9000.0] * 20, "setting_qps": None}}
    meta = {"throttle-off-c2-fortio": {"baseline": "http-c2-fortio"}}
    memory = {"memory-throttle-c2": {"idle_rss_mb": 99.0, "points": [{"held": 0, "rss_mb": 99.0},
                                                                      {"held": 1000, "rss_mb": 120.0}],
                                     "mb_per_1000": 21.0}}
    crow = {"label": "cluster-300-cluster", "variant": "cluster", "rate": "300", "load": "3", "offered_qps": "900",
            "upstream_qps": "299.8", "error_pct": "-0.07", "worst_1s_pct": "0.7", "worst_100ms": "35",
            "bound_100ms": "32", "rejected": "3600", "failures": "0", "p50": "160", "p90": "900", "p99": "1010",
            "p99.9": "1020", "calls_per_proxy_s": "9.0 / 9.0 / 8.9", "service_calls_s": "26.9",
            "shares": "55% / 30% / 15%"}
    cluster = {"rows": [crow], "timeseries": {"cluster-300-cluster": {"window_s": 0.1, "rates": [300.0] * 80,
                                                                       "setting_qps": 300.0}}}
    return report.render(rows, ts, out, meta=meta, memory=memory, info={"run_id": "synthetic"}, cluster=cluster)


def _cluster_only() -> bool:
    """A run of kind: cluster scenarios only (make perf-cluster): no results.csv rows."""
    if not RUN_DIR:
        return False
    with open(Path(RUN_DIR) / "results.csv", newline="") as f:
        return len(list(csv.reader(f))) <= 1 and (Path(RUN_DIR) / "cluster.json").exists()


def _squeezed(path: Path) -> str:
    """The Markdown with runs of spaces as one (tabulate pads the columns)."""
    return "\n".join(" ".join(line.split()) for line in path.read_text().splitlines())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    if RUN_DIR:
        return report.render_run(Path(RUN_DIR))
    return _synthetic(tmp_path_factory.mktemp("report"))


def test_csv_has_the_fixed_columns():
    if not RUN_DIR:
        pytest.skip("no PERF_RUN_DIR: no real run to check")
    if _cluster_only():
        pytest.skip("a run of kind: cluster scenarios only: see test_cluster_table")
    with open(Path(RUN_DIR) / "results.csv", newline="") as f:
        reader = csv.reader(f)
        assert tuple(next(reader)) == CSV_COLUMNS
        rows = list(reader)
    assert rows, "results.csv has no rows"
    assert all(len(r) == len(CSV_COLUMNS) for r in rows)


def test_summary_has_tables_with_ratios(rendered):
    if _cluster_only():
        pytest.skip("a run of kind: cluster scenarios only: see test_cluster_table")
    md = _squeezed(rendered["summary"])
    assert "| scenario | tool | conns | req/s |" in md and "| vs baseline |" in md
    assert " of http-c2-" in md  # a ratio to a baseline row of the same run
    assert "| scenario | tool | setting /s |" in md


def test_html_embeds_charts(rendered):
    page = rendered["html"].read_text()
    # cluster only: its rate chart and its latency chart
    assert page.count('src="data:image/png;base64,') >= (2 if _cluster_only() else 3)


def test_cluster_table(rendered):
    if RUN_DIR and not (Path(RUN_DIR) / "cluster.json").exists():
        pytest.skip("no kind: cluster scenarios in this run")
    md = _squeezed(rendered["summary"])
    assert "## Three proxies, one rate" in md
    assert "| scenario | variant | rate /s | offered /s | upstream /s |" in md
    assert "| cluster" in md
    assert "<h2>Three proxies, one rate: rate seen by the upstream</h2>" in rendered["html"].read_text()
    cases = json.loads((Path(RUN_DIR) / "cluster.json").read_text()).get("cases") if RUN_DIR else None
    if cases:  # the cases of perf/cluster/holds.py: their table, every figure in it
        assert "## Cluster scope under faults, low rates, sporadic traffic and bursts" in md
        for f in cases:
            assert f"| {f['value']} |" in md, f


def test_html_renders_to_a_non_trivial_png(rendered):
    chromium = tools.path("chromium")
    png = rendered["html"].with_name("report.png")
    png.unlink(missing_ok=True)
    profile = tempfile.mkdtemp(prefix="perf-chromium-")
    try:
        r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                            "--disable-background-networking", "--disable-component-update", "--disable-sync",
                            "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
                            f"--screenshot={png}", "--window-size=1400,7000",
                            rendered["html"].resolve().as_uri()],
                           capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert png.exists(), f"no screenshot (rc {r.returncode}):\n{r.stderr[-2000:]}"
    img = Image.open(png).convert("RGB")
    assert img.size == (1400, 7000)
    small = img.resize((350, 1750))
    colors = small.getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 50, "screenshot has almost no colours: blank page?"
    non_white = sum(n for n, c in colors if isinstance(c, tuple) and sum(c) < 720)
    assert non_white / (350 * 1750) > 0.03, "screenshot is almost all white"
