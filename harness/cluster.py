"""Several Envoy proxies sharing one rate: the lab behind cluster scope's demo,
integration tests and benchmark.

`ClusterLab` starts, on loopback and by PID, the real engine (Redis and
envoyproxy/ratelimit, `harness.engine.Engine`, optionally behind its fault
proxy), one upstream that records its own arrival times and which proxy sent
each request (`harness.upstream.Upstream`, header `x-lab-proxy`), and N Envoy
processes built from `envoy/demo.yaml` with a given plugin configuration and
the engine's cluster. `Loads` runs one `fortio load` per proxy at a fixed
offered rate, side by side. `measure()` turns the upstream's timestamps and
the proxies' statistics into the figures the demo prints and the tests assert
(`Measurement`).

The proxies can also run Envoy's native global rate limit filter
(`envoy.filters.http.ratelimit`, gRPC to the same service) instead of the
throttle: `native_ratelimit_config`, used by the benchmark (perf/cluster/bench.py).
"""

from __future__ import annotations

import contextlib
import copy
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import configs, fortio, windows
from harness.configs import render
from harness.engine import Engine
from harness.envoy import Envoy, measure_loops
from harness.net import free_port, wait_until
from harness.procs import WASM
from harness.stalls import StallMonitor
from harness.upstream import Upstream

#: The header each proxy adds to requests it sends upstream: its name in the lab.
LAB_HEADER = "x-lab-proxy"
#: The rule name the lab's plugin configurations use.
RULE = "orders"
#: The domain and descriptor key of the native filter's limit in engine/config/throttle.yaml.
NATIVE_DOMAIN = "envoy_throttle"
NATIVE_KEY = "native_rl"


def plugin_config(rate: str, *, scope: str = "cluster", max_queue_delay: str = "1s", burst: int = 0,
                  expected_replicas: int = 3, on_engine_failure: str = "local_share",
                  engine_timeout: str = "50ms", fallback_after: str = "250ms") -> dict[str, Any]:
    """The throttle's plugin configuration: one rule (`orders`) on every path;
    with `scope: "cluster"`, the engine block naming the lab's engine cluster."""
    rule: dict[str, Any] = {"name": RULE, "rate": rate, "burst": burst, "max_queue_delay": max_queue_delay,
                            "match": {"path_prefix": "/"}}
    plugin: dict[str, Any] = {"rules": [rule], "max_held_per_worker": 10000, "reject_status": 429}
    if scope == "cluster":
        rule.update(scope="cluster", expected_replicas=expected_replicas, on_engine_failure=on_engine_failure)
        plugin["engine"] = {"cluster": "throttle_engine", "timeout": engine_timeout,
                            "fallback_after": fallback_after}
    elif scope != "process":
        raise ValueError(f"scope must be process or cluster, got {scope!r}")
    return plugin


def log_5xx(cfg: dict[str, Any], path: Path) -> None:
    """Adds an access log of answers with status 500 or more to `path`: status,
    Envoy's response flags and details, duration (to tell an upstream failure
    from a local reply when a lab run sees failures)."""
    configs.hcm(cfg)["access_log"] = [{
        "name": "envoy.access_loggers.file",
        "filter": {"status_code_filter": {"comparison": {
            "op": "GE", "value": {"default_value": 500, "runtime_key": "lab.log_5xx_from"}}}},
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(path),
            "log_format": {"text_format_source": {"inline_string":
                "%START_TIME% %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %DURATION%ms\n"}},
        },
    }]


def log_refusals(cfg: dict[str, Any], path: Path, status: int = 429) -> None:
    """Adds an access log of the answers with this status (the throttle's refusals) to
    `path`: when the request arrived (Envoy's START_TIME, Unix seconds to the ms), how
    long Envoy took to answer it (%DURATION%, ms: from its first byte in to its last byte
    out, Envoy's own clock, so the client's and the machine's scheduling outside Envoy
    are left out), and its path. Read back with `ClusterLab.refusals`."""
    configs.hcm(cfg).setdefault("access_log", []).append({
        "name": "envoy.access_loggers.file",
        "filter": {"status_code_filter": {"comparison": {
            "op": "EQ", "value": {"default_value": status, "runtime_key": "lab.log_refusals"}}}},
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(path),
            "log_format": {"text_format_source": {"inline_string":
                "%START_TIME(%s.%3f)% %DURATION% %REQ(:PATH)%\n"}},
        },
    })


@dataclass(frozen=True)
class Answer:
    """One answer of a proxy's access log (`log_refusals`)."""

    arrived: float  # Unix s (Envoy's START_TIME)
    ms: int  # Envoy's %DURATION%
    path: str


def _tag_requests(cfg: dict[str, Any], tag: str) -> None:
    configs.hcm(cfg)["route_config"]["request_headers_to_add"] = [
        {"header": {"key": LAB_HEADER, "value": tag}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]


def proxy_config(plugin: dict[str, Any] | None, *, upstream_port: int, tag: str,
                 engine_cluster: dict[str, Any] | None = None, wasm: Path = WASM) -> dict[str, Any]:
    """`envoy/demo.yaml` on free ports with this plugin configuration, the
    engine's cluster (if given), and requests tagged `x-lab-proxy: <tag>`."""
    cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=upstream_port,
                 plugin=plugin, wasm=wasm)
    if engine_cluster is not None:
        cfg["static_resources"]["clusters"].append(copy.deepcopy(engine_cluster))
    _tag_requests(cfg, tag)
    return cfg


def native_ratelimit_config(*, upstream_port: int, grpc_port: int, rate: float, tag: str,
                            timeout: str = "0.05s", failure_mode_deny: bool = False) -> dict[str, Any]:
    """`envoy/baseline.yaml` (no throttle) with Envoy's native global rate
    limit filter in front of the router: every request sends one descriptor
    `(native_rl, "<rate>")` of domain `envoy_throttle` over gRPC to the rate
    limit service (`grpc_port`); the service's configuration
    (engine/config/throttle.yaml, key `native_rl`) limits each value to that
    many requests per second over all proxies; over the limit, 429.
    `failure_mode_deny: false` (Envoy's default) lets requests through when the
    service fails."""
    value = str(int(rate))
    if float(value) != rate:
        raise ValueError(f"the native limit needs a whole rate per second, got {rate}")
    cfg = render("baseline.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=upstream_port)
    hcm = configs.hcm(cfg)
    hcm["http_filters"] = [{
        "name": "envoy.filters.http.ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": NATIVE_DOMAIN,
            "timeout": timeout,
            "failure_mode_deny": failure_mode_deny,
            "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
            "rate_limit_service": {
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": "ratelimit_grpc"}},
            },
        },
    }] + [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.router"]
    for vh in hcm["route_config"]["virtual_hosts"]:
        for route in vh["routes"]:
            route["route"]["rate_limits"] = [{"actions": [{"generic_key": {
                "descriptor_key": NATIVE_KEY, "descriptor_value": value}}]}]
    cfg["static_resources"]["clusters"].append({
        "name": "ratelimit_grpc",
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": "ratelimit_grpc", "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": grpc_port}}}}]}]},
    })
    _tag_requests(cfg, tag)
    return cfg


def vm_environment(cfg: dict[str, Any], env: dict[str, str]) -> None:
    """Sets the throttle's Wasm VM environment (`vm_config.environment_variables.key_values`):
    what `std::env::var` reads inside the VM (the `test-clock` build's wall-clock offset)."""
    hf = configs.throttle_filter(cfg)
    if hf is None:
        raise KeyError("no throttle filter in config")
    hf["typed_config"]["config"]["vm_config"]["environment_variables"] = {"key_values": dict(env)}


def split(total_qps: float, weights: Sequence[float]) -> list[float]:
    """`total_qps` split in proportion to `weights` (e.g. 60/30/10)."""
    s = float(sum(weights))
    if s <= 0 or any(w < 0 for w in weights):
        raise ValueError(f"weights must be >= 0 with a positive sum, got {list(weights)}")
    return [total_qps * w / s for w in weights]


def fortio_plan(qps: float, max_queue_delay_s: float, duration_s: float, minimum: int = 4) -> tuple[int, int]:
    """(connections, calls) for a closed-loop client to offer `qps` evenly for
    `duration_s` while requests are held up to `max_queue_delay_s`.

    Each connection sends one request every connections/qps seconds (Fortio
    `-qps -uniform -n`: connections start staggered over that interval, so
    together they send evenly); that interval must exceed the longest a
    request takes, so a held request never delays the next one: connections
    >= 1.5 x qps x max_queue_delay. Calls are a whole multiple of connections
    (Fortio gives any remainder to one connection, which would then run long)."""
    need = max(minimum, math.ceil(1.5 * qps * max(max_queue_delay_s, 0.05)))
    calls = max(need, round(qps * duration_s))
    per_connection = max(1, calls // need)
    connections = max(need, calls // per_connection)
    return connections, connections * per_connection


def uniform_load(url: str, *, qps: float, duration_s: float, max_queue_delay_s: float,
                 headers: Sequence[str] = ()) -> fortio.Load:
    """A Fortio load offering `qps` evenly (`-qps -uniform -n`, keep-alive) for about
    `duration_s` (see `fortio_plan` for the connections and calls), with these request
    headers ("name: value", e.g. a priority class's). `-t -1s`: with a duration (0 means
    its default, 5 s) Fortio stretches each connection's interval by k/(k-1) (k calls
    each); a negative one means none."""
    connections, calls = fortio_plan(qps, max_queue_delay_s, duration_s)
    return fortio.Load(url, connections=connections, qps=qps, requests=calls, duration_s=-1, uniform=True,
                       request_timeout_s=max(5.0, max_queue_delay_s + 20), allow_initial_errors=True,
                       headers=tuple(headers))


def client_figures(load: fortio.Load, result: fortio.Result) -> dict[str, Any]:
    """One client's figures: Fortio's (`Result.summary`), its histogram's buckets (so
    several loads' percentiles can be merged), the rate it offered and its connections'
    interval between requests."""
    return dict(result.summary(), histogram=result.histogram, offered_qps=load.qps,
                connections=load.connections, interval_ms=1000 * load.connections / load.qps)


@dataclass
class Measurement:
    """What one run of loads through the lab showed (rates per second, times in
    monotonic seconds)."""

    rate: float  # the setting, per second
    span: tuple[float, float]  # the measured span [a, b) (monotonic s), warm-up and tail left out
    total: int  # arrivals at the upstream in the span
    total_rate: float
    error: float  # total_rate / rate - 1
    shares: dict[str, float]  # proxy tag -> fraction of the arrivals in the span
    per_second: list[int]  # arrivals in each whole second of the span
    worst_100ms: int  # the busiest 100 ms window anywhere in the span
    bound_100ms: int  # the filter's stated bound for it (rate x 0.1 + burst + 2)
    # Client side, per load: requests sent per second. As planned when every request took less than its
    # connection's interval (clients' max_ms < interval_ms): Fortio then never fell behind its schedule.
    offered: list[float]
    clients: list[dict[str, Any]]  # client_figures() of each load
    calls_per_s: list[float | None]  # filter's engine_calls per proxy per second over the loads
    envoy_calls_per_s: list[float]  # Envoy's own count of requests to the engine cluster, per second
    load_s: float  # the span the per-second call counts are over
    service_calls_per_s: float | None  # the service's own count (all proxies), per second, if read
    failures: int  # answers that are neither 200 nor 429 (socket errors included)
    rejected: int  # 429s
    stats: list[dict[str, int]] = field(default_factory=list)  # each proxy's rule stats (deltas over the loads)
    # The longest this machine held up a thread that asked to wake every 5 ms, during the span
    # (harness/stalls.py): how late releases could be because the cores were busy.
    stall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


class ClusterLab:
    """The engine, one upstream and N proxies, on loopback; everything stopped by PID on exit.

    `plugin` gives every proxy's throttle configuration, or a list of them (one
    per proxy); with `native_rate`, the proxies run Envoy's native global rate
    limit filter at that rate instead of the throttle. `add_proxy()` starts
    one more proxy later, with its own configuration, .wasm and VM environment.
    With `refusal_log`, every proxy logs each 429 it answers (`refusals()`); with `loops`,
    it times its event loops (`loop_histograms()`)."""

    def __init__(self, plugin: dict[str, Any] | Sequence[dict[str, Any]] | None = None, *, proxies: int = 3,
                 concurrency: int = 2, fault_proxy: bool = False, native_rate: float | None = None,
                 wasm: Path = WASM, log_level: str = "warn", service_metrics: bool = False,
                 refusal_log: bool = False, loops: bool = False) -> None:
        if (plugin is None) == (native_rate is None):
            raise ValueError("give a throttle plugin configuration or native_rate, not both")
        plugins: list[dict[str, Any] | None]
        if plugin is None or isinstance(plugin, dict):
            plugins = [plugin] * proxies
        else:
            plugins = [dict(p) for p in plugin]
            if not plugins:
                raise ValueError("give at least one plugin configuration")
        self.plugin: dict[str, Any] | None = plugins[0] if plugins else None
        self.plugins = plugins
        self.native_rate = native_rate
        self.n = len(self.plugins)
        self.concurrency = concurrency
        self.wasm = wasm
        self.log_level = log_level
        self.refusal_log = refusal_log
        self.loops = loops
        needs_engine = native_rate is not None or any(p is not None and "engine" in p for p in self.plugins)
        self.engine: Engine | None = (Engine(fault_proxy=fault_proxy, metrics=service_metrics)
                                      if needs_engine else None)
        self.upstream = Upstream(tag_header=LAB_HEADER)
        self.proxies: list[Envoy] = []
        self.configs: list[dict[str, Any]] = []
        self.logdir = Path(tempfile.mkdtemp(prefix="cluster-lab-"))

    # -- lifecycle ---------------------------------------------------------
    def __enter__(self) -> ClusterLab:
        try:
            if self.engine is not None:
                self.engine.start()
            self.upstream.start()
            for i in range(self.n):
                self.configs.append(self._config(i, self.plugins[i]))
                self.proxies.append(Envoy(self.configs[i], concurrency=self.concurrency, log_level=self.log_level,
                                          extra_args=self._envoy_args()))
            for p in self.proxies:
                p.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for p in self.proxies:
            p.stop()
        self.upstream.stop()
        if self.engine is not None:
            self.engine.close()
        shutil.rmtree(self.logdir, ignore_errors=True)

    def add_proxy(self, plugin: dict[str, Any] | None = None, *, wasm: Path | None = None,
                  vm_env: dict[str, str] | None = None, log_level: str | None = None,
                  edit: Callable[[dict[str, Any]], None] | None = None) -> int:
        """Starts one more proxy (tagged `p<n>`) with this plugin configuration
        (default: the lab's), .wasm (default: the lab's) and environment of its
        Wasm VM (`vm_config.environment_variables`); `edit` may change its Envoy
        configuration before it starts (e.g. aim the engine's cluster elsewhere).
        Returns its index."""
        i = self.n
        cfg = self._config(i, plugin if plugin is not None else self.plugin, wasm=wasm, vm_env=vm_env)
        if edit is not None:
            edit(cfg)
        envoy = Envoy(cfg, concurrency=self.concurrency, log_level=log_level or self.log_level,
                      extra_args=self._envoy_args())
        self.configs.append(cfg)
        self.plugins.append(plugin if plugin is not None else self.plugin)
        self.proxies.append(envoy)
        self.n += 1
        envoy.start()
        return i

    def _envoy_args(self) -> list[str]:
        # Envoy writes access logs out every 10 s by default: the refusals are read right after a run.
        return ["--file-flush-interval-msec", "100"] if self.refusal_log else []

    def _config(self, i: int, plugin: dict[str, Any] | None, *, wasm: Path | None = None,
                vm_env: dict[str, str] | None = None) -> dict[str, Any]:
        tag = self.tag(i)
        if self.native_rate is not None:
            assert self.engine is not None
            cfg = native_ratelimit_config(upstream_port=self.upstream.port, grpc_port=self.engine.service.grpc_port,
                                          rate=self.native_rate, tag=tag)
        else:
            assert plugin is not None
            cluster = self.engine.envoy_cluster() if self.engine is not None else None
            cfg = proxy_config(plugin, upstream_port=self.upstream.port, tag=tag, engine_cluster=cluster,
                               wasm=wasm or self.wasm)
            if vm_env:
                vm_environment(cfg, vm_env)
        log_5xx(cfg, self.logdir / f"{tag}-5xx.log")
        if self.refusal_log:
            log_refusals(cfg, self.logdir / f"{tag}-429.log")
        if self.loops:
            measure_loops(cfg)
        return cfg

    def loop_histograms(self) -> list[dict[str, list[tuple[float, int]]]]:
        """Each proxy's workers' event-loop histograms (with `loops`): how long Envoy
        itself was held up, for `harness.envoy.longest_between`."""
        return [p.loop_histograms() for p in self.proxies]

    def errors(self) -> list[str]:
        """Every proxy's logged answers of status 500 or more (see `log_5xx`)."""
        out = []
        for i in range(self.n):
            path = self.logdir / f"{self.tag(i)}-5xx.log"
            if path.exists():
                out += [f"{self.tag(i)}: {line}" for line in path.read_text(errors="replace").splitlines()]
        return out

    def refusals(self, i: int) -> list[Answer]:
        """Proxy i's 429s so far (with `refusal_log`), as Envoy wrote them to its log (it
        writes every 100 ms here: wait for the count you expect)."""
        path = self.logdir / f"{self.tag(i)}-429.log"
        if not self.refusal_log:
            raise ValueError("the lab logs no refusals: ClusterLab(..., refusal_log=True)")
        out = []
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            arrived, ms, req_path = line.split(" ", 2)
            out.append(Answer(float(arrived), int(ms), req_path))
        return out

    @property
    def service_key(self) -> str:
        """The descriptor key whose hits the service counts once per call:
        the member add of a cluster rule's claim, or the native filter's one
        descriptor per request."""
        return NATIVE_KEY if self.native_rate is not None else "throttle_members"

    @staticmethod
    def tag(i: int) -> str:
        return f"p{i}"

    def stop_proxy(self, i: int) -> None:
        self.proxies[i].stop()

    # -- reading -------------------------------------------------------------
    def rule_stats(self, i: int, rule: str = RULE) -> dict[str, int]:
        """Proxy i's throttle statistics of one rule (default: the lab's), no settling wait."""
        if self.native_rate is not None:
            return {k.rsplit(".", 1)[-1]: v for k, v in
                    self.proxies[i].stats("cluster.upstream.ratelimit.", settle=False).items()}
        return self.proxies[i].rule_stats(rule, settle=False)

    @contextlib.contextmanager
    def counter_trace(self, rule: str, names: Sequence[str], interval: float = 0.2) -> Iterator[CounterTrace]:
        """Samples, every `interval` s while the block runs, the sum over the proxies
        of some of a rule's counters (`CounterTrace`): what happened between two
        instants where the upstream sees only what was released."""
        trace = CounterTrace(lambda: sum(sum(self.rule_stats(i, rule).get(n, 0) for n in names)
                                         for i in range(self.n)), interval)
        trace.start()
        try:
            yield trace
        finally:
            trace.stop()

    def arrivals(self, start: float, end: float, *, tag: str | None = None, prefix: str | None = None) -> list[float]:
        """The upstream's arrival times in `[start, end)` (sorted), of one proxy
        (`tag`) and of one rule (the requests whose path starts with `prefix`)."""
        up = self.upstream
        rows = zip(list(up.arrivals), list(up.tags), list(up.paths), strict=False)
        return sorted(t for t, g, p in rows if start <= t < end and (tag is None or g == tag)
                      and (prefix is None or p.startswith(prefix)))

    def engine_requests(self, i: int) -> int:
        """Requests proxy i's Envoy sent to the engine's cluster (Envoy's own count)."""
        name = "ratelimit_grpc" if self.native_rate is not None else "throttle_engine"
        stats = self.proxies[i].stats(f"cluster.{name}.", settle=False)
        return stats.get("upstream_rq_total", 0)

    def panics(self) -> list[str]:
        """Log lines of any proxy that mention a panic (the filter's panic hook logs at critical)."""
        return [f"{self.tag(i)}: {line}" for i, p in enumerate(self.proxies)
                for line in p.log().splitlines() if "panic" in line.lower()]

    # -- running loads -------------------------------------------------------
    def loads(self, qps: Sequence[float], *, duration_s: float, max_queue_delay_s: float,
              path: str = "/") -> list[fortio.Running]:
        """Starts one Fortio load per proxy (0 qps: none for that proxy), see `uniform_load`."""
        return [uniform_load(self.proxies[i].url + path, qps=q, duration_s=duration_s,
                             max_queue_delay_s=max_queue_delay_s).start() for i, q in enumerate(qps) if q > 0]

    def run(self, qps: Sequence[float], *, duration_s: float, warmup_s: float, max_queue_delay_s: float,
            rate: float, burst: int = 0, tail_s: float = 0.3) -> Measurement:
        """Loads side by side for `duration_s`; measures from `warmup_s` after
        their start to `tail_s` before their end."""
        self.upstream.clear()
        before = [self._counters(i) for i in range(self.n)]
        service0 = self.engine.service_calls(self.service_key) if self.engine is not None else None
        t0 = time.monotonic()
        with StallMonitor() as stalls:
            runs = self.loads(qps, duration_s=duration_s, max_queue_delay_s=max_queue_delay_s)
            try:
                clients = [client_figures(r.load, r.result()) for r in runs]
            finally:
                for r in runs:
                    r.kill()
        t1 = time.monotonic()
        after = [self._counters(i) for i in range(self.n)]
        service1 = self._service_calls_settled() if self.engine is not None else None
        m = measure(self.upstream.arrivals, self.upstream.tags, start=t0 + warmup_s,
                    end=t0 + duration_s - tail_s, rate=rate, burst=burst, clients=clients,
                    load_s=t1 - t0, before=before, after=after,
                    service_calls=(None if service0 is None or service1 is None else service1 - service0),
                    tags=[self.tag(i) for i in range(self.n)])
        m.stall_s = stalls.worst(*m.span)
        return m

    def _service_calls_settled(self) -> int | None:
        """The service's count once it stopped moving (it flushes every second;
        calls stop an epoch or two after the last arrival)."""
        assert self.engine is not None
        if self.engine.service.metrics_port is None:
            return None
        seen: list[int | None] = [self.engine.service_calls(self.service_key)]

        def settled() -> bool:
            seen.append(self.engine.service_calls(self.service_key) if self.engine is not None else None)
            return seen[-1] == seen[-2]

        with contextlib.suppress(TimeoutError):  # still moving after 6 s: report what it says now
            wait_until(settled, 6.0, "the service's call count to settle", interval=1.1)
        return seen[-1]

    def _counters(self, i: int) -> dict[str, int]:
        stats = dict(self.rule_stats(i))
        stats["__engine_requests"] = self.engine_requests(i)
        return stats


def measure(arrivals: Sequence[float], arrival_tags: Sequence[str | None], *, start: float, end: float,
            rate: float, burst: int, clients: list[dict[str, Any]], load_s: float,
            before: list[dict[str, int]], after: list[dict[str, int]], service_calls: int | None,
            tags: list[str]) -> Measurement:
    """The figures of one run from the upstream's arrivals (monotonic s) and the
    proxies' counters before and after it."""
    pairs = sorted(zip(arrivals, arrival_tags, strict=False), key=lambda p: p[0])
    stamps = [t for t, _ in pairs]
    inside = [tag for t, tag in pairs if start <= t < end]
    total = len(inside)
    total_rate = total / (end - start)
    shares = {tag: (inside.count(tag) / total if total else 0.0) for tag in tags}
    worst, _ = windows.busiest_window(stamps, 0.1, start, end)
    deltas = [{k: a.get(k, 0) - b.get(k, 0) for k in a if k != "held"} for a, b in zip(after, before, strict=True)]
    calls = [d["engine_calls"] / load_s if "engine_calls" in d else None for d in deltas]
    envoy_calls = [d["__engine_requests"] / load_s for d in deltas]
    codes: dict[int, int] = {}
    for c in clients:
        for k, v in c["codes"].items():
            codes[k] = codes.get(k, 0) + v
    requests = sum(c["requests"] for c in clients)
    return Measurement(
        rate=rate, span=(start, end), total=total, total_rate=total_rate, error=total_rate / rate - 1,
        shares=shares, per_second=windows.window_counts(stamps, start, end, 1.0),
        worst_100ms=worst, bound_100ms=windows.bound(rate, 0.1, burst),
        offered=[c["offered_qps"] for c in clients], clients=clients,
        calls_per_s=calls, envoy_calls_per_s=envoy_calls, load_s=load_s,
        service_calls_per_s=None if service_calls is None else service_calls / load_s,
        failures=requests - codes.get(200, 0) - codes.get(429, 0), rejected=codes.get(429, 0),
        stats=[{k: v for k, v in d.items() if not k.startswith("__")} for d in deltas],
    )


class CounterTrace:
    """A counter read every `interval` s on a thread: `(monotonic s, value)` rows."""

    def __init__(self, read: Callable[[], int], interval: float) -> None:
        self.read = read
        self.interval = interval
        self.rows: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self.rows.append((time.monotonic(), self.read()))
            if self._stop.wait(self.interval):
                return

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.rows.append((time.monotonic(), self.read()))

    def increase(self, start: float, end: float) -> int:
        """How much the counter grew over at least `[start, end)`: from the last
        reading at or before `start` to the first at or after `end` (the whole
        trace where it has none), so a window's count errs towards more."""
        before = [v for t, v in self.rows if t <= start]
        after = [v for t, v in self.rows if t >= end]
        first = before[-1] if before else self.rows[0][1]
        last = after[0] if after else self.rows[-1][1]
        return last - first
