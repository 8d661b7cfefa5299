"""Benchmark report: a Markdown summary (tables like the classic demo's, with
ratios to baseline rows) and a self-contained HTML page with matplotlib charts.

Reusable: `render(csv_rows, timeseries, out_dir, meta=..., memory=..., info=...)`
takes rows in the fixed CSV schema (perf/bench/run.py CSV_COLUMNS; values may be
strings as read by csv.DictReader), and per-label upstream rate series
({"window_s": 0.1, "rates": [...], "setting_qps": 500 | None}). Everything
else is optional. Re-render a finished run with:

  python -m perf.bench.report perf/reports/bench/<run-id>
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from harness.tables import Table, html_page, markdown, num, numbers, png, read_csv
from perf.cluster.bench import cluster_table
from perf.cluster.holds import holds_table

ACCURACY_TARGET_PCT = 0.5
PASS_THROUGH_TARGET = 0.95


# ---------------------------------------------------------------- data helpers

def pacing(ts: dict | None) -> dict | None:
    """Worst 100 ms windows of the rate the upstream saw, against the setting."""
    if not ts or not ts.get("rates"):
        return None
    rates = ts["rates"]
    setting = ts.get("setting_qps")
    out = {"windows": len(rates), "max": max(rates), "min": min(rates), "window_s": ts.get("window_s", 0.1),
           "upstream_qps": ts.get("upstream_qps"), "sd": statistics.pstdev(rates)}
    if setting:
        out["max_pct"] = 100 * (out["max"] / setting - 1)
        out["min_pct"] = 100 * (out["min"] / setting - 1)
        worst = max(rates, key=lambda r: abs(r - setting))
        out["worst"] = worst
        out["worst_pct"] = 100 * (worst / setting - 1)
    return out


def _pct(v: float | None) -> str:
    return num(v, "+.2f") + ("%" if v is not None else "")


# ---------------------------------------------------------------- tables

def tables(rows: list[dict], timeseries: dict, meta: dict, memory: dict) -> list[tuple[str, str, Table]]:
    """(title, note, table) triples, shared by the Markdown and the HTML."""
    by_label = {r["label"]: r for r in rows}
    out = []
    through = [r for r in rows if not (meta.get(r["label"], {}).get("setting_qps"))]
    limited = [r for r in rows if meta.get(r["label"], {}).get("setting_qps")]
    if through:
        head = ["scenario", "tool", "conns", "req/s", "vs baseline", "failures", "p50 ms", "p90 ms", "p99 ms",
                "p99.9 ms", "proxy CPU s", "proxy CPU µs/req", "proxy RSS MB"]
        with_rounds = any(meta.get(r["label"], {}).get("rounds_qps") for r in through)
        if with_rounds:
            head.insert(4, "rounds req/s")
        body = []
        for r in through:
            base_label = meta.get(r["label"], {}).get("baseline")
            base = by_label.get(base_label) if base_label else None
            ratio = ""
            if base and base.get("achieved_qps"):
                ratio = f"{r['achieved_qps'] / base['achieved_qps']:.3f} of {base_label}"
            body.append([r["label"], r["tool"], num(r["conns"], ".0f"), num(r["achieved_qps"]), ratio,
                         num(r["errors"], ".0f"), num(r["p50"], ".2f"), num(r["p90"], ".2f"),
                         num(r["p99"], ".2f"), num(r["p99.9"], ".2f"), num(r["proxy_cpu_s"], ".2f"),
                         num(_cpu_per_request(r, meta)), num(r["proxy_rss_mb"])])
            if with_rounds:
                rq = meta.get(r["label"], {}).get("rounds_qps") or []
                body[-1].insert(4, " / ".join(f"{q:.0f}" for q in rq))
        note = ("req/s = 2xx responses per second seen by the client; vs baseline = ratio of req/s to the "
                "named row of the same run; proxy CPU µs/req = the proxy's CPU time in the run / requests "
                "(less sensitive than req/s to other load on the machine).")
        if with_rounds:
            note += (" Where rounds are listed, the scenarios of a group ran interleaved, round after round; "
                     "the row shows the round with the median req/s.")
        out.append(("Throughput ladder (no limit reached)", note, (head, body)))
    if limited:
        head = ["scenario", "tool", "setting /s", "client req/s", "vs setting", "upstream req/s", "vs setting",
                "worst 100 ms window /s", "vs setting", "window sd /s", "failures", "limiter counts",
                "p50 ms", "p90 ms", "p99 ms"]
        body = []
        for r in limited:
            setting = meta[r["label"]]["setting_qps"]
            p = pacing(timeseries.get(r["label"])) or {}
            up = p.get("upstream_qps")
            body.append([r["label"], r["tool"], num(setting, "g"), num(r["achieved_qps"], ".2f"),
                         _pct(100 * (r["achieved_qps"] / setting - 1)), num(up, ".2f"),
                         _pct(None if up is None else 100 * (up / setting - 1)), num(p.get("worst")),
                         _pct(p.get("worst_pct")), num(p.get("sd")), num(r["errors"], ".0f"),
                         _limiter(meta[r["label"]].get("limiter")), num(r["p50"], ".1f"),
                         num(r["p90"], ".1f"), num(r["p99"], ".1f")])
        out.append(("Rate limited: accuracy and pacing",
                    "client req/s = 2xx per second over the client's run; upstream req/s = (n-1)/(last-first) "
                    "from the upstream's access-log timestamps (ms); worst window = the 100 ms window furthest "
                    "from the setting (1 request = 10 req/s in a 100 ms window); window sd = standard deviation of "
                    "the windows. failures = non-2xx "
                    "(local_ratelimit rejects with 429). limiter counts: the throttle's admitted at once / "
                    "queued / rejected, or local_ratelimit's ok / rate_limited, in the measured run.",
                    (head, body)))
    targets = target_rows(by_label, meta)
    if targets:
        out.append(("Targets (reported, not asserted)", "", (["target", "measured", "met"], targets)))
    if memory:
        head = ["scenario", "idle RSS MB", "points (held: RSS MB)", "MB per 1,000 (between steps)",
                "MB per 1,000 (from idle)", "after close MB"]
        body = []
        for label, m in memory.items():
            if "points" not in m:
                continue
            pts = ", ".join(f"{p['held']}: {p['rss_mb']:.1f}" for p in m["points"][1:])
            body.append([label, num(m["idle_rss_mb"]), pts, num(m.get("mb_per_1000"), ".2f"),
                         num(m.get("mb_per_1000_from_idle"), ".2f"), num(m.get("after_close_rss_mb"))])
        out.append(("Envoy memory (VmRSS)", "held requests each on its own connection; memory-conns-* holds "
                    "idle connections without the filter, for the connection cost alone.", (head, body)))
    return out


def _limiter(stats: dict | None) -> str:
    if not stats:
        return ""
    if "queued" in stats:
        return f"{stats.get('admitted', 0)} / {stats.get('queued', 0)} / {stats.get('rejected', 0)}"
    if "rate_limited" in stats:
        return f"{stats.get('ok', 0)} / {stats.get('rate_limited', 0)}"
    return ""


def _cpu_per_request(r: dict, meta: dict) -> float | None:
    n = meta.get(r["label"], {}).get("requests")
    if not n or r.get("proxy_cpu_s") is None:
        return None
    return r["proxy_cpu_s"] / n * 1e6


def target_rows(by_label: dict, meta: dict | None = None) -> list[list[str]]:
    """The benchmark's targets (accuracy, pass-through, no failures), for the labels of the standard set present."""
    out = []
    for rate in (500, 200):
        for tool in ("ab", "fortio"):
            r = by_label.get(f"throttle-{rate}-c2-{tool}")
            if r:
                err = 100 * (r["achieved_qps"] / rate - 1)
                out.append([f"accuracy within {ACCURACY_TARGET_PCT}% at {rate}/s, --concurrency 2 ({tool})",
                            f"{r['achieved_qps']:.2f} req/s ({err:+.2f}%)",
                            "yes" if abs(err) <= ACCURACY_TARGET_PCT else "no"])
    for c in (1, 2):
        for tool in ("ab", "fortio"):
            t, h, lrl, noop = (by_label.get(f"{x}-c{c}-{tool}") for x in ("throttle-off", "http", "lrl-off", "noop-wasm"))
            if t and h and h["achieved_qps"]:
                ratio = t["achieved_qps"] / h["achieved_qps"]
                out.append([f"pass-through >= {PASS_THROUGH_TARGET:.0%} of Envoy without filter (c{c}, {tool})",
                            f"{ratio:.3f}", "yes" if ratio >= PASS_THROUGH_TARGET else "no"])
            if t and lrl and lrl["achieved_qps"]:
                ratio = t["achieved_qps"] / lrl["achieved_qps"]
                out.append([f"pass-through >= local_ratelimit (c{c}, {tool})", f"{ratio:.3f}",
                            "yes" if ratio >= 1 else "no"])
            cpu = {k: v for k, r in (("t", t), ("h", h), ("l", lrl), ("n", noop))
                   if r and (v := _cpu_per_request(r, meta or {})) is not None}
            if cpu.get("t") and cpu.get("h") and cpu.get("l"):
                floor = f" / {cpu['n']:.1f}" if cpu.get("n") else ""
                out.append([f"(info) proxy CPU per request: throttle / no filter / local_ratelimit"
                            f"{' / no-op Wasm filter' if floor else ''} (c{c}, {tool})",
                            f"{cpu['t']:.1f} / {cpu['h']:.1f} / {cpu['l']:.1f}{floor} µs", ""])
            if cpu.get("t") and cpu.get("h"):
                ratio = cpu["h"] / cpu["t"]
                out.append([f"pass-through by proxy CPU: no filter / throttle >= {PASS_THROUGH_TARGET:.0%} (c{c}, {tool})",
                            f"{ratio:.3f}" + (f" (no-op Wasm filter: {cpu['h'] / cpu['n']:.3f})" if cpu.get("n") else ""),
                            "yes" if ratio >= PASS_THROUGH_TARGET else "no"])
    queued = [r for label, r in by_label.items() if label.startswith(("throttle-500", "throttle-200", "nginx-"))]
    if queued:
        fails = int(sum(r["errors"] or 0 for r in queued))
        out.append([f"zero failures in every queued run ({len(queued)} runs)", f"{fails} failures",
                    "yes" if fails == 0 else "no"])
    return out


def summary_md(title: str, tabs: list[tuple[str, str, Table]], info: dict) -> str:
    """summary.md: the run's description, then each table with its note."""
    lines = [f"# {title}", ""] + ([_info_line(info), ""] if info else [])
    for name, note, (head, body) in tabs:
        lines += [f"## {name}", ""] + ([note, ""] if note else []) + [markdown(head, body), ""]
    return "\n".join(lines)


def _info_line(info: dict) -> str:
    keys = ("run_id", "host", "cpus", "envoy", "nginx", "ab", "fortio", "git", "duration_s",
            "loadavg_start", "loadavg_end")
    parts = []
    for k in keys:
        if k in info:
            v = info[k]
            if isinstance(v, (list, tuple)):
                v = "/".join(f"{x:.2f}" for x in v)
            parts.append(f"{k} {v}")
    if info.get("failed"):
        parts.append(f"FAILED scenarios: {', '.join(info['failed'])}")
    return "Run: " + "; ".join(parts) + "."


# ---------------------------------------------------------------- charts

def chart_rates(timeseries: dict, labels: list[str], title: str) -> bytes | None:
    """Rate the upstream saw per window over time, one panel per scenario,
    with the configured rate as a dashed line."""
    labels = [lb for lb in labels if timeseries.get(lb, {}).get("rates")]
    if not labels:
        return None
    cols = 2 if len(labels) > 1 else 1
    rows_n = (len(labels) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(6.5 * cols, 2.3 * rows_n), squeeze=False)
    for ax, label in zip(axes.flat, labels, strict=False):  # the grid may have spare cells
        ts = timeseries[label]
        w = ts.get("window_s", 0.1)
        rates = ts["rates"]
        ax.plot([i * w for i in range(len(rates))], rates, lw=0.9, color="tab:blue", label="upstream, per window")
        setting = ts.get("setting_qps")
        if setting:
            ax.axhline(setting, color="tab:red", ls="--", lw=1, label=f"setting {setting:g}/s")
            ax.set_ylim(0, max(max(rates), setting) * 1.25)
        else:
            ax.set_ylim(0, max(rates) * 1.15)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("s", fontsize=8)
        ax.set_ylabel(f"req/s ({w * 1000:.0f} ms)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return png(fig)


def chart_latency(rows: list[dict]) -> bytes | None:
    """Latency percentiles per scenario (log scale)."""
    rows = [r for r in rows if r.get("p50") is not None]
    if not rows:
        return None
    pcts = ("p50", "p90", "p99", "p99.9")
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) * 1.6 + 1.2))
    h = 0.8 / len(pcts)
    for i, p in enumerate(pcts):
        ys = [k + i * h for k in range(len(rows))]
        # ab measures whole milliseconds: a 0 ms value is drawn at 0.1 ms
        vals = [max(r[p] or 0, 0.1) for r in rows]
        ax.barh(ys, vals, height=h, label=p)
    ax.set_yticks([k + 0.4 - h / 2 for k in range(len(rows))])
    ax.set_yticklabels([r["label"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("latency, ms (log scale)")
    ax.grid(axis="x", alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Latency percentiles per scenario (client side)")
    fig.tight_layout()
    return png(fig)


def chart_throughput(rows: list[dict], meta: dict) -> bytes | None:
    """2xx req/s per scenario, configured rate marked where there is one."""
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.2))
    ys = range(len(rows))
    colors = ["tab:orange" if meta.get(r["label"], {}).get("setting_qps") else "tab:blue" for r in rows]
    ax.barh(list(ys), [r["achieved_qps"] or 0 for r in rows], color=colors)
    for y, r in zip(ys, rows, strict=True):
        s = meta.get(r["label"], {}).get("setting_qps")
        if s:
            ax.plot([s, s], [y - 0.4, y + 0.4], color="tab:red", lw=2)
        ax.text((r["achieved_qps"] or 0), y, f" {r['achieved_qps']:.0f}", va="center", fontsize=7)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r["label"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("2xx responses per second (log scale); red tick = configured rate")
    ax.grid(axis="x", alpha=0.3, which="both")
    ax.set_title("Throughput per scenario")
    fig.tight_layout()
    return png(fig)


def chart_memory(memory: dict) -> bytes | None:
    series = {k: m for k, m in memory.items() if m.get("points")}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for label, m in series.items():
        pts = m["points"]
        ax.plot([p["held"] for p in pts], [p["rss_mb"] for p in pts], marker="o", label=label)
    ax.set_xlabel("held requests (memory-conns-*: open idle connections)")
    ax.set_ylabel("Envoy VmRSS, MB")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Envoy memory")
    fig.tight_layout()
    return png(fig)


def render(csv_rows: list[dict], timeseries: dict, out_dir: Path, *, meta: dict | None = None,
           memory: dict | None = None, info: dict | None = None,
           title: str = "Throttle benchmarks", cluster: dict | None = None) -> dict[str, Path]:
    """Writes summary.md and report.html into out_dir; returns their paths.
    meta[label] may give "baseline" (label of the row to compare with) and
    "setting_qps" (the limiter's rate; rows without one are pass-through).
    cluster = {"rows": [...], "timeseries": {...}, "cases": [...]} of `kind: cluster`
    scenarios (perf/cluster/bench.py, perf/cluster/holds.py) adds their tables and charts."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = numbers(csv_rows, text=("label", "tool"))
    meta = dict(meta or {})
    for label, ts in timeseries.items():  # a series may carry its own setting
        if ts.get("setting_qps") and not meta.get(label, {}).get("setting_qps"):
            meta.setdefault(label, {})["setting_qps"] = ts["setting_qps"]
    memory = memory or {}
    info = info or {}
    tabs = tables(rows, timeseries, meta, memory)
    crow = numbers((cluster or {}).get("rows", []), text=("label", "variant", "calls_per_proxy_s", "shares"))
    if crow:
        tabs.append(cluster_table(crow))
    if (cluster or {}).get("cases"):
        tabs.append(holds_table((cluster or {})["cases"]))
    summary = out_dir / "summary.md"
    summary.write_text(summary_md(title, tabs, info))
    labels = [r["label"] for r in rows]
    paced = [lb for lb in labels if meta.get(lb, {}).get("setting_qps")]
    through = [lb for lb in labels if lb not in paced]
    charts = [
        ("Rate seen by the upstream, limited scenarios", chart_rates(timeseries, paced, "Rate limited: upstream rate per 100 ms vs setting")),
        ("Throughput", chart_throughput(rows, meta)),
        ("Latency percentiles", chart_latency(rows)),
        ("Rate seen by the upstream, pass-through scenarios", chart_rates(timeseries, through, "Pass-through: upstream rate per 100 ms")),
        ("Memory", chart_memory(memory)),
    ]
    if crow:
        cts = (cluster or {}).get("timeseries", {})
        charts[1:1] = [
            ("Three proxies, one rate: rate seen by the upstream",
             chart_rates(cts, [r["label"] for r in crow], "Three proxies, one rate: upstream rate per 100 ms vs rate")),
            ("Three proxies, one rate: latency", chart_latency(crow)),
        ]
    drawn = {f"chart{i}.png": (n, c) for i, (n, c) in enumerate(charts) if c}
    page = out_dir / "report.html"
    page.write_text(html_page(title, summary.read_text() + "".join(f"\n## {n}\n\n![{n}]({k})\n" for k, (n, _) in drawn.items()),
                              {k: c for k, (_, c) in drawn.items()}))
    return {"summary": summary, "html": page}


def render_run(run_dir: Path) -> dict[str, Path]:
    """Re-renders a finished perf/bench/run.py run from its files."""
    run_dir = Path(run_dir)
    rows = read_csv(run_dir / "results.csv")
    timeseries = json.loads((run_dir / "timeseries.json").read_text())
    memory = json.loads((run_dir / "memory.json").read_text()) if (run_dir / "memory.json").exists() else {}
    info = json.loads((run_dir / "info.json").read_text()) if (run_dir / "info.json").exists() else {}
    meta = {}
    for p in sorted((run_dir / "runs").glob("*.json")):
        d = json.loads(p.read_text())
        sc = d.get("scenario") or {}
        meta[d["label"]] = {"baseline": sc.get("baseline"), "setting_qps": d.get("setting_qps"),
                            "rounds_qps": d.get("rounds_achieved_qps"),
                            "requests": (d.get("client") or {}).get("requests"),
                            "limiter": d.get("filter_stats")}
    cluster = json.loads((run_dir / "cluster.json").read_text()) if (run_dir / "cluster.json").exists() else None
    return render(rows, timeseries, run_dir, meta=meta, memory=memory, info=info, cluster=cluster)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m perf.bench.report perf/reports/bench/<run-id>")
    paths = render_run(Path(sys.argv[1]))
    print(paths["summary"].read_text())
    print(f"report: {paths['html']}")
