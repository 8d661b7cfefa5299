"""The side-by-side benchmark as data (perf/cpu.yaml): which listeners share
the one Envoy, which load shapes run against each, and the hand-off and
smoothness parts. This module checks a profile (a bad field is named, and
nothing runs) and turns it into the Envoy config: one listener per
variant, every HTTP connection manager alike (the one of envoy/baseline.yaml),
only the filter before the router differs. Pure: no process is started."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.configs import load_config, throttle_filter
from harness.procs import ROOT
from perf.scenario import NOOP_WASM, seconds

SPEC = Path(__file__).resolve().parent / "cpu.yaml"
RUNTIMES = ("v8", "wamr", "wasmtime")
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

    def listener_names(self) -> list[str]:
        return [x.name for x in self.listeners]


# -- parsing ---------------------------------------------------------------

def _keys(d: object, where: str, required: set[str], optional: set[str]) -> dict:
    _check(isinstance(d, dict), where, "expected a mapping")
    assert isinstance(d, dict)
    unknown = set(d) - required - optional
    _check(not unknown, where, f"unknown field(s) {sorted(unknown)}")
    missing = required - set(d)
    _check(not missing, where, f"missing field(s) {sorted(missing)}")
    return d


def _int(d: dict, key: str, where: str, lo: int, hi: int, default: int | None = None) -> int:
    v = d.get(key, default)
    if not (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi):
        raise SpecError(f"{where}.{key}: expected an integer {lo}..{hi}, got {v!r}")
    return v


def _duration(d: dict, key: str, where: str, default: str | None = None) -> float:
    v = d.get(key, default)
    try:
        s = seconds(v)  # type: ignore[arg-type]  # None and other types are refused by seconds()
    except (ValueError, TypeError) as e:
        raise SpecError(f"{where}.{key}: {e}") from None
    _check(s > 0, f"{where}.{key}", "expected a duration > 0")
    return s


def _names(v: object, where: str, allowed: set[str], what: str) -> tuple[str, ...]:
    _check(isinstance(v, list) and v and all(isinstance(x, str) for x in v), where, f"expected a list of {what}")
    assert isinstance(v, list)
    bad = [x for x in v if x not in allowed]
    _check(not bad, where, f"unknown {what} {bad} (have {sorted(allowed)})")
    _check(len(set(v)) == len(v), where, "listed more than once")
    return tuple(v)


def parse_profile(name: str, d: object, where: str = "perf/cpu.yaml") -> Profile:
    where = f"{where}: {name}"
    d = _keys(d, where, {"builds", "cpu"}, {"concurrency", "handoff", "smoothness"})
    conc = _int(d, "concurrency", where, 1, 8, 2)
    _check(isinstance(d["builds"], dict) and d["builds"], f"{where}.builds", "expected a mapping of build names")
    builds: dict[str, Build] = {}
    for bname, b in d["builds"].items():
        bw = f"{where}.builds.{bname}"
        _check(isinstance(bname, str) and NAME.fullmatch(bname) is not None and bname != "noop", bw,
               "a build name is lower-case letters, digits and '-' (not 'noop')")
        b = _keys(b, bw, set(), {"path", "ref"})
        _check(len(b) == 1, bw, "expected exactly one of path (a .wasm file) or ref (a git ref to build)")
        if "path" in b:
            _check(isinstance(b["path"], str) and b["path"].endswith(".wasm"), f"{bw}.path", "expected a .wasm path")
            builds[bname] = Build(bname, path=Path(b["path"]))
        else:
            _check(isinstance(b["ref"], str) and b["ref"].strip() != "", f"{bw}.ref", "expected a git ref")
            builds[bname] = Build(bname, ref=b["ref"])
    c = _keys(d["cpu"], f"{where}.cpu", {"listeners", "shapes"}, {"rounds", "warmup_requests", "idle"})
    cw = f"{where}.cpu"
    rounds = _int(c, "rounds", cw, 1, 20, 5)
    warmup = _int(c, "warmup_requests", cw, 0, 100000, 400)
    idle_s = _duration(c, "idle", cw, "3s")
    _check(isinstance(c["listeners"], list) and c["listeners"], f"{cw}.listeners", "expected a list")
    listeners = []
    for i, x in enumerate(c["listeners"]):
        lw = f"{cw}.listeners[{i}]"
        x = _keys(x, lw, {"name"}, {"wasm", "runtime", "local_ratelimit"})
        _check(isinstance(x["name"], str) and NAME.fullmatch(x["name"]) is not None, f"{lw}.name",
               "expected lower-case letters, digits and '-'")
        wasm = x.get("wasm")
        _check(wasm is None or wasm == "noop" or wasm in builds, f"{lw}.wasm",
               f"expected noop or a build name {sorted(builds)}, got {wasm!r}")
        rt = x.get("runtime", "v8")
        _check(rt in RUNTIMES, f"{lw}.runtime", f"expected one of {RUNTIMES}, got {rt!r}")
        _check(wasm is not None or "runtime" not in x, f"{lw}.runtime", "only with wasm")
        lrl = x.get("local_ratelimit", False)
        _check(isinstance(lrl, bool), f"{lw}.local_ratelimit", "expected true or false")
        _check(not (lrl and wasm), lw, "one filter per listener: wasm or local_ratelimit")
        listeners.append(CpuListener(x["name"], wasm, rt, lrl))
    names = [x.name for x in listeners]
    dup = sorted({n for n in names if names.count(n) > 1})
    _check(not dup, f"{cw}.listeners", f"names listed more than once: {dup}")
    _check(isinstance(c["shapes"], list) and c["shapes"], f"{cw}.shapes", "expected a list")
    shapes = []
    for i, s in enumerate(c["shapes"]):
        sw = f"{cw}.shapes[{i}]"
        s = _keys(s, sw, {"name", "connections", "requests"}, {"qps", "pin"})
        _check(isinstance(s["name"], str) and NAME.fullmatch(s["name"]) is not None, f"{sw}.name",
               "expected lower-case letters, digits and '-'")
        conns = _int(s, "connections", sw, 1, 1000)
        reqs = _int(s, "requests", sw, conns, 10_000_000)
        qps = s.get("qps", 0)
        _check(isinstance(qps, (int, float)) and not isinstance(qps, bool) and qps >= 0, f"{sw}.qps",
               "expected a number >= 0 (0: as fast as possible)")
        pin = s.get("pin", False)
        _check(isinstance(pin, bool), f"{sw}.pin", "expected true or false")
        shapes.append(Shape(s["name"], conns, float(qps), reqs, pin))
    snames = [s.name for s in shapes]
    _check(len(set(snames)) == len(snames), f"{cw}.shapes", "names listed more than once")
    p = Profile(name, conc, builds, rounds, warmup, idle_s, listeners, shapes)
    if "handoff" in d:
        hw = f"{where}.handoff"
        h = _keys(d["handoff"], hw, {"builds"}, {"slots", "upstream_delay", "connections", "requests", "rounds",
                                                 "placements"})
        slots = _int(h, "slots", hw, 1, 64, 4)
        conns = _int(h, "connections", hw, slots + 1, 400, 40)
        placements = _names(h.get("placements", list(PLACEMENTS)), f"{hw}.placements", set(PLACEMENTS), "placements")
        if "cross" in placements:
            _check(conc == 2, f"{hw}.placements", "cross needs concurrency 2 (waiters on the other of two workers)")
            _check(conns % (2 * slots) == 0, f"{hw}.connections",
                   f"cross needs a multiple of 2 x slots ({2 * slots}): blocks of {slots} per worker")
        p.handoff = HandoffSpec(slots=slots, upstream_delay_s=_duration(h, "upstream_delay", hw, "20ms"),
                                connections=conns, requests=_int(h, "requests", hw, conns, 1_000_000, 2000),
                                rounds=_int(h, "rounds", hw, 1, 20, 3),
                                builds=_names(h["builds"], f"{hw}.builds", set(builds), "builds"),
                                placements=placements)
    if "smoothness" in d:
        sw = f"{where}.smoothness"
        s = _keys(d["smoothness"], sw, {"builds"}, {"rate", "connections", "duration", "rounds", "window", "nginx"})
        nginx = s.get("nginx", True)
        _check(isinstance(nginx, bool), f"{sw}.nginx", "expected true or false")
        window = _duration(s, "window", sw, "100ms")
        _check(abs(window * 1000 - round(window * 1000)) < 1e-9, f"{sw}.window",
               "expected whole milliseconds (the upstream's timestamps are whole milliseconds)")
        p.smoothness = SmoothSpec(rate=_int(s, "rate", sw, 1, 100000, 500),
                                  connections=_int(s, "connections", sw, 1, 1000, 100),
                                  duration_s=_duration(s, "duration", sw, "20s"),
                                  rounds=_int(s, "rounds", sw, 1, 20, 2), window_s=window,
                                  builds=_names(s["builds"], f"{sw}.builds", set(builds), "builds"), nginx=nginx)
    return p


def load_profile(name: str, path: Path = SPEC) -> Profile:
    try:
        d = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError(f"{path.name}: not valid YAML: {e}") from None
    _check(isinstance(d, dict), path.name, "expected a mapping of profiles")
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
    cfg = load_config("baseline.yaml")
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm = copy.deepcopy(hcm)
    # ab speaks HTTP/1.0; perf/ allows it on every HTTP listener alike (perf/scenario.py).
    hcm.setdefault("http_protocol_options", {})["accept_http_10"] = True
    return hcm


def _wasm_filter(x: EnvoyListener) -> dict:
    hf = copy.deepcopy(throttle_filter(load_config("demo.yaml")))
    assert hf is not None
    c = hf["typed_config"]["config"]
    c["name"] = f"throttle-{x.name}"
    c["vm_config"]["vm_id"] = f"vm-{x.name}"     # a VM (and shared data) of its own
    c["vm_config"]["runtime"] = f"envoy.wasm.runtime.{x.runtime}"
    c["vm_config"]["code"]["local"]["filename"] = str(x.wasm_path)
    plugin = json.loads(c["configuration"]["value"])
    if x.rule is not None:
        plugin["rules"] = [x.rule]
    c["configuration"]["value"] = json.dumps(plugin)
    hf["name"] = f"throttle-{x.name}"
    return hf


def _lrl_filter() -> dict:
    cfg = load_config("local_ratelimit.yaml")
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hf = copy.deepcopy(next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.local_ratelimit"))
    # never reached: 1,000,000 tokens a second (as perf/scenarios/lrl-off-*)
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
        hcm = _hcm_template()
        hcm["stat_prefix"] = x.name
        hcm["route_config"]["name"] = x.name
        hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] = x.cluster
        router = hcm["http_filters"][-1]
        filters = []
        if x.wasm_path is not None:
            filters.append(_wasm_filter(x))
        if x.local_ratelimit:
            filters.append(_lrl_filter())
        hcm["http_filters"] = [*filters, router]
        if x.access_log is not None:
            hcm["access_log"] = [{
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": str(x.access_log),
                    "log_format": {"text_format_source": {"inline_string": HANDOFF_LOG_FORMAT}}}}]
        listener: dict = {
            "name": x.name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": x.port}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                            "typed_config": hcm}]}],
        }
        if x.exact_balance:
            # One listen socket, and Envoy gives each new connection to the
            # worker with the fewest (checked per connection by perf/handoff.py).
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
