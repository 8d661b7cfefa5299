"""The pure parts of the benchmark sets (perf/bench/): ab output parsing, rate windows,
scenario and set checks."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from harness import windows
from perf.bench import loadgen, report, run
from perf.bench.scenario import ScenarioError, load_set, parse

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
    assert windows.window_rates(stamps, 0.1) == pytest.approx([500.0] * 10)
    assert windows.span_rate(stamps) == pytest.approx(500.0)
    assert windows.span_rate([1.0]) is None


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
    # the shape (scenario.schema.yaml)
    ("description: x\ntopology: direct\ntool: wrk\nrequests: 100\n", "s.yaml: tool: 'wrk' is not one of ['ab', 'fortio']"),
    ("description: x\ntopology: mesh\n", "s.yaml: topology: 'mesh' is not one of ['direct', 'envoy', 'nginx_limit']"),
    ("description: x\ntopology: direct\ntool: fortio\nrequests: 100\nspeed: 3\n",
     "s.yaml: Additional properties are not allowed ('speed' was unexpected)"),
    ("description: x\ntopology: nginx_limit\nnginx_limit: {rate: fast}\ntool: ab\nrequests: 100\n",
     "s.yaml: nginx_limit.rate: 'fast' is not of type 'integer'"),
    ("description: x\ntopology: direct\ntool: fortio\nduration: 10 s\n", "s.yaml: duration: '10 s' does not match"),
    ("description: x\ntopology: envoy\nenvoy: {config: demo.yaml, throttle: {rate: 5 per s}}\ntool: fortio\n"
     "requests: 100\n", "s.yaml: envoy.throttle.rate: '5 per s' does not match"),
    ("description: x\ntopology: direct\nrequests: 100\n", "s.yaml: 'tool' is a required property"),
    ("description: x\nkind: memory\ntopology: direct\nsteps: [1]\n", "s.yaml: topology: 'envoy' was expected"),
    ("description: x\nkind: cluster\ntopology: direct\ncluster: {variant: cluster, rate: 1, load: 1, duration: 2s}\n",
     "s.yaml: 'topology' is not one of ['label', 'description', 'kind', 'cluster']"),
    ("description: x\ntopology: direct\ntool: ab\nrequests: 100\nenvoy: {config: demo.yaml}\n",
     "s.yaml: envoy: not allowed with topology direct"),
    ("description: x\ntopology: direct\ntool: ab\nrequests: 100\ncluster: {variant: cluster, rate: 1, load: 1, duration: 2s}\n",
     "s.yaml: cluster: only with kind cluster"),
    # the rules between fields (perf/bench/scenario.py)
    ("description: x\ntopology: direct\ntool: ab\nrequests: 100\nqps: 50\n", "s.yaml: qps: ab cannot offer a fixed rate"),
    ("description: x\ntopology: direct\ntool: fortio\n", "s.yaml: give exactly one of requests or duration"),
    ("description: x\ntopology: direct\ntool: fortio\nconnections: 100\nrequests: 10\n",
     "s.yaml: requests: expected an integer >= connections"),
    ("description: x\ntopology: envoy\nenvoy: {config: demo.yaml}\ntool: fortio\nrequests: 100\n",
     "s.yaml: envoy.throttle: config demo.yaml needs exactly one of throttle or wasm: noop"),
    ("description: x\ntopology: envoy\nenvoy: {config: baseline.yaml, throttle: {rate: 5/s}}\ntool: fortio\n"
     "requests: 100\n", "s.yaml: envoy.throttle: needs config demo.yaml"),
    ("description: x\ntopology: envoy\nenvoy: {config: demo.yaml, throttle: {rate: 5/s}, wasm: noop}\ntool: fortio\n"
     "requests: 100\n", "s.yaml: envoy.throttle: config demo.yaml needs exactly one of throttle or wasm: noop"),
    ("description: x\nkind: memory\ntopology: envoy\nenvoy: {config: baseline.yaml}\nsteps: [2, 1]\n",
     "s.yaml: steps: expected increasing positive integers"),
    ("description: x\nkind: cluster\ncluster: {variant: process, rate: 100, load: 1, duration: 2s}\n",
     "s.yaml: cluster.warmup: must be shorter than the duration"),
    ("description: x\nkind: cluster\ncluster: {variant: cluster, rate: 100, load: 1, duration: 5s, split: [1, 1]}\n",
     "s.yaml: cluster.split: expected 3 weights"),
    ("description: x\nkind: cluster\ncluster: {variant: process, rate: 1, load: 1, duration: 5s, proxies: 7, "
     "split: [1, 1, 1, 1, 1, 1, 1]}\n", "s.yaml: cluster.rate: process scope gives each proxy rate/7"),
    # the cases of perf/cluster/holds.py
    ("description: x\nkind: cluster\ncluster: {case: restart, variants: [cluster], rate: 300, load: 1, duration: 14s}\n",
     "s.yaml: cluster.restart_at: required with case restart"),
    ("description: x\nkind: cluster\ncluster: {case: burst, variants: [cluster], rate: 100, requests: 150, load: 1}\n",
     "s.yaml: cluster.load: not used by case burst"),
    ("description: x\nkind: cluster\ncluster: {case: restart, variants: [cluster], rate: 300, load: 1, duration: 8s, "
     "restart_at: 6s}\n", "s.yaml: cluster.restart_at: must fall after the warm-up and at least 3 s before the end"),
    ("description: x\nkind: cluster\ncluster: {case: burst, variants: [cluster], rate: 100, requests: 100}\n",
     "s.yaml: cluster.requests: expected a multiple of 3"),
    ("description: x\nkind: cluster\ncluster: {case: sporadic, variants: [cluster], rate: 300, periods: [0.5s, 40s], "
     "duration: 30s}\n", "s.yaml: cluster.periods: expected durations above 0 and at most the duration"),
    ("description: x\nkind: cluster\ncluster: {case: low_rates, variants: [process], rates: [1, 2], load: 2, "
     "duration: 10s, proxies: 7, split: [1, 1, 1, 1, 1, 1, 1]}\n",
     "s.yaml: cluster.rates: process scope gives each proxy rate/7"),
    ("description: x\nkind: cluster\ncluster: {case: storm, variants: [cluster], rate: 1}\n",
     "s.yaml: cluster.case: 'storm' is not one of"),
])
def test_bad_scenarios_are_refused_naming_the_field(tmp_path, body, error):
    with pytest.raises(ScenarioError) as e:
        parse(_scenario(tmp_path, "s", body))
    assert error in str(e.value)


def test_bad_sets_are_refused_naming_the_entry(tmp_path, monkeypatch):
    from perf.bench import scenario
    sets = tmp_path / "sets.yaml"
    monkeypatch.setattr(scenario, "SETS", sets)
    for text, error in (("quick: [{rounds: 0, scenarios: [direct-ab]}]", "sets.yaml: quick[0].rounds: 0 is less than the minimum of 1"),
                        ("quick: [direct-ab, direct-ab]", "quick: listed more than once: ['direct-ab']"),
                        ("quick: [nothing-here]", "quick: no scenario file for ['nothing-here']"),
                        ("quick: [{rounds: 2, scenarios: [memory-throttle-c2]}]", "rounds apply to load scenarios only")):
        sets.write_text(text)
        with pytest.raises(ScenarioError, match=re.escape(error)):
            load_set("quick")
    with pytest.raises(ScenarioError, match=re.escape("no set 'other' (have ['quick'])")):
        load_set("other")


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


def test_holds_table_puts_each_variant_in_its_column():
    from perf.cluster import holds
    fig = [{"row": "burst after idle", "label": "b", "case": "burst", "variant": v, "figure": "429s", "value": x}
           for v, x in (("native", "50"), ("cluster", "0"))]
    fig.append({"row": "Redis restarted", "label": "r", "case": "restart", "variant": "cluster",
                "figure": "busiest 1 s", "value": "302"})
    steady = holds.steady_figures([{"label": "l", "variant": "process", "rate": "300", "load": "0.5", "p50": "1.25",
                                    "p99": "2.5"},
                                   {"label": "h", "variant": "process", "rate": "300", "load": "3", "p50": "9",
                                    "p99": "9"}])
    assert [f["value"] for f in steady] == ["1.2 / 2.5"]  # the row over the rate is not latency within it
    _, _, (head, body) = holds.holds_table(fig + steady)
    assert head == ["situation", "figure", "throttle, cluster scope", "Envoy native global rate limit",
                    "throttle, process scope (rate / 3 each)"]
    # the cases in CASE_ORDER (restart first), a situation named once, "—" where a variant did not run
    assert body == [["Redis restarted", "busiest 1 s", "302", "—", "—"],
                    ["steady: 50% of 300/s (60/30/10 split)", "p50 / p99 ms", "—", "—", "1.2 / 2.5"],
                    ["burst after idle", "429s", "0", "50", "—"]]
