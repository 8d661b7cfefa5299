"""The cluster-scope demo: one rate for three Envoy proxies.

Starts the engine (Redis + envoyproxy/ratelimit on loopback), one upstream that
records its own arrival times, and three Envoy processes (`--concurrency 2`
each) with one cluster-scope rule; drives uneven Fortio loads over the three
(60/30/10 of 3x the rate, each offered evenly at a fixed rate); prints the
total rate at the upstream, each proxy's share, every 1 s window, the worst
100 ms window against the filter's stated bound, failures, and calls to the
engine per proxy per second (the filter's `engine_calls`, Envoy's own count of
requests to the engine's cluster, and the service's own count). Then the same
at a second rate. Everything is stopped by PID at the end.

    python -m harness.demo_cluster [--rates 300 100] [--duration 10] [--split 60,30,10]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from harness.cluster import ClusterLab, Measurement, plugin_config, split
from harness.procs import WASM
from harness.tables import num


def report(m: Measurement, *, label: str) -> list[str]:
    """The lines the demo prints for one run."""
    a, b = m.span
    worst_1s = max((abs(c - m.rate) for c in m.per_second), default=0.0)
    lines = [
        f"{label}; the machine held a 5 ms timer of this process up to {m.stall_s * 1000:.0f} ms",
        f"  total at the upstream : {m.total_rate:8.2f}/s  ({m.error:+.2%} of {m.rate:g}/s; "
        f"{m.total} requests in {b - a:.1f} s, warm-up left out)",
        f"  each 1 s window       : {' '.join(str(c) for c in m.per_second)}  "
        f"(furthest {worst_1s / m.rate:.1%} from the rate)",
        f"  worst 100 ms window   : {m.worst_100ms}  (stated bound {m.bound_100ms} = rate x 0.1 s + burst + 2; "
        f"{m.worst_100ms - m.bound_100ms:+d})",
        "  share per proxy       : " + "  ".join(f"{t} {s:.1%}" for t, s in m.shares.items()),
        "  offered (client side) : " + "  ".join(
            f"{c['offered_qps']:.0f}/s on {c['connections']} conns" for c in m.clients)
        + ("  (as planned: every request took less than its connection's interval)"
           if all(c["max_ms"] < c["interval_ms"] for c in m.clients) else
           "  (BEHIND: some requests took longer than their connection's interval)"),
        "  answers               : " + "  ".join(
            f"200 {c['codes'].get(200, 0)} / 429 {c['codes'].get(429, 0)}" for c in m.clients)
        + f";  failures (neither 200 nor 429) {m.failures}",
        "  latency p50/p99 ms    : " + "  ".join(f"{c['p50_ms']:.0f}/{c['p99_ms']:.0f}" for c in m.clients),
        "  engine calls /s/proxy : filter " + " ".join(num(c, missing="-") for c in m.calls_per_s)
        + ";  Envoy's cluster " + " ".join(num(c, missing="-") for c in m.envoy_calls_per_s)
        + (f";  service (all proxies) {m.service_calls_per_s:.1f}" if m.service_calls_per_s is not None else ""),
        "  engine failures       : " + " ".join(str(s.get("engine_failures", 0)) for s in m.stats)
        + ";  slots granted/taken/unused: " + "  ".join(
            f"{s.get('slots_granted', 0)}/{s.get('slots_taken', 0)}/{s.get('slots_unused', 0)}" for s in m.stats),
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[300.0, 100.0],
                    help="rule rates per second, one run each (default 300 100)")
    ap.add_argument("--proxies", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=2, help="Envoy worker threads per proxy")
    ap.add_argument("--split", default="60,30,10", help="load split over the proxies (default 60,30,10)")
    ap.add_argument("--overload", type=float, default=3.0, help="total offered load / rate (default 3)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of load per rate (default 10)")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds left out at the start (default 2)")
    ap.add_argument("--max-queue-delay", type=float, default=1.0, help="seconds (default 1)")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    args = ap.parse_args(argv)
    weights = [float(x) for x in args.split.split(",")]
    if len(weights) != args.proxies:
        ap.error(f"--split: {len(weights)} weights for {args.proxies} proxies")
    if not WASM.exists():
        ap.error(f"{WASM} missing: run `make build`")
    results: list[dict[str, object]] = []
    failed = False
    for rate in args.rates:
        plugin = plugin_config(f"{rate:g}/s", max_queue_delay=f"{args.max_queue_delay:g}s",
                               expected_replicas=args.proxies)
        with ClusterLab(plugin, proxies=args.proxies, concurrency=args.concurrency, service_metrics=True) as lab:
            assert lab.engine is not None
            if not results:
                print(f"engine:   redis 127.0.0.1:{lab.engine.redis.port}, envoyproxy/ratelimit "
                      f"http :{lab.engine.service.port} (POST /json), grpc :{lab.engine.service.grpc_port}")
                print(f"proxies:  {args.proxies} x envoy --concurrency {args.concurrency} "
                      + " ".join(f"{lab.tag(i)}={p.url}" for i, p in enumerate(lab.proxies)))
                print(f"upstream: 127.0.0.1:{lab.upstream.port} (records each arrival and its proxy)")
                print(f"rule:     {json.dumps(plugin['rules'][0])}")
                print(f"load:     fortio -qps -uniform, {args.overload:g} x the rate split {args.split}, "
                      f"{args.duration:g} s per rate; load average {_load()}\n")
            qps = split(args.overload * rate, weights)
            m = lab.run(qps, duration_s=args.duration, warmup_s=args.warmup,
                        max_queue_delay_s=args.max_queue_delay, rate=rate)
            panics = lab.panics()
            errors = lab.errors()
        print("\n".join(report(m, label=f"rate {rate:g}/s (load average {_load()})")))
        if errors:
            print(f"  5xx answers logged by Envoy ({len(errors)}): " + "; ".join(errors[:3]))
        if panics:
            print("  PANIC in Envoy logs: " + "; ".join(panics[:3]))
        print()
        failed |= m.failures > 0 or bool(panics)
        results.append({"rate": rate, "measurement": m.to_json(), "panics": panics})
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 1 if failed else 0


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
