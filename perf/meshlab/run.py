"""Runs the mesh comparison: every topology x every load case, Fortio from the client node.

    python -m perf.meshlab.run            # full: 4 cases, 8 topologies, 3 runs for the 100 RPS cases
    python -m perf.meshlab.run --short    # CI: 100 RPS / 10 connections, 5 topologies, 3 s runs

Writes results.csv (fixed columns), results.json, report.md and report.html to --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from harness.procs import WASM, envoy_bin, go_bin, summarize
from perf.meshlab import report, topologies
from perf.meshlab.certs import make_certs
from perf.meshlab.lab import AppServer, Lab, LabUnavailable, check_available, cpu_seconds, rss_mb

CSV_COLUMNS = ("label", "tool", "conns", "offered_qps", "achieved_qps", "errors", "p50", "p75", "p90", "p99",
               "p99.9", "proxy_rss_mb", "proxy_cpu_s")


@dataclass(frozen=True)
class Case:
    name: str
    qps: int
    conns: int
    keepalive: bool
    runs: int  # repetitions in the full run (the study did three for the 100 RPS case)


CASES = (Case("100 RPS / 10 connections", 100, 10, True, 3),
         Case("100 RPS / 10 connections, Connection: close", 100, 10, False, 3),
         Case("1000 RPS / 100 connections", 1000, 100, True, 1),
         Case("4000 RPS / 400 connections", 4000, 400, True, 1))
SHORT_CASES = (Case("100 RPS / 10 connections", 100, 10, True, 1),)


def fortio_load(lab: Lab, url: str, case: Case, duration_s: float, out: Path) -> dict:
    cmd = [go_bin("fortio"), "load", "-c", str(case.conns), "-qps", str(case.qps), "-t", f"{duration_s}s",
           "-json", str(out), "-loglevel", "error", "-timeout", "30s", "-allow-initial-errors"]
    if not case.keepalive:
        cmd.append("-keepalive=false")
    r = lab["client"].run([*cmd, url], timeout=duration_s + 90)
    if r.returncode != 0:
        raise RuntimeError(f"fortio load failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(out.read_text())


def throttle_stats(dep: topologies.Deployed) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in dep.proxies:
        for name, v in p.stats(r"^wasmcustom\.throttle\.rule\.default\.").items():
            key = name.rsplit(".", 1)[1]
            out[key] = out.get(key, 0) + v
    return out


def measure(lab: Lab, certs: dict, topo: topologies.Topology, case: Case, duration_s: float, warmup_s: float,
            run: int) -> dict:
    dep = topologies.deploy(lab, topo, certs, case.qps, case.conns)
    try:
        if warmup_s:
            fortio_load(lab, dep.url, case, warmup_s, lab.dir / "warmup.json")
        pids = [p.pid for p in dep.proxies]
        thr0 = throttle_stats(dep)
        cpu0 = sum(cpu_seconds(p) for p in pids)
        result = fortio_load(lab, dep.url, case, duration_s, lab.dir / "load.json")
        cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        rss = sum(rss_mb(p) for p in pids)
        # Counters during the measured run only (warm-up excluded); the gauge `held` as seen at its end.
        throttle = {k: v - (0 if k == "held" else thr0.get(k, 0)) for k, v in throttle_stats(dep).items()}
    finally:
        dep.stop()
    s = summarize(result)
    return {
        "case": case.name, "run": run, "topology": topo.key, "throttle": topo.throttle,
        "rate": topo.rate(case.qps), "burst": topo.burst(case.conns), "label": topo.label(case.qps, case.conns), "tool": "fortio",
        "conns": case.conns, "offered_qps": case.qps, "keepalive": case.keepalive, "duration_s": duration_s,
        "achieved_qps": s["qps"], "errors": s["errors"], "codes": s["codes"], "requests": s["requests"],
        "avg": s["avg_ms"], "p50": s["p50_ms"], "p75": s["p75_ms"], "p90": s["p90_ms"], "p99": s["p99_ms"],
        "p99.9": s["p99.9_ms"], "max": s["max_ms"], "sockets": s["sockets"],
        "proxies": [p.name for p in dep.proxies], "proxy_rss_mb": rss, "proxy_cpu_s": cpu,
        "throttle_stats": throttle,
    }


def environment() -> dict:
    envoy_v = subprocess.run([envoy_bin(), "--version"], capture_output=True, text=True).stdout.strip()
    fortio_v = subprocess.run([go_bin("fortio"), "version"], capture_output=True, text=True).stdout.strip()
    load = Path("/proc/loadavg").read_text().split()[:3]
    return {"envoy": envoy_v.split("version:")[-1].strip(), "fortio": fortio_v, "cpus": len(
        [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("processor")]),
        "loadavg_at_start": load, "kernel": subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--short", action="store_true", help="CI version: one case, five topologies, short runs")
    ap.add_argument("--duration", type=float, help="seconds per measured run (full: 8, short: 3)")
    ap.add_argument("--warmup", type=float, help="seconds of unrecorded load before each run (full: 1, short: 0.5)")
    ap.add_argument("--runs", type=int, help="override the repetitions of every case")
    ap.add_argument("--check", action="store_true",
                    help="fail unless every unthrottled run served >= 90%% of the offered load without errors, "
                         "and every run throttled below the load achieved its rate within 20%%")
    ap.add_argument("--out", type=Path, help="output directory (default perf/meshlab/results/<UTC time>)")
    args = ap.parse_args(argv)

    try:
        check_available()
    except LabUnavailable as e:
        print(f"perf-mesh: SKIPPED: {e}")
        return 0
    if not WASM.exists():
        print(f"perf-mesh: {WASM} missing: run `make build`", file=sys.stderr)
        return 2
    cases = SHORT_CASES if args.short else CASES
    topos = topologies.SHORT if args.short else topologies.ALL
    duration = args.duration or (3.0 if args.short else 8.0)
    warmup = args.warmup if args.warmup is not None else (0.5 if args.short else 1.0)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or Path(__file__).resolve().parent / "results" / stamp
    out.mkdir(parents=True, exist_ok=True)

    # SIGTERM (e.g. a CI timeout) unwinds like Ctrl-C, so the lab's teardown runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.monotonic()
    meta = {"started_utc": stamp, "mode": "short" if args.short else "full", "duration_s": duration,
            "warmup_s": warmup, "app": report.APP_LABEL, **environment()}
    rows: list[dict] = []
    with Lab() as lab:
        certs = make_certs(lab.dir / "certs", ("client", "app", "waypoint"))
        AppServer(lab["app"], go_bin("fortio")).start()
        max_runs = max(args.runs or c.runs for c in cases)
        for run in range(1, max_runs + 1):
            for case in cases:
                if run > (args.runs or case.runs):
                    continue
                for topo in topos:
                    row = measure(lab, certs, topo, case, duration, warmup, run)
                    rows.append(row)
                    print(f"[{time.monotonic() - t0:6.1f}s] run {run} | {case.name} | {row['label']}: "
                          f"{row['achieved_qps']:.1f} qps, p50 {row['p50']:.3f} ms, p99 {row['p99']:.3f} ms, "
                          f"errors {row['errors']}, proxy cpu {row['proxy_cpu_s']:.2f} s", flush=True)
    meta["elapsed_s"] = round(time.monotonic() - t0, 1)

    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.4f}" if isinstance(r[k], float) else r[k]) for k in CSV_COLUMNS})
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    report.write(out, meta, rows)
    print(f"perf-mesh: {len(rows)} runs in {meta['elapsed_s']} s; report: {out / 'report.html'}")
    if args.check:
        problems = check(rows)
        for p in problems:
            print(f"perf-mesh: CHECK FAILED: {p}")
        print(f"perf-mesh: check {'failed' if problems else 'passed'} ({len(rows)} runs)")
        return 1 if problems else 0
    return 0


def check(rows: list[dict]) -> list[str]:
    """Sanity of a run (honest tolerances; precise figures belong in the report)."""
    problems = []
    for r in rows:
        what = f"{r['case']} | {r['label']} (run {r['run']})"
        if not r["throttle"]:
            if r["errors"] or r["achieved_qps"] < 0.9 * r["offered_qps"]:
                problems.append(f"{what}: {r['achieved_qps']:.1f} of {r['offered_qps']} qps, errors {r['codes']}")
        elif r["throttle"] == "below" and abs(r["achieved_qps"] - r["rate"]) > 0.2 * r["rate"]:
            problems.append(f"{what}: {r['achieved_qps']:.1f} qps with the throttle at {r['rate']}/s")
    return problems


if __name__ == "__main__":
    sys.exit(main())
