"""The study's published figures, to set beside the lab's.

Source: Lin Sun, "Ambient Mesh: Can Sidecar-less Istio Make Your Application Faster?", CNCF blog,
2024-08-23 (first published on The New Stack):
https://cncf.io/blog/2024/08/23/ambient-mesh-can-sidecar-less-istio-make-your-application-faster
Three worker nodes of 32 cores / 256 GB, Istio 1.22.3/1.23 Bookinfo with 2 replicas per service,
Fortio on another node than details. Figures in ms, as published (two decimals).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

URL = "https://cncf.io/blog/2024/08/23/ambient-mesh-can-sidecar-less-istio-make-your-application-faster"
METRICS = ("avg", "p50", "p75", "p90", "p99")

# Table 3: Fortio to the *new* details (TCP_NODELAY, Istio 1.23), 100 RPS / 10 connections, 3 runs.
DETAILS_KEEPALIVE: dict[str, Any] = {
    "table": "Table 3 (new details with TCP_NODELAY, 3 runs)",
    "no mesh": [(0.76, 0.58, 0.69, 0.81, 1.56), (0.72, 0.59, 0.70, 0.82, 1.60), (0.77, 0.58, 0.70, 0.80, 1.49)],
    "ambient": [(0.72, 0.57, 0.66, 0.76, 1.24), (0.76, 0.59, 0.69, 0.80, 1.37), (0.76, 0.59, 0.69, 0.81, 1.38)],
}
# Table 1: the same with the *old* details (no TCP_NODELAY), for reference.
DETAILS_KEEPALIVE_OLD: dict[str, Any] = {
    "table": "Table 1 (old details without TCP_NODELAY, 3 runs)",
    "no mesh": [(0.89, 0.64, 0.74, 0.85, 2.67), (0.86, 0.65, 0.75, 0.86, 1.71), (0.90, 0.65, 0.76, 0.88, 1.92)],
    "ambient": [(0.80, 0.60, 0.71, 0.81, 1.40), (0.81, 0.61, 0.72, 0.83, 1.56), (0.82, 0.63, 0.72, 0.84, 1.50)],
}
# Table 2: Connection: close, 100 RPS / 10 connections, one run, the old details (before TCP_NODELAY).
DETAILS_CLOSE: dict[str, Any] = {
    "table": "Table 2 (Connection: close, old details, 1 run)",
    "no mesh": [(1.90, 1.72, 2.28, 2.77, 3.98)],
    "ambient": [(2.06, 2.15, 2.65, 2.94, 4.00)],
}
# Tables 4 and 6: Fortio to the new Bookinfo (productpage), one run each.
PRODUCTPAGE: dict[tuple[int, int], dict[str, Any]] = {
    (1000, 100): {"table": "Table 4 (new Bookinfo, 1000 RPS / 100 connections, 1 run)",
                  "no mesh": [(1.39, 1.32, 1.42, 1.67, 2.19)], "ambient": [(1.40, 1.34, 1.48, 1.68, 2.94)]},
    (4000, 400): {"table": "Table 6 (new Bookinfo, 4000 RPS / 400 connections, 1 run)",
                  "no mesh": [(1.54, 1.33, 1.54, 2.25, 3.98)], "ambient": [(1.58, 1.37, 1.57, 2.33, 4.90)]},
}

# What a calibration against a real ztunnel showed on this machine (built by hand from its source,
# run standalone in network namespaces; issue 15): not reproduced by the project, cited as such.
HAND_CALIBRATION: dict[str, dict[str, float]] = {
    "p50 ms, 100 RPS / 10 connections keep-alive": {"no mesh": 0.456, "ztunnel": 1.264, "Envoy node proxy": 1.289},
    "p50 ms, 100 RPS / 10 connections, Connection: close": {"no mesh": 0.920, "ztunnel": 3.665,
                                                            "Envoy node proxy": 3.795},
    "p50 ms, 1000 RPS / 100 connections": {"no mesh": 1.828, "ztunnel": 6.009, "Envoy node proxy": 6.263},
}
ZTUNNEL_RSS_MB = 17.0     # per instance, measured by hand (issue 15)
ENVOY_NODE_RSS_MB = 66.0  # the lab's Envoy node proxy, same hand measurement


def study_for(case: dict) -> dict | None:
    """The study's table for one of the lab's cases (by target, keep-alive and unscaled shape)."""
    if case["target"] == "details":
        return DETAILS_KEEPALIVE if case["keepalive"] else DETAILS_CLOSE
    for shape, t in PRODUCTPAGE.items():
        if f"{shape[0]} RPS / {shape[1]} connections" in case.get("scale", ""):
            return t
    return None


def median_row(runs: Sequence[Sequence[float]]) -> dict[str, float]:
    import statistics

    return {m: statistics.median(r[i] for r in runs) for i, m in enumerate(METRICS)}
