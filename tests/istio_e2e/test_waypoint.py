"""The throttle on an ambient waypoint, configured by a real istiod from
`k8s/overlays/ambient-waypoint-throttle`.

The namespace is in ambient mode: details and the Fortio client run without sidecars, each with a
ztunnel stand-in (harness/ztunnel_standin.py: the only hand-written proxy configuration here).
The client's traffic to the details Service goes over HBONE to the waypoint, whose whole
configuration (HBONE in, the HTTP filters with the throttle, HBONE out to the pod) comes from
istiod, with the changes harness/meshpatches.py names for the waypoint.
"""

from __future__ import annotations

import time

import pytest

from harness.mesh import NAMESPACE
from tests.support import istio

pytestmark = pytest.mark.istio

URL = f"http://details.{NAMESPACE}.svc.cluster.local:9080/details/0"
PLUGIN = "throttle-details"
TOLERANCE = 0.05  # as in test_sidecar.py


def test_waypoint_acked_and_nothing_was_rejected(waypoint, mesh, figures):
    (wp,) = waypoint.pods["waypoint"]
    (row,) = istio.wait_acked(mesh.cp, [wp.proxy_id]).values()
    assert row.get("extensionconfig_sent"), row
    assert "config rejected" not in wp.log(), wp.log()[-3000:]
    figures["waypoint_acked"] = {t: row.get(f"{t}_acked", "") for t in istio.XDS_TYPES}


def test_waypoint_runs_the_shipped_plugin(waypoint, figures):
    (wp,) = waypoint.pods["waypoint"]
    line = istio.wait_configured(wp, 0, "details: rate 1000/1s")
    (wasm,) = [f for f in istio.ecds_wasm(wp) if PLUGIN in f["name"]]
    figures["waypoint_configured"] = {"line": line, "ecds": wasm["name"]}


def test_pacing_at_the_app_through_the_waypoint(waypoint, figures):
    (wp,) = waypoint.pods["waypoint"]
    (app,) = waypoint.pods["details-v1"]
    before = len(istio.configured_lines(wp))
    waypoint.mesh.kube.apply([istio.with_rule(waypoint.plugin(PLUGIN), rate="50/s", burst=1, max_queue_delay="2s")])
    line = istio.wait_configured(wp, before, "details: rate 50/1s")
    held = istio.load(waypoint.client, URL, qps=200, connections=16, duration="10s")
    stamps = app.arrival_times()
    rate = istio.rate_at_app(stamps, held["start"], held["end"])
    assert held["codes"] == {200: held["requests"]}, held
    assert abs(rate - 50) <= 50 * TOLERANCE, (rate, istio.per_second(stamps, held["start"], held["end"]))

    over = istio.Background(waypoint.client, URL, qps=400, connections=200, duration="6s")
    time.sleep(3)
    probe = istio.first_429(waypoint.client, URL, within=2.5)
    result = over.result()
    over_rate = istio.rate_at_app(app.arrival_times(), result["start"], result["end"])
    assert set(result["codes"]) == {200, 429} and result["codes"][429] > 0, result
    assert probe[0] == 429 and int(probe[1]["retry-after"]) >= 1, probe
    assert abs(over_rate - 50) <= 50 * TOLERANCE, over_rate
    figures["pacing_waypoint"] = {"configured": line, "rate_at_app": round(rate, 2), "codes_held": held["codes"],
                                  "p50_ms": held["p50_ms"], "overload_codes": result["codes"],
                                  "overload_rate_at_app": round(over_rate, 2), "retry_after": probe[1]["retry-after"]}
