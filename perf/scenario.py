"""Scenarios are data: one YAML file each under perf/scenarios/, named by
their label. This module loads and checks them (a bad field is named, and
nothing runs), and turns one into the Envoy config it needs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.configs import load_config, plugin_json, render

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE / "scenarios"
SETS = HERE / "sets.yaml"

TOPOLOGIES = ("direct", "envoy", "nginx_limit")
ENVOY_CONFIGS = ("baseline.yaml", "tcp_proxy.yaml", "demo.yaml", "local_ratelimit.yaml")
TOP_KEYS = {"label", "description", "kind", "topology", "envoy", "nginx_limit", "tool", "connections",
            "requests", "duration", "qps", "keepalive", "warmup_requests", "baseline", "steps", "cluster"}
# kind: cluster (perf/cluster_bench.py): several proxies, one rate.
CLUSTER_KEYS = {"variant", "rate", "load", "split", "duration", "warmup", "max_queue_delay", "proxies", "concurrency"}
CLUSTER_VARIANTS = ("process", "cluster", "native")
ENVOY_KEYS = {"config", "concurrency", "throttle", "local_ratelimit", "wasm"}
THROTTLE_KEYS = {"rate", "burst", "max_queue_delay"}
# The floor of any proxy-wasm filter (perf/noop-filter, built by `make perf-noop`).
NOOP_WASM = Path(__file__).resolve().parent.parent / "target/noop-filter/wasm32-wasip1/release/noop_filter.wasm"
LRL_KEYS = {"max_tokens", "tokens_per_fill", "fill_interval"}
NEVER_REACHED = 100_000  # a limiter set at or above this rate is "never reached" here


class ScenarioError(ValueError):
    pass


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
        for hcm in _hcms(cfg):
            # ab speaks HTTP/1.0, which Envoy answers with 426 unless allowed:
            # allowed in every HTTP scenario alike (ab and fortio).
            hcm.setdefault("http_protocol_options", {})["accept_http_10"] = True
            if "local_ratelimit" in e:
                for hf in hcm["http_filters"]:
                    if hf["name"] == "envoy.filters.http.local_ratelimit":
                        hf["typed_config"]["token_bucket"] = dict(e["local_ratelimit"])
        return cfg


def _hcms(cfg: dict) -> list[dict]:
    out = []
    for listener in cfg["static_resources"]["listeners"]:
        for chain in listener.get("filter_chains", []):
            for f in chain.get("filters", []):
                if f.get("name") == "envoy.filters.network.http_connection_manager":
                    out.append(f["typed_config"])
    return out


def per_second(rate: str | float | int) -> float:
    if isinstance(rate, (int, float)):
        return float(rate)
    n, _, unit = str(rate).partition("/")
    return float(n) / {"": 1, "s": 1, "m": 60, "h": 3600}[unit.strip()]


def seconds(text: str | float | int) -> float:
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"([\d.]+)(ms|s|m)", str(text).strip())
    if not m:
        raise ValueError(f"expected a duration like 500ms, 10s or 1m, got {text!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]


def _check(cond: object, where: str, msg: str) -> None:
    if not cond:
        raise ScenarioError(f"{where}: {msg}")


def parse(path: Path) -> Scenario:
    """One scenario file, checked field by field."""
    where = str(path.relative_to(HERE.parent)) if path.is_relative_to(HERE.parent) else str(path)
    try:
        d = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ScenarioError(f"{where}: not valid YAML: {e}") from None
    _check(isinstance(d, dict), where, "expected a mapping")
    unknown = set(d) - TOP_KEYS
    _check(not unknown, where, f"unknown field(s) {sorted(unknown)}")
    _check(d.get("label") == path.stem, f"{where}: label", f"must equal the file name {path.stem!r}")
    _check(isinstance(d.get("description"), str), f"{where}: description", "required text")
    kind = d.get("kind", "load")
    _check(kind in ("load", "memory", "cluster"), f"{where}: kind", f"expected load, memory or cluster, got {kind!r}")
    if kind == "cluster":
        return _parse_cluster(d, where)
    _check("cluster" not in d, f"{where}: cluster", "only with kind cluster")
    topo = d.get("topology")
    _check(topo in TOPOLOGIES, f"{where}: topology", f"expected one of {TOPOLOGIES}, got {topo!r}")
    s = Scenario(label=d["label"], description=d["description"], topology=topo, kind=kind)
    if topo == "envoy":
        env = d.get("envoy")
        _check(isinstance(env, dict), f"{where}: envoy", "required for topology envoy")
        unknown = set(env) - ENVOY_KEYS
        _check(not unknown, f"{where}: envoy", f"unknown field(s) {sorted(unknown)}")
        _check(env.get("config") in ENVOY_CONFIGS, f"{where}: envoy.config",
               f"expected one of {ENVOY_CONFIGS}, got {env.get('config')!r}")
        _check(env.get("concurrency", 2) in (1, 2, 4), f"{where}: envoy.concurrency", "expected 1, 2 or 4")
        if "throttle" in env:
            _check(env["config"] == "demo.yaml", f"{where}: envoy.throttle", "needs config demo.yaml")
            _check(isinstance(env["throttle"], dict) and not set(env["throttle"]) - THROTTLE_KEYS
                   and "rate" in env["throttle"], f"{where}: envoy.throttle",
                   f"expected a mapping with rate and optional {sorted(THROTTLE_KEYS - {'rate'})}")
            try:
                per_second(env["throttle"]["rate"])
            except (ValueError, KeyError):
                raise ScenarioError(f"{where}: envoy.throttle.rate: expected \"<n>/s\", got "
                                    f"{env['throttle']['rate']!r}") from None
        elif env.get("wasm") == "noop":
            _check(env["config"] == "demo.yaml", f"{where}: envoy.wasm", "needs config demo.yaml")
        else:
            _check(env["config"] != "demo.yaml", f"{where}: envoy.throttle", "required with config demo.yaml")
        _check(env.get("wasm", "noop") == "noop" and not ("wasm" in env and "throttle" in env), f"{where}: envoy.wasm",
               "the only value is noop (the no-op filter in the throttle's place), without throttle")
        if "local_ratelimit" in env:
            b = env["local_ratelimit"]
            _check(env["config"] == "local_ratelimit.yaml", f"{where}: envoy.local_ratelimit",
                   "needs config local_ratelimit.yaml")
            _check(isinstance(b, dict) and set(b) == LRL_KEYS, f"{where}: envoy.local_ratelimit",
                   f"expected exactly {sorted(LRL_KEYS)}")
            try:
                seconds(b["fill_interval"])
            except ValueError as err:
                raise ScenarioError(f"{where}: envoy.local_ratelimit.fill_interval: {err}") from None
        s.envoy = {"concurrency": 2, **env}
    else:
        _check("envoy" not in d, f"{where}: envoy", f"not allowed with topology {topo}")
    if topo == "nginx_limit":
        n = d.get("nginx_limit")
        _check(isinstance(n, dict) and set(n) == {"rate"} and isinstance(n["rate"], int) and n["rate"] > 0,
               f"{where}: nginx_limit", "expected {rate: <requests per second, integer>}")
        s.nginx_limit = n
    if kind == "memory":
        _check(topo == "envoy", f"{where}: topology", "memory scenarios need topology envoy")
        steps = d.get("steps")
        _check(isinstance(steps, list) and steps and all(isinstance(x, int) and x > 0 for x in steps)
               and steps == sorted(steps), f"{where}: steps", "expected increasing positive integers")
        s.steps = steps
        return s
    tool = d.get("tool")
    _check(tool in ("ab", "fortio"), f"{where}: tool", f"expected ab or fortio, got {tool!r}")
    s.tool = tool
    conns = d.get("connections", 100)
    _check(isinstance(conns, int) and 1 <= conns <= 10000, f"{where}: connections", "expected 1..10000")
    s.connections = conns
    _check(("requests" in d) != ("duration" in d), where, "give exactly one of requests or duration")
    if "requests" in d:
        _check(isinstance(d["requests"], int) and d["requests"] >= conns, f"{where}: requests",
               "expected an integer >= connections")
        s.requests = d["requests"]
    else:
        try:
            s.duration_s = seconds(d["duration"])
        except ValueError as err:
            raise ScenarioError(f"{where}: duration: {err}") from None
        _check(0 < s.duration_s <= 300, f"{where}: duration", "expected at most 5m")
    qps = d.get("qps", 0)
    _check(isinstance(qps, (int, float)) and qps >= 0, f"{where}: qps", "expected a number >= 0 (0: as fast as possible)")
    _check(not (tool == "ab" and qps), f"{where}: qps", "ab cannot offer a fixed rate: use fortio or qps 0")
    s.qps = qps
    ka = d.get("keepalive", tool == "fortio")
    _check(isinstance(ka, bool), f"{where}: keepalive", "expected true or false")
    s.keepalive = ka
    w = d.get("warmup_requests", 1000)
    _check(isinstance(w, int) and w >= 0, f"{where}: warmup_requests", "expected an integer >= 0")
    s.warmup_requests = w
    if "baseline" in d:
        _check(isinstance(d["baseline"], str), f"{where}: baseline", "expected a scenario label")
        s.baseline = d["baseline"]
    return s


def _parse_cluster(d: dict, where: str) -> Scenario:
    """kind: cluster: N proxies sharing one rate (perf/cluster_bench.py)."""
    unknown = set(d) - {"label", "description", "kind", "cluster"}
    _check(not unknown, where, f"fields {sorted(unknown)} do not apply to kind cluster")
    raw = d.get("cluster")
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: cluster: required mapping for kind cluster")
    c: dict[str, Any] = raw
    unknown = set(c) - CLUSTER_KEYS
    _check(not unknown, f"{where}: cluster", f"unknown field(s) {sorted(unknown)}")
    _check(c.get("variant") in CLUSTER_VARIANTS, f"{where}: cluster.variant",
           f"expected one of {CLUSTER_VARIANTS}, got {c.get('variant')!r}")
    rate: Any = c.get("rate")
    _check(isinstance(rate, int) and 1 <= rate <= 100_000, f"{where}: cluster.rate",
           "expected a whole number of requests per second for all proxies, 1..100000")
    load: Any = c.get("load")
    _check(isinstance(load, (int, float)) and 0 < load <= 10, f"{where}: cluster.load",
           "expected the offered load as a multiple of the rate, above 0 and at most 10")
    proxies = c.get("proxies", 3)
    _check(isinstance(proxies, int) and 1 <= proxies <= 8, f"{where}: cluster.proxies", "expected 1..8")
    split = c.get("split", [1] * proxies)
    _check(isinstance(split, list) and len(split) == proxies and all(isinstance(x, (int, float)) and x >= 0
                                                                    for x in split) and sum(split) > 0,
           f"{where}: cluster.split", f"expected {proxies} weights >= 0 (one per proxy) with a positive sum")
    _check(c.get("concurrency", 2) in (1, 2, 4), f"{where}: cluster.concurrency", "expected 1, 2 or 4")
    out: dict[str, Any] = {"variant": c["variant"], "rate": rate, "load": float(load), "split": split, "proxies": proxies,
           "concurrency": c.get("concurrency", 2)}
    for key, default, top in (("duration", None, 120.0), ("warmup", "2s", 60.0), ("max_queue_delay", "1s", 60.0)):
        try:
            value: Any = c.get(key, default)
            out[key] = seconds(value)
        except (ValueError, KeyError, TypeError):
            raise ScenarioError(f"{where}: cluster.{key}: expected a duration like 500ms or 10s, "
                                f"got {c.get(key)!r}") from None
        _check(0 <= out[key] <= top, f"{where}: cluster.{key}", f"expected at most {top:g} s")
    _check(out["warmup"] < out["duration"], f"{where}: cluster.warmup", "must be shorter than the duration")
    if c["variant"] == "process":
        _check(rate * 60 % proxies == 0, f"{where}: cluster.rate", f"process scope gives each proxy rate/{proxies} "
               f"(per minute): make rate x 60 a multiple of {proxies}")
    return Scenario(label=d["label"], description=d["description"], topology="cluster", kind="cluster",
                    cluster=out)


def load_all() -> dict[str, Scenario]:
    return {p.stem: parse(p) for p in sorted(SCENARIOS.glob("*.yaml"))}


def load_set(name: str) -> list[tuple[list[Scenario], int]]:
    """A named set from perf/sets.yaml, in its order, as groups of
    (scenarios, rounds). An entry is a label (one run) or
    {rounds: N, scenarios: [labels]}: those scenarios run interleaved,
    round after round, so that slow drifts of the machine hit them alike."""
    sets = yaml.safe_load(SETS.read_text())
    if name not in sets:
        raise ScenarioError(f"perf/sets.yaml: no set {name!r} (have {sorted(sets)})")
    scenarios = load_all()
    groups: list[tuple[list[str], int]] = []
    for i, entry in enumerate(sets[name]):
        where = f"perf/sets.yaml: {name}[{i}]"
        if isinstance(entry, str):
            groups.append(([entry], 1))
            continue
        _check(isinstance(entry, dict) and set(entry) == {"rounds", "scenarios"}, where,
               "expected a label or {rounds: N, scenarios: [labels]}")
        _check(isinstance(entry["rounds"], int) and 1 <= entry["rounds"] <= 10, f"{where}.rounds", "expected 1..10")
        _check(isinstance(entry["scenarios"], list) and entry["scenarios"], f"{where}.scenarios",
               "expected a list of labels")
        groups.append((entry["scenarios"], entry["rounds"]))
    labels = [label for g, _ in groups for label in g]
    missing = [label for label in labels if label not in scenarios]
    if missing:
        raise ScenarioError(f"perf/sets.yaml: {name}: no scenario file for {missing}")
    dup = sorted({label for label in labels if labels.count(label) > 1})
    _check(not dup, f"perf/sets.yaml: {name}", f"listed more than once: {dup}")
    for label in labels:
        s = scenarios[label]
        if s.baseline and s.baseline not in scenarios:
            raise ScenarioError(f"perf/scenarios/{s.label}.yaml: baseline: no scenario {s.baseline!r}")
    for g, rounds in groups:
        _check(rounds == 1 or all(scenarios[label].kind == "load" for label in g), f"perf/sets.yaml: {name}",
               "rounds apply to load scenarios only")
    return [([scenarios[label] for label in g], rounds) for g, rounds in groups]
