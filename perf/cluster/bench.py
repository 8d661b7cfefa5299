"""Three proxies, one rate: scenarios of `kind: cluster` (perf/bench/scenarios/,
run by perf/bench/run.py in any set), on the lab of harness/cluster.py.

Variants at the same total rate R, same loads (Fortio, offered evenly, split
unevenly over the proxies), same upstream recording its own arrival times:

- `process`: the throttle with `scope: process`, R / proxies each (what a
  per-proxy rate gives when the load is uneven);
- `cluster`: the throttle with `scope: cluster`, R for all, through the engine
  (envoyproxy/ratelimit + Redis on loopback);
- `native`: Envoy's native global rate limit filter (`envoy.filters.http.ratelimit`),
  gRPC to the same service, descriptor `(native_rl, "<R>")` (engine/config/throttle.yaml):
  R per second in the service's fixed 1 s windows; over it, 429 at once.

Each run gives one row of CLUSTER_COLUMNS and the upstream's rate per 100 ms; the
report (perf/bench/report.py) shows them with `cluster_table`.
"""

from __future__ import annotations

import os
import time
from typing import Any

from harness import windows
from harness.cluster import ClusterLab, Measurement, plugin_config, split
from harness.tables import Table, num
from perf.bench.scenario import Scenario
from perf.cluster import holds

CLUSTER_COLUMNS = ("label", "variant", "rate", "load", "offered_qps", "upstream_qps", "error_pct", "worst_1s_pct",
                   "worst_100ms", "bound_100ms", "rejected", "failures", "p50", "p90", "p99", "p99.9",
                   "calls_per_proxy_s", "service_calls_s", "shares")
WINDOW_S = 0.1


def run(s: Scenario) -> dict[str, Any]:
    """Runs one `kind: cluster` scenario; returns {"row", "timeseries", "measurement", ...}, or
    for a case other than `load`, holds.run's {"figures", ...}."""
    c = s.cluster
    if c["case"] != "load":
        return holds.run(s)
    rate = float(c["rate"])
    n = c["proxies"]
    mqd = c["max_queue_delay"]
    if c["variant"] == "native":
        lab = ClusterLab(native_rate=rate, proxies=n, concurrency=c["concurrency"], log_level="warn",
                         service_metrics=True)
    else:
        scope = c["variant"]
        # process: rate / n each, per minute when that is not a whole number per second.
        per_proxy = holds.per_proxy_rate(scope, rate, n)
        plugin = plugin_config(per_proxy, scope=scope, max_queue_delay=f"{mqd * 1000:.0f}ms",
                               expected_replicas=n)
        lab = ClusterLab(plugin, proxies=n, concurrency=c["concurrency"], log_level="warn", service_metrics=True)
    load0 = os.getloadavg()
    started = time.monotonic()
    with lab:
        # tail 0: the span is whole seconds, so the native filter's 1 s windows count fully.
        m = lab.run(split(c["load"] * rate, c["split"]), duration_s=c["duration"], warmup_s=c["warmup"],
                    max_queue_delay_s=mqd, rate=rate, tail_s=0.0)
        panics = lab.panics()
    stamps = sorted(t for t in _arrivals(lab) if m.span[0] <= t < m.span[1])
    rates = [k / WINDOW_S for k in windows.window_counts(stamps, m.span[0], m.span[1], WINDOW_S)]
    return {
        "label": s.label, "scenario": {"description": s.description, **c}, "row": row(s, m),
        "timeseries": {"window_s": WINDOW_S, "rates": rates, "setting_qps": rate, "upstream_qps": m.total_rate},
        "measurement": {k: v for k, v in m.to_json().items() if k != "clients"},
        "clients": [{k: v for k, v in cl.items() if k != "histogram"} for cl in m.clients],
        "panics": panics, "loadavg": [load0, os.getloadavg()], "wall_s": round(time.monotonic() - started, 1),
    }


def _arrivals(lab: ClusterLab) -> list[float]:
    return list(lab.upstream.arrivals)


def row(s: Scenario, m: Measurement) -> dict[str, Any]:
    """One CLUSTER_COLUMNS row."""
    c = s.cluster
    pct = merged_percentiles([cl["histogram"] for cl in m.clients], (50, 90, 99, 99.9))
    calls = m.envoy_calls_per_s if c["variant"] == "native" else [x or 0.0 for x in m.calls_per_s]
    worst_1s = max((abs(k / m.rate - 1) for k in m.per_second), default=None)
    return {
        "label": s.label, "variant": c["variant"], "rate": m.rate, "load": c["load"],
        "offered_qps": sum(m.offered), "upstream_qps": m.total_rate, "error_pct": 100 * m.error,
        "worst_1s_pct": None if worst_1s is None else 100 * worst_1s,
        "worst_100ms": m.worst_100ms, "bound_100ms": m.bound_100ms, "rejected": m.rejected, "failures": m.failures,
        "p50": pct[50], "p90": pct[90], "p99": pct[99], "p99.9": pct[99.9],
        "calls_per_proxy_s": " / ".join(f"{x:.1f}" for x in calls) if c["variant"] != "process" else "",
        "service_calls_s": m.service_calls_per_s if c["variant"] != "process" else None,
        "shares": " / ".join(f"{100 * v:.0f}%" for v in m.shares.values()),
    }


def cluster_table(rows: list[dict]) -> tuple[str, str, Table]:
    """The report's table of `kind: cluster` rows (CLUSTER_COLUMNS, as read back from cluster.csv)."""
    head = ["scenario", "variant", "rate /s", "offered /s", "upstream /s", "vs rate", "worst 1 s",
            "worst 100 ms (bound)", "429s", "failures", "p50 ms", "p99 ms", "engine calls /s per proxy",
            "service calls /s", "shares"]
    body = []
    for r in rows:
        bound = r.get("bound_100ms")
        body.append([r["label"], r["variant"], num(r["rate"], ".0f"), num(r["offered_qps"], ".0f"),
                     num(r["upstream_qps"]), num(r["error_pct"], "+.2f") + "%",
                     "" if r.get("worst_1s_pct") is None else f"±{r['worst_1s_pct']:.1f}%",
                     f"{num(r['worst_100ms'], '.0f')} ({num(bound, '.0f')})",
                     num(r["rejected"], ".0f"), num(r["failures"], ".0f"), num(r["p50"], ".1f"),
                     num(r["p99"], ".1f"), r.get("calls_per_proxy_s") or "", num(r.get("service_calls_s")),
                     r.get("shares") or ""])
    note = ("Three Envoy processes at the same total rate, the same uneven loads (Fortio, offered evenly; "
            "offered = all proxies together) and one upstream recording its own arrival times. process = the "
            "throttle at rate/3 per proxy; cluster = the throttle with scope cluster through the engine "
            "(envoyproxy/ratelimit + Redis); native = Envoy's envoy.filters.http.ratelimit, gRPC to the same "
            "service, fixed 1 s windows. upstream /s and the windows are over the measured span (warm-up left "
            "out); worst 1 s = the 1 s window furthest from the rate; worst 100 ms = the busiest 100 ms anywhere, "
            "against the throttle's stated bound rate x 0.1 s + burst + 2; failures = answers neither 200 nor "
            "429; latency = all proxies' requests together; engine calls: the throttle's engine_calls, or for "
            "native Envoy's requests to the service (one per request); service calls: the service's own count.")
    return ("Three proxies, one rate", note, (head, body))


def merged_percentiles(hists: list[list[dict[str, Any]]], pcts: tuple[float, ...]) -> dict[float, float | None]:
    """Percentiles (ms) of several Fortio duration histograms together
    (`DurationHistogram.Data`: buckets {Start, End, Count} in seconds),
    interpolated linearly inside a bucket as Fortio does."""
    buckets: dict[tuple[float, float], int] = {}
    for h in hists:
        for b in h:
            key = (float(b["Start"]), float(b["End"]))
            buckets[key] = buckets.get(key, 0) + int(b["Count"])
    total = sum(buckets.values())
    out: dict[float, float | None] = {}
    for p in pcts:
        if total == 0:
            out[p] = None
            continue
        target = total * p / 100
        seen = 0
        value = None
        for (start, end), count in sorted(buckets.items()):
            if count and seen + count >= target:
                value = start + (end - start) * (target - seen) / count
                break
            seen += count
        if value is None:
            value = max(end for _, end in buckets)
        out[p] = 1000 * value
    return out
