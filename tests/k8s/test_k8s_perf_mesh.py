"""perf/mesh's parsing and tables, offline, on Fortio JSON recorded from our own
local runs (tests/k8s/data, see its README). The cluster runner itself
(perf/mesh/run.py) needs a Kubernetes cluster and is not run here."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from perf.mesh.results import ResultError, collect, load_result, tables
from perf.mesh.scenarios import CONFIGS, LOADS
from perf.study import diff_pct
from tests.support.k8s import ROOT

pytestmark = pytest.mark.k8s

DATA = ROOT / "tests" / "k8s" / "data"


def test_collect_reads_every_recorded_run():
    res = collect(DATA)
    assert set(res) == {x.name for x in LOADS}
    for load, by_config in res.items():
        assert set(by_config) == {"envoy-baseline", "envoy-throttle"}, load
        for s in by_config.values():
            assert s["errors"] == 0 and s["requests"] > 0
            assert 0 < s["p50_ms"] <= s["p75_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"]


def test_summary_matches_the_fortio_json():
    raw = json.loads((DATA / "envoy-baseline" / "details-100rps-10c.json").read_text())
    (s,) = [v["envoy-baseline"] for k, v in collect(DATA).items() if k == "details-100rps-10c"]
    pct = {p["Percentile"]: p["Value"] for p in raw["DurationHistogram"]["Percentiles"]}
    assert s["p99_ms"] == pytest.approx(pct[99] * 1000)
    assert s["avg_ms"] == pytest.approx(raw["DurationHistogram"]["Avg"] * 1000)
    assert s["requests"] == raw["DurationHistogram"]["Count"] == sum(raw["RetCodes"].values())
    assert s["qps"] == pytest.approx(raw["ActualQPS"])


def test_tables_have_the_study_shape():
    res = collect(DATA)
    text = tables(res, baseline="envoy-baseline")
    text = "\n".join(" ".join(ln.split()) for ln in text.splitlines())  # tabulate pads the columns
    assert text.count("### ") == len(LOADS)
    assert "| configuration | avg (ms) | p50 (ms) | p75 (ms) | p90 (ms) | p99 (ms) | qps | errors |" in text
    # the difference line is computed from the same summaries
    b = res["productpage-1000rps-100c"]["envoy-baseline"]
    t = res["productpage-1000rps-100c"]["envoy-throttle"]
    line = [ln for ln in text.splitlines() if ln.startswith("| envoy-throttle vs envoy-baseline")][2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == f"{diff_pct(t['avg_ms'], b['avg_ms']):+.1f}%"
    assert cells[5] == f"{diff_pct(t['p99_ms'], b['p99_ms']):+.1f}%"


def test_cluster_configs_order_first(tmp_path):
    """Configurations print in scenarios.CONFIGS order whatever the directory order."""
    for cfg in ("sidecar-throttle", "nomesh", "sidecar"):
        shutil.copytree(DATA / "envoy-baseline", tmp_path / cfg)
    text = tables(collect(tmp_path))
    rows = [r for r in re.findall(r"^\| ([a-z-]+) +\|", text, re.M) if r != "configuration"][:3]
    assert rows == [c for c in CONFIGS if c in ("nomesh", "sidecar", "sidecar-throttle")]


def test_bad_result_files_are_named(tmp_path):
    (tmp_path / "nomesh").mkdir()
    bad = tmp_path / "nomesh" / "x.json"
    bad.write_text("{}")
    with pytest.raises(ResultError, match=r"x\.json: not a Fortio HTTP result \(no RetCodes\)"):
        load_result(bad)
    bad.write_text("not json")
    with pytest.raises(ResultError, match="not JSON"):
        collect(tmp_path)


def test_missing_baseline_is_an_error():
    with pytest.raises(KeyError, match="baseline 'nomesh'"):
        tables(collect(DATA))


def test_fortio_rest_requests():
    close = [x for x in LOADS if x.headers]
    assert [x.name for x in close] == ["details-100rps-10c-close"]
    body = close[0].fortio_request()["metadata"]
    assert body["headers"] == ["Connection: close"] and body["connection-reuse"] == "1:1"
    assert {(x.qps, x.connections) for x in LOADS} == {(100, 10), (1000, 100), (4000, 400)}
    for x in LOADS:
        m = x.fortio_request()["metadata"]
        assert all(isinstance(v, str) for k, v in m.items() if k != "headers")  # Fortio reads strings only
        assert m["url"].startswith(("http://details.bookinfo:9080/", "http://productpage.bookinfo:9080/"))
