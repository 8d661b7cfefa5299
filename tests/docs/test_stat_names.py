"""The filter's stat names are one table (filters/throttle/core/src/stats.rs),
which generates the README's statistics table (a Rust test keeps them equal);
the Prometheus relabelling that splits Istio's flattened names and the
dashboards' queries use exactly those names."""

import json
import re

import yaml

from harness.procs import ROOT

README = ROOT / "filters/throttle/README.md"


def core_stats() -> list[str]:
    """The stat names, in table order, from the README's generated table."""
    text = README.read_text()
    start = text.index("<!-- stats-reference:start")
    table = text[start:text.index("<!-- stats-reference:end -->")]
    names = re.findall(r"^\| `(\w+)` \| (?:Counter|Gauge|Histogram) \|", table, re.M)
    assert names, "no statistics table in the README"
    return names


def test_istio_relabelling_knows_every_stat():
    cfg = yaml.safe_load((ROOT / "k8s/monitoring/prometheus.yml").read_text())
    regexes = {r["regex"] for job in cfg["scrape_configs"] for r in job.get("metric_relabel_configs", [])
               if "throttle_rule_" in r.get("regex", "")}
    assert regexes, "no throttle relabelling"
    for rx in regexes:
        alternatives = rx.rsplit("_(", 1)[1].removesuffix(")")  # the stat group, last in the regex
        names = [a.split("(?:")[0] for a in alternatives.split("|") if not a.startswith("_")]
        assert sorted(names) == sorted(core_stats()), rx
        # Every flattened name splits back to the right rule and stat,
        # including rule names that look like stats.
        for rule in ("default", "a_b", "queued", "x_would", "in"):
            for stat in core_stats():
                m = re.fullmatch(rx, f"throttle_rule_{rule}_{stat}")
                assert m and m.group(1) == rule and m.group(2) == stat, (rule, stat)


def test_dashboards_query_only_known_stats():
    known = set(core_stats())
    for path in (ROOT / "k8s/monitoring").rglob("*.json"):
        text = path.read_text()
        for name in re.findall(r"\bthrottle_(\w+?)(?:_bucket|_sum|_count)?\{", text):
            assert name in known, f"{path.relative_to(ROOT)}: throttle_{name}"
        json.loads(text)
