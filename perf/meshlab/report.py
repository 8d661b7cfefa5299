"""Markdown + HTML report of a mesh-lab run: the study's tables (perf/study.py) and the study's
published figures beside the lab's (study_data.py), ratios to no mesh, spread, resources, per-hop
checks, and matplotlib charts (PNG files, embedded in the HTML)."""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from harness.tables import html_page, markdown, png
from perf.meshlab import study_data, topologies
from perf.study import table

APP_LABEL = ("Bookinfo-shaped application written here (perf/bookinfo): productpage (Python, gunicorn gthread) "
             "-> details (Ruby WEBrick) and reviews (Java, JDK HttpServer) -> ratings (Node.js); port 9080, "
             "one node each")
BASELINE = "no mesh"
AMB = " (Envoy as HBONE node proxy, not ztunnel)"
METRICS = study_data.METRICS


def ztunnel_rss_estimate(rss: dict[str, float]) -> float:
    """Proxy RSS with every Envoy node proxy counted at ztunnel's hand-measured RSS instead."""
    return sum(study_data.ZTUNNEL_RSS_MB if name.startswith("node-") else mb for name, mb in rss.items())


def _as_summary(r: dict) -> dict:
    return {"avg_ms": r["avg"], "p50_ms": r["p50"], "p75_ms": r["p75"], "p90_ms": r["p90"], "p99_ms": r["p99"],
            "qps": r["achieved_qps"], "errors": r["errors"]}


def _median_rows(rows: list[dict]) -> list[dict]:
    """One row per label: the median of every figure over the runs (errors: the sum), and the spread."""
    out = []
    for label in dict.fromkeys(r["label"] for r in rows):
        rs = [r for r in rows if r["label"] == label]
        m = dict(rs[0])
        for k in ("avg", "p50", "p75", "p90", "p99", "p99.9", "achieved_qps", "proxy_cpu_s", "proxy_rss_mb",
                  "proxy_rss_mb_ztunnel_est"):
            m[k] = statistics.median(r.get(k, 0.0) for r in rs)
            m[f"{k}_min"], m[f"{k}_max"] = min(r.get(k, 0.0) for r in rs), max(r.get(k, 0.0) for r in rs)
        m["errors"] = sum(r["errors"] for r in rs)
        m["runs"] = len(rs)
        m["hops_ok_runs"] = sum(1 for r in rs if r.get("hops_ok"))
        out.append(m)
    return out


def _spread(med: list[dict]) -> str:
    head = ["configuration", "runs", "avg min-max (ms)", "p50 min-max", "p90 min-max", "p99 min-max", "qps min-max"]
    return markdown(head, [[m["label"], m["runs"], *(f"{m[k + '_min']:.3f}-{m[k + '_max']:.3f}"
                                                      for k in ("avg", "p50", "p90", "p99")),
                            f"{m['achieved_qps_min']:.1f}-{m['achieved_qps_max']:.1f}"] for m in med])


def _resources(rows: list[dict]) -> str:
    head = ["configuration", "offered qps", "achieved qps", "errors (status: count)", "proxies",
            "proxy CPU (s)", "proxy CPU per 1k req (ms)", "proxy RSS (MB)",
            "proxy RSS, node proxies as ztunnel (MB, est.)", "throttle admitted/queued/rejected"]
    body = []
    for r in rows:
        n = max(1, r["requests"])
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(r["codes"].items(), key=lambda kv: str(kv[0])))
        t = r.get("throttle_stats") or {}
        thr = f"{t.get('admitted', 0)}/{t.get('queued', 0)}/{t.get('rejected', 0)}" if t else ""
        has = bool(r["proxies"])
        body.append([
            r["label"], r["offered_qps"], f"{r['achieved_qps']:.1f}", f"{r['errors']} ({codes})",
            " + ".join(r["proxies"]) or "none", f"{r['proxy_cpu_s']:.2f}",
            f"{1000 * 1000 * r['proxy_cpu_s'] / n:.1f}" if has else "",
            f"{r['proxy_rss_mb']:.1f}" if has else "",
            f"{r.get('proxy_rss_mb_ztunnel_est', 0.0):.1f}" if has and r["topology"] in ("ambient", "waypoint", "waypoints") else "",
            thr])
    return markdown(head, body)


def _hops(rows: list[dict]) -> str:
    return markdown(["configuration", "run", "requests", "hops checked", "result"], [
        [r["label"], r["run"], r["requests"], " ".join(f"{s}->{d}" for s, d in topologies.edges(r["target"])),
         "every hop seen" if r.get("hops_ok") else "MISSING: " + "; ".join(r.get("hop_problems", [])).replace("|", "/")]
        for r in rows])


def _by_topology(med: list[dict], key: str, throttle: str = "") -> dict | None:
    return next((m for m in med if m["topology"] == key and m["throttle"] == throttle), None)


def _ratio(a: dict | None, b: dict | None, k: str) -> str:
    if not a or not b or not b.get(k):
        return "n/a"
    return f"{a[k] / b[k]:.2f}"


def _beside_study(case: dict, med: list[dict]) -> list[str]:
    """The study's table for this case beside the lab's medians, and the ratios to no mesh."""
    st = study_data.study_for(case)
    if st is None:
        return []
    s_nm, s_amb = study_data.median_row(st["no mesh"]), study_data.median_row(st["ambient"])
    nm, amb, sc = _by_topology(med, "nomesh"), _by_topology(med, "ambient"), _by_topology(med, "sidecar")
    nruns = len(st["no mesh"])
    scale = case.get("scale") or "the study's own load"
    lines = [f"Beside the study ([{st['table']}]({study_data.URL}); "
             f"{'median of its ' + str(nruns) + ' runs' if nruns > 1 else 'its one run'}). Lab: median of "
             f"{nm['runs'] if nm else 0} runs; load: {scale}. The study ran ztunnel on 32-core nodes, one service per "
             "node pair; the lab runs Envoy node proxies and everything else on one 2-core machine:", ""]
    body = [[label, *(f"{r[k]:.3f}" for k in METRICS)] for label, r in (
        ("study: no mesh", s_nm), ("study: ambient (ztunnel)", s_amb), ("lab: no mesh", nm),
        ("lab: ambient L4" + AMB, amb), ("lab: sidecar", sc)) if r]
    body += [["**ratio** study ambient / no mesh", *(f"{s_amb[k] / s_nm[k]:.2f}" for k in METRICS)],
             ["**ratio** lab ambient / no mesh", *(_ratio(amb, nm, k) for k in METRICS)],
             ["**ratio** lab sidecar / no mesh", *(_ratio(sc, nm, k) for k in METRICS)]]
    return [*lines, markdown(["", *(f"{k} (ms)" for k in METRICS)], body), ""]


def _throttle_cost(med: list[dict]) -> list[str]:
    out = []
    for r in med:
        if r["throttle"] != "above":
            continue
        base = _by_topology(med, r["topology"])
        if base is None:
            continue
        out += [table([(base["label"], _as_summary(base)), (r["label"], _as_summary(r))], baseline=base["label"]), ""]
    return out


def _added_latency(cases: list[tuple[dict, list[dict]]]) -> str:
    """Per case and topology: the throttle above the offered load (admits everything) minus the same
    topology without it, in ms (medians)."""
    body = []
    for case, med in cases:
        for key, where in (("sidecar", f"{case['target']} sidecar inbound"), ("waypoint", f"{case['target']}'s waypoint"),
                           ("waypoints", f"{case['target']}'s {topologies.WAYPOINT_REPLICAS} waypoints, cluster scope")):
            a, b = _by_topology(med, key, "above"), _by_topology(med, key)
            if a and b:
                body.append([case["name"], where, *(f"{a[k] - b[k]:+.3f}" for k in METRICS),
                             f"{a['proxy_cpu_s'] - b['proxy_cpu_s']:+.2f}"])
    return markdown(["case", "throttle in", *(f"+{k} (ms)" for k in METRICS), "proxy CPU + (s)"], body)


def _chart(case: str, med: list[dict]) -> bytes:
    labels = [r["label"].replace(AMB, "*") for r in med]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 0.55 * len(labels) + 1.8),
                                   gridspec_kw={"width_ratios": [3, 1.3]}, sharey=True)
    ys = range(len(labels))
    h = 0.27
    for i, (k, color) in enumerate((("p50", "#4c72b0"), ("p90", "#dd8452"), ("p99", "#c44e52"))):
        ax1.barh([y + (i - 1) * h for y in ys], [r[k] for r in med], height=h, label=k, color=color)
    ax1.set_yticks(list(ys), labels, fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xscale("log")
    ax1.set_xlabel("latency (ms, log scale, median of the runs)")
    ax1.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3, frameon=False)
    ax1.grid(axis="x", alpha=0.3)
    ax2.barh(list(ys), [r["proxy_cpu_s"] for r in med], color="#55a868")
    ax2.set_xlabel("proxy CPU (s, all proxies)")
    ax2.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{case}  (* = Envoy as HBONE node proxy, not ztunnel)", fontsize=10)
    fig.tight_layout()
    return png(fig)


def _ratio_chart(cases: list[tuple[dict, list[dict]]]) -> bytes | None:
    """p50 and p90 ratios to no mesh: the study's ambient, the lab's ambient and sidecar, per case."""
    groups = []
    for case, med in cases:
        st = study_data.study_for(case)
        nm = _by_topology(med, "nomesh")
        if not nm:
            continue
        vals = {}
        if st:
            s_nm, s_amb = study_data.median_row(st["no mesh"]), study_data.median_row(st["ambient"])
            vals["study ambient"] = (s_amb["p50"] / s_nm["p50"], s_amb["p90"] / s_nm["p90"])
        for key, name in (("ambient", "lab ambient*"), ("sidecar", "lab sidecar")):
            m = _by_topology(med, key)
            if m:
                vals[name] = (m["p50"] / nm["p50"], m["p90"] / nm["p90"])
        groups.append((case["name"].replace(" connections", " conns"), vals))
    if not groups:
        return None
    series = ["study ambient", "lab ambient*", "lab sidecar"]
    colors = {"study ambient": "#8172b2", "lab ambient*": "#4c72b0", "lab sidecar": "#c44e52"}
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.9 * len(groups) + 2), sharey=True)
    for ax, (idx, pname) in zip(axes, ((0, "p50"), (1, "p90")), strict=False):
        ys = range(len(groups))
        h = 0.27
        for i, sname in enumerate(series):
            ax.barh([y + (i - 1) * h for y in ys], [g[1].get(sname, (0, 0))[idx] for g in groups], height=h,
                    label=sname, color=colors[sname])
        ax.axvline(1.0, color="#333", lw=0.8)
        ax.set_yticks(list(ys), [g[0] for g in groups], fontsize=8)
        ax.set_xlabel(f"{pname} / no-mesh {pname}")
        ax.grid(axis="x", alpha=0.3)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3, frameon=False)
    fig.suptitle("Ratios to no mesh (* = Envoy as HBONE node proxy, not ztunnel; the lab on one 2-core machine)",
                 fontsize=10)
    fig.tight_layout()
    return png(fig)


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s.lower()).strip("-").replace("--", "-")[:80]


def _istiod_lines(meta: dict) -> list[str]:
    """How the sidecars and the waypoint were configured (runs from 2026-11-25 on: a real istiod)."""
    ist = meta.get("istiod")
    if not ist:
        return ["- sidecars and waypoint: Envoy configurations written by hand (perf/meshlab/configs.py of the "
                "time), Istio's listeners in small"]
    return [f"- sidecars and waypoint: **configured by a real istiod** (harness/controlplane.py, in a node of the "
            f"lab, up in {ist['control_plane_s']} s): `pilot-agent proxy sidecar` / `proxy waypoint` with upstream "
            "Envoy, the settings harness/meshpatches.py names (istio/README.md); PeerAuthentication STRICT. Only "
            "the ambient node proxies are written by hand. Proxy CPU and RSS count pilot-agent too (an istio-proxy "
            "container runs both)"]


def _header(meta: dict) -> list[str]:
    during = meta.get("loadavg_during") or {}
    start = meta.get("loadavg_start") or meta["loadavg_at_start"]  # the latter: runs before 2026-11-25
    load = f"load average (1 min) at start {' '.join(f'{float(x):.2f}' for x in start)}"
    if during:
        load += f", during the runs {during['min_1m']:.2f}-{during['max_1m']:.2f}"
    md = ["# Mesh comparison on one machine: a Bookinfo-shaped application", "",
          f"- app: {APP_LABEL}; Fortio loads `details` alone (`/details/0`) or the whole fan-out through productpage "
          "(`/api/v1/products/0/page`: details, then reviews -> ratings)",
          "- nodes: one network namespace per workload (client, productpage, details, reviews, ratings) and one "
          "for each waypoint replica" + (", one for the control plane" if meta.get("istiod") else "")
          + ", joined by veth to a bridge; Fortio on the client node",
          f"- Envoy {meta['envoy']}, `--concurrency 2` per proxy; Fortio {meta['fortio']} with `-r "
          f"{meta.get('fortio_resolution_s', '0.001')}` (10 µs histogram buckets); {meta['cpus']} CPUs, {load} "
          "(other work shares this machine: numbers are noisy)",
          *_istiod_lines(meta),
          "- capture: sidecars have Istio's own iptables rules (`pilot-agent istio-iptables`, REDIRECT, the proxy's "
          "uid excluded), in and out; for the ambient node proxies an iptables REDIRECT (nat OUTPUT, in each "
          "calling node's own namespace, the client's included) sends connections to the services' port 9080 to "
          "the node's proxy on 15001; HBONE is dialled on 15008",
          "- ambient rows: **Envoy as HBONE node proxy, not ztunnel** (ztunnel is not obtainable here). A hand "
          "calibration on this machine (issue 15, not part of the project) put a real ztunnel's latency and CPU "
          "within a few percent of this Envoy node proxy (p50 at 100 RPS / 10 connections: no mesh 0.456 ms, "
          "ztunnel 1.264, Envoy node proxy 1.289), but **not its memory**: ztunnel about "
          f"{study_data.ZTUNNEL_RSS_MB:.0f} MB per instance against about {study_data.ENVOY_NODE_RSS_MB:.0f} MB for "
          "the Envoy node proxy (measured by hand). Ambient RSS is therefore also given with every node proxy "
          f"counted at {study_data.ZTUNNEL_RSS_MB:.0f} MB (an estimate)",
          f"- mode {meta['mode']}: {meta['duration_s']} s per measured run after {meta['warmup_s']} s of unrecorded "
          f"warm-up at the case's load; the proxies are restarted for every run; the services run for the whole lab "
          "(after 10 s of full-speed load without a mesh at start, 3 s in CI, so the JVM's JIT is warm) and drop "
          f"their pooled connections whenever the topology changes; whole run took {meta['elapsed_s']} s",
          "- throttle: the filter as a WasmPlugin (pulled by pilot-agent from the registry), one rule, rate below "
          "(0.5x, burst 0) or above (2x, burst = connections, since Fortio's connections fire in step) the offered "
          "load, max_queue_delay 1s; on the loaded service's sidecar inbound (`selector`, `match: SERVER`), or on "
          "its waypoint (`targetRefs: Service`), where istiod puts it; on the waypoint with "
          f"{topologies.WAYPOINT_REPLICAS} replicas the rule has cluster scope (one rate for the Service across "
          "them, through envoyproxy/ratelimit + Redis run as pods of the lab, `istio/engine-waypoint` giving the "
          "waypoints the engine's cluster)",
          "- rows with the throttle *below* the offered load are paced by design: their latency is mostly the "
          "wait in the throttle's queue, and their achieved qps is the throttle rate",
          "- proxy CPU: utime+stime (10 ms resolution) of every proxy of the topology during the measured run; RSS: "
          "sum at its end",
          f"- the study: [{study_data.URL}]({study_data.URL}); its figures are copied into perf/meshlab/study_data.py",
          ""]
    sc = meta.get("scale")
    if sc:
        md += ["## Saturation point and scale", ""]
        if sc.get("saturation"):
            md += [f"productpage (whole fan-out) at full speed (`-qps 0`), {sc['conns']} connections, "
                   f"{sc['saturation'][0]['duration_s']} s per topology and pass, passes interleaved; other work on "
                   "the machine only lowers a pass, so a topology's capacity is its best pass:", "",
                   markdown(["topology", "capacity (qps, best pass)", "p50 (ms)", "p99 (ms)", "errors",
                             "every pass: qps (load average)"],
                            [[s["label"], f"{s['qps']:.1f}", f"{s['p50']:.2f}", f"{s['p99']:.2f}", s["errors"],
                              ", ".join(f"{p['qps']:.1f} ({p['load_1m']})" for p in s.get("passes", []))]
                             for s in sc["saturation"]]), ""]
        md += [f"Scale factor **x{sc['factor']:g}** ({sc['how']}): the study's 1000 RPS / 100 connections becomes "
               f"{round(1000 * sc['factor'])} RPS / {max(1, round(100 * sc['factor']))} connections, and 4000 / 400 "
               f"becomes {round(4000 * sc['factor'])} / {max(1, round(400 * sc['factor']))}. Rate and connections "
               "scale by the same factor, so each connection carries the study's 10 RPS.", ""]
    return md


def write(out: Path, meta: dict, rows: list[dict]) -> None:
    md = _header(meta)
    charts: dict[str, bytes] = {}
    per_case: list[tuple[dict, list[dict]]] = []
    for case in dict.fromkeys(r["case"] for r in rows):
        cr = [r for r in rows if r["case"] == case]
        first = cr[0]
        cinfo = {"name": case, "target": first["target"], "keepalive": first["keepalive"],
                 "scale": first.get("scale", "")}
        runs = sorted({r["run"] for r in cr})
        med = _median_rows(cr)
        per_case.append((cinfo, med))
        md += [f"## {case}", ""]
        if cinfo["scale"]:
            md += [f"Scale: **{cinfo['scale']}** (this machine saturates far below the study's load).", ""]
        md += _beside_study(cinfo, med)
        if len(runs) > 1:
            md += [f"All configurations, median of {len(runs)} runs (errors: sum over the runs):", "",
                   table([(r["label"], _as_summary(r)) for r in med], baseline=BASELINE), "",
                   "Spread over the runs:", "", _spread(med), ""]
        else:
            md += [table([(r["label"], _as_summary(r)) for r in cr], baseline=BASELINE), ""]
        cost = _throttle_cost(med)
        if cost:
            md += ["Cost of the throttle where it admits everything (rate above the offered load), against the "
                   "same topology without it" + (" (medians)" if len(runs) > 1 else "") + ":", "", *cost]
        md += ["Resources" + (f" (run {runs[-1]})" if len(runs) > 1 else "") + ":", "",
               _resources([r for r in cr if r["run"] == runs[-1]]), "",
               "Every hop, checked on the proxies' counters and the services' own request counts "
               "(perf/meshlab/hops.py)" + (f" (run {runs[-1]})" if len(runs) > 1 else "") + ":", "",
               _hops([r for r in cr if r["run"] == runs[-1]]), ""]
        png = _chart(case, med)
        name = f"chart-{_slug(case)}.png"
        (out / name).write_bytes(png)
        charts[name] = png
        md += [f"![{case}]({name})", ""]
    if any(m["throttle"] == "above" for _, med in per_case for m in med):
        md += ["## The throttle's added latency per topology", "",
               "The throttle set above the offered load (it admits everything) minus the same topology without it; "
               "medians, ms (negative = within noise):", "", _added_latency(per_case), ""]
    rpng = _ratio_chart(per_case)
    if rpng:
        md += ["## Ratios to no mesh", "", "![Ratios to no mesh](chart-ratios.png)", ""]
        (out / "chart-ratios.png").write_bytes(rpng)
        charts["chart-ratios.png"] = rpng
    text = "\n".join(md)
    (out / "report.md").write_text(text)
    (out / "report.html").write_text(html_page("Mesh comparison", text, charts))


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
