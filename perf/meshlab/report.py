"""Markdown + HTML report of a mesh-lab run: the study's tables (harness/study.py), resource
tables, and matplotlib charts (PNG files, embedded in the HTML)."""

from __future__ import annotations

import base64
import html
import io
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from harness.study import table

APP_LABEL = ("fortio server, details-sized payload (like Istio's two-pod benchmarks): "
             "GET /echo?size=180, a 180-byte body")
BASELINE = "no mesh"


def _as_summary(r: dict) -> dict:
    return {"avg_ms": r["avg"], "p50_ms": r["p50"], "p75_ms": r["p75"], "p90_ms": r["p90"], "p99_ms": r["p99"],
            "qps": r["achieved_qps"], "errors": r["errors"]}


def _median_rows(rows: list[dict]) -> list[dict]:
    """One row per label: the median of every figure over the runs (errors: the sum)."""
    out = []
    for label in dict.fromkeys(r["label"] for r in rows):
        rs = [r for r in rows if r["label"] == label]
        m = dict(rs[0])
        for k in ("avg", "p50", "p75", "p90", "p99", "p99.9", "achieved_qps", "proxy_cpu_s", "proxy_rss_mb"):
            m[k] = statistics.median(r[k] for r in rs)
        m["errors"] = sum(r["errors"] for r in rs)
        m["runs"] = len(rs)
        out.append(m)
    return out


def _resources(rows: list[dict]) -> str:
    head = ["configuration", "offered qps", "achieved qps", "errors (status: count)", "proxies",
            "proxy CPU (s)", "proxy CPU per 1k req (ms)", "proxy RSS (MB)", "throttle admitted/queued/rejected"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        n = max(1, r["requests"])
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(r["codes"].items(), key=lambda kv: str(kv[0])))
        t = r.get("throttle_stats") or {}
        thr = f"{t.get('admitted', 0)}/{t.get('queued', 0)}/{t.get('rejected', 0)}" if t else ""
        lines.append("| " + " | ".join([
            r["label"], str(r["offered_qps"]), f"{r['achieved_qps']:.1f}", f"{r['errors']} ({codes})",
            " + ".join(r["proxies"]) or "none", f"{r['proxy_cpu_s']:.2f}",
            f"{1000 * 1000 * r['proxy_cpu_s'] / n:.1f}" if r["proxies"] else "",
            f"{r['proxy_rss_mb']:.1f}" if r["proxies"] else "", thr]) + " |")
    return "\n".join(lines)


def _throttle_cost(med: list[dict]) -> list[str]:
    out = []
    for r in med:
        if r["throttle"] != "above":
            continue
        base = next((b for b in med if b["topology"] == r["topology"] and not b["throttle"]), None)
        if base is None:
            continue
        out += [table([(base["label"], _as_summary(base)), (r["label"], _as_summary(r))], baseline=base["label"]), ""]
    return out


def _chart(case: str, med: list[dict]) -> bytes:
    labels = [r["label"].replace(" (Envoy as HBONE node proxy, not ztunnel)", "*") for r in med]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 0.55 * len(labels) + 1.8),
                                   gridspec_kw={"width_ratios": [3, 1.3]}, sharey=True)
    ys = range(len(labels))
    h = 0.27
    for i, (k, color) in enumerate((("p50", "#4c72b0"), ("p90", "#dd8452"), ("p99", "#c44e52"))):
        ax1.barh([y + (i - 1) * h for y in ys], [r[k] for r in med], height=h, label=k, color=color)
    ax1.set_yticks(list(ys), labels, fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xscale("log")
    ax1.set_xlabel("latency (ms, log scale)")
    ax1.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3, frameon=False)
    ax1.grid(axis="x", alpha=0.3)
    ax2.barh(list(ys), [r["proxy_cpu_s"] for r in med], color="#55a868")
    ax2.set_xlabel("proxy CPU (s, all proxies)")
    ax2.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{case}  (* = Envoy as HBONE node proxy, not ztunnel)", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s.lower()).strip("-").replace("--", "-")


def write(out: Path, meta: dict, rows: list[dict]) -> None:
    md = ["# Mesh comparison on one machine", "",
          f"- app: {APP_LABEL}",
          "- nodes: network namespaces joined by veth to a bridge (client, app, waypoint); Fortio load from the client node",
          f"- Envoy {meta['envoy']}, `--concurrency 2` per proxy; Fortio {meta['fortio']}; {meta['cpus']} CPUs, "
          f"load average at start {' '.join(meta['loadavg_at_start'])} (other work shares this machine: numbers are noisy)",
          "- ambient rows: **Envoy as HBONE node proxy, not ztunnel** (ztunnel is not obtainable here)",
          f"- mode {meta['mode']}: {meta['duration_s']} s per measured run after {meta['warmup_s']} s of unrecorded "
          f"warm-up, proxies restarted for every run; whole run took {meta['elapsed_s']} s",
          "- throttle: the wasm filter of envoy/demo.yaml, one rule, rate below (0.5x, burst 0) or above (2x, burst = "
          "connections, since Fortio's connections fire in step) the offered load, max_queue_delay 1s; placed in the server sidecar's inbound HCM, or in the waypoint's HCM",
          "- rows with the throttle *below* the offered load are paced by design: their latency is mostly the "
          "wait in the throttle's queue, and their achieved qps is the throttle rate",
          "- proxy CPU: utime+stime (10 ms resolution) of every proxy of the topology during the measured run; RSS: sum at its end", ""]
    charts: list[tuple[str, bytes]] = []
    for case in dict.fromkeys(r["case"] for r in rows):
        cr = [r for r in rows if r["case"] == case]
        runs = sorted({r["run"] for r in cr})
        med = _median_rows(cr)
        md += [f"## {case}", ""]
        if len(runs) > 1:
            md += [f"Median of {len(runs)} runs (errors: sum over the runs):", "",
                   table([(r["label"], _as_summary(r)) for r in med], baseline=BASELINE), ""]
            for run in runs:
                rr = [r for r in cr if r["run"] == run]
                md += [f"Run {run}:", "", table([(r["label"], _as_summary(r)) for r in rr], baseline=BASELINE), ""]
        else:
            md += [table([(r["label"], _as_summary(r)) for r in cr], baseline=BASELINE), ""]
        cost = _throttle_cost(med)
        if cost:
            md += ["Cost of the throttle where it admits everything (rate above the offered load), against the "
                   "same topology without it" + (" (medians)" if len(runs) > 1 else "") + ":", "", *cost]
        md += ["Resources" + (f" (run {runs[-1]})" if len(runs) > 1 else "") + ":", "",
               _resources([r for r in cr if r["run"] == runs[-1]]), ""]
        png = _chart(case, med)
        name = f"chart-{_slug(case)}.png"
        (out / name).write_bytes(png)
        charts.append((case, png))
        md += [f"![{case}]({name})", ""]
    text = "\n".join(md)
    (out / "report.md").write_text(text)
    (out / "report.html").write_text(_html(text, charts))


def _html(md: str, charts: list[tuple[str, bytes]]) -> str:
    """A small Markdown subset (headings, bullets, tables, images) to self-contained HTML."""
    imgs = {c: base64.b64encode(p).decode() for c, p in charts}
    body, in_table, in_list = [], False, False
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
            if set(line) <= set("|-"):
                continue
            if not in_table:
                body.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in cells) + "</tr>")
                in_table = True
            else:
                body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("- "):
            if not in_list:
                body.append("<ul>")
                in_list = True
            body.append(f"<li>{html.escape(line[2:]).replace('**', '')}</li>")
            continue
        if in_list:
            body.append("</ul>")
            in_list = False
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("!["):
            case = line[2:line.index("]")]
            body.append(f'<img alt="{html.escape(case)}" src="data:image/png;base64,{imgs[case]}">')
        elif line:
            body.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        body.append("</table>")
    style = ("body{font-family:sans-serif;max-width:1400px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}td:first-child,th:first-child{text-align:left}"
             "th{background:#f3f3f3}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Mesh comparison</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def main(argv: list[str] | None = None) -> int:
    """Re-renders report.md/.html and charts of a results directory from its results.json."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m perf.meshlab.report RESULTS_DIR", file=sys.stderr)
        return 2
    out = Path(args[0])
    data = json.loads((out / "results.json").read_text())
    for r in data["rows"]:
        r["codes"] = {int(k): v for k, v in r["codes"].items()}
    write(out, data["meta"], data["rows"])
    print(f"report: {out / 'report.md'}, {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
