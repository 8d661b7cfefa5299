"""The instruction-count benchmark as data (perf/icount/profiles.yaml): which variants
run, each in an Envoy of its own under callgrind, and the phases each process runs.
This module checks a profile (its shape against profile.schema.yaml, the rules that
relate fields here: a bad field is named, and nothing runs) and builds each variant's
Envoy config: one listener, the HTTP connection manager of envoy/baseline.yaml, the
variant's filter before the router (perf/cpu/config.py builds it). Pure: no process
is started."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness import schema
from harness.configs import hcm
from harness.engine import CLUSTER_NAME as ENGINE_CLUSTER
from harness.nginx import PATH as UPSTREAM_PATH
from harness.units import seconds
from perf.cpu import config as cpu_config
from perf.cpu.config import NEVER_REACHED, Build, EnvoyListener

HERE = Path(__file__).resolve().parent
SPEC = HERE / "profiles.yaml"
RULE_KINDS = ("unkeyed", "keyed", "path", "cluster", "adaptive")
#: Every variant's requests: the upstream's file, with the header the keyed rule keys on
#: (sent to every variant, so that only the filter differs).
REQUEST_PATH = UPSTREAM_PATH
KEY_HEADER = "x-user"
REQUEST_HEADERS = (f"{KEY_HEADER}: icount",)
#: A cluster rule's burst: 0.3 s of its rate (see plugin()).
CLUSTER_BURST = 300_000
#: The path rule's prefix: it matches REQUEST_PATH, and only by reading the path.
PATH_PREFIX = "/details"


class SpecError(ValueError):
    pass


def _check(cond: object, where: str, msg: str) -> None:
    if not cond:
        raise SpecError(f"{where}: {msg}")


@dataclass(frozen=True)
class Variant:
    name: str
    wasm: str | None = None          # a build name, "noop", or None
    rule: str | None = None          # RULE_KINDS, with a build
    local_ratelimit: bool = False

    @property
    def kind(self) -> str:
        if self.local_ratelimit:
            return "local_ratelimit"
        if self.wasm == "noop":
            return "noop"
        return "throttle" if self.wasm else "plain"

    @property
    def needs_engine(self) -> bool:
        return self.rule == "cluster"


@dataclass(frozen=True)
class Phase:
    requests: int
    qps: float = 0.0                 # 0: as fast as one connection goes

    @property
    def paced(self) -> bool:
        return self.qps > 0


@dataclass
class Profile:
    name: str
    builds: dict[str, Build]
    processes: int
    jobs: int
    warmup_requests: int
    idle_s: float
    start_timeout_s: float
    phases: list[Phase]
    variants: list[Variant]


def parse_profile(name: str, d: Any, where: str = "perf/icount/profiles.yaml") -> Profile:
    """One profile: its shape (profile.schema.yaml), then the rules between fields."""
    where = f"{where}: {name}"
    schema.check(d, HERE / "profile.schema.yaml", where, SpecError)
    builds = {b: Build(b, path=Path(v["path"])) if "path" in v else Build(b, ref=v["ref"])
              for b, v in d["builds"].items()}
    variants = []
    for i, x in enumerate(d["variants"]):
        vw, wasm, rule = f"{where}: variants[{i}]", x.get("wasm"), x.get("rule")
        _check(wasm is None or wasm == "noop" or wasm in builds, f"{vw}.wasm",
               f"expected noop or a build name {sorted(builds)}, got {wasm!r}")
        _check(not (x.get("local_ratelimit") and wasm), vw, "one filter per variant: wasm or local_ratelimit")
        _check(rule is None or (wasm is not None and wasm != "noop"), f"{vw}.rule", "only with a throttle build")
        _check(rule is not None or wasm is None or wasm == "noop", f"{vw}.rule",
               f"a throttle build needs a rule ({', '.join(RULE_KINDS)})")
        variants.append(Variant(x["name"], wasm, rule, x.get("local_ratelimit", False)))
    names = [v.name for v in variants]
    dup = sorted({n for n in names if names.count(n) > 1})
    _check(not dup, f"{where}: variants", f"names listed more than once: {dup}")
    phases = [Phase(p["requests"], float(p.get("qps", 0))) for p in d["phases"]]
    # Ir = requests x c + seconds x r: the fit needs phases whose seconds per request differ.
    _check(any(p.paced for p in phases) and any(not p.paced for p in phases), f"{where}: phases",
           "expected at least one paced phase (qps > 0) and one as fast as possible (qps 0): "
           "the fit tells the work per request from the work per second by their different mix")
    for i, p in enumerate(phases):
        _check(not p.paced or p.requests / p.qps <= 600, f"{where}: phases[{i}]",
               f"{p.requests} requests at {p.qps:g}/s take more than 10 minutes")
    idle_s = seconds(d.get("idle", "5s"))
    start_s = seconds(d.get("start_timeout", "10m"))
    _check(start_s > 0, f"{where}: start_timeout", "expected a duration > 0")
    return Profile(name, builds, d.get("processes", 3), d.get("jobs", 1), d.get("warmup_requests", 500),
                   idle_s, start_s, phases, variants)


def load_profile(name: str, path: Path = SPEC) -> Profile:
    try:
        d = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError(f"{path.name}: not valid YAML: {e}") from None
    _check(isinstance(d, dict), path.name, "expected a mapping of profiles")
    assert isinstance(d, dict)
    _check(name in d, path.name, f"no profile {name!r} (have {sorted(d)})")
    return parse_profile(name, d[name], path.name)


def select(p: Profile, only: list[str]) -> None:
    """Keeps the variants named in `only` (all if empty)."""
    if not only:
        return
    unknown = sorted(set(only) - {v.name for v in p.variants})
    _check(not unknown, "--only", f"no variants {unknown} in profile {p.name} (have {[v.name for v in p.variants]})")
    p.variants = [v for v in p.variants if v.name in only]
    p.builds = {b: x for b, x in p.builds.items() if any(v.wasm == b for v in p.variants)}


# -- the plugin configurations and the Envoy config -------------------------------------

def plugin(kind: str, name: str) -> dict[str, Any]:
    """The throttle's configuration of a rule kind: one rule named after the variant, at a
    rate never reached (each request on the fast path)."""
    _check(kind in RULE_KINDS, "rule", f"expected one of {RULE_KINDS}, got {kind!r}")
    rule: dict[str, Any] = {"name": name, "rate": NEVER_REACHED, "burst": 0, "max_queue_delay": "1s",
                            "match": {"path_prefix": PATH_PREFIX if kind == "path" else "/"}}
    out: dict[str, Any] = {"rules": [rule], "max_held_per_worker": 10000, "reject_status": 429}
    if kind == "keyed":
        rule["key"] = {"header": KEY_HEADER}
    if kind == "adaptive":
        # Learned from the answers, starting (and staying: nothing sheds) at the top:
        # the response's :status, the request's path and a sampled address are read.
        rule["adaptive"] = {"min_rate": "10000/s", "max_rate": NEVER_REACHED}
    if kind == "cluster":
        # burst: slots granted in the last CLUSTER_SLACK are usable at once (slack = (burst + 1)
        # x interval), so that a claim answered late under valgrind leaves no request waiting.
        rule.update(scope="cluster", expected_replicas=1, on_engine_failure="local_share",
                    burst=CLUSTER_BURST)
        # Under valgrind Envoy is ~50x slower, and stands still while callgrind dumps: the
        # longest call timeout (the epochs a claim looks back grow with it: the runner waits
        # until the rule is on the grid), and no fallback within a run.
        out["engine"] = {"cluster": ENGINE_CLUSTER, "timeout": "250ms", "fallback_after": "1m"}
    return out


def envoy_config(v: Variant, *, wasm: Path | None, port: int, admin_port: int, upstream_port: int,
                 engine_port: int | None = None) -> dict[str, Any]:
    """One Envoy with one listener for variant `v` (`wasm`: its module, if any)."""
    _check((wasm is not None) == (v.wasm is not None), v.name, "a .wasm exactly when the variant has one")
    clusters = {"nginx": upstream_port}
    if v.needs_engine:
        _check(engine_port is not None, v.name, "a cluster rule needs the engine's port")
        assert engine_port is not None
        clusters[ENGINE_CLUSTER] = engine_port
    pl = plugin(v.rule, v.name) if v.rule else None
    listener = EnvoyListener(v.name, port, wasm_path=wasm, rule=pl["rules"][0] if pl else None,
                             local_ratelimit=v.local_ratelimit)
    cfg = cpu_config.envoy_config([listener], admin_port=admin_port, clusters=clusters)
    if pl is not None:  # the whole plugin configuration (the engine block of a cluster rule)
        for hf in hcm(cfg)["http_filters"]:
            if hf["name"] == f"throttle-{v.name}":
                hf["typed_config"]["config"]["configuration"]["value"] = json.dumps(pl)
    return cfg

