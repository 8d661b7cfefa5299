"""Priority classes under open-loop load (perf/priority/README.md).

Each scenario offers each class its own constant arrival rate (Vegeta, one attack per class,
side by side) through one arm: the throttle with classes and a floor for batch, the throttle
with strict priority (no floor), or HAProxy's `set-priority-class` queue (the anchor: strict,
concurrency-based). The upstream (harness.upstream) serves every request in `service_ms` and
records each arrival with its class, so the total rate and each class's share are measured
where they land.

  python -m perf.priority.run --set quick   # make perf-priority-quick (CI): short, asserts nothing
  python -m perf.priority.run --set full    # make perf-priority (~5 min)

Writes perf/reports/priority/<run-id>/: results.csv (a row per scenario, arm and class),
results.json (the rows, the skipped scenarios and the environment), summary.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from harness import vegeta
from harness.configs import render
from harness.envoy import Envoy
from harness.net import free_port
from harness.procs import WASM, raise_open_files
from harness.results import environment, run_dir
from harness.tables import write_csv
from harness.upstream import Upstream
from harness.windows import span_rate
from perf.priority import report
from perf.priority.config import CLASSES, HEADER, Arm, Scenario, Spec, SpecError, load_set, plugin, refused
from perf.priority.haproxy import HAProxy

COLUMNS = ("scenario", "arm", "class", "offered_per_s", "sent", "ok", "ok_pct", "rejected", "displaced",
           "p50_ms", "p99_ms", "wait_p99_ms", "upstream_per_s", "share", "total_per_s", "total_error_pct")
WARMUP_S = 1.0  # the steady window starts after it and ends half a second before the load does


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def envoy_wait_p99(envoy: Envoy, cls: str) -> float | None:
    """The filter's own p99 of `class.<cls>.wait_ms` (released requests; cumulative)."""
    _, body = envoy.admin(f"/stats?filter=rule.api.class.{cls}.wait_ms")
    m = re.search(r"P99\([^,]+,([^)]+)\)", body.decode())
    return None if m is None or m.group(1) == "nan" else float(m.group(1))


def steady(arrivals: list[tuple[float, str | None]], start: float, end: float) -> dict[str, Any]:
    """Upstream arrivals within [start, end): the total rate (over their own span: (n - 1) /
    (last - first), so the window's edges add no error) and each class's count."""
    inside = [(t, tag) for t, tag in arrivals if start <= t < end]
    return {"total_per_s": span_rate([t for t, _ in inside]) or 0.0,
            "by_class": {c: sum(1 for _, tag in inside if tag == c) for c in CLASSES}, "n": len(inside)}


def run_arm(spec: Spec, scn: Scenario, arm: Arm) -> list[dict[str, Any]]:
    with Upstream(tag_header=HEADER) as app:
        path = f"/slow?ms={spec.service_ms:g}"
        if arm.kind == "throttle":
            cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=app.port,
                         plugin=plugin(spec, arm), wasm=WASM)
            # Envoy computes histogram quantiles at each stats flush (default 5 s).
            cfg["stats_flush_interval"] = "1s"
            proxy: Envoy | HAProxy = Envoy(cfg, concurrency=2, log_level="warn")
        else:
            proxy = HAProxy(app.port, maxconn=arm.maxconn, queue_ms=int(spec.max_queue_delay_s * 1000),
                            header=HEADER, value="critical")
        with proxy:  # starts it (an Envoy started again here was a second one, never stopped)
            started = time.monotonic()
            running = {c: vegeta.Load(proxy.url + path, rate=rate, duration_s=spec.duration_s,
                                      headers=[f"{HEADER}: {c}"]).start()
                       for c, rate in scn.load.items()}
            results = {c: r.result() for c, r in running.items()}
            if isinstance(proxy, Envoy):
                time.sleep(1.2)  # a stats flush after the last release: the quantiles include it
            stats = proxy.rule_stats("api") if isinstance(proxy, Envoy) else {}
            waits = {c: envoy_wait_p99(proxy, c) for c in scn.load} if isinstance(proxy, Envoy) else {}
        arrivals = list(zip(list(app.arrivals), list(app.tags), strict=False))
    window = steady(arrivals, started + WARMUP_S, started + spec.duration_s - 0.5)
    capacity = spec.rate if arm.kind == "throttle" else 1000 / spec.service_ms * arm.maxconn
    rows = []
    for c, res in results.items():
        codes = res.codes()
        ok_ms = res.latencies_ms(200)
        rows.append({
            "scenario": scn.name, "arm": arm.name, "class": c, "offered_per_s": scn.load[c],
            "sent": res.requests, "ok": codes.get(200, 0),
            "ok_pct": 100 * codes.get(200, 0) / res.requests if res.requests else None,
            "rejected": sum(v for k, v in codes.items() if k != 200),
            "displaced": stats.get(f"class.{c}.displaced") if stats else None,
            "p50_ms": percentile(ok_ms, 0.50), "p99_ms": percentile(ok_ms, 0.99),
            "wait_p99_ms": waits.get(c),
            "upstream_per_s": window["by_class"][c] / max(1e-9, spec.duration_s - 0.5 - WARMUP_S),
            "share": window["by_class"][c] / window["n"] if window["n"] else None,
            "total_per_s": window["total_per_s"],
            "total_error_pct": 100 * (window["total_per_s"] / capacity - 1) if capacity else None,
        })
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="quick", help="a set of perf/priority/scenarios.yaml (quick, full)")
    ap.add_argument("--out", type=Path, help="write here instead of perf/reports/priority/<run-id>/")
    ap.add_argument("--scenario", action="append", help="run only this scenario of the set (repeatable)")
    args = ap.parse_args(argv)
    try:
        spec = load_set(args.set)
    except SpecError as e:
        print(f"perf.priority: {e}", file=sys.stderr)
        return 2
    raise_open_files(20000)
    run_id, out = run_dir("priority", args.set, args.out)
    env = environment(run_id, set=args.set, rate=spec.rate, service_ms=spec.service_ms,
                      duration_s=spec.duration_s, vegeta=vegeta.VERSION)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for scn in spec.scenarios:
        if args.scenario and scn.name not in args.scenario:
            continue
        for arm in scn.arms:
            if scn.requires:
                why = refused(plugin(spec, arm))
                if why is not None:
                    skipped.append({"scenario": scn.name, "arm": arm.name,
                                    "why": f"the configuration validator refuses `{scn.requires}`: {why}"})
                    log(f"{scn.name} / {arm.name}: skipped ({skipped[-1]['why'][:120]})")
                    continue
            log(f"{scn.name} / {arm.name}: {scn.what}")
            got = run_arm(spec, scn, arm)
            for r in got:
                log(f"  {r['class']}: ok {r['ok']}/{r['sent']}, p99 {r['p99_ms']} ms, "
                    f"upstream {r['upstream_per_s']:.1f}/s (total {r['total_per_s']:.1f}/s)")
            rows.extend(got)
    write_csv(out / "results.csv", COLUMNS, rows)
    (out / "results.json").write_text(json.dumps({"environment": env, "rows": rows, "skipped": skipped},
                                                 indent=2) + "\n")
    (out / "summary.md").write_text(report.summary(env, rows, skipped))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
