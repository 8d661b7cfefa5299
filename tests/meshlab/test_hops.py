"""The per-hop check (perf/meshlab/hops.py) on synthetic counter snapshots: it passes when every
hop's counters grew, and names the hop when one did not (the check can fail)."""

from __future__ import annotations

import copy

import pytest

from perf.meshlab import hops, topologies

N = 100
EDGES = topologies.edges("productpage")


def _snapshots(mode: str, n: int = N) -> tuple[dict, dict]:
    """Before/after snapshots as a complete run of n pages in `mode` leaves them."""
    services = ("productpage", "details", "reviews", "ratings")
    before = {"apps": {s: {"requests": 7, "from_loopback": 0 if mode == "nomesh" else 7} for s in services},
              "proxies": {}}
    after = {"apps": {s: {"requests": 7 + n, "from_loopback": 0 if mode == "nomesh" else 7 + n} for s in services},
             "proxies": {}}
    for src, dst in EDGES:
        if mode == "sidecar":
            out = f"cluster.{hops.outbound_cluster_name(dst)}.upstream_rq_total"
            inb = f"http.{hops.INBOUND_STAT}.downstream_rq_total"
            before["proxies"].setdefault(f"sidecar-{src}", {})[out] = 3
            after["proxies"].setdefault(f"sidecar-{src}", {})[out] = 3 + n
            before["proxies"].setdefault(f"sidecar-{dst}", {})[inb] = 3
            after["proxies"].setdefault(f"sidecar-{dst}", {})[inb] = 3 + n
        elif mode in ("ambient", "waypoint", "waypoints"):
            for name, stat, grow in ((f"node-{src}", f"tcp.outbound_{dst}.downstream_cx_total", 0),
                                     (f"node-{src}", f"tcp.outbound_{dst}.downstream_cx_rx_bytes_total", 90 * n),
                                     (f"node-{dst}", "http.inbound_hbone.downstream_rq_total", 0),
                                     (f"node-{dst}", "cluster.inbound_app.upstream_cx_tx_bytes_total", 90 * n)):
                before["proxies"].setdefault(name, {})[stat] = 2
                after["proxies"].setdefault(name, {})[stat] = 2 + grow
            if mode in ("waypoint", "waypoints") and dst == "productpage":
                # One waypoint carries all; two replicas 70/30 (each counts its own).
                shares = {"waypoint": 1.0} if mode == "waypoint" else {"waypoint-0": 0.7, "waypoint-1": 0.3}
                for wp, share in shares.items():
                    m = round(share * n)
                    for stat, a, b in ((f"http.{hops.INBOUND_STAT}.downstream_rq_total", 5, 5 + m),
                                       (f"cluster.{hops.waypoint_cluster_name(dst)}.upstream_rq_total", 5, 5 + m),
                                       ("cluster.connect_originate;.upstream_rq_total", 2, 2),
                                       ("cluster.connect_originate;.upstream_cx_tx_bytes_total", 0, 90 * m)):
                        before["proxies"].setdefault(wp, {})[stat] = a
                        after["proxies"].setdefault(wp, {})[stat] = b
    return before, after


@pytest.mark.parametrize("mode", ["nomesh", "sidecar", "ambient", "waypoint", "waypoints"])
def test_a_complete_run_passes(mode):
    before, after = _snapshots(mode)
    assert hops.check(mode, "productpage", before, after, N) == []


def test_edges_follow_the_call_graph():
    assert EDGES == [("client", "productpage"), ("productpage", "details"), ("productpage", "reviews"),
                     ("reviews", "ratings")]
    assert topologies.edges("details") == [("client", "details")]


def test_a_missing_sidecar_hop_is_named():
    before, after = _snapshots("sidecar")
    after["proxies"]["sidecar-productpage"][f"cluster.{hops.outbound_cluster_name('details')}.upstream_rq_total"] = 3
    problems = hops.check("sidecar", "productpage", before, after, N)
    assert len(problems) == 1 and problems[0].startswith("hop productpage -> details (caller's sidecar outbound)")


def test_a_proxy_without_the_counter_is_named():
    before, after = _snapshots("sidecar")
    del after["proxies"]["sidecar-ratings"]
    (problem,) = hops.check("sidecar", "productpage", before, after, N)
    assert "hop reviews -> ratings (callee's sidecar inbound): sidecar-ratings has no counter" in problem


def test_a_call_that_bypassed_the_mesh_is_named():
    """The app served its requests, but not through its local proxy: the call went straight to it."""
    before, after = _snapshots("ambient")
    after["apps"]["details"]["from_loopback"] = 7
    after["proxies"]["node-productpage"]["tcp.outbound_details.downstream_cx_rx_bytes_total"] = 2
    problems = hops.check("ambient", "productpage", before, after, N)
    assert any("hop productpage -> details" in p and "bypassed the mesh" in p for p in problems), problems
    assert any("node-productpage tcp.outbound_details.downstream_cx_rx_bytes_total grew by 0" in p for p in problems)
    assert all("productpage -> details" in p for p in problems), problems


def test_pooled_tunnels_count_as_totals_but_traffic_must_grow():
    before, after = _snapshots("waypoint")
    assert hops.check("waypoint", "productpage", before, after, N) == []  # tunnels made before the run
    after["proxies"]["waypoint"][f"http.{hops.INBOUND_STAT}.downstream_rq_total"] = 5 + N - 1
    (problem,) = hops.check("waypoint", "productpage", before, after, N)
    assert "waypoint HCM" in problem and f"expected >= {N}" in problem
    fresh = copy.deepcopy(after)
    fresh["proxies"]["node-details"]["http.inbound_hbone.downstream_rq_total"] = 0
    assert any("node-details http.inbound_hbone.downstream_rq_total grew by 0, expected >= 1" in p
               for p in hops.check("waypoint", "productpage", before, fresh, N))


def test_without_a_mesh_a_request_from_loopback_is_a_problem():
    before, after = _snapshots("nomesh")
    after["apps"]["reviews"]["from_loopback"] = 1
    (problem,) = hops.check("nomesh", "productpage", before, after, N)
    assert "reviews got 1 requests from loopback without a mesh" in problem


def test_a_service_that_served_too_few_is_named():
    before, after = _snapshots("nomesh")
    after["apps"]["ratings"]["requests"] = 7 + N - 10
    (problem,) = hops.check("nomesh", "productpage", before, after, N)
    assert problem == f"hop reviews -> ratings: ratings served {N - 10} requests, expected >= {N}"



def test_waypoint_replicas_are_checked_together():
    """With two waypoint replicas the requests are counted over both: one replica carrying all of
    them passes (few connections may land on one), and too few over both is named."""
    one, _ = _snapshots("waypoint")
    before, after = _snapshots("waypoints")
    growth = {k: v - one["proxies"]["waypoint"][k] for k, v in _snapshots("waypoint")[1]["proxies"]["waypoint"].items()}
    after["proxies"]["waypoint-0"] = {k: v + growth[k] for k, v in before["proxies"]["waypoint-0"].items()}
    after["proxies"]["waypoint-1"] = dict(before["proxies"]["waypoint-1"])
    assert hops.check("waypoints", "productpage", before, after, N) == []
    stat = f"http.{hops.INBOUND_STAT}.downstream_rq_total"
    after["proxies"]["waypoint-0"][stat] -= 1
    (problem,) = hops.check("waypoints", "productpage", before, after, N)
    assert "waypoint-0 + waypoint-1" in problem and "(waypoint HCM)" in problem, problem
