"""The pure parts of perf/: ab output parsing, rate windows, scenario checks."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from perf import loadgen, report, run
from perf.scenario import ScenarioError, load_set, parse

AB_OUT = """\
Concurrency Level:      100
Time taken for tests:   2.000 seconds
Complete requests:      10000
Failed requests:        30
   (Connect: 0, Receive: 0, Length: 30, Exceptions: 0)
Non-2xx responses:      30
Requests per second:    5000.00 [#/sec] (mean)
"""


def test_parse_ab_counts_non_2xx_as_errors():
    r = loadgen.parse_ab(AB_OUT)
    assert (r["requests"], r["ok"], r["errors"], r["duration_s"]) == (10000, 9970, 30, 2.0)
    assert r["achieved_qps"] == pytest.approx(4985.0)


def test_parse_ab_refuses_output_without_counts():
    with pytest.raises(ValueError, match="Complete requests"):
        loadgen.parse_ab("ab: invalid URL\n")


def test_percentile_nearest_rank():
    values = list(range(1, 1001))
    assert loadgen._percentile(values, 50) == 500
    assert loadgen._percentile(values, 99.9) == 999
    assert loadgen._percentile([], 50) is None


def test_window_counts_drop_the_partial_last_window():
    stamps = [i * 0.002 for i in range(501)]  # 500/s for 1.0 s
    ts = run.window_counts(stamps, 0.1)
    assert ts["rates"] == [500.0] * 10
    assert run.upstream_rate(stamps) == pytest.approx(500.0)


def test_pacing_reports_the_worst_window():
    p = report.pacing({"window_s": 0.1, "rates": [500, 500, 450, 520], "setting_qps": 500})
    assert p is not None
    assert (p["worst"], p["max"], p["min"]) == (450, 520, 450)
    assert p["worst_pct"] == pytest.approx(-10.0)


def _scenario(tmp_path: Path, label: str, body: str) -> Path:
    p = tmp_path / f"{label}.yaml"
    p.write_text(f"label: {label}\n" + textwrap.dedent(body))
    return p


@pytest.mark.parametrize("body, error", [
    ("description: x\ntopology: direct\ntool: wrk\nrequests: 100\n", "tool: expected ab or fortio, got 'wrk'"),
    ("description: x\ntopology: direct\ntool: ab\nrequests: 100\nqps: 50\n", "qps: ab cannot offer a fixed rate"),
    ("description: x\ntopology: direct\ntool: fortio\n", "give exactly one of requests or duration"),
    ("description: x\ntopology: mesh\n", "topology: expected one of"),
    ("description: x\ntopology: direct\ntool: fortio\nrequests: 100\nspeed: 3\n", "unknown field(s) ['speed']"),
    ("description: x\ntopology: envoy\nenvoy: {config: demo.yaml}\ntool: fortio\nrequests: 100\n",
     "envoy.throttle: required with config demo.yaml"),
    ("description: x\ntopology: envoy\nenvoy: {config: baseline.yaml, throttle: {rate: 5/s}}\ntool: fortio\n"
     "requests: 100\n", "envoy.throttle: needs config demo.yaml"),
    ("description: x\ntopology: nginx_limit\nnginx_limit: {rate: fast}\ntool: ab\nrequests: 100\n",
     "nginx_limit: expected {rate:"),
])
def test_bad_scenarios_are_refused_naming_the_field(tmp_path, body, error):
    with pytest.raises(ScenarioError) as e:
        parse(_scenario(tmp_path, "s", body))
    assert error in str(e.value)


def test_label_must_match_the_file_name(tmp_path):
    p = tmp_path / "one.yaml"
    p.write_text("label: two\ndescription: x\ntopology: direct\ntool: ab\nrequests: 100\n")
    with pytest.raises(ScenarioError, match="label: must equal the file name 'one'"):
        parse(p)


@pytest.mark.parametrize("name", ["standard", "quick"])
def test_shipped_sets_parse(name):
    scenarios = [s for group, _ in load_set(name) for s in group]
    assert scenarios
    for s in scenarios:
        if s.topology == "envoy":
            cfg = s.envoy_config(listen_port=1, admin_port=2, upstream_port=3)
            assert cfg["static_resources"]["clusters"][0]["load_assignment"]


def test_choose_takes_the_median_round_and_keeps_all():
    rounds = [{"row": {"achieved_qps": q}, "n": i} for i, q in enumerate((300.0, 100.0, 200.0))]
    r = run.choose(rounds)
    assert (r["n"], r["chosen_round"], r["rounds_achieved_qps"]) == (2, 3, [300.0, 100.0, 200.0])
    assert len(r["rounds"]) == 3
