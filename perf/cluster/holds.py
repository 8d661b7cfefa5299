"""Does one rate over three proxies hold in what a mesh meets every week (issue 20)?
Scenarios of `kind: cluster` with a `case` (perf/bench/scenarios/cluster-holds-*.yaml),
each run once per variant on the lab of harness/cluster.py, so that one row of the
report's table shows the throttle in cluster scope, Envoy's native global rate limit
and, where it means something, the throttle in process scope (rate / proxies each):

- `restart`: Redis killed and started again, empty (no persistence), `restart_at`
  into an even load of `load` x the rate: the rate delivered after the warm-up,
  the busiest 1 s window at the upstream, the excess over the rate in `[t - 1 s, t + 3 s)` (t: the kill), 429s;
- `low_rates`: each rate of `rates` as its own rule (path `/r<rate>/`, all at once),
  `load` x the rate offered, split `split`: the rate passed, the busiest 1 s,
  each proxy's share of it against its share of the demand, 429s per proxy;
- `sporadic`: one request per proxy every `periods` (each period its own rule at
  `rate`, path `/s<k>/`, all at once), a kept-alive connection each: p50 / p99 ms;
- `burst`: each proxy warmed at `warm_qps` for `warm`, idle for `idle`, then
  `requests` at once over all proxies: 429s, how long the last admitted one waited,
  the busiest 100 ms and 1 s at the upstream.

Latency within the rate under steady load comes from the `kind: cluster` rows at
under the rate of the same run (`steady_figures`). Every figure is a string as the
table shows it (CASE_COLUMNS); the run's JSON keeps the raw numbers. Reported,
never asserted.
"""

from __future__ import annotations

import copy
import http.client
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import configs, fortio, windows
from harness.cluster import NATIVE_KEY, ClusterLab, plugin_config, split, uniform_load
from harness.tables import Table, markdown, num
from perf.bench.scenario import Scenario

CASE_COLUMNS = ("row", "label", "case", "variant", "figure", "value")
VARIANTS = ("cluster", "native", "process")
VARIANT_TITLES = {"cluster": "throttle, cluster scope", "native": "Envoy native global rate limit",
                  "process": "throttle, process scope (rate / 3 each)"}
#: The table's order of the cases ("steady" comes from the kind: cluster rows of the run).
CASE_ORDER = ("restart", "low_rates", "sporadic", "steady", "burst")


@dataclass(frozen=True)
class Rule:
    name: str
    rate: float  # per second, all proxies together
    prefix: str  # the path prefix it matches (and the native filter's route)


def per_proxy_rate(variant: str, rate: float, proxies: int) -> str:
    """The throttle's `rate` for one proxy: the whole rate in cluster scope; rate / proxies
    in process scope (per minute when that is not a whole number per second)."""
    if variant == "cluster":
        return f"{rate:g}/s"
    return f"{rate / proxies:g}/s" if rate % proxies == 0 else f"{rate * 60 / proxies:g}/m"


def plugin(variant: str, rules: Sequence[Rule], *, max_queue_delay_s: float, burst: int,
           proxies: int) -> dict[str, Any]:
    """The throttle's plugin configuration with one rule per `Rule` (plugin_config's fields)."""
    base = plugin_config(per_proxy_rate(variant, rules[0].rate, proxies), scope=variant,
                         max_queue_delay=f"{max_queue_delay_s * 1000:.0f}ms", burst=burst,
                         expected_replicas=proxies)
    template = base["rules"][0]
    base["rules"] = [dict(template, name=r.name, rate=per_proxy_rate(variant, r.rate, proxies),
                          match={"path_prefix": r.prefix}) for r in rules]
    return base


class Lab(ClusterLab):
    """The cluster lab with several rules, one per path prefix; for `native`, one route per
    rule sending the descriptor `(native_rl, "<its rate>")` (engine/config/throttle.yaml has
    a limit for each rate used here; rules at the same rate share its counter)."""

    def __init__(self, variant: str, rules: Sequence[Rule], *, max_queue_delay_s: float, burst: int = 0,
                 proxies: int = 3, concurrency: int = 2) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.rules = list(rules)
        self.variant = variant
        if variant == "native":
            super().__init__(native_rate=self.rules[0].rate, proxies=proxies, concurrency=concurrency)
        else:
            super().__init__(plugin(variant, self.rules, max_queue_delay_s=max_queue_delay_s, burst=burst,
                                    proxies=proxies), proxies=proxies, concurrency=concurrency)

    def __enter__(self) -> Lab:
        super().__enter__()
        return self

    def _config(self, i: int, plugin: dict[str, Any] | None, *, wasm: Path | None = None,
                vm_env: dict[str, str] | None = None) -> dict[str, Any]:
        cfg = super()._config(i, plugin, wasm=wasm, vm_env=vm_env)
        if self.native_rate is not None:
            for vh in configs.hcm(cfg)["route_config"]["virtual_hosts"]:
                (route,) = vh["routes"]
                vh["routes"] = []
                for r in self.rules:
                    one = copy.deepcopy(route)
                    one["match"] = {"prefix": r.prefix}
                    value = f"{r.rate:g}"
                    one["route"]["rate_limits"] = [{"actions": [{"generic_key": {
                        "descriptor_key": NATIVE_KEY, "descriptor_value": value}}]}]
                    vh["routes"].append(one)
        return cfg

    def stats_of(self, rule: str) -> list[dict[str, int]]:
        """Each proxy's throttle statistics of one rule (none for native)."""
        if self.native_rate is not None:
            return []
        return [p.rule_stats(rule, settle=True) for p in self.proxies]


# ---------------------------------------------------------------- small helpers

def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile, linear between the closest ranks (numpy's default)."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def per_proxy(values: Sequence[Any], spec: str = ".0f") -> str:
    return " / ".join(num(v, spec) for v in values)


def shares_text(counts: Sequence[int]) -> str:
    total = sum(counts)
    return " / ".join(f"{100 * c / total:.0f}" for c in counts) + "%" if total else "none passed"


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
    return host, int(port)


def get(conn: http.client.HTTPConnection, path: str) -> tuple[int, float]:
    """One GET on a kept-alive connection: (status, milliseconds to the whole answer);
    status -1 on a socket error (the connection is then closed, and reopens on next use)."""
    t = time.perf_counter()
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        status = r.status
    except (OSError, http.client.HTTPException):
        conn.close()
        status = -1
    return status, 1000 * (time.perf_counter() - t)


# ---------------------------------------------------------------- the cases

def run(s: Scenario) -> dict[str, Any]:
    """Runs one case scenario, each variant in turn; returns {"figures": [CASE_COLUMNS rows], ...}."""
    c = s.cluster
    fn = CASES[c["case"]]
    started = time.monotonic()
    figures: list[dict[str, str]] = []
    detail: dict[str, Any] = {}
    for variant in c["variants"]:
        load0 = os.getloadavg()
        t = time.monotonic()
        rows, raw = fn(c, variant)
        figures += [{"label": s.label, "case": c["case"], "variant": variant, "row": row, "figure": figure,
                     "value": value} for row, figure, value in rows]
        detail[variant] = dict(raw, loadavg=[load0, os.getloadavg()], wall_s=round(time.monotonic() - t, 1))
    return {"label": s.label, "case": c["case"], "scenario": {"description": s.description, **c},
            "figures": figures, "detail": detail, "wall_s": round(time.monotonic() - started, 1)}


Figures = list[tuple[str, str, str]]  # (row, figure, value)


def restart(c: dict[str, Any], variant: str) -> tuple[Figures, dict[str, Any]]:
    rate, mqd, n = float(c["rate"]), c["max_queue_delay"], c["proxies"]
    lab = Lab(variant, [Rule("orders", rate, "/")], max_queue_delay_s=mqd, proxies=n, concurrency=c["concurrency"])
    with lab:
        assert lab.engine is not None
        lab.upstream.clear()
        t0 = time.monotonic()
        runs = lab.loads(split(c["load"] * rate, c["split"]), duration_s=c["duration"], max_queue_delay_s=mqd)
        try:
            _sleep_until(t0 + c["restart_at"])
            killed = time.monotonic()
            lab.engine.redis.kill()
            lab.engine.redis.start()
            back = time.monotonic()
            clients = [r.result() for r in runs]
        finally:
            for r in runs:
                r.kill()
        stats = lab.stats_of("orders")
    stamps = sorted(lab.upstream.arrivals)
    span = (t0 + c["warmup"], t0 + c["duration"])
    busiest, _ = windows.busiest_window(stamps, 1.0, *span)
    around = windows.count_between(stamps, killed - 1.0, killed + 3.0)
    excess = around - 4 * rate
    codes = _codes(clients)
    delivered = windows.rate(stamps, *span)
    row = f"Redis restarted empty, {rate:g}/s, max_queue_delay {mqd:g} s"
    out = [(row, f"delivered /s ({span[1] - span[0]:g} s after the warm-up)", f"{delivered:.1f}"),
           (row, f"busiest 1 s at the upstream (rate {rate:g})", num(busiest)),
           (row, f"excess over the rate in [t-1 s, t+3 s) (of {4 * rate:g})", f"{excess:+.0f}"),
           (row, "429s", num(codes.get(429, 0))),
           (row, "Redis down (ms)", f"{1000 * (back - killed):.0f}")]
    raw = {"busiest_1s": busiest, "in_window": around, "excess": excess, "codes": codes,
           "down_ms": 1000 * (back - killed), "per_second": windows.window_counts(stamps, *span, 1.0),
           "restart_at_s": killed - t0, "stats": stats}
    return out, raw


def low_rates(c: dict[str, Any], variant: str) -> tuple[Figures, dict[str, Any]]:
    mqd, n = c["max_queue_delay"], c["proxies"]
    rules = [Rule(f"low{r:g}", float(r), f"/r{r:g}/") for r in c["rates"]]
    demand = split(100.0, c["split"])
    with Lab(variant, rules, max_queue_delay_s=mqd, proxies=n, concurrency=c["concurrency"]) as lab:
        lab.upstream.clear()
        t0 = time.monotonic()
        runs: list[tuple[Rule, int, fortio.Running]] = []
        try:
            for r in rules:
                for i, q in enumerate(split(c["load"] * r.rate, c["split"])):
                    if q > 0:
                        load = uniform_load(lab.proxies[i].url + r.prefix + "x", qps=q, duration_s=c["duration"],
                                            max_queue_delay_s=mqd)
                        runs.append((r, i, load.start()))
            results = [(r, i, run.result()) for r, i, run in runs]
        finally:
            for _, _, run in runs:
                run.kill()
        stats = {r.name: lab.stats_of(r.name) for r in rules}
    span = (t0 + c["warmup"], t0 + c["duration"])
    seconds = span[1] - span[0]
    out: Figures = []
    raw: dict[str, Any] = {"span_s": seconds, "rules": {}, "stats": stats}
    tags = [lab.tag(i) for i in range(n)]
    for r in rules:
        mine = [(t, tag) for t, tag, path in zip(lab.upstream.arrivals, lab.upstream.tags, lab.upstream.paths,
                                                 strict=False) if path.startswith(r.prefix)]
        counts = [sum(1 for t, tag in mine if span[0] <= t < span[1] and tag == tg) for tg in tags]
        busiest, _ = windows.busiest_window(sorted(t for t, _ in mine), 1.0, *span)
        rejected = [sum(res.codes.get(429, 0) for rr, i, res in results if rr is r and i == k) for k in range(n)]
        other = sum(res.requests - res.codes.get(200, 0) - res.codes.get(429, 0) for rr, _, res in results if rr is r)
        passed = sum(counts) / seconds
        row = f"low rate {r.rate:g}/s, offered {c['load']:g}x split {'/'.join(f'{w:g}' for w in c['split'])}"
        out += [(row, "passed /s (% of the rate)", f"{passed:.2f} ({100 * passed / r.rate:.0f}%)"),
                (row, "busiest 1 s at the upstream", num(busiest)),
                (row, f"shares (of demand {'/'.join(f'{d:.0f}' for d in demand)}%)", shares_text(counts)),
                (row, "429s per proxy", per_proxy(rejected))]
        if other:
            out.append((row, "failures (neither 200 nor 429)", num(other)))
        raw["rules"][r.name] = {"rate": r.rate, "counts": counts, "passed_per_s": passed, "busiest_1s": busiest,
                                "rejected": rejected, "failures": other}
    return out, raw


def sporadic(c: dict[str, Any], variant: str) -> tuple[Figures, dict[str, Any]]:
    rate, mqd, n = float(c["rate"]), c["max_queue_delay"], c["proxies"]
    periods = c["periods"]
    rules = [Rule(f"sporadic{k}", rate, f"/s{k}/") for k in range(len(periods))]
    with Lab(variant, rules, max_queue_delay_s=mqd, proxies=n, concurrency=c["concurrency"]) as lab:
        t0 = time.monotonic() + 0.5
        end = t0 + c["duration"]
        samples: dict[int, list[tuple[int, float]]] = {k: [] for k in range(len(periods))}
        lock = threading.Lock()

        def client(i: int, k: int) -> None:
            host, port = _address(lab.proxies[i].url)
            conn = http.client.HTTPConnection(host, port, timeout=mqd + 10)
            # Staggered: proxy i starts i/n of a period after proxy 0, each rule a little later.
            t = t0 + periods[k] * i / n + 0.05 * k
            try:
                while t < end:
                    _sleep_until(t)
                    got = get(conn, f"{rules[k].prefix}x")
                    with lock:
                        samples[k].append(got)
                    t += periods[k]
            finally:
                conn.close()

        threads = [threading.Thread(target=client, args=(i, k), daemon=True) for i in range(n)
                   for k in range(len(periods))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(c["duration"] + mqd + 30)
        stats = {r.name: lab.stats_of(r.name) for r in rules}
    out: Figures = []
    raw: dict[str, Any] = {"periods": {}, "stats": stats}
    for k, period in enumerate(periods):
        ms = [m for status, m in samples[k] if status == 200]
        bad = len(samples[k]) - len(ms)
        row = f"sporadic: 1 request per proxy every {period:g} s ({rate:g}/s rule)"
        out.append((row, f"p50 / p99 ms (of {len(ms)})", f"{num(percentile(ms, 50), '.1f')} / "
                                                         f"{num(percentile(ms, 99), '.1f')}"))
        if bad:
            out.append((row, "not 200", num(bad)))
        raw["periods"][f"{period:g}"] = {"ms": ms, "not_200": bad}
    return out, raw


def burst(c: dict[str, Any], variant: str) -> tuple[Figures, dict[str, Any]]:
    rate, mqd, n = float(c["rate"]), c["max_queue_delay"], c["proxies"]
    each = c["requests"] // n
    with Lab(variant, [Rule("orders", rate, "/")], max_queue_delay_s=mqd, burst=c["burst"], proxies=n,
             concurrency=c["concurrency"]) as lab:
        runs = lab.loads([c["warm_qps"]] * n, duration_s=c["warm"], max_queue_delay_s=mqd)
        try:
            warm = [r.result() for r in runs]
        finally:
            for r in runs:
                r.kill()
        time.sleep(c["idle"])
        lab.upstream.clear()
        shots, t_start = simultaneous([lab.proxies[i].url for i in range(n)], each, timeout_s=mqd + 10)
        stats = lab.stats_of("orders")
    stamps = sorted(lab.upstream.arrivals)
    ok = [ms for _, status, ms in shots if status == 200]
    rejected = [sum(1 for i, status, _ in shots if i == k and status == 429) for k in range(n)]
    other = len(shots) - len(ok) - sum(rejected)
    busiest, _ = windows.busiest_window(stamps, 0.1)
    busiest_1s, _ = windows.busiest_window(stamps, 1.0)
    row = (f"burst after idle: {each * n} at once over {n} proxies, {rate:g}/s, max_queue_delay {mqd:g} s"
           + (f", burst {c['burst']}" if c["burst"] else "")
           + f" (each warmed at {c['warm_qps']:g}/s for {c['warm']:g} s, then idle {c['idle']:g} s)")
    out = [(row, "429s (per proxy)", f"{sum(rejected)} ({per_proxy(rejected)})"),
           (row, "last admitted one waited (ms)", num(max(ok) if ok else None, ".0f")),
           (row, "busiest 100 ms at the upstream", num(busiest)),
           (row, f"busiest 1 s at the upstream (rate {rate:g})", num(busiest_1s))]
    if other:
        out.append((row, "failures (neither 200 nor 429)", num(other)))
    raw = {"ok_ms": sorted(ok), "rejected": rejected, "failures": other, "busiest_100ms": busiest,
           "busiest_1s": busiest_1s,
           "last_arrival_ms": 1000 * (stamps[-1] - t_start) if stamps else None,
           "warm_codes": _codes(warm), "stats": stats}
    return out, raw


def simultaneous(urls: Sequence[str], each: int, *, timeout_s: float) -> tuple[list[tuple[int, int, float]], float]:
    """`each` requests on each URL at once: every connection opened first, then one
    barrier releases all. Returns ([(url index, status, ms)], the monotonic release time)."""
    conns = []
    for i, url in enumerate(urls):
        host, port = _address(url)
        for _ in range(each):
            conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
            conn.connect()
            conns.append((i, conn))
    barrier = threading.Barrier(len(conns) + 1)
    out: list[tuple[int, int, float]] = []
    lock = threading.Lock()

    def shoot(i: int, conn: http.client.HTTPConnection) -> None:
        barrier.wait()
        status, ms = get(conn, "/")
        with lock:
            out.append((i, status, ms))

    threads = [threading.Thread(target=shoot, args=(i, conn), daemon=True) for i, conn in conns]
    try:
        for th in threads:
            th.start()
        barrier.wait()
        released = time.monotonic()
        for th in threads:
            th.join(timeout_s + 5)
    finally:
        for _, conn in conns:
            conn.close()
    return out, released


def _codes(results: Sequence[fortio.Result]) -> dict[int, int]:
    codes: dict[int, int] = {}
    for r in results:
        for k, v in r.codes.items():
            codes[k] = codes.get(k, 0) + v
    return codes


CASES: dict[str, Callable[[dict[str, Any], str], tuple[Figures, dict[str, Any]]]] = {
    "restart": restart, "low_rates": low_rates, "sporadic": sporadic, "burst": burst}


# ---------------------------------------------------------------- the table

def steady_figures(rows: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The latency rows of steady load within the rate: the `kind: cluster` rows (CLUSTER_COLUMNS)
    offered less than the rate, one table row per rate and load, p50 / p99 per variant."""
    out = []
    for r in rows:
        load = float(r["load"])
        if load >= 1:
            continue
        rate = float(r["rate"])
        out.append({"row": f"steady: {100 * load:.0f}% of {rate:g}/s (60/30/10 split)", "label": r["label"],
                    "case": "steady", "variant": r["variant"], "figure": "p50 / p99 ms",
                    "value": f"{num(_float(r['p50']), '.1f')} / {num(_float(r['p99']), '.1f')}"})
    return out


def _float(v: Any) -> float | None:
    return None if v is None or v == "" else float(v)


def holds_table(figures: Sequence[dict[str, str]]) -> tuple[str, str, Table]:
    """The report's table of the cases: one line per figure, one column per variant, the
    situation named on its first line."""
    variants = [v for v in VARIANTS if any(f["variant"] == v for f in figures)]
    order: dict[tuple[str, str], dict[str, str]] = {}
    rank = {case: k for k, case in enumerate(CASE_ORDER)}
    for f in sorted(figures, key=lambda f: rank.get(f["case"], len(CASE_ORDER))):  # stable: run order within a case
        order.setdefault((f["row"], f["figure"]), {})[f["variant"]] = f["value"]
    body, last = [], None
    for (row, figure), values in order.items():
        body.append([row if row != last else "", figure] + [values.get(v, "—") for v in variants])
        last = row
    note = ("Each situation runs once per variant on the same lab (three Envoy processes, --concurrency 2, one "
            "upstream recording its own arrival times, the engine on loopback). Cluster scope: engine timeout "
            "50 ms, fallback_after 250 ms, on_engine_failure local_share, expected_replicas 3, burst 0. Native: "
            "Envoy's envoy.filters.http.ratelimit, gRPC to the same service, fixed 1 s windows, failure_mode_deny "
            "false (lets requests through while the service fails). Process scope: rate / 3 per proxy. Redis "
            "restart: t = the kill; the issue's aim for the excess is rate x (fallback_after + one epoch) + burst "
            "= 105 at 300/s. Low rates: counted at the upstream after the warm-up. Sporadic: a "
            "kept-alive Python client per proxy and period, every request counted (Python's own time to send and "
            "read is in it, alike for every variant). Burst: every connection opened first, then all requests "
            "released together; 'waited' is the client's time to the answer. — : not run.")
    head = ["situation", "figure"] + [VARIANT_TITLES[v] for v in variants]
    return ("Cluster scope under faults, low rates, sporadic traffic and bursts", note, (head, body))


def markdown_table(figures: Sequence[dict[str, str]]) -> str:
    title, note, (head, body) = holds_table(figures)
    return f"## {title}\n\n{note}\n\n{markdown(head, body)}\n"

