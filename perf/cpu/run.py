"""Side by side in one Envoy, in one run (perf/cpu/profiles.yaml):

  1. Envoy CPU µs per request: one listener per variant (plain HTTP proxy,
     the no-op Wasm floor, the throttle builds at a rate never reached,
     native local_ratelimit), the same HCM on each, nginx serving the
     178-byte file behind all; interleaved rounds (round r runs every
     listener once, order rotated by r), each measuring the Envoy process's
     CPU over a fixed number of requests, at a fixed offered load and at
     saturation; median and spread per listener, req/s beside it.
  2. The same under Envoy's other Wasm runtimes (WAMR, Wasmtime) when the
     Envoy binary has them (else Envoy's log line says so).
  3. Concurrency hand-off: a gate of N slots before a fixed-delay upstream,
     achieved / ideal (N / service time), waiters on the same worker and on
     the other worker, gap from freed slot to release.
  4. Pacing smoothness: sd of 100 ms windows of the upstream's own
     timestamps, the throttle builds beside nginx limit_req.

  python -m perf.cpu.run --profile full                # make perf-cpu
  python -m perf.cpu.run --profile quick               # make perf-cpu-quick (CI)
  python -m perf.cpu.run --profile full --wasm before=git:8f14453 --wasm after=/other/throttle.wasm --skip smoothness

Writes perf/reports/cpu/<run-id>/: cpu.csv, handoff.csv, smoothness.csv,
cpu.json (everything, every round), info.json, summary.md.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from harness import fortio, nginx
from harness.envoy import Envoy
from harness.net import free_port
from harness.procs import NOOP_WASM
from harness.procstats import cpu_seconds as cpu_s
from harness.procstats import set_affinity, thread_cpu_ns
from harness.results import environment, run_dir
from harness.tables import num, write_csv
from harness.windows import span_rate, window_rates
from perf.cpu import builds as refbuilds
from perf.cpu import handoff, report
from perf.cpu.config import (
    NEVER_REACHED,
    SPEC,
    Build,
    EnvoyListener,
    HandoffSpec,
    Profile,
    Shape,
    SpecError,
    envoy_config,
    load_profile,
    parse_wasm_overrides,
    throttle_rule,
    wasm_path,
)
from perf.cpu.stats import block_order, handoff_summary, pair_handoffs, rotated, stdev, us_per_request

CPU_COLUMNS = ("round", "shape", "listener", "kind", "runtime", "connections", "offered_qps", "requests", "ok",
               "achieved_qps", "envoy_us_per_req", "envoy_workers_us_per_req", "envoy_stat_us_per_req",
               "client_us_per_req", "nginx_us_per_req", "p50_ms", "p99_ms", "loadavg_1m")
HANDOFF_COLUMNS = ("round", "build", "placement", "slots", "connections", "requests", "errors",
                   "service_ms", "envoy_upstream_ms", "ideal_qps", "achieved_qps", "achieved_pct",
                   "handoffs", "cross_pct", "gap_p50_ms", "gap_p90_ms", "gap_p99_ms", "gap_max_ms",
                   "cross_gap_p50_ms", "cross_gap_p99_ms", "same_gap_p50_ms", "same_gap_p99_ms")
SMOOTH_COLUMNS = ("round", "variant", "setting_qps", "requests", "upstream_qps", "windows", "sd_qps",
                  "min_window_qps", "max_window_qps", "off_10pct", "sd_1s_qps")
HANDOFF_FIRST_HOLD = "3s"  # the first `slots` requests hold the gate while the rest queue in order


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(f"perf.cpu: signal {signum}: stopping (Envoy, nginx and fortio are stopped on the way out)")


# -- the Wasm builds and runtimes ---------------------------------------------

def resolve_builds(p: Profile, overrides: dict[str, Build]) -> dict[str, Path]:
    unknown = sorted(set(overrides) - set(p.builds))
    if unknown:
        raise SpecError(f"--wasm: no build {unknown} in profile {p.name} (have {sorted(p.builds)})")
    p.builds.update(overrides)
    out: dict[str, Path] = {}
    for name, b in p.builds.items():
        if b.path is not None:
            path = b.path
        else:
            assert b.ref is not None
            path = refbuilds.wasm_at(b.ref, log=log)
        path = wasm_path(name, {name: path})
        if not path.exists():
            raise SpecError(f"build {name}: {path} does not exist (make build?)")
        out[name] = path
    return out


def probe_runtime(runtime: str) -> dict:
    """Does this Envoy load a Wasm module under `runtime`? `--mode validate`
    with one no-op listener; the log line that says why not, if not."""
    cfg = envoy_config([EnvoyListener("probe", free_port(), wasm_path=NOOP_WASM, runtime=runtime)],
                       admin_port=free_port(), clusters={"nginx": free_port()})
    rc, text = Envoy(cfg, concurrency=1, log_level="warn").validate()
    lines = [ln for ln in text.splitlines() if "wasm" in ln.lower() and ("[warning]" in ln or "[error]" in ln
                                                                         or "[critical]" in ln)]
    why = next((ln for ln in lines if "compiled without" in ln), lines[0] if lines else text.strip()[-300:])
    return {"runtime": f"envoy.wasm.runtime.{runtime}", "loads": rc == 0, "log": None if rc == 0 else why.strip()}


# -- load ---------------------------------------------------------------------

def fortio_load(url: str, *, connections: int, qps: float = 0, requests: int | None = None,
                duration_s: float | None = None, cpus: set[int] | None = None) -> fortio.Result:
    """Fortio keep-alive, p50 and p99; with a rate, connections spread over the period, not in step."""
    return fortio.Load(url, connections=connections, qps=qps, requests=requests, duration_s=duration_s,
                       uniform=bool(qps), percentiles=(50, 99)).run(timeout_s=600, cpus=cpus)


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def envoy_ns(pid: int) -> tuple[int, int]:
    """(all threads, worker threads) CPU ns of Envoy."""
    t = thread_cpu_ns(pid)
    return sum(t.values()), sum(v for k, v in t.items() if k.startswith("wrk:"))


def measure(url: str, shape: Shape, envoy_pid: int, nginx_pids: list[int], warmup: int) -> dict:
    """One listener, one shape: Envoy's CPU over a fixed number of requests."""
    cpus = {1} if shape.pin else None
    if warmup:
        fortio_load(url, connections=shape.connections, requests=max(warmup, shape.connections), cpus=cpus)
    all0, wrk0 = envoy_ns(envoy_pid)
    stat0 = cpu_s(envoy_pid)
    ng0 = sum(cpu_s(p) for p in nginx_pids)
    cl0 = children_cpu_s()
    res = fortio_load(url, connections=shape.connections, qps=shape.qps, requests=shape.requests, cpus=cpus)
    cl1 = children_cpu_s()
    ng1 = sum(cpu_s(p) for p in nginx_pids)
    stat1 = cpu_s(envoy_pid)
    all1, wrk1 = envoy_ns(envoy_pid)
    ok = res.ok
    if ok == 0 or ok != res.requests:
        raise RuntimeError(f"{url}: expected every answer 200, got {res.codes}")
    return {
        "requests": res.requests, "ok": ok, "codes": res.codes, "achieved_qps": ok / res.duration_s,
        "envoy_us_per_req": us_per_request((all1 - all0) / 1e9, ok),
        "envoy_workers_us_per_req": us_per_request((wrk1 - wrk0) / 1e9, ok),
        "envoy_stat_us_per_req": us_per_request(stat1 - stat0, ok),
        "client_us_per_req": us_per_request(cl1 - cl0, ok),
        "nginx_us_per_req": us_per_request(ng1 - ng0, ok),
        "p50_ms": res.ms(50), "p99_ms": res.ms(99), "loadavg_1m": os.getloadavg()[0],
    }


def idle_cpu(envoy_pid: int, seconds: float) -> dict:
    """Envoy's CPU with no traffic (timers, stats): µs per second."""
    a0, w0 = envoy_ns(envoy_pid)
    t0 = time.monotonic()
    time.sleep(seconds)  # the measurement window itself, not a wait for anything
    a1, w1 = envoy_ns(envoy_pid)
    dt_s = time.monotonic() - t0
    return {"seconds": round(dt_s, 3), "us_per_s": (a1 - a0) / 1e3 / dt_s, "workers_us_per_s": (w1 - w0) / 1e3 / dt_s}


def pin(envoy_pid: int, nginx_pids: list[int], on: bool) -> None:
    """Envoy on core 0, nginx (and fortio, per run) on core 1; or both cores again."""
    both = set(range(os.cpu_count() or 2))
    set_affinity(envoy_pid, {0} if on else both)
    for p in nginx_pids:
        set_affinity(p, {1} if on else both)


def run_cpu(p: Profile, envoy_pid: int, ports: dict[str, int], nginx_pids: list[int],
            listeners: list) -> tuple[list[dict], list[dict]]:
    rows: list[dict] = []
    failures: list[dict] = []
    names = [x.name for x in listeners]
    by_name = {x.name: x for x in listeners}
    pid = envoy_pid
    total = p.rounds * len(p.shapes) * len(names)
    step = 0
    for r in range(p.rounds):
        for shape in p.shapes:
            pin(pid, nginx_pids, shape.pin)
            try:
                for name in rotated(names, r):
                    step += 1
                    url = f"http://127.0.0.1:{ports[name]}{nginx.PATH}"
                    x = by_name[name]
                    try:
                        m = measure(url, shape, pid, nginx_pids, p.warmup_requests)
                    except Exception as e:  # one failure must not lose the run
                        failures.append({"round": r + 1, "shape": shape.name, "listener": name,
                                         "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})
                        log(f"[cpu {step}/{total}] round {r + 1} {shape.name} {name}: FAILED {e}")
                        continue
                    row = {"round": r + 1, "shape": shape.name, "listener": name, "kind": x.kind,
                           "runtime": x.runtime if x.wasm else "", "connections": shape.connections,
                           "offered_qps": shape.qps, **m}
                    rows.append(row)
                    log(f"[cpu {step}/{total}] round {r + 1} {shape.name:<20} {name:<24} "
                        f"{m['envoy_us_per_req']:7.1f} µs/req (workers {m['envoy_workers_us_per_req']:6.1f})  "
                        f"{m['achieved_qps']:8.0f} req/s  client {m['client_us_per_req']:6.1f} µs/req  "
                        f"load {m['loadavg_1m']:.2f}")
            finally:
                pin(pid, nginx_pids, False)
    return rows, failures


# -- hand-off -----------------------------------------------------------------

def service_time(echo: fortio.FortioServer, slots: int, delay_s: float) -> dict:
    """The upstream's own service time with `slots` requests at once, direct."""
    res = fortio_load(echo.url + f"/echo?delay={delay_s * 1000:g}ms", connections=slots, requests=slots * 50)
    return {"mean_ms": res.avg_ms, "p50_ms": res.ms(50), "p99_ms": res.ms(99), "qps": res.qps}


async def _handoff_one(spec: HandoffSpec, envoy: Envoy, rule: str, conns: list[handoff.Conn],
                       log_path: Path) -> dict:
    tail = nginx.LogTail(log_path)
    delay = f"{spec.upstream_delay_s * 1000:g}ms"
    res = await handoff.closed_loop(
        conns, path=f"/echo?delay={delay}", first_path=f"/echo?delay={HANDOFF_FIRST_HOLD}",
        requests=spec.requests, slots=spec.slots,
        arrived_count=lambda: envoy.counter(f"http.{rule}.downstream_rq_total"),
        timeout_s=spec.requests / (spec.slots / spec.upstream_delay_s) * 3 + 20)
    ports = {c.local_port: c.worker for c in conns}

    def lines() -> list[handoff.LogRecord]:
        return [x for x in handoff.parse_log(tail.text()) if x.port in ports]

    # Envoy writes its access log about once a second: wait for every line.
    deadline = time.monotonic() + 15
    recs = lines()
    while len(recs) < res["sent"] and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        recs = lines()
    if len(recs) < res["sent"]:
        raise RuntimeError(f"access log has {len(recs)} of {res['sent']} requests")
    # (released upstream, answer back = slot freed, worker) of every answered request
    ok = sorted((x.released, x.freed, ports[x.port]) for x in recs
                if x.status == 200 and x.released is not None and x.freed is not None)
    pairs = pair_handoffs([(f, w) for _, f, w in ok], [(r, w) for r, _, w in ok])
    # steady state: after the first round of every connection (the initial holds)
    steady = ok[len(conns):]
    rel = [r for r, _, _ in steady]
    achieved = (len(rel) - 1) / (rel[-1] - rel[0]) if len(rel) > 1 and rel[-1] > rel[0] else 0.0
    upstream_ms = [(f - r) * 1000 for r, f, _ in steady]
    return {"client": res, "records": len(recs), "ok": len(ok), "achieved_qps": achieved,
            "envoy_upstream_ms": sum(upstream_ms) / len(upstream_ms) if upstream_ms else None,
            **handoff_summary(pairs[len(conns):])}


async def _open(spec: HandoffSpec, listeners: dict[str, int], envoy: Envoy) -> dict[str, dict[int, list[handoff.Conn]]]:
    out = {}
    for name, port in listeners.items():
        conns = await handoff.open_on_workers(port, envoy, 2 * spec.connections)
        by_worker: dict[int, list[handoff.Conn]] = {}
        for c in conns:
            by_worker.setdefault(c.worker, []).append(c)
        out[name] = by_worker
    return out


def placement_order(spec: HandoffSpec, by_worker: dict[int, list[handoff.Conn]], placement: str) -> list[handoff.Conn]:
    if placement == "same":
        w = max(by_worker, key=lambda k: len(by_worker[k]))
        if len(by_worker[w]) < spec.connections:
            raise RuntimeError(f"worker {w} has {len(by_worker[w])} connections, need {spec.connections}")
        return by_worker[w][:spec.connections]
    if len(by_worker) != 2:
        raise RuntimeError(f"cross placement needs connections on 2 workers, got {sorted(by_worker)}")
    return block_order(by_worker, spec.slots, spec.connections)


def run_handoff(p: Profile, envoy: Envoy, ports: dict[str, int], logs: dict[str, Path],
                echo: fortio.FortioServer) -> tuple[list[dict], list[dict], dict]:
    spec = p.handoff
    assert spec is not None
    rows, failures = [], []
    names = {b: f"handoff-{b}" for b in spec.builds}
    workers: dict[str, dict[int, int]] = {}  # listener -> client port -> worker

    async def go() -> None:
        opened = await _open(spec, {n: ports[n] for n in names.values()}, envoy)
        for n, by_worker in opened.items():
            workers[n] = {c.local_port: w for w, cs in by_worker.items() for c in cs}
        try:
            variants = [(b, pl) for b in spec.builds for pl in spec.placements]
            for r in range(spec.rounds):
                svc = service_time(echo, spec.slots, spec.upstream_delay_s)
                ideal = spec.slots / (svc["mean_ms"] / 1000)
                for b, pl in rotated(variants, r):
                    name = names[b]
                    conns = placement_order(spec, opened[name], pl)
                    try:
                        m = await _handoff_one(spec, envoy, name, conns, logs[name])
                    except Exception as e:
                        failures.append({"round": r + 1, "build": b, "placement": pl,
                                         "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})
                        log(f"[handoff] round {r + 1} {b} {pl}: FAILED {e}")
                        continue
                    errors = sum(v for k, v in m["client"]["codes"].items() if k != 200)
                    row = {"round": r + 1, "build": b, "placement": pl, "slots": spec.slots,
                           "connections": spec.connections, "requests": m["client"]["sent"], "errors": errors,
                           "service_ms": svc["mean_ms"], "envoy_upstream_ms": m["envoy_upstream_ms"],
                           "ideal_qps": ideal, "achieved_qps": m["achieved_qps"],
                           "achieved_pct": 100 * m["achieved_qps"] / ideal,
                           **{k: m[k] for k in HANDOFF_COLUMNS[12:]}}
                    rows.append(row)
                    log(f"[handoff] round {r + 1} {b:<8} {pl:<5} {m['achieved_qps']:6.1f}/s of ideal {ideal:6.1f}/s "
                        f"({row['achieved_pct']:5.1f}%), service {svc['mean_ms']:.2f} ms, cross "
                        f"{num(m['cross_pct'], missing='-')}%, gap p50 {num(m['gap_p50_ms'], '.2f', '-')} ms "
                        f"p99 {num(m['gap_p99_ms'], '.2f', '-')} ms, errors {errors}")
        finally:
            for by_worker in opened.values():
                await handoff.close_all([c for cs in by_worker.values() for c in cs])

    asyncio.run(go())
    return rows, failures, workers


# -- smoothness -----------------------------------------------------------------

def run_smoothness(p: Profile, ports: dict[str, int], web: nginx.Nginx) -> tuple[list[dict], list[dict]]:
    spec = p.smoothness
    assert spec is not None
    rows, failures = [], []
    variants = [f"pace-{b}" for b in spec.builds] + (["nginx-limit_req"] if spec.nginx else [])
    for r in range(spec.rounds):
        for v in rotated(variants, r):
            if v == "nginx-limit_req":
                url, logp = web.url(spec.rate), web.access_log(spec.rate)
            else:
                url, logp = f"http://127.0.0.1:{ports[v]}{nginx.PATH}", web.access_log()
            try:
                tail = nginx.LogTail(logp)
                res = fortio_load(url, connections=spec.connections, duration_s=spec.duration_s)
                stamps = [t for t, status in tail.read() if status == 200]
                rates = window_rates(stamps, spec.window_s)
                if not rates:
                    raise RuntimeError(f"the upstream logged {len(stamps)} requests: no full window")
            except Exception as e:
                failures.append({"round": r + 1, "variant": v, "error": f"{type(e).__name__}: {e}",
                                 "trace": traceback.format_exc()})
                log(f"[smooth] round {r + 1} {v}: FAILED {e}")
                continue
            row = {"round": r + 1, "variant": v, "setting_qps": spec.rate, "requests": len(stamps),
                   "upstream_qps": span_rate(stamps), "windows": len(rates),
                   "sd_qps": stdev(rates), "min_window_qps": min(rates), "max_window_qps": max(rates),
                   "off_10pct": sum(1 for x in rates if abs(x - spec.rate) > 0.1 * spec.rate),
                   "sd_1s_qps": stdev(window_rates(stamps, 1.0)),
                   "client_codes": res.codes, "rates": rates}  # every window: cpu.json only
            rows.append(row)
            log(f"[smooth] round {r + 1} {v:<16} {row['upstream_qps']:6.1f}/s upstream, sd of "
                f"{spec.window_s * 1000:g} ms windows {row['sd_qps']:5.2f} req/s "
                f"(min {row['min_window_qps']:.0f}, max {row['max_window_qps']:.0f}), {len(rates)} windows")
    return rows, failures


# -- the run ------------------------------------------------------------------

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="quick", help="profile of perf/cpu/profiles.yaml (default quick)")
    ap.add_argument("--wasm", action="append", default=[], metavar="NAME=PATH|NAME=git:REF",
                    help="use this .wasm (or the build of this git ref) for build NAME, e.g. before=git:main")
    ap.add_argument("--skip", nargs="*", default=[], choices=("cpu", "handoff", "smoothness"))
    ap.add_argument("--out", type=Path, help="results directory (default perf/reports/cpu/<run-id>)")
    ap.add_argument("--spec", type=Path, default=SPEC, help="profiles file (default perf/cpu/profiles.yaml)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # so that every `finally` stops what it started
    try:
        p = load_profile(args.profile, args.spec)
        wasm = resolve_builds(p, parse_wasm_overrides(args.wasm))
    except (SpecError, ValueError, RuntimeError) as e:
        print(f"perf.cpu: {e}", file=sys.stderr)
        return 2
    run_id, out = run_dir("cpu", p.name, args.out)
    info = environment(run_id, set=f"cpu:{p.name}", nginx=nginx.version(), concurrency=p.concurrency,
                       uptime_start=_uptime(),
                       builds={b: {"path": str(path), "bytes": path.stat().st_size, "sha256": sha256(path),
                                   "ref": p.builds[b].ref} for b, path in wasm.items()},
                       noop={"path": str(NOOP_WASM), "sha256": sha256(NOOP_WASM) if NOOP_WASM.exists() else None})
    log(f"perf.cpu {p.name}: load {info['uptime_start']}")
    for b, d in info["builds"].items():
        log(f"  build {b}: {d['path']} ({d['bytes']} bytes, sha256 {d['sha256'][:12]})")
    runtimes = {rt: probe_runtime(rt) for rt in sorted({x.runtime for x in p.listeners if x.wasm})}
    for _rt, pr in runtimes.items():
        log(f"  runtime {pr['runtime']}: {'loads' if pr['loads'] else 'NOT AVAILABLE: ' + str(pr['log'])}")
    cpu_listeners = [x for x in p.listeners if not x.wasm or runtimes[x.runtime]["loads"]]
    left_out = [x.name for x in p.listeners if x not in cpu_listeners]
    t0 = time.monotonic()
    logdir = out / "logs"  # the hand-off listeners' access logs (kept: re-analysable with cpu.json's connections)
    logdir.mkdir(exist_ok=True)
    result: dict = {"profile": p.name, "runtimes": runtimes, "left_out": left_out, "failures": []}
    cpu_rows: list[dict] = []
    ho_rows: list[dict] = []
    sm_rows: list[dict] = []
    rates = (p.smoothness.rate,) if p.smoothness and p.smoothness.nginx else ()
    with nginx.Nginx(limit_rates=rates) as web, fortio.FortioServer(max_echo_delay="10s") as echo:
        nginx_pids = web.pids()
        envs: list[EnvoyListener] = []
        for x in cpu_listeners:
            rule = throttle_rule(x.name, rate=NEVER_REACHED, burst=0, max_queue_delay="1s") \
                if x.kind == "throttle" else None
            envs.append(EnvoyListener(x.name, free_port(), wasm_path=wasm_path(x.wasm, wasm) if x.wasm else None,
                                      runtime=x.runtime, rule=rule, local_ratelimit=x.local_ratelimit))
        logs: dict[str, Path] = {}
        if p.handoff and "handoff" not in args.skip:
            for b in p.handoff.builds:
                name = f"handoff-{b}"
                logs[name] = logdir / f"{name}.log"
                envs.append(EnvoyListener(name, free_port(), wasm_path=wasm[b], cluster="echo", exact_balance=True,
                                          access_log=logs[name], rule=throttle_rule(
                                              name, concurrency=p.handoff.slots, max_queue_delay="60s")))
        if p.smoothness and "smoothness" not in args.skip:
            for b in p.smoothness.builds:
                name = f"pace-{b}"
                envs.append(EnvoyListener(name, free_port(), wasm_path=wasm[b], rule=throttle_rule(
                    name, rate=f"{p.smoothness.rate}/s", burst=0, max_queue_delay="1s")))
        ports = {x.name: x.port for x in envs}
        cfg = envoy_config(envs, admin_port=free_port(), clusters={"nginx": web.upstream_port, "echo": echo.port})
        (out / "envoy.yaml").write_text(json.dumps(cfg, indent=1))
        envoy = Envoy(cfg, concurrency=p.concurrency, log_level="warn").start()
        assert envoy.proc is not None
        pid = envoy.proc.pid
        try:
            if "cpu" not in args.skip:
                for x in cpu_listeners:  # load every VM and connection pool before any measurement
                    fortio_load(f"http://127.0.0.1:{ports[x.name]}{nginx.PATH}", connections=16,
                                requests=max(p.warmup_requests, 16) * 2)
                result["idle_start"] = idle_cpu(pid, p.idle_s)
                cpu_rows, fails = run_cpu(p, pid, ports, nginx_pids, cpu_listeners)
                result["failures"] += fails
                result["idle_end"] = idle_cpu(pid, p.idle_s)
            if p.handoff and "handoff" not in args.skip:
                ho_rows, fails, result["handoff_connections"] = run_handoff(p, envoy, ports, logs, echo)
                result["failures"] += fails
            if p.smoothness and "smoothness" not in args.skip:
                sm_rows, fails = run_smoothness(p, ports, web)
                result["failures"] += fails
        finally:
            envoy.stop()
            result["envoy_log_tail"] = envoy.log()[-4000:]
    info["duration_s"] = round(time.monotonic() - t0, 1)
    info["loadavg_end"] = os.getloadavg()
    info["uptime_end"] = _uptime()
    result.update(cpu=cpu_rows, handoff=ho_rows, smoothness=sm_rows,
                  shapes=[vars(s) for s in p.shapes], listeners=[vars(x) for x in p.listeners])
    for name, columns, rows in (("cpu", CPU_COLUMNS, cpu_rows), ("handoff", HANDOFF_COLUMNS, ho_rows),
                                ("smoothness", SMOOTH_COLUMNS, sm_rows)):
        write_csv(out / f"{name}.csv", columns, rows)
    (out / "cpu.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "info.json").write_text(json.dumps(info, indent=1, default=str))
    summary = report.markdown(result, info, p)
    (out / "summary.md").write_text(summary)
    print()
    print(summary)
    nfail = len(result["failures"])
    log(f"perf.cpu: {len(cpu_rows)} CPU, {len(ho_rows)} hand-off, {len(sm_rows)} smoothness measurements "
        f"({nfail} failed) in {info['duration_s']} s -> {out}/ (summary.md, cpu.csv, handoff.csv, smoothness.csv)")
    return 1 if nfail else 0


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
