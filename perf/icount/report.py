"""summary.md of an instruction-count run (perf/icount/run.py): the tables, from one row
per process (processes.csv) and the calls out of the Wasm code by callee (callees.csv).
Pure: tested in perf/tests/test_icount.py.

  python -m perf.icount.report perf/reports/icount/<run-id>    # re-writes summary.md"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from harness import tables
from harness.tables import Table, num
from perf.icount.fit import rel_range_pct

NUMERIC = ("c", "r", "fit_rms_pct", "raw_per_req", "envoy_c", "tcmalloc_c", "libc_c", "jit_c", "other_c",
           "calls_out_c", "calls_out_ir_c", "host_calls_c", "host_calls_ir_c", "helper_calls_c", "into_jit_c",
           "idle_ir_per_s", "start_s", "wall_s", "round", "calls_per_req", "ir_per_call")


def _num(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as read from CSV: the numeric columns as numbers (None where empty)."""
    out = []
    for r in rows:
        x = dict(r)
        for k in NUMERIC:
            if k in x and isinstance(x[k], str):
                x[k] = float(x[k]) if x[k] != "" else None
        out.append(x)
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _of(rows: list[dict[str, Any]], variant: str, key: str) -> list[float]:
    return [r[key] for r in rows if r["variant"] == variant and r.get(key) is not None]


def _ir(v: float | None) -> str:
    return num(v, ",.0f", "-")


def variant_table(rows: list[dict[str, Any]], order: list[str]) -> Table:
    """Per variant (median over its processes): c with the spread of c between processes,
    r, raw Ir/request, the parts of c, and the calls out of the Wasm code."""
    head = ["variant", "Ir/request (c)", "spread", "r (Ir/s)", "raw Ir/request", "Envoy", "tcmalloc", "libc",
            "JIT", "host calls/request", "their Ir/request", "helper calls/request", "processes"]
    out = []
    for v in order:
        cs = _of(rows, v, "c")
        if not cs:
            continue
        out.append([v, f"**{_ir(_median(cs))}**", f"{num(rel_range_pct(cs), '.2f')}%", _ir(_median(_of(rows, v, "r"))),
                    _ir(_median(_of(rows, v, "raw_per_req"))),
                    *(_ir(_median(_of(rows, v, k))) for k in ("envoy_c", "tcmalloc_c", "libc_c", "jit_c")),
                    num(_median(_of(rows, v, "host_calls_c")), ".2f", "-"),
                    _ir(_median(_of(rows, v, "host_calls_ir_c"))),
                    num(_median(_of(rows, v, "helper_calls_c")), ".2f", "-"), str(len(cs))])
    return head, out


def pairs(rows: list[dict[str, Any]], order: list[str]) -> list[tuple[str, str, str]]:
    """The differences worth reading, as (label, a, b) for a − b: the floor and the native
    limiter against plain; each throttle variant against the no-op floor; keyed, path and
    cluster rules against the unkeyed rule of the same build; each rule's other builds
    against its first variant in the profile (after − before)."""
    meta = {r["variant"]: r for r in rows}
    present = [v for v in order if v in meta]
    plain = next((v for v in present if meta[v]["kind"] == "plain"), None)
    noop = next((v for v in present if meta[v]["kind"] == "noop"), None)
    out = []
    for v in present:
        if meta[v]["kind"] in ("noop", "local_ratelimit") and plain:
            out.append((f"{v} − {plain}", v, plain))
    throttles = [v for v in present if meta[v]["kind"] == "throttle"]
    if noop:
        out += [(f"{v} − {noop}", v, noop) for v in throttles]
    for v in throttles:
        if meta[v]["rule"] == "unkeyed":
            continue
        base = next((u for u in throttles if meta[u]["rule"] == "unkeyed" and meta[u]["build"] == meta[v]["build"]),
                    None)
        if base:
            out.append((f"{v} − {base}", v, base))
    for rule in dict.fromkeys(meta[v]["rule"] for v in throttles):
        first, *others = [v for v in throttles if meta[v]["rule"] == rule]
        out += [(f"{v} − {first}", v, first) for v in others if meta[v]["build"] != meta[first]["build"]]
    return out


def paired(rows: list[dict[str, Any]], a: str, b: str, key: str) -> list[float]:
    """a − b per round (the processes of one round ran close together)."""
    by = {(int(r["round"]), r["variant"]): r[key] for r in rows if r.get(key) is not None}
    return [by[(rd, a)] - by[(rd, b)] for rd in sorted({k[0] for k in by}) if (rd, a) in by and (rd, b) in by]


def diff_table(rows: list[dict[str, Any]], order: list[str]) -> Table:
    head = ["difference", "Ir/request (c)", "range over rounds", "spread", "host calls/request", "their Ir/request",
            "JIT Ir/request", "tcmalloc Ir/request", "rounds"]
    out = []
    for label, a, b in pairs(rows, order):
        d = paired(rows, a, b, "c")
        if not d:
            continue
        m = _median(d)
        assert m is not None
        spread = f"{100 * (max(d) - min(d)) / abs(m):.1f}%" if m else "-"
        out.append([label, f"**{m:+,.0f}**", f"{min(d):+,.0f} to {max(d):+,.0f}", spread,
                    num(_median(paired(rows, a, b, "host_calls_c")), "+.2f", "-"),
                    num(_median(paired(rows, a, b, "host_calls_ir_c")), "+,.0f", "-"),
                    num(_median(paired(rows, a, b, "jit_c")), "+,.0f", "-"),
                    num(_median(paired(rows, a, b, "tcmalloc_c")), "+,.0f", "-"), str(len(d))])
    return head, out


def callee_table(callees: list[dict[str, Any]], order: list[str], min_per_req: float = 0.05) -> Table:
    """Calls out of the Wasm code by callee (an address of Envoy's text: the binary is
    stripped), per variant: calls per request (fitted) and inclusive Ir per call."""
    head = ["variant", "callee", "calls/request", "Ir per call", "kind"]
    out = []
    for v in order:
        mine = [c for c in callees if c["variant"] == v]
        for callee in sorted({(c["callee_part"], c["callee"]) for c in mine}):
            cs = [c for c in mine if (c["callee_part"], c["callee"]) == callee]
            per = _median([c["calls_per_req"] for c in cs if c["calls_per_req"] is not None])
            cost = _median([c["ir_per_call"] for c in cs if c["ir_per_call"] is not None])
            if per is None or per < min_per_req:
                continue
            kind = "host call" if cost is not None and cost >= 300 else "V8 helper"
            out.append([v, f"{callee[0]} {callee[1]}", f"{per:.2f}", _ir(cost), kind])
    return head, out


def markdown(rows: list[dict[str, Any]], callees: list[dict[str, Any]], info: dict[str, Any], order: list[str],
             failures: list[dict[str, Any]]) -> str:
    rows, callees = _num(rows), _num(callees)
    phases = ", ".join(f"{p['requests']}" + (f" at {p['qps']:g}/s" if p.get("qps") else " as fast as possible")
                       for p in info.get("phases", []))
    parts = [f"# Instructions per request ({info.get('set', '').split(':')[-1]})", "",
             f"Run `{info.get('run_id')}` on {info.get('host')} ({info.get('cpus')} cores), Envoy {info.get('envoy')} "
             f"(build id `{str(info.get('envoy_build_id', '?'))[:12]}`), {info.get('valgrind')}, fortio "
             f"{info.get('fortio')}, git {info.get('git')}, {info.get('duration_s')} s, {info.get('jobs')} "
             f"processes at once; load average {_load(info.get('loadavg_start'))} at the start, "
             f"{_load(info.get('loadavg_end'))} at the end.", ""]
    for b, d in info.get("builds", {}).items():
        ref = f" (git {d['ref']})" if d.get("ref") else ""
        parts.append(f"- build **{b}**{ref}: `{d['path']}`, {d['bytes']} bytes, sha256 `{d['sha256'][:16]}`")
    parts += ["", "Each process: one Envoy (`--concurrency 1`) under callgrind, one keep-alive fortio connection, "
              f"{info.get('warmup_requests')} requests of warm-up, counters zeroed, then phases of {phases} "
              "requests, a dump after each. **c** = Ir per request from `Ir = requests × c + seconds × r` fitted "
              "over the phases (r: Envoy's work per second of traffic under valgrind, its timers and the filter's "
              "ticks); spread = (max − min) / median of c over the processes. Raw = median Ir/request of the "
              "fast phases. Envoy/tcmalloc/libc/JIT: the parts of c by address (JIT: the Wasm code V8 compiled). "
              "Host calls: calls out of the JIT code costing ≥ 300 Ir each (the proxy-wasm and WASI imports), "
              "their inclusive Ir; helper calls: V8's cheap helpers (memory.copy, memory.fill).", ""]
    if rows:
        parts += ["## Per variant", "", tables.markdown(*variant_table(rows, order)), ""]
        d = diff_table(rows, order)
        if d[1]:
            parts += ["## Differences (per round, median of the process pairs)", "", tables.markdown(*d), ""]
        checks = [f"- {r['variant']} {int(r['round'])}: {r['checked']}" for r in rows if r.get("checked")]
        if checks:
            parts += ["## Every measured request on the fast path (the filter's counters over the phases)", "",
                      *checks, ""]
        c = callee_table(callees, order)
        if c[1]:
            parts += ["## Calls out of the Wasm code, by callee", "", tables.markdown(*c), ""]
        starts = [r["start_s"] for r in rows if r.get("start_s") is not None]
        walls = [r["wall_s"] for r in rows if r.get("wall_s") is not None]
        if starts and walls:
            parts += [f"Start-up under valgrind {min(starts):.0f}–{max(starts):.0f} s; a whole process "
                      f"{min(walls):.0f}–{max(walls):.0f} s.", ""]
    if failures:
        parts += ["## Failures", "", *(f"- {x['variant']} {x['round']}: {x['error']}" for x in failures), ""]
    return "\n".join(parts)


def _load(v: Any) -> str:
    return "/".join(f"{x:.1f}" for x in v) if isinstance(v, list | tuple) else "?"


def render_run(run_dir: Path) -> Path:
    """Re-writes summary.md of a finished run (processes.csv, callees.csv, info.json, icount.json)."""
    rows = tables.read_csv(run_dir / "processes.csv")
    callees = tables.read_csv(run_dir / "callees.csv")
    info = json.loads((run_dir / "info.json").read_text())
    result = json.loads((run_dir / "icount.json").read_text())
    order = [v["name"] for v in result["variants"]]
    out = run_dir / "summary.md"
    out.write_text(markdown(rows, callees, info, order, result["failures"]))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m perf.icount.report perf/reports/icount/<run-id>", file=sys.stderr)
        sys.exit(2)
    print(render_run(Path(sys.argv[1])).read_text())
