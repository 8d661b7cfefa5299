"""The filter's stat names are one table (filters/throttle/core/src/stats.rs),
which generates the README's statistics table (a Rust test keeps them equal);
the Prometheus relabelling that splits Istio's flattened names (the rule's
stats, and its classes': `throttle_rule_<rule>_class_<class>_<stat>`) and the
dashboards' queries use exactly those names."""

import json
import re

import yaml

from harness.procs import ROOT
from tests.support.repo import stat_features

README = ROOT / "filters/throttle/README.md"


def stats_table() -> str:
    text = README.read_text()
    start = text.index("<!-- stats-reference:start")
    return text[start:text.index("<!-- stats-reference:end -->")]


def core_stats() -> list[str]:
    """The rule's stat names, in table order, from the README's generated table."""
    names = re.findall(r"^\| `(\w+)` \| (?:Counter|Gauge|Histogram) \|", stats_table(), re.M)
    assert names, "no statistics table in the README"
    return names


def class_stats() -> list[str]:
    """A class's stat names (`class.<class>.<stat>` rows of the same table)."""
    names = re.findall(r"^\| `class\.<class>\.(\w+)` \| (?:Counter|Gauge|Histogram) \|", stats_table(), re.M)
    assert names, "no class statistics in the README's table"
    return names


def test_every_stat_has_one_feature():
    """The README's tables group the stats by the feature that defines them."""
    features = stat_features()
    assert sorted(features) == sorted(core_stats())
    assert set(features.values()) == {"core", "enforce", "dry_run", "concurrency", "cluster", "adaptive"}


def relabel_configs() -> list[dict]:
    cfg = yaml.safe_load((ROOT / "k8s/monitoring/prometheus.yml").read_text())
    (pods,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "kubernetes-pods"]
    return pods["metric_relabel_configs"]


def relabel(name: str) -> dict[str, str]:
    """Prometheus's `replace` relabelling of one series name, entry after entry (each entry
    sees the labels the entries before it wrote)."""
    labels = {"__name__": name}
    for r in relabel_configs():
        value = ";".join(labels.get(s, "") for s in r["source_labels"])
        m = re.fullmatch(r["regex"], value)
        if m:
            labels[r["target_label"]] = m.expand(re.sub(r"\$(\d+)", r"\\g<\1>", r["replacement"]))
    return labels


def test_istio_relabelling_knows_every_stat():
    regexes = {r["regex"] for r in relabel_configs() if "throttle_rule_" in r.get("regex", "")}
    assert len(regexes) == 2, "one regex for the rules' stats, one for the classes'"
    for rx in regexes:
        alternatives = rx.rsplit("_(", 1)[1].removesuffix(")")  # the stat group, last in the regex
        names = [a.split("(?:")[0] for a in alternatives.split("|") if not a.startswith("_")]
        want = class_stats() if "_class_" in rx else core_stats()
        assert sorted(names) == sorted(want), rx


# Rule names that look like stats or hold the word `class` where the validator allows it
# (at the start or the end), and class names that look like stats.
RULES = ("default", "a_b", "queued", "x_would", "in", "class_a", "b_class", "a-b")
CLASSES = ("critical", "x_queued", "wait_ms", "best-effort")


def test_every_flattened_name_splits_back_to_its_rule_class_and_stat():
    for rule in RULES:
        flat_rule = rule.replace("-", "_")  # Envoy's Prometheus names: `-` becomes `_`
        for stat in core_stats():
            for suffix in ("_bucket", "_sum", "_count") if stat == "wait_ms" else ("",):
                got = relabel(f"throttle_rule_{flat_rule}_{stat}{suffix}")
                assert got == {"__name__": f"throttle_{stat}{suffix}", "throttle_rule": flat_rule}, (rule, stat)
        for cls in CLASSES:
            flat_class = cls.replace("-", "_")
            for stat in class_stats():
                for suffix in ("_bucket", "_sum", "_count") if stat == "wait_ms" else ("",):
                    got = relabel(f"throttle_rule_{flat_rule}_class_{flat_class}_{stat}{suffix}")
                    assert got == {"__name__": f"throttle_class_{stat}{suffix}", "throttle_rule": flat_rule,
                                   "throttle_class": flat_class}, (rule, cls, stat, got)


def test_dashboards_query_only_known_stats():
    known = set(core_stats()) | {f"class_{s}" for s in class_stats()}
    for path in (ROOT / "k8s/monitoring").rglob("*.json"):
        text = path.read_text()
        for name in re.findall(r"\bthrottle_(\w+?)(?:_bucket|_sum|_count)?\{", text):
            assert name in known, f"{path.relative_to(ROOT)}: throttle_{name}"
        json.loads(text)


def test_alert_rules_use_only_known_stats():
    """k8s/monitoring/alerts.yml: every throttle series its expressions name is a stat of the table
    (after the relabelling above), and the cluster-scope stats it watches are all there."""
    rules = [r for g in yaml.safe_load((ROOT / "k8s/monitoring/alerts.yml").read_text())["groups"] for r in g["rules"]]
    known = set(core_stats())
    used = set()
    for r in rules:
        names = re.findall(r"\bthrottle_(\w+)", r["expr"])
        assert names, r["alert"]
        for name in names:
            assert name in known, f"{r['alert']}: throttle_{name}"
        used |= set(names)
    assert {"engine_calls", "engine_failures", "failures_config", "failures_lost", "failures_clock", "fallback_ms",
            "clock_offset_ms", "grid_mismatch"} <= used, sorted(used)
