"""The side-by-side benchmark as data (perf/cpu/profiles.yaml): which listeners share
the one Envoy, which load shapes run against each, and the hand-off and
smoothness parts. This module checks a profile (its shape against
profile.schema.yaml, the rules that relate fields here: a bad field is named, and
nothing runs) and turns it into the Envoy config: one listener per
variant, every HTTP connection manager alike (the one of envoy/baseline.yaml),
only the filter before the router differs. Pure: no process is started."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness import schema
from harness.configs import hcm, load_config, plugin_json, throttle_http_filter
from harness.procs import NOOP_WASM, ROOT
from harness.units import seconds

HERE = Path(__file__).resolve().parent
SPEC = HERE / "profiles.yaml"
PLACEMENTS = ("same", "cross")
NEVER_REACHED = "1000000/s"  # the throttle's highest rate: never reached on this machine
NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,40}")
# Envoy's access log for the hand-off listeners: wall-clock start (µs), the
# client's port (-> its connection -> its worker), and monotonic offsets
# from the first request byte: request released upstream, response received.
HANDOFF_LOG_FORMAT = ("%START_TIME(%s.%6f)% %DOWNSTREAM_REMOTE_PORT% %COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)% "
                      "%COMMON_DURATION(DS_RX_BEG:US_RX_END:us)% %RESPONSE_CODE%\n")


class SpecError(ValueError):
    pass


def _check(cond: object, where: str, msg: str) -> None:
    if not cond:
        raise SpecError(f"{where}: {msg}")


@dataclass(frozen=True)
class Build:
    """A .wasm of the throttle: a file, or a git ref built into target/perf-ref/."""
    name: str
    path: Path | None = None
    ref: str | None = None


@dataclass(frozen=True)
class CpuListener:
    name: str
    wasm: str | None = None          # a build name, "noop", or None
    runtime: str = "v8"
    local_ratelimit: bool = False

    @property
    def kind(self) -> str:
        if self.local_ratelimit:
            return "local_ratelimit"
        if self.wasm == "noop":
            return "noop"
        return "throttle" if self.wasm else "plain"


@dataclass(frozen=True)
class Shape:
    name: str
    connections: int
    qps: float
    requests: int
    pin: bool = False


@dataclass(frozen=True)
class HandoffSpec:
    slots: int
    upstream_delay_s: float
    connections: int
    requests: int
    rounds: int
    builds: tuple[str, ...]
    placements: tuple[str, ...]


@dataclass(frozen=True)
class SmoothSpec:
    rate: int
    connections: int
    duration_s: float
    rounds: int
    window_s: float
    builds: tuple[str, ...]
    nginx: bool


@dataclass
class Profile:
    name: str
    concurrency: int
    builds: dict[str, Build]
    rounds: int
    warmup_requests: int
    idle_s: float
    listeners: list[CpuListener]
    shapes: list[Shape]
    handoff: HandoffSpec | None = None
    smoothness: SmoothSpec | None = None


# -- parsing ---------------------------------------------------------------

def _builds(names: list[str], where: str, builds: dict[str, Build]) -> tuple[str, ...]:
    bad = [x for x in names if x not in builds]
    _check(not bad, where, f"unknown builds {bad} (have {sorted(builds)})")
    return tuple(names)


def _seconds(d: dict[str, Any], key: str, default: str) -> float:
    """A duration field (its grammar is the schema's), or its default."""
    return seconds(d.get(key, default))


def parse_profile(name: str, d: Any, where: str = "perf/cpu/profiles.yaml") -> Profile:
    """One profile: its shape (profile.schema.yaml), then the rules between fields."""
    where = f"{where}: {name}"
    schema.check(d, HERE / "profile.schema.yaml", where, SpecError)
    conc = d.get("concurrency", 2)
    builds = {b: Build(b, path=Path(v["path"])) if "path" in v else Build(b, ref=v["ref"])
              for b, v in d["builds"].items()}
    c = d["cpu"]
    listeners = []
    for i, x in enumerate(c["listeners"]):
        lw, wasm = f"{where}: cpu.listeners[{i}]", x.get("wasm")
        _check(wasm is None or wasm == "noop" or wasm in builds, f"{lw}.wasm",
               f"expected noop or a build name {sorted(builds)}, got {wasm!r}")
        _check(wasm is not None or "runtime" not in x, f"{lw}.runtime", "only with wasm")
        _check(not (x.get("local_ratelimit") and wasm), lw, "one filter per listener: wasm or local_ratelimit")
        listeners.append(CpuListener(x["name"], wasm, x.get("runtime", "v8"), x.get("local_ratelimit", False)))
    names = [x.name for x in listeners]
    dup = sorted({n for n in names if names.count(n) > 1})
    _check(not dup, f"{where}: cpu.listeners", f"names listed more than once: {dup}")
    shapes = []
    for i, sh in enumerate(c["shapes"]):
        _check(sh["requests"] >= sh["connections"], f"{where}: cpu.shapes[{i}].requests",
               f"expected at least connections ({sh['connections']})")
        shapes.append(Shape(sh["name"], sh["connections"], float(sh.get("qps", 0)), sh["requests"], sh.get("pin", False)))
    snames = [x.name for x in shapes]
    _check(len(set(snames)) == len(snames), f"{where}: cpu.shapes", "names listed more than once")
    idle_s = _seconds(c, "idle", "3s")
    _check(idle_s > 0, f"{where}: cpu.idle", "expected a duration > 0")
    p = Profile(name, conc, builds, c.get("rounds", 5), c.get("warmup_requests", 400), idle_s, listeners, shapes)
    if "handoff" in d:
        h, hw = d["handoff"], f"{where}: handoff"
        slots, conns = h.get("slots", 4), h.get("connections", 40)
        placements = tuple(h.get("placements", PLACEMENTS))
        _check(conns > slots, f"{hw}.connections", f"expected more than slots ({slots})")
        if "cross" in placements:
            _check(conc == 2, f"{hw}.placements", "cross needs concurrency 2 (waiters on the other of two workers)")
            _check(conns % (2 * slots) == 0, f"{hw}.connections",
                   f"cross needs a multiple of 2 x slots ({2 * slots}): blocks of {slots} per worker")
        p.handoff = HandoffSpec(slots=slots, upstream_delay_s=_seconds(h, "upstream_delay", "20ms"), connections=conns,
                                requests=h.get("requests", 2000), rounds=h.get("rounds", 3),
                                builds=_builds(h["builds"], f"{hw}.builds", builds), placements=placements)
        _check(p.handoff.requests >= conns, f"{hw}.requests", f"expected at least connections ({conns})")
    if "smoothness" in d:
        sm, sw = d["smoothness"], f"{where}: smoothness"
        window = _seconds(sm, "window", "100ms")
        _check(window > 0 and abs(window * 1000 - round(window * 1000)) < 1e-9, f"{sw}.window",
               "expected whole milliseconds (the upstream's timestamps are whole milliseconds)")
        p.smoothness = SmoothSpec(rate=sm.get("rate", 500), connections=sm.get("connections", 100),
                                  duration_s=_seconds(sm, "duration", "20s"), rounds=sm.get("rounds", 2),
                                  window_s=window, builds=_builds(sm["builds"], f"{sw}.builds", builds),
                                  nginx=sm.get("nginx", True))
    return p


def load_profile(name: str, path: Path = SPEC) -> Profile:
    try:
        d = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError(f"{path.name}: not valid YAML: {e}") from None
    _check(isinstance(d, dict), path.name, "expected a mapping of profiles")
    assert isinstance(d, dict)
    _check(name in d, path.name, f"no profile {name!r} (have {sorted(d)})")
    return parse_profile(name, d[name], path.name)


def parse_wasm_overrides(items: list[str]) -> dict[str, Build]:
    """--wasm NAME=PATH.wasm or NAME=git:REF, repeated."""
    out: dict[str, Build] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if sep and NAME.fullmatch(name) and value.startswith("git:") and len(value) > 4:
            out[name] = Build(name, ref=value[4:])
        elif sep and NAME.fullmatch(name) and value.endswith(".wasm"):
            out[name] = Build(name, path=Path(value))
        else:
            raise SpecError(f"--wasm: expected NAME=PATH.wasm or NAME=git:REF, got {item!r}")
    return out


# -- the Envoy config ---------------------------------------------------------

@dataclass(frozen=True)
class EnvoyListener:
    """One listener of the one Envoy: its filter (none, a Wasm module, or
    local_ratelimit), its cluster, and how connections are spread."""
    name: str
    port: int
    wasm_path: Path | None = None
    runtime: str = "v8"
    rule: dict | None = None         # the throttle rule (None: a no-op module or no Wasm)
    local_ratelimit: bool = False
    cluster: str = "nginx"
    exact_balance: bool = False      # connections to the worker with the fewest
    access_log: Path | None = None


def throttle_rule(name: str, **fields: object) -> dict:
    """A rule named after its listener (so its statistics are its own)."""
    return {"name": name, **fields, "match": {"path_prefix": "/"}}


def _hcm_template() -> dict:
    """The HTTP connection manager of envoy/baseline.yaml, router last."""
    h = hcm(load_config("baseline.yaml"))
    # ab speaks HTTP/1.0; perf/ allows it on every HTTP listener alike (perf/bench/scenario.py).
    h.setdefault("http_protocol_options", {})["accept_http_10"] = True
    return h


def _wasm_filter(x: EnvoyListener) -> dict:
    """The throttle's filter of envoy/demo.yaml with this listener's .wasm, runtime and rule,
    in a VM (so shared data and statistics) of its own."""
    plugin = json.loads(plugin_json(load_config("demo.yaml")))
    if x.rule is not None:
        plugin["rules"] = [x.rule]
    assert x.wasm_path is not None
    return throttle_http_filter(plugin, x.wasm_path, name=x.name, runtime=x.runtime)


def _lrl_filter() -> dict:
    h = hcm(load_config("local_ratelimit.yaml"))
    hf = next(f for f in h["http_filters"] if f["name"] == "envoy.filters.http.local_ratelimit")
    # never reached: 1,000,000 tokens a second (as perf/bench/scenarios/lrl-off-*)
    hf["typed_config"]["token_bucket"] = {"max_tokens": 1000000, "tokens_per_fill": 1000000, "fill_interval": "1s"}
    return hf


def envoy_config(listeners: list[EnvoyListener], *, admin_port: int, clusters: dict[str, int]) -> dict:
    """One Envoy, one listener per variant on its own port; the same HCM
    settings everywhere, the variant's filter before the router."""
    base = load_config("baseline.yaml")
    names = [x.name for x in listeners]
    if len(set(names)) != len(names):
        raise SpecError(f"listener names must be unique: {names}")
    ports = [x.port for x in listeners]
    if len(set(ports)) != len(ports):
        raise SpecError(f"listener ports must be unique: {ports}")
    for x in listeners:
        if x.cluster not in clusters:
            raise SpecError(f"listener {x.name}: no cluster {x.cluster!r} (have {sorted(clusters)})")
        if x.rule is not None and x.wasm_path is None:
            raise SpecError(f"listener {x.name}: a throttle rule needs a .wasm")
    out_listeners = []
    for x in listeners:
        h = _hcm_template()
        h["stat_prefix"] = x.name
        h["route_config"]["name"] = x.name
        h["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] = x.cluster
        router = h["http_filters"][-1]
        filters = []
        if x.wasm_path is not None:
            filters.append(_wasm_filter(x))
        if x.local_ratelimit:
            filters.append(_lrl_filter())
        h["http_filters"] = [*filters, router]
        if x.access_log is not None:
            h["access_log"] = [{
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": str(x.access_log),
                    "log_format": {"text_format_source": {"inline_string": HANDOFF_LOG_FORMAT}}}}]
        listener: dict = {
            "name": x.name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": x.port}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                            "typed_config": h}]}],
        }
        if x.exact_balance:
            # One listen socket, and Envoy gives each new connection to the
            # worker with the fewest (checked per connection by perf/cpu/handoff.py).
            listener["enable_reuse_port"] = False
            listener["connection_balance_config"] = {"exact_balance": {}}
        out_listeners.append(listener)
    cluster_tpl = base["static_resources"]["clusters"][0]
    out_clusters = []
    for cname, port in clusters.items():
        c = copy.deepcopy(cluster_tpl)
        c["name"] = cname
        c["load_assignment"]["cluster_name"] = cname
        c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"][
            "port_value"] = port
        out_clusters.append(c)
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "stats_config": copy.deepcopy(base.get("stats_config", {})),
        "static_resources": {"listeners": out_listeners, "clusters": out_clusters},
    }


def wasm_path(build: str, paths: dict[str, Path]) -> Path:
    if build == "noop":
        return NOOP_WASM
    p = paths[build]
    return p if p.is_absolute() else ROOT / p
