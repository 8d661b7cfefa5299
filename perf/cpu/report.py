"""summary.md of a side-by-side run (perf/cpu/run.py): the tables, from the
rows of every round. Pure: tested in perf/tests/test_cpu.py.

  python -m perf.cpu.report perf/reports/cpu/<run-id>    # re-writes summary.md"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness import tables
from harness.tables import Table, num
from perf.cpu.config import SPEC, Profile, load_profile
from perf.cpu.stats import Spread, spread


def _f(v: float | None, spec: str = ".1f") -> str:
    return num(v, spec, "-")


def _median_of(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return spread(vals).median if vals else None


def paired(rows: list[dict], a: str, b: str, key: str = "envoy_us_per_req") -> Spread | None:
    """a − b in each round where both ran (the listeners of one round run back
    to back, so drifts of the machine mostly cancel); their spread."""
    by = {(r["round"], r["listener"]): r[key] for r in rows}
    diffs = [by[(rd, a)] - by[(rd, b)] for rd in sorted({r["round"] for r in rows})
             if (rd, a) in by and (rd, b) in by]
    return spread(diffs) if diffs else None


def _pm(s: Spread | None) -> str:
    return "-" if s is None else f"{s.median:+.1f} ({s.lo:+.1f} to {s.hi:+.1f})"


def cpu_table(rows: list[dict], shape: str, listeners: list[str]) -> Table:
    """Per listener: Envoy CPU µs per request (median, min-max, IQR), the
    worker threads' share, the difference to plain and to the no-op floor
    of the same runtime (median of the per-round differences, and their
    range), req/s, and what the client and nginx spent."""
    mine = [r for r in rows if r["shape"] == shape]
    floor = {r["runtime"]: r["listener"] for r in mine if r["kind"] == "noop"}
    plain = next((r["listener"] for r in mine if r["kind"] == "plain"), None)
    out = []
    for n in listeners:
        lr = [r for r in mine if r["listener"] == n]
        if not lr:
            continue
        s = spread([r["envoy_us_per_req"] for r in lr])
        f = floor.get(lr[0]["runtime"]) if lr[0]["kind"] == "throttle" else None
        out.append([n, f"**{s.median:.1f}**", f"{s.lo:.1f}–{s.hi:.1f}", f"{s.iqr_pct:.1f}%",
                    _f(_median_of(lr, "envoy_workers_us_per_req")),
                    _pm(paired(mine, n, plain)) if plain and n != plain else "-",
                    _pm(paired(mine, n, f)) if f else "-",
                    _f(_median_of(lr, "achieved_qps"), ".0f"), _f(_median_of(lr, "client_us_per_req")),
                    _f(_median_of(lr, "nginx_us_per_req")), str(s.n)])
    return (["listener", "Envoy µs/req (median)", "min–max", "IQR", "workers µs/req", "vs plain, per round",
             "vs no-op floor, per round", "req/s", "client µs/req", "nginx µs/req", "rounds"], out)


def builds_table(rows: list[dict], shapes: list[str]) -> Table:
    """Each pair of throttle listeners of the same runtime, per shape: the
    later minus the earlier in each round (median, range, and in how many
    rounds the later one cost less)."""
    out = []
    for sh in shapes:
        mine = [r for r in rows if r["shape"] == sh]
        thr = sorted({(r["runtime"], r["listener"]) for r in mine if r["kind"] == "throttle"})
        for i, (rt, a) in enumerate(thr):
            for rt2, b in thr[i + 1:]:
                if rt2 != rt:
                    continue
                # "throttle-after" minus "throttle-before": name order puts after first
                d = paired(mine, a, b)
                if d is None:
                    continue
                by = {(r["round"], r["listener"]): r["envoy_us_per_req"] for r in mine}
                fewer = sum(1 for rd in {r["round"] for r in mine}
                            if (rd, a) in by and (rd, b) in by and by[(rd, a)] < by[(rd, b)])
                out.append([sh, rt, f"{a} − {b}", f"**{d.median:+.1f}**", f"{d.lo:+.1f} to {d.hi:+.1f}",
                            f"{fewer} of {d.n}"])
    return (["shape", "runtime", "difference", "µs/req, median of rounds", "range", "rounds where the first costs less"],
            out)


def runtime_table(rows: list[dict], runtimes: dict, shape: str) -> Table:
    """Per Wasm runtime: the no-op floor and each throttle build (median µs
    per request), or Envoy's reason when the runtime is not there."""
    mine = [r for r in rows if r["shape"] == shape]
    out = []
    for rt, pr in runtimes.items():
        if not pr["loads"]:
            out.append([rt, "not in this Envoy", "-", "-", "-", f"`{pr['log']}`"])
            continue
        here = [r for r in mine if r["runtime"] == rt]
        floor = _median_of([r for r in here if r["kind"] == "noop"], "envoy_us_per_req")
        floor_name = next((r["listener"] for r in here if r["kind"] == "noop"), None)
        for n in sorted({r["listener"] for r in here if r["kind"] == "throttle"}):
            t = _median_of([r for r in here if r["listener"] == n], "envoy_us_per_req")
            out.append([rt, "loads", _f(floor), f"{n}: {_f(t)}",
                        _pm(paired(mine, n, floor_name)) if floor_name else "-", ""])
        if not any(r["kind"] == "throttle" for r in here):
            out.append([rt, "loads", _f(floor), "-", "-", ""])
    return (["runtime", "status", "no-op floor µs/req", "throttle µs/req", "throttle − floor, per round", "Envoy says"],
            out)


def variation_table(rows: list[dict], shapes: list[str]) -> Table:
    """How much rounds differ, per shape: the listeners' median relative
    spread, beside what the load generator and nginx spent on the same cores."""
    out = []
    for sh in shapes:
        mine = [r for r in rows if r["shape"] == sh]
        if not mine:
            continue
        per = {}
        for n in sorted({r["listener"] for r in mine}):
            per[n] = spread([r["envoy_us_per_req"] for r in mine if r["listener"] == n])
        iqr = spread([s.iqr_pct for s in per.values()]).median
        rng = spread([s.range_pct for s in per.values()]).median
        out.append([sh, f"{iqr:.1f}%", f"{rng:.1f}%", _f(_median_of(mine, "client_us_per_req")),
                    _f(_median_of(mine, "nginx_us_per_req")), _f(_median_of(mine, "loadavg_1m"), ".2f")])
    return (["shape", "IQR / median (median over listeners)", "(max−min) / median", "client µs/req",
             "nginx µs/req", "load avg (1 min) during"], out)


def handoff_table(rows: list[dict]) -> Table:
    """Per build and placement: achieved / ideal over rounds, and the gap from
    a freed slot to the release of the waiter that took it, for hand-offs
    to the other worker and within one worker (median over rounds of each
    round's p50 and p99)."""
    out = []
    keys = sorted({(r["build"], r["placement"]) for r in rows}, key=lambda k: (k[1], k[0]))
    for b, pl in keys:
        rr = [r for r in rows if r["build"] == b and r["placement"] == pl]
        pct = spread([r["achieved_pct"] for r in rr])

        def gap(prefix: str, rr: list = rr) -> str:
            p50, p99 = _median_of(rr, f"{prefix}gap_p50_ms"), _median_of(rr, f"{prefix}gap_p99_ms")
            return "-" if p50 is None else f"{p50:.2f} / {p99:.2f}"
        out.append([b, pl, _f(_median_of(rr, "service_ms"), ".2f"), _f(_median_of(rr, "envoy_upstream_ms"), ".2f"),
                    _f(_median_of(rr, "ideal_qps")), _f(_median_of(rr, "achieved_qps")),
                    f"**{pct.median:.1f}%** ({pct.lo:.1f}–{pct.hi:.1f})", "-" if (c := _median_of(rr, "cross_pct")) is None else f"{c:.0f}%",
                    gap("cross_"), gap("same_"), str(sum(r["errors"] for r in rr)), str(len(rr))])
    return (["build", "waiters", "upstream service ms (direct)", "upstream ms (seen by Envoy)", "ideal req/s",
             "achieved req/s", "achieved / ideal (min–max)", "hand-offs to the other worker",
             "freed → released ms, to the other worker (p50 / p99)", "within one worker (p50 / p99)", "errors",
             "rounds"], out)


def smooth_table(rows: list[dict]) -> Table:
    out = []
    for v in sorted({r["variant"] for r in rows}, key=lambda v: (v.startswith("nginx"), v)):
        rr = [r for r in rows if r["variant"] == v]
        s = spread([r["sd_qps"] for r in rr])
        off = [r.get("off_10pct") for r in rr]
        out.append([v, _f(_median_of(rr, "upstream_qps")), f"**{s.median:.2f}**",
                    ", ".join(f"{r['sd_qps']:.2f}" for r in rr), _f(min(r["min_window_qps"] for r in rr), ".0f"),
                    _f(max(r["max_window_qps"] for r in rr), ".0f"),
                    "-" if None in off else ", ".join(str(x) for x in off),
                    "-" if any(r.get("sd_1s_qps") is None for r in rr) else ", ".join(
                        f"{r['sd_1s_qps']:.2f}" for r in rr), str(rr[0]["windows"])])
    return (["variant", "upstream req/s", "sd of windows, req/s (median)", "each round", "lowest window",
             "highest window", "windows off by > 10%, each round", "sd of 1 s windows, each round",
             "windows per round"], out)


def markdown(result: dict, info: dict, p: Profile) -> str:
    rows = result["cpu"]
    listeners = [x.name for x in p.listeners if x.name not in result["left_out"]]
    parts = [f"# Side by side in one Envoy ({p.name}): CPU per request, runtimes, hand-off, smoothness", "",
             f"Run `{info['run_id']}` on {info.get('host')} ({info.get('cpus')} cores), Envoy {info.get('envoy')}, "
             f"nginx {info.get('nginx')}, fortio {info.get('fortio')}, `--concurrency {p.concurrency}`, "
             f"git {info.get('git')}, {info.get('duration_s')} s.", "",
             f"- load before: `{info.get('uptime_start')}`", f"- load after: `{info.get('uptime_end')}`"]
    for b, d in info.get("builds", {}).items():
        ref = f" (git {d['ref']})" if d.get("ref") else ""
        parts.append(f"- build **{b}**{ref}: `{d['path']}`, {d['bytes']} bytes, sha256 `{d['sha256'][:16]}`")
    parts.append("")
    if rows:
        parts += ["## Envoy CPU µs per request", "",
                  "User+system CPU of the whole Envoy process (every thread, from /proc) over a fixed number of "
                  "requests, divided by the requests; one listener per variant in one Envoy, interleaved rounds "
                  f"(round r runs every listener once, order rotated), {p.rounds} rounds. \"vs no-op floor\" is the "
                  "throttle's own work (minus the no-op Wasm module of the same runtime).", ""]
        for sh in p.shapes:
            desc = f"{sh.connections} connections keep-alive, " + (
                f"{sh.qps:g} req/s offered" if sh.qps else "as fast as possible (saturation)") + \
                f", {sh.requests} requests per measurement" + (
                ", Envoy pinned to core 0, fortio and nginx to core 1" if sh.pin else "")
            parts += [f"### {sh.name}: {desc}", "", tables.markdown(*cpu_table(rows, sh.name, listeners)), ""]
        parts += ["### Throttle builds, per round", "", tables.markdown(*builds_table(rows, [s.name for s in p.shapes])), "",
                  "### Wasm runtimes", "", tables.markdown(*runtime_table(rows, result["runtimes"], p.shapes[0].name)), "",
                  f"(shape {p.shapes[0].name})", "",
                  "### How much rounds vary, and the load generator", "",
                  tables.markdown(*variation_table(rows, [s.name for s in p.shapes])), ""]
        i0, i1 = result.get("idle_start"), result.get("idle_end")
        fixed = next((s.qps for s in p.shapes if s.qps), None)
        if i0 and i1:
            worst = max(i0["us_per_s"], i1["us_per_s"])
            per = f"; at {fixed:,.0f} req/s that is {worst / fixed:.2f} µs per request" if fixed else ""
            parts += [f"Idle Envoy (no traffic, every listener loaded): {i0['us_per_s']:.0f} µs/s at the start, "
                      f"{i1['us_per_s']:.0f} µs/s at the end (already inside every figure above{per}).", ""]
    if result["handoff"]:
        h = p.handoff
        assert h is not None
        parts += ["## Concurrency hand-off", "",
                  f"A gate of {h.slots} slots (`concurrency: {h.slots}`) before fortio's echo server with "
                  f"`delay={h.upstream_delay_s * 1000:g}ms`, {h.connections} closed-loop keep-alive connections, "
                  f"{h.requests} requests per run, {h.rounds} rounds. Ideal = {h.slots} / the upstream's service time "
                  f"measured directly ({h.slots} at once) in the same round; achieved = the rate of releases "
                  "upstream (Envoy's access log) after every connection's first request. *same*: every connection "
                  "on one worker; *cross*: blocks of slots alternating between the two workers (each freed slot "
                  "goes to the other worker: the \"hand-offs to the other worker\" column checks it).", "",
                  tables.markdown(*handoff_table(result["handoff"])), ""]
    if result["smoothness"]:
        s = p.smoothness
        assert s is not None
        parts += ["## Pacing smoothness", "",
                  f"{s.rate}/s, {s.connections} connections for {s.duration_s:g} s, rounds interleaved; standard "
                  f"deviation of the {s.window_s * 1000:g} ms windows of the upstream's own timestamps (nginx "
                  "`$msec`: whole milliseconds, which count every window exactly since windows start on a whole "
                  "millisecond).", "", tables.markdown(*smooth_table(result["smoothness"])), ""]
    if result["left_out"]:
        parts += [f"Left out (runtime not in this Envoy): {', '.join(result['left_out'])}.", ""]
    if result["failures"]:
        parts += ["## Failures", ""] + [f"- {f}" for f in
                                        ({k: v for k, v in x.items() if k != "trace"} for x in result["failures"])] + [""]
    return "\n".join(parts)


def render_run(run_dir: Path, spec: Path = SPEC) -> Path:
    """Re-writes summary.md of a finished run (its cpu.json and info.json)."""
    result = json.loads((run_dir / "cpu.json").read_text())
    info = json.loads((run_dir / "info.json").read_text())
    out = run_dir / "summary.md"
    out.write_text(markdown(result, info, load_profile(result["profile"], spec)))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m perf.cpu.report perf/reports/cpu/<run-id>", file=sys.stderr)
        sys.exit(2)
    print(render_run(Path(sys.argv[1])).read_text())
