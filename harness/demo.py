"""The one-command demo: a burst of load through Envoy + the throttle.

Starts a real upstream (`fortio server`) and Envoy (`envoy/demo.yaml`,
--concurrency 2) on free loopback ports, drives 100 connections and a few
thousand requests through it as fast as they go (like `ab -c 100 -n 10000`),
prints what the client saw and what the filter counted, and stops both.
"""

from __future__ import annotations

import argparse
import json
import sys

from harness import fortio
from harness.configs import load_config, plugin_json, render
from harness.envoy import Envoy
from harness.net import free_port
from harness.units import per_second


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="500/s", help="throttle rate (default 500/s, as in envoy/demo.yaml)")
    ap.add_argument("--connections", type=int, default=100)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=2, help="Envoy worker threads")
    args = ap.parse_args(argv)

    plugin = json.loads(plugin_json(load_config("demo.yaml")))
    plugin["rules"][0]["rate"] = args.rate
    with fortio.FortioServer() as upstream:
        cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(),
                     upstream_port=upstream.port, plugin=plugin)
        with Envoy(cfg, concurrency=args.concurrency, log_level="warn") as envoy:
            print(f"upstream: fortio server {upstream.url}")
            print(f"envoy:    {envoy.url} (admin :{envoy.admin_port}), --concurrency {args.concurrency}, "
                  f"throttle {args.rate}, max_queue_delay {plugin['rules'][0]['max_queue_delay']}")
            print(f"load:     fortio load -c {args.connections} -n {args.requests} -qps 0 (keep-alive)\n")
            s = fortio.load(envoy.url + "/", connections=args.connections, requests=args.requests)
            stats = envoy.rule_stats("default")
    rate = per_second(args.rate)
    print(f"achieved rate : {s.qps:.2f} req/s  (setting {rate:g}/s, {100 * (s.qps / rate - 1):+.2f}%)")
    print(f"requests      : {s.requests} in {s.duration_s:.3f} s, failures {s.errors}  codes {s.codes}")
    print(f"latency (ms)  : avg {s.avg_ms:.1f}  p50 {s.ms(50):.1f}  p90 {s.ms(90):.1f}  p99 {s.ms(99):.1f}  "
          f"max {s.max_ms:.1f}")
    print("filter        : " + "  ".join(f"{k} {stats.get(k, 0)}" for k in
                                         ("admitted", "queued", "released", "rejected", "cancelled", "gone", "held")))
    return 0 if s.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
