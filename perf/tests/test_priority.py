"""The pure parts of the priority benchmark (perf/priority/): the scenarios file and its
checks, the plugin configuration of each arm, Vegeta's per-request results, the steady
window's figures, and the summary's key figures."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.vegeta import Load, Result
from perf.priority import report, run
from perf.priority.config import SpecError, load_set, plugin


def test_the_shipped_sets_load():
    quick, full = load_set("quick"), load_set("full")
    assert [s.name for s in quick.scenarios] == ["mixed-2x", "starvation"]
    assert "capacity-drop" in [s.name for s in full.scenarios]
    drop = next(s for s in full.scenarios if s.name == "capacity-drop")
    assert drop.requires == "adaptive" and drop.arms[0].adaptive


def write(tmp_path: Path, text: str) -> Path:
    shipped = (Path(run.__file__).parent / "scenarios.yaml").read_text()
    p = tmp_path / "scenarios.yaml"
    p.write_text(shipped + textwrap.dedent(text))
    return p


@pytest.mark.parametrize("extra, message", [
    ("bogus: 1\n", "scenarios.yaml: Additional properties are not allowed ('bogus' was unexpected)"),
])
def test_a_bad_file_names_the_field(tmp_path, extra, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_set("quick", write(tmp_path, extra))


def test_the_rules_between_fields(tmp_path):
    with pytest.raises(SpecError, match="no set 'nope'"):
        load_set("nope")
    data = (Path(run.__file__).parent / "scenarios.yaml").read_text()
    bad = tmp_path / "scenarios.yaml"
    bad.write_text(data.replace("arms: [throttle]\n", "arms: [throttle, nosuch]\n"))
    with pytest.raises(SpecError, match=r"scenarios\.alone\.arms: no arm 'nosuch'"):
        load_set("full", bad)
    bad.write_text(data.replace("haproxy: {kind: haproxy, maxconn: 1}", "haproxy: {kind: haproxy, min_share: 0.1}"))
    with pytest.raises(SpecError, match=r"arms\.haproxy: HAProxy has no floors"):
        load_set("quick", bad)


def test_each_throttle_arm_is_a_rule_with_classes():
    spec = load_set("quick")
    (mixed,) = [s for s in spec.scenarios if s.name == "mixed-2x"]
    arms = {a.name: a for a in mixed.arms}
    floor = plugin(spec, arms["throttle"])["rules"][0]
    strict = plugin(spec, arms["throttle-strict"])["rules"][0]
    assert floor["rate"] == "200/s" and floor["max_queue_delay"] == "1000ms"
    assert floor["classes"][0] == {"name": "critical", "match": {"headers": {"x-priority": "critical"}}}
    assert floor["classes"][1] == {"name": "batch", "min_share": 0.1}
    assert strict["classes"][1] == {"name": "batch"}
    json.dumps(floor)


def test_vegeta_results_and_arguments():
    csv = "1000,200,5000000,0,10,,,,0,GET,http://x/,\n900,429,1000000,0,10,,,,1,GET,http://x/,\n" \
          "1100,200,7000000,0,10,,,,2,GET,http://x/,\n"
    r = Result.from_csv(csv)
    assert [h.start_ns for h in r.hits] == [900, 1000, 1100]
    assert r.codes() == {200: 2, 429: 1}
    assert r.latencies_ms(200) == [5.0, 7.0]
    argv = Load("http://x/", rate=80, duration_s=4, headers=["x-priority: critical"]).argv(Path("/tmp/o"), "vegeta")
    assert "-rate=80/1s" in argv and "-duration=4s" in argv
    assert argv[-2:] == ["-header", "x-priority: critical"]


def test_the_steady_window_measures_the_span_and_the_classes():
    arrivals = [(10.0 + k * 0.005, "critical" if k % 5 == 0 else "batch") for k in range(1000)]
    got = run.steady([*arrivals, (0.5, "batch"), (20.0, "batch")], 10.0, 15.0)
    assert got["n"] == 1000
    assert got["total_per_s"] == pytest.approx(200.0)
    assert got["by_class"] == {"critical": 200, "batch": 800}
    assert run.percentile([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0 and run.percentile([], 0.5) is None


def test_the_key_figures_name_what_the_issue_asks():
    def row(scenario, arm, cls, **kw):
        base = {"scenario": scenario, "arm": arm, "class": cls, "offered_per_s": 80, "sent": 100, "ok": 100,
                "ok_pct": 100.0, "rejected": 0, "displaced": 0, "p50_ms": 6.0, "p99_ms": 9.0,
                "wait_p99_ms": 4.0, "upstream_per_s": 80.0, "share": 0.4, "total_per_s": 200.2,
                "total_error_pct": 0.1}
        return {**base, **kw}

    rows = [row("alone", "throttle", "critical"), row("mixed-2x", "throttle", "critical", p99_ms=12.0),
            row("mixed-2x", "throttle", "batch", displaced=3, share=0.6),
            row("starvation", "throttle", "batch", share=0.102, upstream_per_s=20.4)]
    figures = report.key_figures(rows)
    assert figures[0].startswith("- critical without batch load (alone): 0 rejected of 100, p99 9.0 ms")
    assert "with batch load (mixed-2x): 0 rejected of 100, p99 12.0 ms" in figures[1]
    assert "batch got 10.2% of the releases (20.4/s)" in figures[2]
    assert "200.20/s, +0.10% from the rate" in figures[3]
    assert figures[4] == "- displaced (all throttle arms, all classes): 3"
    env = {"run_id": "x", "host": "h", "cpus": 2, "loadavg_start": (1.0, 1.0, 1.0), "envoy": "1.40.0",
           "vegeta": "v12.13.0", "git": "abc", "rate": 200.0, "service_ms": 5.0, "duration_s": 4.0}
    md = report.summary(env, rows, [{"scenario": "capacity-drop", "arm": "throttle-adaptive", "why": "refused"}])
    assert "## Key figures" in md and "## mixed-2x" in md and "## Skipped" in md
