"""Cluster scope beyond this machine, by simulation (`make cluster-sim`).

Runs perf/cluster/sim/ (the core's own cluster code for N proxies, in real
time) against the real Redis + rate limit service started by harness.engine,
and against the core's in-memory engine where the real one cannot keep up on
2 cores. Reads Redis's own counters (INFO stats / commandstats) and the CPU
time of Redis and the service around each run. Writes results.json and summary.md to
perf/reports/cluster/<run-id>/.

    python -m perf.cluster.sim            # the standard set (~2.5 min)
    python -m perf.cluster.sim --quick    # two short runs (~30 s)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.engine import Engine
from harness.procs import ROOT
from harness.results import run_dir
from harness.tables import markdown, num

CRATE = ROOT / "perf" / "cluster" / "sim"
TARGET = ROOT / "target" / "cluster-sim"
BINARY = TARGET / "release" / "cluster-sim"

# (engine, proxies, rate/s, seconds measured): uneven demand, 1.5 x the rate offered.
STANDARD = [
    ("real", 50, 2000, 10),
    ("real", 200, 2000, 10),
    ("real", 200, 20000, 10),
    ("real", 400, 20000, 10),
    ("fake", 200, 20000, 10),
    ("fake", 1000, 20000, 10),
]
QUICK = [("real", 50, 2000, 4), ("fake", 200, 20000, 4)]


def build() -> None:
    subprocess.run(["cargo", "build", "-q", "--release", "--manifest-path", str(CRATE / "Cargo.toml")],
                   check=True, env={**os.environ, "CARGO_TARGET_DIR": str(TARGET)})


def run_one(kind: str, proxies: int, rate: int, seconds: int, engine: Engine) -> dict[str, Any]:
    real = kind == "real"
    cmd = [str(BINARY), "--proxies", str(proxies), "--rate", str(rate), "--seconds", str(seconds),
           "--warmup", "2", "--offered", "1.5", "--threads", "16"]
    cmd += ["--url", f"127.0.0.1:{engine.port}"] if real else ["--fake"]
    before, cpu0 = (engine.redis_stats(), engine.cpu_seconds()) if real else ({}, {})
    t0 = time.monotonic()
    result: dict[str, Any] = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60,
                                                       check=True).stdout)
    wall = time.monotonic() - t0
    if real:
        after = engine.redis_stats()
        result["redis_ops_per_s"] = (after["total_commands_processed"] - before["total_commands_processed"]) / wall
        result["redis_incrby_per_s"] = (after["incrby"] - before["incrby"]) / wall
        result["cpu_pct"] = {k: (v - cpu0[k]) / wall * 100 for k, v in engine.cpu_seconds().items()}
    else:
        result["redis_ops_per_s"] = result["fake_engine_redis_commands"] / result["wall_seconds"]
    return result


PROBE_THREADS = [1, 4, 16]


def probe(engine: Engine, threads: int, seconds: int) -> dict[str, Any]:
    """The service's capacity alone: `threads` clients calling back to back."""
    cpu0 = engine.cpu_seconds()
    out = subprocess.run([str(BINARY), "--probe", "--url", f"127.0.0.1:{engine.port}", "--threads", str(threads),
                          "--seconds", str(seconds)], capture_output=True, text=True, timeout=seconds + 30, check=True)
    r: dict[str, Any] = json.loads(out.stdout)
    r["cpu_pct"] = {k: (v - cpu0[k]) / seconds * 100 for k, v in engine.cpu_seconds().items()}
    return r


def probe_table(probes: list[dict[str, Any]]) -> str:
    return markdown(["clients", "calls/s", "p50 ms", "p90 ms", "p99 ms", "errors", "CPU ratelimit / redis"], [
        [p["threads"], num(p["calls_per_s"], ",.0f"), *(num(p["call_ms"][q], ".2f") for q in ("p50", "p90", "p99")),
         p["errors"], f"{p['cpu_pct']['ratelimit']:.0f}% / {p['cpu_pct']['redis']:.0f}%"] for p in probes])


def table(results: list[dict[str, Any]]) -> str:
    head = ["engine", "proxies", "rate/s", "released/s", "error", "worst 100 ms (bound)", "worst 1 s (bound)",
            "calls/proxy/s", "engine calls/s", "call p50 / p99 ms", "failed calls", "fallback proxy-s",
            "Redis ops/s", "CPU ratelimit / redis"]
    rows = []
    for r in results:
        cpu = r.get("cpu_pct")
        rows.append([
            r["engine"], r["proxies"], num(r["rate"], ","), num(r["released_per_s"], ",.1f"),
            num(r["rate_error_pct"], "+.2f") + "%",
            f"{r['worst_100ms']} ({r['bound_100ms']}; grid only {r['worst_100ms_grid_only']})",
            f"{r['worst_1s']} ({r['bound_1s']})",
            f"{r['calls_per_proxy_per_s']['mean']:.2f} (max {r['calls_per_proxy_per_s']['max']:.1f})",
            num(r["engine_calls_per_s"], ",.0f"), f"{r['call_ms']['p50']:.2f} / {r['call_ms']['p99']:.2f}",
            r["failed_calls"], num(r["fallback_proxy_seconds"]), num(r["redis_ops_per_s"], ",.0f"),
            f"{cpu['ratelimit']:.0f}% / {cpu['redis']:.0f}%" if cpu else "—"])
    return markdown(head, rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.cluster.sim")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, help="results directory (default perf/reports/cluster/<run-id>)")
    args = p.parse_args(argv)
    build()
    runs = QUICK if args.quick else STANDARD
    results: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    with Engine() as engine:
        for threads in PROBE_THREADS[:1] if args.quick else PROBE_THREADS:
            print(f"cluster-sim: service capacity, {threads} clients back to back", file=sys.stderr, flush=True)
            probes.append(probe(engine, threads, 3 if args.quick else 5))
            print(probe_table(probes[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
        for kind, proxies, rate, seconds in runs:
            print(f"cluster-sim: {kind} engine, {proxies} proxies, {rate}/s, {seconds} s", file=sys.stderr, flush=True)
            r = run_one(kind, proxies, rate, seconds, engine)
            results.append(r)
            print(table([r]).splitlines()[-1], file=sys.stderr, flush=True)
    _, out = run_dir("cluster", "sim-quick" if args.quick else "sim", args.out)
    (out / "results.json").write_text(json.dumps({"probes": probes, "runs": results}, indent=2) + "\n")
    md = ("# Cluster scope simulation (perf/cluster/sim.py)\n\n"
          f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on this machine (2 cores, shared). "
          "Uneven demand (proxy i weighs 1/(i+1)^0.8), 1.5 x the rate offered in total; 2 s warm-up, then the "
          "measured window. Bound = R x W + burst + 2 (burst 0).\n\n"
          "## The service alone (6 descriptors per call, clients calling back to back)\n\n" + probe_table(probes)
          + "\n\n## Simulated proxies\n\n" + table(results) + "\n")
    (out / "summary.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
