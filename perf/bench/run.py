"""The benchmark runner: executes a set of scenarios (perf/bench/sets.yaml) in one
run against one nginx (upstream + limit_req anchors), skips each scenario's
warm-up, and writes self-describing results to perf/reports/bench/<run-id>/
(a set of `kind: cluster` scenarios only: perf/reports/cluster/<run-id>/):

  runs/<label>.json   everything about one run (scenario, config, client and upstream figures)
  results.csv         one fixed-column row per load run (CSV_COLUMNS)
  timeseries.json     the rate the upstream saw per 100 ms window, per run
  memory.json         Envoy RSS idle and with held requests
  cluster.csv, cluster.json  kind: cluster scenarios (three proxies, one rate; perf/cluster/bench.py)
  cases.csv           their cases, one variant per column in the report (perf/cluster/holds.py)
  summary.md, report.html  (perf/bench/report.py)

  python -m perf.bench.run --set quick    # or standard; --only LABEL... to pick some
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

from harness import nginx, windows
from harness.envoy import Envoy
from harness.net import free_port
from harness.procs import raise_open_files
from harness.procstats import Sampler
from harness.results import environment, run_dir
from harness.tables import num, read_csv, write_csv
from perf.bench import loadgen, memory, report
from perf.bench.scenario import Scenario, ScenarioError, load_set
from perf.cluster import bench as cluster_bench
from perf.cluster import holds

CSV_COLUMNS = ("label", "tool", "conns", "offered_qps", "achieved_qps", "errors",
               "p50", "p75", "p90", "p99", "p99.9", "proxy_rss_mb", "proxy_cpu_s")
WINDOW_S = 0.1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="quick", help="scenario set from perf/bench/sets.yaml (default quick)")
    ap.add_argument("--only", nargs="*", help="run only these labels of the set")
    ap.add_argument("--out", type=Path, help="results directory (default perf/reports/<family>/<run-id>)")
    args = ap.parse_args(argv)
    try:
        groups = load_set(args.set)
    except ScenarioError as e:
        print(f"perf: {e}", file=sys.stderr)
        return 2
    if args.only:
        groups = [([s for s in g if s.label in set(args.only)], n) for g, n in groups]
        groups = [(g, n) for g, n in groups if g]
    scenarios = [s for g, _ in groups for s in g]
    family = "cluster" if all(s.kind == "cluster" for s in scenarios) else "bench"
    run_id, out = run_dir(family, args.set, args.out)
    (out / "runs").mkdir(exist_ok=True)
    raise_open_files(16384)
    info = environment(run_id, set=args.set, nginx=nginx.version(), **loadgen.versions(), window_s=WINDOW_S)
    t0 = time.monotonic()
    rates = tuple(sorted({s.nginx_limit["rate"] for s in scenarios if s.topology == "nginx_limit"}))
    total = sum(len(g) * n for g, n in groups)
    step = 0
    results: dict[str, dict] = {}
    with nginx.Nginx(limit_rates=rates) as web:
        for group, rounds in groups:
            done: dict[str, list[dict]] = {s.label: [] for s in group}
            for r in range(rounds):
                for s in group:
                    step += 1
                    tag = f" (round {r + 1}/{rounds})" if rounds > 1 else ""
                    print(f"[{step}/{total}] {s.label}{tag}: {s.description}", flush=True)
                    done[s.label].append(run_one(s, web))
            for s in group:
                results[s.label] = choose(done[s.label])
                (out / "runs" / f"{s.label}.json").write_text(json.dumps(results[s.label], indent=1, default=str))
    failed = [label for label, r in results.items() if "error" in r]
    by_kind = {k: [res for s in scenarios if s.kind == k and "error" not in (res := results[s.label])]
               for k in ("load", "memory", "cluster")}
    info.update(duration_s=round(time.monotonic() - t0, 1), loadavg_end=os.getloadavg(), failed=failed)
    write_csv(out / "results.csv", CSV_COLUMNS, [r["row"] for r in by_kind["load"]])
    (out / "timeseries.json").write_text(json.dumps({r["label"]: r["timeseries"] for r in by_kind["load"]}))
    (out / "memory.json").write_text(json.dumps({r["label"]: r for r in by_kind["memory"]}, indent=1))
    (out / "info.json").write_text(json.dumps(info, indent=1))
    if by_kind["cluster"]:
        steady = [r for r in by_kind["cluster"] if "row" in r]
        write_csv(out / "cluster.csv", cluster_bench.CLUSTER_COLUMNS, [r["row"] for r in steady])
        rows = read_csv(out / "cluster.csv")
        # The cases (perf/cluster/holds.py), with the latency of steady load within the rate from the rows.
        figures = [f for r in by_kind["cluster"] for f in r.get("figures", [])] + holds.steady_figures(rows)
        write_csv(out / "cases.csv", holds.CASE_COLUMNS, figures)
        (out / "cluster.json").write_text(json.dumps({
            "rows": rows, "cases": figures,
            "timeseries": {r["label"]: r["timeseries"] for r in steady}}, indent=1))
    paths = report.render_run(out)  # from the files just written: a run and its re-render are one report
    print()
    print(paths["summary"].read_text())
    print(f"perf: {len(scenarios)} scenarios ({len(failed)} failed) in {info['duration_s']} s -> "
          f"{out}/ (results.csv, summary.md, report.html)")
    return 1 if failed else 0


def run_one(s: Scenario, web: nginx.Nginx) -> dict:
    started = time.monotonic()
    try:
        if s.kind == "memory":
            result = run_memory(s, web)
        elif s.kind == "cluster":
            result = cluster_bench.run(s)
            if "figures" in result:
                for f in result["figures"]:
                    print(f"    {f['variant']}: {f['row']}: {f['figure']} = {f['value']}", flush=True)
            else:
                print("    " + "  ".join(f"{k}={num(result['row'][k], '.3f')}"
                                         for k in cluster_bench.CLUSTER_COLUMNS[1:]), flush=True)
        else:
            result = run_load(s, web)
            print("    " + "  ".join(f"{k}={num(result['row'][k], '.3f')}" for k in CSV_COLUMNS[2:]), flush=True)
    except Exception as e:  # one broken scenario must not lose the rest of the run
        result = {"label": s.label, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        print(f"    FAILED: {result['error']}", flush=True)
    result["wall_s"] = round(time.monotonic() - started, 2)
    return result


def choose(results: list[dict]) -> dict:
    """One result of several interleaved rounds: the median by achieved req/s
    (the whole run, so its percentiles belong to it); every round is kept."""
    if len(results) == 1:
        return results[0]
    failed = [r for r in results if "error" in r]
    if failed:
        return {**failed[0], "rounds": results}
    order = sorted(range(len(results)), key=lambda i: results[i]["row"]["achieved_qps"])
    k = order[len(order) // 2]
    return {**results[k], "chosen_round": k + 1, "rounds_achieved_qps": [r["row"]["achieved_qps"] for r in results],
            "rounds": results}


def run_load(s: Scenario, web: nginx.Nginx) -> dict:
    envoy = None
    try:
        if s.topology == "envoy":
            cfg = s.envoy_config(listen_port=free_port(), admin_port=free_port(), upstream_port=web.upstream_port)
            envoy = Envoy(cfg, concurrency=s.envoy["concurrency"], log_level="warn").start()
            assert envoy.proc is not None  # started
            url, pids, log = f"{envoy.url}{nginx.PATH}", [envoy.proc.pid], web.access_log()
        elif s.topology == "nginx_limit":
            rate = s.nginx_limit["rate"]
            url, pids, log = web.url(rate), web.pids(), web.access_log(rate)
        else:
            url, pids, log = web.url(), [], web.access_log()
        timeout = 600.0
        if s.warmup_requests:
            loadgen.run(s.tool, url, connections=min(s.connections, s.warmup_requests),
                        requests=s.warmup_requests, keepalive=s.keepalive, timeout_s=timeout)
        tail = nginx.LogTail(log)
        stats0 = envoy.rule_stats() if envoy and "throttle" in s.envoy else None
        with Sampler(pids) as cost:
            res = loadgen.run(s.tool, url, connections=s.connections, requests=s.requests,
                              duration_s=s.duration_s, qps=s.qps, keepalive=s.keepalive, timeout_s=timeout)
        seen = [t for t, status in tail.read() if 200 <= status < 300]
        filter_stats = None
        if envoy is not None and stats0 is not None:
            now = envoy.rule_stats()
            filter_stats = {k: now.get(k, 0) - stats0.get(k, 0) for k in now if k != "held"}
        elif envoy and s.envoy["config"] == "local_ratelimit.yaml":
            filter_stats = {k.rsplit(".", 1)[-1]: v for k, v in envoy.stats("local_rate_limit.").items()}
    finally:
        if envoy:
            envoy.stop()
    row = {
        "label": s.label, "tool": s.tool, "conns": s.connections, "offered_qps": s.qps,
        "achieved_qps": res["achieved_qps"], "errors": res["errors"],
        "p50": res["p50"], "p75": res["p75"], "p90": res["p90"], "p99": res["p99"], "p99.9": res["p99.9"],
        "proxy_rss_mb": cost.peak_mb if pids else None, "proxy_cpu_s": cost.cpu_s if pids else None,
    }
    ts = {"window_s": WINDOW_S, "rates": windows.window_rates(seen, WINDOW_S), "setting_qps": s.setting_qps,
          "upstream_qps": windows.span_rate(seen), "upstream_requests": len(seen)}
    return {"label": s.label, "scenario": vars(s), "setting_qps": s.setting_qps, "url": url, "row": row,
            "client": res, "filter_stats": filter_stats,
            "upstream": {"requests": len(seen), "qps": windows.span_rate(seen)}, "timeseries": ts}


def run_memory(s: Scenario, web: nginx.Nginx) -> dict:
    cfg = s.envoy_config(listen_port=free_port(), admin_port=free_port(), upstream_port=web.upstream_port)
    throttled = "throttle" in s.envoy
    with Envoy(cfg, concurrency=s.envoy["concurrency"], log_level="warn") as envoy:
        res = memory.measure(envoy, s.steps, throttled=throttled)
    res.update({"label": s.label, "description": s.description, "throttled": throttled,
                "concurrency": s.envoy["concurrency"]})
    print(f"    idle {res['idle_rss_mb']:.1f} MB; " + ", ".join(
        f"{p['held']} {'held' if throttled else 'idle conns'}: {p['rss_mb']:.1f} MB" for p in res["points"][1:])
          + (f"; {res['mb_per_1000']:.2f} MB per 1,000 between steps" if res["mb_per_1000"] is not None else ""),
          flush=True)
    return res


if __name__ == "__main__":
    sys.exit(main())
