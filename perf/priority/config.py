"""perf/priority/scenarios.yaml, read and checked: its shape by scenarios.schema.yaml
(harness.schema), the rules between fields here (each error naming the field); and the
configurations each arm runs (the throttle's plugin configuration, HAProxy's settings)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness import schema
from harness.procs import ROOT
from harness.units import seconds

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE / "scenarios.yaml"
SCHEMA = HERE / "scenarios.schema.yaml"
HEADER = "x-priority"
CLASSES = ("critical", "batch")  # highest first


class SpecError(ValueError):
    pass


@dataclass(frozen=True)
class Arm:
    name: str
    kind: str  # "throttle" or "haproxy"
    min_share: float = 0.0
    maxconn: int = 1
    adaptive: dict[str, str] | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    load: dict[str, float]  # class -> offered requests per second
    arms: tuple[Arm, ...]
    requires: str | None = None


@dataclass(frozen=True)
class Spec:
    rate: float
    service_ms: float
    max_queue_delay_s: float
    duration_s: float
    scenarios: tuple[Scenario, ...] = field(default=())


def load_set(name: str, path: Path = SCENARIOS) -> Spec:
    data = yaml.safe_load(path.read_text())
    schema.check(data, SCHEMA, path.name, SpecError)
    if name not in data["sets"]:
        raise SpecError(f"{path.name}: sets: no set {name!r} (have {sorted(data['sets'])})")
    arms: dict[str, Arm] = {}
    for a, v in data["arms"].items():
        if v["kind"] == "haproxy" and ("min_share" in v or "adaptive" in v):
            raise SpecError(f"{path.name}: arms.{a}: HAProxy has no floors and no adaptive rate (strict priority)")
        arms[a] = Arm(a, v["kind"], v.get("min_share", 0.0), v.get("maxconn", 1), v.get("adaptive"))
    chosen = data["sets"][name]
    scenarios = []
    for s in chosen["scenarios"]:
        if s not in data["scenarios"]:
            raise SpecError(f"{path.name}: sets.{name}.scenarios: no scenario {s!r}")
        v = data["scenarios"][s]
        unknown = [a for a in v["arms"] if a not in arms]
        if unknown:
            raise SpecError(f"{path.name}: scenarios.{s}.arms: no arm {unknown[0]!r}")
        scenarios.append(Scenario(s, v["what"], dict(v["load"]), tuple(arms[a] for a in v["arms"]),
                                  v.get("requires")))
    return Spec(float(data["rate"]), float(data["service_ms"]), seconds(data["max_queue_delay"]),
                float(chosen["duration_s"]), tuple(scenarios))


def plugin(spec: Spec, arm: Arm) -> dict[str, Any]:
    """The throttle's plugin configuration of a throttle arm: one rule at the rate, critical
    (on the header) above batch (the default class, with the arm's floor)."""
    batch: dict[str, Any] = {"name": "batch"}
    if arm.min_share:
        batch["min_share"] = arm.min_share
    rule: dict[str, Any] = {"name": "api", "rate": f"{spec.rate:g}/s",
                            "max_queue_delay": f"{spec.max_queue_delay_s * 1000:g}ms",
                            "classes": [{"name": "critical", "match": {"headers": {HEADER: "critical"}}}, batch]}
    if arm.adaptive:
        rule["adaptive"] = dict(arm.adaptive)
    return {"rules": [rule], "max_held_per_worker": 20000}


def refused(config: dict[str, Any]) -> str | None:
    """Why the filter's own validator refuses a plugin configuration (None: accepted)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
    try:
        r = subprocess.run(["cargo", "run", "-q", "-p", "throttle-core", "--bin", "throttle-config", "--", "check",
                            f.name], cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        Path(f.name).unlink(missing_ok=True)
    if r.returncode == 0:
        return None
    return " ".join((r.stdout + r.stderr).split())[-400:]
