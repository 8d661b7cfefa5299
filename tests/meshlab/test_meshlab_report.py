"""The mesh-lab report, rendered offline from synthetic runs: the study's figures beside the lab's,
the ratios to no mesh, the scale, the spread, the ztunnel memory estimate, the throttle's added
latency, the per-hop results, and a self-contained HTML page with its charts."""

from __future__ import annotations

from perf.meshlab import report, run, topologies


def _row(case: run.Case, topo: topologies.Topology, rn: int, p50: float) -> dict:
    rss = {f"node-{n}": 66.0 for n in topologies.involved(case.target)} if topo.key in ("ambient", "waypoint",
                                                                                         "waypoints") \
        else {f"sidecar-{n}": 60.0 for n in topologies.involved(case.target)} if topo.key == "sidecar" else {}
    hops_ok = not (topo.key == "sidecar" and rn == 3)
    return {"case": case.name, "target": case.target, "scale": case.scale, "run": rn, "topology": topo.key,
            "throttle": topo.throttle, "rate": topo.rate(case.qps), "burst": topo.burst(case.conns),
            "label": topo.label(case.qps, case.conns, case.target), "tool": "fortio", "conns": case.conns,
            "offered_qps": case.qps, "keepalive": case.keepalive, "duration_s": 8.0, "achieved_qps": case.qps * 0.99,
            "errors": 0, "codes": {200: 800}, "requests": 800, "avg": p50 * 1.1, "p50": p50, "p75": p50 * 1.2,
            "p90": p50 * 1.5, "p99": p50 * 3, "p99.9": p50 * 4, "max": p50 * 5, "sockets": case.conns,
            "proxies": list(rss), "proxy_rss": rss, "proxy_cpu": dict.fromkeys(rss, 0.1),
            "proxy_rss_mb": sum(rss.values()), "proxy_rss_mb_ztunnel_est": report.ztunnel_rss_estimate(rss),
            "proxy_cpu_s": 0.1 * len(rss), "throttle_stats": {"queued": 10} if topo.throttle else {},
            "hops": {}, "hop_problems": [] if hops_ok else ["hop client -> details (x): outbound|9080||details missing"],
            "hops_ok": hops_ok}


def test_report_sets_the_study_beside_the_lab(tmp_path):
    base = {"nomesh": 1.0, "sidecar": 2.0, "ambient": 1.5, "waypoint": 1.8, "waypoints": 1.9}
    cases = (run.DETAILS_CASES[0], run.productpage_cases(0.05)[1])
    rows = [_row(c, t, rn, base[t.key] * (1 + 0.1 * rn) + (0.3 if t.throttle == "above" else 0))
            for rn in (1, 2, 3) for c in cases for t in topologies.ALL]
    meta = {"mode": "full", "duration_s": 8.0, "warmup_s": 2.0, "elapsed_s": 1.0, "envoy": "1.40.0", "fortio": "1.68.2",
            "cpus": 2, "loadavg_start": [1.0, 1.0, 1.0], "loadavg_during": {"min_1m": 1.0, "max_1m": 2.0},
            "fortio_resolution_s": "0.00001",
            "scale": {"factor": 0.05, "how": "test", "conns": 16, "saturation": [
                {"label": "no mesh", "qps": 500.0, "p50": 20.0, "p99": 50.0, "errors": 0, "duration_s": 5.0,
                 "passes": [{"qps": 400.0, "load_1m": "3.0"}, {"qps": 500.0, "load_1m": "2.0"}]}]}}
    report.write(tmp_path, meta, rows)
    # tabulate pads the table columns: runs of spaces as one
    md = "\n".join(" ".join(line.split()) for line in (tmp_path / "report.md").read_text().splitlines())
    assert "| study: no mesh | 0.760 | 0.580 | 0.700 | 0.810 | 1.560 |" in md  # Table 3, median of 3 runs
    assert "| study: ambient (ztunnel) | 1.580 | 1.370 | 1.570 | 2.330 | 4.900 |" in md  # Table 6
    assert "| **ratio** lab ambient / no mesh | 1.50 | 1.50 | 1.50 | 1.50 | 1.50 |" in md
    assert "| **ratio** lab sidecar / no mesh | 2.00 | 2.00 | 2.00 | 2.00 | 2.00 |" in md
    assert "Scale: **x0.05 of the study's 4000 RPS / 400 connections**" in md
    assert "| no mesh | 500.0 | 20.00 | 50.00 | 0 | 400.0 (3.0), 500.0 (2.0) |" in md
    assert "| no mesh | 3 | 1.210-1.430 | 1.100-1.300 |" in md  # spread over the 3 runs
    # Ambient RSS: 2 node proxies measured at 66 MB each, estimated at ztunnel's 17 MB each.
    assert "| 132.0 | 34.0 |" in md
    assert "## The throttle's added latency per topology" in md
    assert "| details, 100 RPS / 10 connections | details sidecar inbound | +0.330 | +0.300 |" in md
    assert "| details, 100 RPS / 10 connections | details's 2 waypoints, cluster scope | +0.330 | +0.300 |" in md
    assert "MISSING: hop client -> details (x): outbound/9080//details missing" in md  # pipes kept out of the table
    assert md.count("every hop seen") >= 6
    page = (tmp_path / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 3  # two cases and the ratios
    assert '<a href="https://cncf.io/blog/2024/08/23/ambient-mesh-can-sidecar-less-istio-make-your-application-faster">' in page
    assert "**" not in page
