"""The report of an adaptive-pacing run: summary.md (one line per scenario and arm, then
per scenario every arm's figures per phase), a chart per scenario (<scenario>.png:
admitted rate against the backend's capacity over time, and goodput, every arm) and
report.html with both (harness.tables).

  python -m perf.adaptive.report perf/reports/adaptive/latest
"""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path
from typing import Any

from harness.tables import html_page, markdown, num, png

COLUMNS = ("arm", "phase", "capacity /s", "target /s", "admitted /s", "goodput /s (share)", "2xx p50 / p99 ms",
           "throttle 429", "upstream 429", "503", "504", "no answer", "max upstream concurrency",
           "time to adapt s", "overshoot")
SUMMARY = ("scenario", "arm", "lowest goodput share", "errors (throttle 429 / upstream 429 / 503 / 504 / none)",
           "time to adapt per change", "note")


def load_runs(out: Path) -> list[dict[str, Any]]:
    """The runs of a run directory, in the order of its set (environment.json)."""
    env_path = out / "environment.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    order = {name: i for i, name in enumerate([*env.get("scenarios", []), *env.get("arms", [])])}
    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    return sorted(runs, key=lambda r: (order.get(r["scenario"], 99), order.get(r["arm"], 99)))


def _tta(p: dict[str, Any]) -> str:
    return "never" if p["time_to_adapt_s"] is None else num(p["time_to_adapt_s"])


def phase_rows(run: dict[str, Any]) -> list[list[str]]:
    return [[run["arm"], f"{p['at_s']:.0f}–{p['end_s']:.0f} s", num(p["capacity"], ".0f"), num(p["target"], ".0f"),
             num(p["admitted_per_s"]), f"{p['goodput_per_s']:.1f} ({p['goodput_share']:.0%})",
             f"{num(p['p50_ms'], '.0f', '–')} / {num(p['p99_ms'], '.0f', '–')}", num(p["local_429"]),
             num(p["upstream_429"]), num(p["e503"]), num(p["e504"]), num(p["no_answer"]),
             num(p["upstream_concurrency_max"]), _tta(p), num(p["overshoot"])]
            for p in run.get("phases", [])]


def summary_row(run: dict[str, Any]) -> list[str]:
    if "refused" in run:
        return [run["scenario"], run["arm"], "–", "–", "–", f"refused: {run['refused']}"]
    ps = run["phases"]
    errs = [sum(p[k] for p in ps) for k in ("local_429", "upstream_429", "e503", "e504", "no_answer")]
    tta = ", ".join(_tta(p) for p in ps[1:]) or _tta(ps[0])
    notes = []
    if "recovery_s" in run:
        notes.append(f"back at 90% of offered goodput after {num(run['recovery_s'], missing='–')} s; "
                     f"{run['attempts'] / max(run['requests'], 1):.2f} attempts per request")
    if run.get("first_cut_s"):
        notes.append("first cut " + ", ".join(f"none after {at} s" if v is None else f"{num(v)} s after {at} s"
                                              for at, v in run["first_cut_s"].items()))
    if "attack" in run:
        notes.append(f"attacker ({run['attack']['path']}, {run['attack']['rate']}/s): {run['attack']['codes']}")
    note = "; ".join(notes)
    return [run["scenario"], run["arm"], f"{min(p['goodput_share'] for p in ps):.0%}",
            " / ".join(map(str, errs)), tta, note]


LEARNER_LINE = re.compile(r"^\s*(-?[\d.]+) .*adaptive rate ([\d.]+)/s -> ([\d.]+)/s")


def learned_series(log: str) -> tuple[list[float], list[float]]:
    """The learner's rate over time from its log (runs/<scenario>--<arm>.learner.log): a step
    series from 0 s, the rate it started at first."""
    ts: list[float] = []
    rates: list[float] = []
    for line in log.splitlines():
        m = LEARNER_LINE.match(line)
        if not m:
            continue
        t, before, after = float(m[1]), float(m[2]), float(m[3])
        if not ts:
            ts, rates = [0.0], [before]
        ts.append(max(t, ts[-1]))
        rates.append(after)
    return ts, rates


def chart(scenario: str, runs: list[dict[str, Any]], learned: dict[str, tuple[list[float], list[float]]]
          | None = None) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for i, run in enumerate(runs):
        s = run["series"]
        if i == 0:
            top.plot(s["t"], s["capacity"], color="black", linestyle="--", linewidth=1.5, label="capacity")
            top.axhline(run["offered"], color="grey", linestyle=":", linewidth=1, label="offered")
        (line,) = top.plot(s["t"], s["admitted"], linewidth=1.1, label=run["arm"])
        bottom.plot(s["t"], s["goodput"], linewidth=1.1, label=run["arm"])
        ts, rates = (learned or {}).get(run["arm"], ([], []))
        if ts:
            end = s["t"][-1] if s["t"] else ts[-1]
            top.step([*ts, max(end, ts[-1])], [*rates, rates[-1]], where="post", color=line.get_color(),
                     linestyle="--", linewidth=0.8, label=f"{run['arm']} learned rate")
    top.set_ylabel("admitted to the backend /s\n(1 s windows)")
    bottom.set_ylabel("goodput /s\n(2xx within 1 s)")
    bottom.set_xlabel("seconds")
    top.set_title(f"{scenario}: {runs[0]['what']}" if runs else scenario, fontsize=10)
    top.legend(fontsize=7, ncol=3, loc="upper right")
    top.grid(alpha=0.3)
    bottom.grid(alpha=0.3)
    raw = png(fig)
    # Line charts need few colours: a palette image is a fifth of the size.
    buf = io.BytesIO()
    with Image.open(io.BytesIO(raw)) as img:
        img.convert("RGB").quantize(colors=64).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def render(out: Path) -> dict[str, Path]:
    runs = load_runs(out)
    env_path = out / "environment.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_scenario.setdefault(r["scenario"], []).append(r)
    load_start, load_end = env.get("loadavg_start"), env.get("loadavg_end")
    md = [f"# Adaptive pacing benchmark: run {env.get('run_id', out.name)}", "",
          f"Envoy {env.get('envoy', '?')}, Vegeta {env.get('vegeta', '?')}, git {env.get('git', '?')}, "
          f"{env.get('cpus', '?')} cores. Load average at the start {load_start}, at the end {load_end}.", "",
          "One line per scenario and arm: the worst phase's goodput share (2xx within 1 s against min(capacity, "
          "offered)), every error the clients saw, and the time to adapt after each change (s; `never` if not "
          "within the phase).", "",
          markdown(SUMMARY, [summary_row(r) for r in runs])]
    images: dict[str, bytes] = {}
    for scenario, rs in by_scenario.items():
        ran = [r for r in rs if "refused" not in r]
        md += ["", f"## {scenario}: {rs[0]['what']}", "", markdown(COLUMNS, [row for r in ran for row in phase_rows(r)])]
        md += [f"\n`{r['arm']}` refused: {r['refused']}" for r in rs if "refused" in r]
        if ran:
            name = f"{scenario}.png"
            logs = {r["arm"]: out / "runs" / f"{scenario}--{r['arm']}.learner.log" for r in ran}
            learned = {arm: learned_series(p.read_text()) for arm, p in logs.items() if p.exists()}
            images[name] = chart(scenario, ran, learned)
            (out / name).write_bytes(images[name])
            md += ["", f"![{scenario}]({name})"]
    md += ["", "## Arms", ""] + [f"- `{a}`: {w}" for a, w in {r["arm"]: r["arm_what"] for r in runs}.items()]
    text = "\n".join(md) + "\n"
    (out / "summary.md").write_text(text)
    (out / "report.html").write_text(html_page(f"adaptive pacing {env.get('run_id', out.name)}", text, images))
    return {"summary": out / "summary.md", "html": out / "report.html"}


if __name__ == "__main__":
    render(Path(sys.argv[1]))
    print(f"rendered {sys.argv[1]}")
