"""Scenarios are data: one YAML file each under perf/bench/scenarios/, named by their
label, grouped into sets by perf/bench/sets.yaml. This module loads them, checks them
(the shape against scenario.schema.yaml and sets.schema.yaml, the rules that relate
fields here: a bad field is named, and nothing runs) and turns one into the Envoy config
it needs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness import schema
from harness.configs import hcms, load_config, plugin_json, render
from harness.procs import NOOP_WASM
from harness.units import per_second, seconds

HERE = Path(__file__).resolve().parent
ENGINE_CONFIG = HERE.parent.parent / "engine" / "config" / "throttle.yaml"
SCENARIOS = HERE / "scenarios"
SETS = HERE / "sets.yaml"
NEVER_REACHED = 100_000  # a limiter set at or above this rate is "never reached" here
# kind: cluster: the longest of each duration (s) and its default (None: no default).
CLUSTER_TIMES = {"duration": (120.0, None), "warmup": (60.0, "2s"), "max_queue_delay": (60.0, "1s"),
                 "restart_at": (60.0, None), "warm": (60.0, "3s"), "idle": (60.0, "3s")}
# kind: cluster: each case's fields besides proxies and concurrency, (required, optional); `load`
# (the default) is one variant under a steady load (perf/cluster/bench.py), the others run each
# of `variants` in turn (perf/cluster/holds.py).
CLUSTER_CASES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "load": (("variant", "rate", "load", "duration"), ("split", "warmup", "max_queue_delay")),
    "restart": (("variants", "rate", "load", "duration", "restart_at"), ("split", "warmup", "max_queue_delay")),
    "low_rates": (("variants", "rates", "load", "duration"), ("split", "warmup", "max_queue_delay")),
    "sporadic": (("variants", "rate", "periods", "duration"), ("max_queue_delay",)),
    "burst": (("variants", "rate", "requests"), ("warm", "warm_qps", "idle", "burst", "max_queue_delay")),
}


class ScenarioError(ValueError):
    pass


def _check(cond: object, where: str, msg: str) -> None:
    if not cond:
        raise ScenarioError(f"{where}: {msg}")


@dataclass
class Scenario:
    label: str
    description: str
    topology: str
    tool: str = "fortio"
    kind: str = "load"
    connections: int = 100
    requests: int | None = None
    duration_s: float | None = None
    qps: float = 0
    keepalive: bool = True
    warmup_requests: int = 1000
    baseline: str | None = None
    envoy: dict = field(default_factory=dict)
    nginx_limit: dict = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    cluster: dict = field(default_factory=dict)

    @property
    def setting_qps(self) -> float | None:
        """The limiter's configured rate, or None when there is no limiter or
        it is set so high that it is never reached (overhead scenarios)."""
        rate = None
        if self.kind == "cluster":
            return float(self.cluster["rate"])
        if self.topology == "nginx_limit":
            rate = float(self.nginx_limit["rate"])
        elif "throttle" in self.envoy:
            rate = per_second(self.envoy["throttle"]["rate"])
        elif self.envoy.get("config") == "local_ratelimit.yaml":
            b = self.envoy.get("local_ratelimit") or {"tokens_per_fill": 50, "fill_interval": "0.1s"}
            rate = b["tokens_per_fill"] / seconds(b["fill_interval"])
        return None if rate is None or rate >= NEVER_REACHED else rate

    def envoy_config(self, *, listen_port: int, admin_port: int, upstream_port: int) -> dict:
        e = self.envoy
        plugin = None
        if "throttle" in e:
            plugin = json.loads(plugin_json(load_config("demo.yaml")))
            plugin["rules"][0].update(e["throttle"])
        extra = {"wasm": NOOP_WASM} if e.get("wasm") == "noop" else {}
        cfg = render(e["config"], listen_port=listen_port, admin_port=admin_port,
                     upstream_port=upstream_port, plugin=plugin, **extra)
        for hcm in hcms(cfg):
            # ab speaks HTTP/1.0, which Envoy answers with 426 unless allowed:
            # allowed in every HTTP scenario alike (ab and fortio).
            hcm.setdefault("http_protocol_options", {})["accept_http_10"] = True
            if "local_ratelimit" in e:
                for hf in hcm["http_filters"]:
                    if hf["name"] == "envoy.filters.http.local_ratelimit":
                        hf["typed_config"]["token_bucket"] = dict(e["local_ratelimit"])
        return cfg


def parse(path: Path) -> Scenario:
    """One scenario file: its shape (scenario.schema.yaml), then the rules between fields."""
    where = str(path.relative_to(HERE.parent.parent)) if path.is_relative_to(HERE.parent.parent) else str(path)
    try:
        d = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ScenarioError(f"{where}: not valid YAML: {e}") from None
    schema.check(d, HERE / "scenario.schema.yaml", where, ScenarioError)
    _check(d["label"] == path.stem, f"{where}: label", f"must equal the file name {path.stem!r}")
    kind = d.get("kind", "load")
    if kind == "cluster":
        return Scenario(label=d["label"], description=d["description"], topology="cluster", kind=kind,
                        cluster=_cluster(d["cluster"], where))
    _check("cluster" not in d, f"{where}: cluster", "only with kind cluster")
    _check("envoy" not in d or d["topology"] == "envoy", f"{where}: envoy", f"not allowed with topology {d['topology']}")
    s = Scenario(label=d["label"], description=d["description"], topology=d["topology"], kind=kind,
                 nginx_limit=d.get("nginx_limit", {}), steps=d.get("steps", []))
    if "envoy" in d:
        s.envoy = {"concurrency": 2, **_envoy(d["envoy"], f"{where}: envoy")}
    if kind == "memory":
        _check(s.steps == sorted(s.steps), f"{where}: steps", "expected increasing positive integers")
        return s
    tool = s.tool = d["tool"]
    s.connections = d.get("connections", 100)
    _check(("requests" in d) != ("duration" in d), where, "give exactly one of requests or duration")
    if "requests" in d:
        _check(d["requests"] >= s.connections, f"{where}: requests", "expected an integer >= connections")
        s.requests = d["requests"]
    else:
        s.duration_s = seconds(d["duration"])
        _check(0 < s.duration_s <= 300, f"{where}: duration", "expected at most 5m")
    s.qps = d.get("qps", 0)
    _check(not (tool == "ab" and s.qps), f"{where}: qps", "ab cannot offer a fixed rate: use fortio or qps 0")
    s.keepalive = d.get("keepalive", tool == "fortio")
    s.warmup_requests = d.get("warmup_requests", 1000)
    s.baseline = d.get("baseline")
    return s


def _envoy(env: dict[str, Any], where: str) -> dict[str, Any]:
    """The envoy block's rules between fields: which filter goes with which config."""
    demo = env["config"] == "demo.yaml"
    _check(demo or "throttle" not in env, f"{where}.throttle", "needs config demo.yaml")
    _check(demo or "wasm" not in env, f"{where}.wasm", "needs config demo.yaml")
    _check(not demo or ("throttle" in env) != ("wasm" in env), f"{where}.throttle",
           "config demo.yaml needs exactly one of throttle or wasm: noop (the no-op filter in its place)")
    _check(env["config"] == "local_ratelimit.yaml" or "local_ratelimit" not in env, f"{where}.local_ratelimit",
           "needs config local_ratelimit.yaml")
    return env


def _cluster(c: dict[str, Any], where: str) -> dict[str, Any]:
    """kind: cluster: N proxies sharing one rate (perf/cluster/bench.py, perf/cluster/holds.py)."""
    case = c.get("case", "load")
    required, optional = CLUSTER_CASES[case]
    for key in required:
        _check(key in c, f"{where}: cluster.{key}", f"required with case {case}")
    for key in c:
        _check(key in (*required, *optional, "case", "proxies", "concurrency"), f"{where}: cluster.{key}",
               f"not used by case {case}")
    proxies = c.get("proxies", 3)
    split = c.get("split", [1] * proxies)
    _check(len(split) == proxies and sum(split) > 0, f"{where}: cluster.split",
           f"expected {proxies} weights >= 0 (one per proxy) with a positive sum")
    out: dict[str, Any] = {k: c[k] for k in required + optional if k in c and k not in CLUSTER_TIMES}
    out.update(case=case, split=split, proxies=proxies, concurrency=c.get("concurrency", 2))
    if "load" in out:
        out["load"] = float(out["load"])
    for key, (top, default) in CLUSTER_TIMES.items():
        if key in required or (key in optional and default is not None):
            out[key] = seconds(c[key] if key in c or default is None else default)
            _check(out[key] <= top, f"{where}: cluster.{key}", f"expected at most {top:g} s")
    if "warmup" in out:
        _check(out["warmup"] < out["duration"], f"{where}: cluster.warmup", "must be shorter than the duration")
    if "restart_at" in out:
        _check(out.get("warmup", 0) < out["restart_at"] < out["duration"] - 3, f"{where}: cluster.restart_at",
               "must fall after the warm-up and at least 3 s before the end (the excess is counted to t + 3 s)")
    if "periods" in out:
        out["periods"] = [seconds(p) for p in out["periods"]]
        _check(all(0 < p <= out["duration"] for p in out["periods"]), f"{where}: cluster.periods",
               "expected durations above 0 and at most the duration")
    if "requests" in out:
        _check(out["requests"] % proxies == 0, f"{where}: cluster.requests", f"expected a multiple of {proxies}")
    if case == "burst":
        out.setdefault("burst", 0)
        out.setdefault("warm_qps", 20)
    variants = out.get("variants", [out.get("variant")])
    rates = out.get("rates", [out.get("rate")])
    _check("process" not in variants or all(r * 60 % proxies == 0 for r in rates),
           f"{where}: cluster.{'rates' if 'rates' in out else 'rate'}",
           f"process scope gives each proxy rate/{proxies} (per minute): make rate x 60 a multiple of {proxies}")
    return out

def load_all() -> dict[str, Scenario]:
    return {p.stem: parse(p) for p in sorted(SCENARIOS.glob("*.yaml"))}


def load_set(name: str) -> list[tuple[list[Scenario], int]]:
    """A named set from perf/bench/sets.yaml, in its order, as groups of
    (scenarios, rounds). An entry is a label (one run) or
    {rounds: N, scenarios: [labels]}: those scenarios run interleaved,
    round after round, so that slow drifts of the machine hit them alike."""
    sets = yaml.safe_load(SETS.read_text())
    schema.check(sets, HERE / "sets.schema.yaml", "perf/bench/sets.yaml", ScenarioError)
    _check(name in sets, "perf/bench/sets.yaml", f"no set {name!r} (have {sorted(sets)})")
    groups = [([e], 1) if isinstance(e, str) else (e["scenarios"], e["rounds"]) for e in sets[name]]
    scenarios = load_all()
    labels = [label for g, _ in groups for label in g]
    missing = [label for label in labels if label not in scenarios]
    _check(not missing, f"perf/bench/sets.yaml: {name}", f"no scenario file for {missing}")
    dup = sorted({label for label in labels if labels.count(label) > 1})
    _check(not dup, f"perf/bench/sets.yaml: {name}", f"listed more than once: {dup}")
    for label in labels:
        s = scenarios[label]
        _check(not s.baseline or s.baseline in scenarios, f"perf/bench/scenarios/{s.label}.yaml: baseline",
               f"no scenario {s.baseline!r}")
    for g, rounds in groups:
        _check(rounds == 1 or all(scenarios[label].kind == "load" for label in g), f"perf/bench/sets.yaml: {name}",
               "rounds apply to load scenarios only")
    return [([scenarios[label] for label in g], rounds) for g, rounds in groups]
