"""The report of an adaptive-pacing run: summary.md (per scenario, each arm's
figures per phase, and one line per arm and scenario), a chart per scenario
(<scenario>.png: admitted rate against the backend's capacity over time, and
goodput, every arm) and report.html with both.

  python -m perf.adaptive.report perf/results/adaptive-<run-id>
"""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from PIL import Image

COLUMNS = ("arm", "phase", "capacity /s", "target /s", "admitted /s", "goodput /s (share)", "2xx p50 / p99 ms",
           "throttle 429", "upstream 429", "503", "504", "no answer", "max upstream concurrency",
           "time to adapt s", "overshoot")


def _f(v: float | None, digits: int = 0) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def load_runs(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]


def phase_rows(run: dict[str, Any]) -> list[list[str]]:
    rows = []
    for p in run.get("phases", []):
        rows.append([
            run["arm"], f"{p['at_s']:.0f}–{p['end_s']:.0f} s", _f(p["capacity"]), _f(p["target"]),
            _f(p["admitted_per_s"], 1), f"{p['goodput_per_s']:.1f} ({p['goodput_share']:.0%})",
            f"{_f(p['p50_ms'])} / {_f(p['p99_ms'])}", str(p["local_429"]), str(p["upstream_429"]),
            str(p["e503"]), str(p["e504"]), str(p["no_answer"]), str(p["upstream_concurrency_max"]),
            _f(p["time_to_adapt_s"], 1) if p["time_to_adapt_s"] is not None else "never", str(p["overshoot"]),
        ])
    return rows


def _md_table(header: tuple[str, ...] | list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def chart(scenario: str, runs: list[dict[str, Any]], path: Path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    cap_drawn = False
    for run in runs:
        s = run.get("series")
        if not s:
            continue
        if not cap_drawn:
            top.plot(s["t"], s["capacity"], color="black", linestyle="--", linewidth=1.5, label="capacity")
            top.axhline(run["offered"], color="grey", linestyle=":", linewidth=1, label="offered")
            cap_drawn = True
        top.plot(s["t"], s["admitted"], linewidth=1.1, label=run["arm"])
        bottom.plot(s["t"], s["goodput"], linewidth=1.1, label=run["arm"])
    top.set_ylabel("admitted to the backend /s\n(1 s windows)")
    bottom.set_ylabel("goodput /s\n(2xx within 1 s)")
    bottom.set_xlabel("seconds")
    top.set_title(f"{scenario}: {runs[0]['what']}" if runs else scenario, fontsize=10)
    top.legend(fontsize=7, ncol=3, loc="upper right")
    top.grid(alpha=0.3)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    # Line charts need few colours: a palette image is a third of the size.
    with Image.open(path) as img:
        small = img.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)


def render(out: Path) -> dict[str, Path]:
    info = json.loads((out / "info.json").read_text()) if (out / "info.json").exists() else {}
    order = {name: i for i, name in enumerate([*info.get("scenarios", []), *info.get("arms", [])])}
    runs = sorted(load_runs(out), key=lambda r: (order.get(r["scenario"], 99), order.get(r["arm"], 99)))
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_scenario.setdefault(r["scenario"], []).append(r)
    md = [f"# Adaptive pacing benchmark: run {info.get('run_id', out.name)}", ""]
    md.append(f"Envoy {info.get('envoy', '?')}, Vegeta {info.get('vegeta', '?')}, git {info.get('git', '?')}, "
              f"{info.get('nproc', '?')} cores. Load average before: `{info.get('uptime_before', '?')}`; "
              f"after: `{info.get('uptime_after', '?')}`.")
    md.append("")
    md.append("One line per arm and scenario: the worst phase's goodput share, all errors the clients saw, "
              "and time to adapt after each change (s; `never` if not within the phase).")
    md.append("")
    head = ["scenario", "arm", "lowest goodput share", "errors (throttle 429 / upstream 429 / 503 / 504 / none)",
            "time to adapt per change", "note"]
    rows = []
    for scenario, rs in by_scenario.items():
        for r in rs:
            if "refused" in r:
                rows.append([scenario, r["arm"], "–", "–", "–", f"refused: {r['refused']}"])
                continue
            ps = r["phases"]
            errs = [sum(p[k] for p in ps) for k in ("local_429", "upstream_429", "e503", "e504", "no_answer")]
            tta = ", ".join(_f(p["time_to_adapt_s"], 1) if p["time_to_adapt_s"] is not None else "never"
                            for p in ps[1:]) or _f(ps[0]["time_to_adapt_s"], 1)
            note = f"back at 90% of offered goodput after {_f(r.get('recovery_s'), 1)} s; " \
                   f"{r['attempts'] / max(r['requests'], 1):.2f} attempts per request" if "recovery_s" in r else ""
            rows.append([scenario, r["arm"], f"{min(p['goodput_share'] for p in ps):.0%}",
                         " / ".join(map(str, errs)), tta, note])
    md.append(_md_table(head, rows))
    charts = {}
    for scenario, rs in by_scenario.items():
        md += ["", f"## {scenario}: {rs[0]['what']}", ""]
        md.append(_md_table(COLUMNS, [row for r in rs if "refused" not in r for row in phase_rows(r)]))
        for r in rs:
            if "refused" in r:
                md += ["", f"`{r['arm']}` refused: {r['refused']}"]
        png = out / f"{scenario}.png"
        chart(scenario, [r for r in rs if "refused" not in r], png)
        charts[scenario] = png
        md += ["", f"![{scenario}]({png.name})"]
    md += ["", "## Arms", ""]
    arms_seen = {r["arm"]: r["arm_what"] for r in runs}
    md += [f"- `{a}`: {w}" for a, w in arms_seen.items()]
    summary = out / "summary.md"
    summary.write_text("\n".join(md) + "\n")
    page = ["<!doctype html><meta charset=utf-8><title>adaptive pacing benchmark</title>",
            "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;"
            "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}</style>"]
    for line in md:
        if line.startswith("# "):
            page.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            page.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("![") and "](" in line:
            page.append(f'<img src="{html.escape(line.split("](")[1].rstrip(")"))}" width="1000">')
        elif line.startswith("|---"):
            continue
        elif line.startswith("| "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            page.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        elif line:
            page.append(f"<p>{html.escape(line)}</p>")
    body = _close_tables("\n".join(page))
    report_html = out / "report.html"
    report_html.write_text(body + "\n")
    return {"summary": summary, "html": report_html, **{f"chart:{k}": v for k, v in charts.items()}}


def _close_tables(body: str) -> str:
    """Wraps consecutive <tr> lines in <table> elements."""
    out, inside = [], False
    for line in body.splitlines():
        if line.startswith("<tr>") and not inside:
            out.append("<table>")
            inside = True
        elif not line.startswith("<tr>") and inside:
            out.append("</table>")
            inside = False
        out.append(line)
    if inside:
        out.append("</table>")
    return "\n".join(out)


if __name__ == "__main__":
    render(Path(sys.argv[1]))
    print(f"rendered {sys.argv[1]}")
