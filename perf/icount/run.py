"""Instructions per request (perf/icount/profiles.yaml): each variant in an Envoy of its
own (`--concurrency 1`) under valgrind's callgrind, with one keep-alive fortio connection
outside valgrind and nginx as the upstream:

  1. start (ready when Envoy logs "starting main dispatch loop": polling the admin
     interface would add requests that depend on the start-up time), warm up;
  2. zero the counters (`callgrind_control -z`), then each phase of the profile with a
     dump after it (`callgrind_control -d`): as fast as one connection goes, and paced;
  3. an idle dump for the record, read the filter's counters (every request of a
     throttle variant admitted on its fast path; a cluster rule's on granted slots),
     stop (SIGTERM);
  4. per dump: Ir, the parts of the address space (Envoy, tcmalloc, libc, JIT), the calls
     out of the Wasm code V8 compiled; per process, Ir = requests x c + seconds x r
     fitted over the phases (perf/icount/fit.py).

Variants are interleaved: round r starts every variant once, in an order rotated by r;
`jobs` processes run at once (instruction counts do not depend on the machine's load;
only r and the wall time do).

  python -m perf.icount.run --profile full              # make perf-icount
  python -m perf.icount.run --profile quick             # make perf-icount-quick (CI)
  python -m perf.icount.run --profile full --wasm before=git:9cbb678 --only noop unkeyed-before unkeyed-after

Writes perf/reports/icount/<run-id>/: summary.md, processes.csv (one row per process,
the fitted figures), phases.csv (one row per dump), callees.csv (calls out of the Wasm
code by callee), icount.json, info.json, and per process its callgrind dumps, Envoy
config and log (processes/<variant>-<round>/).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import fortio, nginx, tools
from harness.engine import Engine
from harness.envoy import Envoy
from harness.net import free_port
from harness.procs import NOOP_WASM, envoy_elf
from harness.results import environment, first_line, run_dir
from harness.tables import write_csv
from perf.cpu import builds as refbuilds
from perf.cpu.config import Build, wasm_path
from perf.cpu.stats import rotated
from perf.icount import callgrind, report
from perf.icount.config import (
    REQUEST_HEADERS,
    REQUEST_PATH,
    SPEC,
    Phase,
    Profile,
    SpecError,
    Variant,
    envoy_config,
    load_profile,
    select,
)
from perf.icount.fit import FitError, fit

# --instr-atstart=no: start-up (V8 compiling the module: billions of instructions) runs
# uninstrumented, several times faster; instrumentation goes on before the warm-up.
VALGRIND = ["valgrind", "--tool=callgrind", "--smc-check=all-non-file", "--fair-sched=yes",
            "--compress-pos=no", "--instr-atstart=no"]
#: Calls out of the Wasm code costing less than this on average (inclusive Ir per call)
#: are V8's helpers (memory.copy and memory.fill: ~60 Ir); the host-call entry (every
#: proxy-wasm and WASI import) costs thousands.
HOST_CALL_MIN_IR = 300
#: The per-dump figures fitted per process (besides Ir itself).
METRICS = ("ir", "envoy", "tcmalloc", "libc", "jit", "other", "calls_out", "calls_out_ir",
           "host_calls", "host_calls_ir", "helper_calls", "into_jit")
PHASE_COLUMNS = ("variant", "kind", "build", "rule", "round", "phase", "requests", "qps", "seconds",
                 "fortio_s", "ir_per_req", *METRICS, "trigger")
PROCESS_COLUMNS = ("variant", "kind", "build", "rule", "round", "c", "r", "fit_rms_pct", "raw_per_req",
                   *(f"{m}_c" for m in METRICS[1:]), "idle_ir_per_s", "start_s", "wall_s",
                   "checked")
CALLEE_COLUMNS = ("variant", "round", "callee_part", "callee", "calls_per_req", "ir_per_call")


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


class Stop(Exception):
    pass


_RUNNING: set[Envoy] = set()
_LOCK = threading.Lock()
_STOPPING = threading.Event()


def _stop_on_sigterm(signum: int, frame: object) -> None:
    _STOPPING.set()
    with _LOCK:
        for e in list(_RUNNING):
            e.kill()
    raise SystemExit(f"perf.icount: signal {signum}: stopping (every Envoy, nginx and the engine on the way out)")


# -- builds --------------------------------------------------------------------------------

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


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- one process ---------------------------------------------------------------------------

def control(pid: int, *args: str) -> None:
    """`callgrind_control <args> <pid>` (through vgdb): zero (-z) or dump (-d NAME)."""
    r = subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"callgrind_control {' '.join(args)} {pid}: rc {r.returncode}: "
                           f"{(r.stdout + r.stderr).strip()[-500:]}")


def wait_log(envoy: Envoy, line: str, timeout_s: float) -> float:
    """Waits until Envoy's log has `line` (bounded); seconds waited."""
    t0 = time.monotonic()
    while line not in envoy.log():
        if envoy.proc is not None and envoy.proc.poll() is not None:
            raise RuntimeError(f"envoy exited with {envoy.proc.returncode}:\n{envoy.log()[-3000:]}")
        if time.monotonic() - t0 > timeout_s or _STOPPING.is_set():
            raise TimeoutError(f"envoy under valgrind not ready in {timeout_s:.0f} s:\n{envoy.log()[-2000:]}")
        time.sleep(0.5)
    return time.monotonic() - t0


def load(url: str, phase: Phase, all_ok: bool = True) -> fortio.Result:
    # Under valgrind Envoy answers 100-600 requests a second: a bound of 10 a second.
    timeout = phase.requests / phase.qps + 120 if phase.paced else phase.requests * 0.1 + 120
    res = fortio.Load(url, connections=1, qps=phase.qps, requests=phase.requests, allow_initial_errors=not all_ok,
                      headers=REQUEST_HEADERS, percentiles=(50, 99)).run(timeout_s=timeout)
    if all_ok and res.ok != phase.requests:
        raise RuntimeError(f"{url}: expected {phase.requests} answers 200, got {res.codes}")
    return res


def rule_counts(envoy: Envoy, rule: str, requests: int, timeout_s: float = 30) -> dict[str, int]:
    """The rule's counters once `requests` have arrived (the filter batches them per worker:
    it hands them over on its flush tick, slower under valgrind)."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = envoy.rule_stats(rule, settle=False)
        if s.get("requests", 0) >= requests or time.monotonic() > deadline:
            return s
        time.sleep(0.5)


SETTLE_BATCH = 200
SETTLE_TRIES = 10
PHASE_TRIES = 6


def settle_on_grid(envoy: Envoy, v: Variant, url: str, sent: int, before: dict[str, int]) -> tuple[int, dict[str, int]]:
    """A cluster rule is on its fast path once the engine grants this proxy its share of
    every epoch: until then (the first claims look back several epochs) some requests wait
    for grants. Batches of requests until one is all on granted slots, at once (bounded)."""
    for _ in range(SETTLE_TRIES):
        load(url, Phase(SETTLE_BATCH), all_ok=False)
        sent += SETTLE_BATCH
        after = rule_counts(envoy, v.name, sent)
        try:
            check_fast_path(v, before, after, SETTLE_BATCH)
            return sent, after
        except RuntimeError:
            before = after
    raise RuntimeError(f"{v.name}: not on the grid after {SETTLE_TRIES} batches of {SETTLE_BATCH} requests "
                       f"(the engine's answers late under valgrind?): {before}")


def check_fast_path(v: Variant, before: dict[str, int], after: dict[str, int], measured: int) -> str:
    """Every measured request of a throttle variant was admitted at once (a cluster rule's on
    a granted slot, with no engine failure or fallback): else the run measured something
    else, and says so."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
    want = {"requests": measured, "admitted": measured, "queued": 0, "rejected": 0}
    if v.rule == "cluster":
        want.update(slots_taken=measured, engine_failures=0)
    bad = {k: (d.get(k, 0), n) for k, n in want.items() if d.get(k, 0) != n}
    if v.rule == "cluster" and after.get("fallback_ms", 0) != before.get("fallback_ms", 0):
        bad["fallback_ms"] = (after.get("fallback_ms", 0) - before.get("fallback_ms", 0), 0)
    if bad:
        raise RuntimeError(f"{v.name}: not the fast path: " + ", ".join(f"{k} {got} (expected {n})"
                                                                          for k, (got, n) in sorted(bad.items())))
    return "fast path: " + ", ".join(f"{k} +{d.get(k, 0)}" for k in sorted(want))  # for the log


def dump_figures(d: callgrind.Dump) -> dict[str, Any]:
    host = [c for c in d.out_of_jit.values() if c.count and c.inclusive / c.count >= HOST_CALL_MIN_IR]
    helpers = [c for c in d.out_of_jit.values() if c.count and c.inclusive / c.count < HOST_CALL_MIN_IR]
    out = d.calls_out
    return {"ir": d.summary, **d.self_ir, "calls_out": out.count, "calls_out_ir": out.inclusive,
            "host_calls": sum(c.count for c in host), "host_calls_ir": sum(c.inclusive for c in host),
            "helper_calls": sum(c.count for c in helpers), "into_jit": d.into_jit.count, "trigger": d.trigger}


def measure(v: Variant, rnd: int, p: Profile, wasm: dict[str, Path], base: Path, upstream_port: int,
            engine_port: int | None, elf: str) -> dict[str, Any]:
    """One Envoy under callgrind for variant `v`: every phase, its dumps read."""
    d = base / "processes" / f"{v.name}-{rnd + 1}"
    d.mkdir(parents=True, exist_ok=True)
    module = None if v.wasm is None else NOOP_WASM if v.wasm == "noop" else wasm[v.wasm]
    out_file = d / "callgrind.out"
    t_start = time.monotonic()
    phases: list[dict[str, Any]] = []
    for attempt in range(3):  # a free port may be taken by another process before Envoy binds it
        port = free_port()
        cfg = envoy_config(v, wasm=module, port=port, admin_port=free_port(), upstream_port=upstream_port,
                           engine_port=engine_port)
        envoy = Envoy(cfg, concurrency=1, log_level="info", workdir=d, binary=elf,
                      prefix=[*VALGRIND, f"--callgrind-out-file={out_file}"])
        with _LOCK:
            _RUNNING.add(envoy)
        envoy.launch()
        try:
            start_s = wait_log(envoy, "starting main dispatch loop", p.start_timeout_s)
            break
        except BaseException as e:
            with _LOCK:
                _RUNNING.discard(envoy)
            envoy.stop()
            if not isinstance(e, RuntimeError) or "Address already in use" not in envoy.log() or attempt == 2:
                raise
            for f in d.glob("callgrind.out*"):
                f.unlink()
    url = f"http://127.0.0.1:{port}{REQUEST_PATH}"
    try:
        pid = envoy.pid
        layout = callgrind.layout_of(Path(elf), callgrind.load_base(Path(f"/proc/{pid}/maps").read_text(),
                                                                    Path(elf).resolve()))
        control(pid, "-i", "on")
        # A cluster rule's first requests wait for the engine's first answer, and under
        # valgrind some wait past max_queue_delay: the warm-up may see 429s; the phases may not.
        load(url, Phase(p.warmup_requests), all_ok=not v.needs_engine)
        sent = p.warmup_requests
        before = rule_counts(envoy, v.name, sent) if v.rule else {}
        if v.needs_engine:
            sent, before = settle_on_grid(envoy, v, url, sent, before)
        dumps = 0        # callgrind numbers its dumps callgrind.out.1, .2, ...
        retried = 0
        for i, ph in enumerate(p.phases):
            for attempt in range(PHASE_TRIES if v.needs_engine else 1):
                # Zeroed right before the load, so that nothing between phases (reading the
                # filter's counters: admin requests) is counted.
                control(pid, "-z")
                t0 = time.monotonic()
                res = load(url, ph)
                control(pid, "-d", f"phase{i + 1}")
                seconds = time.monotonic() - t0
                dumps += 1
                if v.rule:
                    sent += ph.requests
                    after = rule_counts(envoy, v.name, sent)
                    try:
                        check_fast_path(v, before, after, ph.requests)
                    except RuntimeError:
                        # A cluster rule's claim for an epoch may come late under valgrind:
                        # its requests waited for grants. That phase is measured again.
                        if attempt == PHASE_TRIES - 1 or not v.needs_engine:
                            raise
                        retried += 1
                        before = after
                        continue
                    before = after
                phases.append({"phase": i + 1, "requests": ph.requests, "qps": ph.qps, "seconds": seconds,
                               "fortio_s": res.duration_s, "dump": dumps})
                break
        idle = None
        if p.idle_s > 0:
            control(pid, "-z")
            t0 = time.monotonic()
            time.sleep(p.idle_s)  # the idle measurement itself
            control(pid, "-d", "idle")
            dumps += 1
            idle = {"seconds": time.monotonic() - t0, "dump": float(dumps)}
        measured = sum(ph.requests for ph in p.phases)
        checked = ""
        if v.rule:
            checked = (f"every phase on the fast path ({measured} requests admitted at once"
                       + (", on granted slots" if v.needs_engine else "")
                       + (f"; {retried} phase(s) measured again after requests waited for grants" if retried else "")
                       + ")")
    finally:
        envoy.stop(timeout=180)  # SIGTERM: Envoy exits, callgrind writes its last file
        with _LOCK:
            _RUNNING.discard(envoy)
    files = {int(f.suffix[1:]): f for f in d.glob("callgrind.out.*")}
    if sorted(files) != list(range(1, dumps + 1)):
        raise RuntimeError(f"{d}: expected dumps 1 to {dumps}, found {sorted(files)}")
    for rec in phases:
        dump = callgrind.read(files[rec["dump"]], layout)
        rec.update(dump_figures(dump))
        rec["ir_per_req"] = dump.summary / rec["requests"]
        rec["callees"] = {f"{part}:{fn}": [c.count, c.inclusive] for (part, fn), c in dump.out_of_jit.items()}
    if idle is not None:
        idle["ir"] = callgrind.read(files[int(idle["dump"])], layout).summary
        idle["ir_per_s"] = idle["ir"] / idle["seconds"]
    return {"variant": v.name, "kind": v.kind, "build": v.wasm if v.kind == "throttle" else "",
            "rule": v.rule or "", "round": rnd + 1, "phases": phases, "idle": idle, "start_s": start_s,
            "wall_s": time.monotonic() - t_start, "checked": checked,
            "layout": {"tcmalloc": [[hex(a), hex(b)] for a, b in layout.tcmalloc]}}


def summarise(proc: dict[str, Any]) -> dict[str, Any]:
    """A process's fitted figures: c and r of Ir, c of every other figure."""
    phases = proc["phases"]
    n = [ph["requests"] for ph in phases]
    t = [ph["seconds"] for ph in phases]
    f = fit(n, t, [ph["ir"] for ph in phases])
    row = {k: proc[k] for k in ("variant", "kind", "build", "rule", "round", "start_s", "wall_s", "checked")}
    fast = sorted(ph["ir_per_req"] for ph in phases if not ph["qps"])
    row.update(c=f.per_request, r=f.per_second, fit_rms_pct=f.rms_pct, raw_per_req=fast[len(fast) // 2] if fast else None,
               idle_ir_per_s=proc["idle"]["ir_per_s"] if proc["idle"] else None)
    for m in METRICS[1:]:
        row[f"{m}_c"] = fit(n, t, [ph[m] for ph in phases]).per_request
    callees: dict[str, list[float]] = {}
    for ph in phases:
        for k in ph["callees"]:
            callees.setdefault(k, [])
    proc["callees"] = []
    for k in sorted(callees):
        counts = [ph["callees"].get(k, [0, 0])[0] for ph in phases]
        inc = [ph["callees"].get(k, [0, 0])[1] for ph in phases]
        per_req = fit(n, t, counts).per_request
        part, _, fn = k.partition(":")
        proc["callees"].append({"variant": proc["variant"], "round": proc["round"], "callee_part": part,
                                "callee": fn, "calls_per_req": per_req,
                                "ir_per_call": sum(inc) / sum(counts) if sum(counts) else None})
    return row


# -- the run ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="quick", help="profile of perf/icount/profiles.yaml (default quick)")
    ap.add_argument("--wasm", action="append", default=[], metavar="NAME=PATH|NAME=git:REF",
                    help="use this .wasm (or the build of this git ref) for build NAME, e.g. before=git:main")
    ap.add_argument("--only", nargs="*", default=[], metavar="VARIANT", help="run only these variants")
    ap.add_argument("--processes", type=int, help="Envoy processes per variant (default: the profile's)")
    ap.add_argument("--jobs", type=int, help="processes under valgrind at once (default: the profile's)")
    ap.add_argument("--out", type=Path, help="results directory (default perf/reports/icount/<run-id>)")
    ap.add_argument("--spec", type=Path, default=SPEC, help="profiles file (default perf/icount/profiles.yaml)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    # valgrind is CPU-heavy and the machine is shared: everything this run starts runs niced.
    os.nice(max(0, 10 - os.nice(0)))
    try:
        from perf.cpu.config import parse_wasm_overrides

        p = load_profile(args.profile, args.spec)
        select(p, args.only)
        if args.processes is not None:
            p.processes = max(1, args.processes)
        if args.jobs is not None:
            p.jobs = max(1, args.jobs)
        wasm = resolve_builds(p, parse_wasm_overrides(args.wasm))
        for tool in ("valgrind", "callgrind_control"):
            tools.path(tool)  # installed by `make tool-valgrind`, else FileNotFoundError
        elf = envoy_elf()
    except (SpecError, ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"perf.icount: {e}", file=sys.stderr)
        return 2
    run_id, out = run_dir("icount", p.name, args.out)
    info = environment(run_id, set=f"icount:{p.name}", valgrind=first_line(["valgrind", "--version"]),
                       envoy_elf=elf, envoy_build_id=callgrind.build_id(Path(elf)), nginx=nginx.version(),
                       processes=p.processes, jobs=p.jobs, loadavg=os.getloadavg(),
                       phases=[vars(ph) for ph in p.phases], warmup_requests=p.warmup_requests,
                       builds={b: {"path": str(path), "bytes": path.stat().st_size, "sha256": sha256(path),
                                   "ref": p.builds[b].ref} for b, path in wasm.items()},
                       noop={"path": str(NOOP_WASM), "sha256": sha256(NOOP_WASM) if NOOP_WASM.exists() else None})
    log(f"perf.icount {p.name}: {len(p.variants)} variants x {p.processes} processes, {p.jobs} at once -> {out}")
    for b, dd in info["builds"].items():
        log(f"  build {b}: {dd['path']} ({dd['bytes']} bytes, sha256 {dd['sha256'][:12]})")
    t0 = time.monotonic()
    procs: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    schedule = [(r, v) for r in range(p.processes) for v in rotated(p.variants, r)]
    engine = Engine() if any(v.needs_engine for v in p.variants) else None
    try:
        if engine is not None:
            engine.start()
        with nginx.Nginx(workers=1) as web:
            def job(item: tuple[int, Variant]) -> None:
                r, v = item
                if _STOPPING.is_set():
                    return
                log(f"[{v.name} {r + 1}/{p.processes}] starting under callgrind")
                try:
                    proc = measure(v, r, p, wasm, out, web.upstream_port, engine.port if engine else None, elf)
                    row = summarise(proc)
                except (Exception, FitError) as e:  # one failure must not lose the run
                    failures.append({"variant": v.name, "round": r + 1, "error": f"{type(e).__name__}: {e}",
                                     "trace": traceback.format_exc()})
                    log(f"[{v.name} {r + 1}/{p.processes}] FAILED {e}")
                    return
                proc["summary"] = row
                procs.append(proc)
                log(f"[{v.name} {r + 1}/{p.processes}] c {row['c']:,.0f} Ir/req (r {row['r']:,.0f} Ir/s, "
                    f"raw {row['raw_per_req']:,.0f}), host calls {row['host_calls_c']:.2f}/req "
                    f"({row['host_calls_ir_c']:,.0f} Ir), start {row['start_s']:.0f} s, "
                    f"all {row['wall_s']:.0f} s{', ' + row['checked'] if row['checked'] else ''}")

            with ThreadPoolExecutor(max_workers=p.jobs) as pool:
                list(pool.map(job, schedule))
    finally:
        if engine is not None:
            engine.close()
    info["duration_s"] = round(time.monotonic() - t0, 1)
    info["loadavg_end"] = os.getloadavg()
    procs.sort(key=lambda x: (x["round"], [v.name for v in p.variants].index(x["variant"])))
    rows = [x["summary"] for x in procs]
    phase_rows = [{**{k: x[k] for k in ("variant", "kind", "build", "rule", "round")}, **ph}
                  for x in procs for ph in x["phases"]]
    callee_rows = [c for x in procs for c in x["callees"]]
    write_csv(out / "processes.csv", PROCESS_COLUMNS, rows)
    write_csv(out / "phases.csv", PHASE_COLUMNS, phase_rows)
    write_csv(out / "callees.csv", CALLEE_COLUMNS, callee_rows)
    result = {"profile": p.name, "variants": [vars(v) for v in p.variants], "processes": procs,
              "failures": failures}
    (out / "icount.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "info.json").write_text(json.dumps(info, indent=1, default=str))
    summary = report.markdown(rows, callee_rows, info, [v.name for v in p.variants], failures)
    (out / "summary.md").write_text(summary)
    print()
    print(summary)
    log(f"perf.icount: {len(procs)} processes ({len(failures)} failed) in {info['duration_s']} s -> {out}/")
    return 1 if failures or not procs else 0


if __name__ == "__main__":
    sys.exit(main())
