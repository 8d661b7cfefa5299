"""Every Envoy config the mesh lab writes by hand (the ambient node proxies; sidecars and the waypoint
come from istiod) passes `envoy --mode validate` with this session's certificates, and has the
pieces each topology promises; the run's pure parts (scale factor, cases, checks, the study's
figures) behave."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from harness.procs import envoy_bin
from perf.meshlab import run, study_data, topologies
from perf.meshlab.lab import NODE_ADDRS

Topology = topologies.Topology
CASES = [(t, target) for t in topologies.ALL if t.key in ("ambient", "waypoint", "waypoints") and not t.throttle
         for target in ("details", "productpage")]
# Service addresses as the API server would give them (the waypoint's node proxies route by them).
VIPS = {"productpage": "10.96.0.20", "details": "10.96.0.30", "reviews": "10.96.0.40", "ratings": "10.96.0.50"}


def _ids(c):
    return f"{c[0].key}-{c[1]}"


def _rendered(topo, certs, tmp_path, target="productpage"):
    return {name: (node, cfg) for node, name, cfg in
            topologies.render(topo, target, tmp_path, certs, NODE_ADDRS, VIPS)}


def _walk(node):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _throttle_plugins(cfg):
    return [n["typed_config"]["config"]["configuration"]["value"] for n in _walk(cfg)
            if n.get("name") == "throttle" and "typed_config" in n]


def _listener(cfg, name):
    return next(lst for lst in cfg["static_resources"]["listeners"] if lst["name"] == name)


@pytest.mark.integration
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_config_validates(case, certs, tmp_path):
    topo, target = case
    for name, (node, cfg) in _rendered(topo, certs, tmp_path, target).items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        r = subprocess.run([envoy_bin(), "--mode", "validate", "-c", str(path), "--disable-hot-restart",
                            "--log-level", "warning"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{name} on {node}:\n{(r.stdout + r.stderr)[-3000:]}"
        assert "OK" in r.stdout + r.stderr


def test_a_details_case_deploys_only_what_it_crosses(certs, tmp_path):
    assert set(_rendered(Topology("ambient", ""), certs, tmp_path, "details")) == {"node-client", "node-details"}
    # The waypoint itself comes from istiod; nothing of a sidecar is written by hand.
    assert set(_rendered(Topology("waypoint", ""), certs, tmp_path, "details")) == {"node-client", "node-details"}
    assert _rendered(Topology("sidecar", ""), certs, tmp_path, "details") == {}


def test_ambient_node_proxies_capture_by_original_destination_and_speak_hbone(certs, tmp_path):
    proxies = _rendered(Topology("ambient", ""), certs, tmp_path)
    assert set(proxies) == {f"node-{n}" for n in ("client", "productpage", "details", "reviews", "ratings")}
    pp = proxies["node-productpage"][1]
    cap = _listener(pp, "outbound_capture")
    assert cap["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 15001}
    assert [f["name"] for f in cap["listener_filters"]] == ["envoy.filters.listener.original_dst"]
    chains = {c["filter_chain_match"]["prefix_ranges"][0]["address_prefix"]: c for c in cap["filter_chains"]}
    assert set(chains) == {NODE_ADDRS["details"], NODE_ADDRS["reviews"]}
    tunnel = chains[NODE_ADDRS["details"]]["filters"][0]["typed_config"]
    assert tunnel["tunneling_config"]["hostname"] == f"{NODE_ADDRS['details']}:9080"
    cluster = next(c for c in pp["static_resources"]["clusters"] if c["name"] == "hbone_details")
    assert cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == \
        {"socket_address": {"address": NODE_ADDRS["details"], "port_value": 15008}}
    assert "http2_protocol_options" in str(cluster["typed_extension_protocol_options"])
    assert cluster["transport_socket"]["typed_config"]["common_tls_context"]["alpn_protocols"] == ["h2"]
    hcm = _listener(pp, "inbound_hbone")["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["codec_type"] == "HTTP2" and hcm["http2_protocol_options"]["allow_connect"] is True
    assert [f["name"] for f in hcm["http_filters"]] == ["envoy.filters.http.router"]
    assert all(_throttle_plugins(c) == [] for _, c in proxies.values())
    # The client node only sends; the leaves only receive.
    assert [x["name"] for x in proxies["node-client"][1]["static_resources"]["listeners"]] == ["outbound_capture"]
    assert [x["name"] for x in proxies["node-ratings"][1]["static_resources"]["listeners"]] == ["inbound_hbone"]


def test_waypoint_topology_sends_the_targets_service_to_the_waypoint(certs, tmp_path):
    """With a waypoint, calls to the loaded Service's address become HBONE to the waypoint, the
    tunnel's :authority naming that address (what istiod's waypoint routes by); productpage's own
    calls (to details and reviews) go node to node."""
    proxies = _rendered(Topology("waypoint", ""), certs, tmp_path, "productpage")
    client = proxies["node-client"][1]
    (chain,) = _listener(client, "outbound_capture")["filter_chains"]
    assert chain["filter_chain_match"]["prefix_ranges"] == [{"address_prefix": VIPS["productpage"], "prefix_len": 32}]
    assert chain["filters"][0]["typed_config"]["tunneling_config"]["hostname"] == f"{VIPS['productpage']}:9080"
    (cluster,) = [c for c in client["static_resources"]["clusters"] if c["name"] == "hbone_productpage"]
    assert cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"] == {"address": NODE_ADDRS["waypoint"], "port_value": 15008}
    tls = cluster["transport_socket"]["typed_config"]["common_tls_context"]
    assert tls["tls_params"]["tls_minimum_protocol_version"] == "TLSv1_3"
    assert tls["validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "URI", "matcher": {"exact": certs["waypoint"]["san"]}}]
    pp_clusters = {c["name"]: c for c in proxies["node-productpage"][1]["static_resources"]["clusters"]}
    assert pp_clusters["hbone_details"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"][
        "address"]["socket_address"]["address"] == NODE_ADDRS["details"]
    with pytest.raises(ValueError, match="vips"):
        topologies.render(Topology("waypoint", ""), "productpage", tmp_path, certs, NODE_ADDRS)


def test_the_replicated_waypoint_takes_both_replicas_and_the_rule_in_cluster_scope(certs, tmp_path):
    """With 2 waypoint replicas, the callers' node proxies send the target's Service to both (taken in
    turn per connection), each checked for the waypoint's identity; the throttle's rule is the
    shipped cluster-scope one (the engine's cluster, one rate for the Service)."""
    proxies = _rendered(Topology("waypoints", ""), certs, tmp_path, "productpage")
    client = proxies["node-client"][1]
    (cluster,) = [c for c in client["static_resources"]["clusters"] if c["name"] == "hbone_productpage"]
    hosts = [e["endpoint"]["address"]["socket_address"]["address"]
             for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert hosts == [NODE_ADDRS["waypoint"], NODE_ADDRS["waypoint2"]]
    assert cluster["transport_socket"]["typed_config"]["common_tls_context"]["validation_context"][
        "match_typed_subject_alt_names"] == [{"san_type": "URI", "matcher": {"exact": certs["waypoint"]["san"]}}]
    below = Topology("waypoints", "below")
    rate = below.rate(40)
    assert rate == 20
    cfg = topologies.plugin(rate, below.burst(4), cluster=below.cluster_scope)
    (rule,) = cfg["rules"]
    assert cfg["engine"]["cluster"] == "outbound|8080||ratelimit.throttle-engine.svc.cluster.local"
    assert (rule["scope"], rule["rate"], rule["expected_replicas"]) == ("cluster", "20/s", topologies.WAYPOINT_REPLICAS)
    assert topologies.plugin(20, 0) == {"rules": [{"name": "default", "rate": "20/s", "burst": 0,
                                                   "max_queue_delay": "1s"}]}
    assert "productpage's 2 waypoints, cluster scope 20/s (below offered)" in below.label(40, 4, "productpage")


def test_labels_say_the_node_proxies_are_not_ztunnel():
    for t in topologies.ALL:
        if t.key in ("ambient", "waypoint", "waypoints"):
            assert "(Envoy as HBONE node proxy, not ztunnel)" in t.label(100, 10)


def test_scale_factor_keeps_the_study_shapes_below_saturation():
    assert run.scale_factor(1000.0) == 0.2    # 4000 x 0.2 = 800 = 0.8 x 1000
    assert run.scale_factor(140.0) == 0.02    # 0.028 rounded down to whole connections per 100
    assert run.scale_factor(10.0) == 0.01     # never below one connection for the smaller shape
    small, large = run.productpage_cases(0.02)
    assert (small.qps, small.conns, large.qps, large.conns) == (20, 2, 80, 8)
    assert small.scale == "x0.02 of the study's 1000 RPS / 100 connections"
    assert "(study's 4000/400 x 0.02)" in large.name


def test_study_figures_match_the_cases():
    _details, _close = run.DETAILS_CASES
    assert study_data.study_for({"target": "details", "keepalive": True}) is study_data.DETAILS_KEEPALIVE
    assert study_data.study_for({"target": "details", "keepalive": False}) is study_data.DETAILS_CLOSE
    _small, large = run.productpage_cases(0.03)
    assert study_data.study_for({"target": "productpage", "keepalive": True, "scale": large.scale}) is \
        study_data.PRODUCTPAGE[(4000, 400)]
    nm = study_data.median_row(study_data.DETAILS_KEEPALIVE["no mesh"])
    assert nm == {"avg": 0.76, "p50": 0.58, "p75": 0.70, "p90": 0.81, "p99": 1.56}
    assert study_data.URL.startswith("https://cncf.io/blog/2024/08/23/ambient-mesh")


def test_ztunnel_memory_estimate_replaces_only_node_proxies():
    from perf.meshlab.report import ztunnel_rss_estimate

    assert ztunnel_rss_estimate({"node-client": 66.0, "node-details": 70.0, "waypoint": 80.0}) == 17.0 + 17.0 + 80.0


def test_without_root_the_run_skips_with_a_clear_message(monkeypatch, capsys, tmp_path):
    from perf.meshlab import lab

    monkeypatch.setattr(lab.os, "geteuid", lambda: 1000)
    with pytest.raises(lab.LabUnavailable, match="need root"):
        lab.check_available()
    assert run.main(["--short", "--out", str(tmp_path)]) == 0
    assert "perf-mesh: SKIPPED: network namespaces need root" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("tool,says", [("ip", "iproute2"), ("iptables", "make tool-iptables")])
def test_without_a_tool_the_run_names_it(monkeypatch, tool, says):
    from perf.meshlab import lab

    real = lab.shutil.which
    monkeypatch.setattr(lab.shutil, "which", lambda name: None if name == tool else real(name) or f"/bin/{name}")

    def path(name: str) -> str:  # the tool table's lookup, as on a machine without iptables set up
        if name == tool:
            raise FileNotFoundError(f"{name} is not installed in this checkout: run `make tool-{name}`")
        return f"/bin/{name}"
    monkeypatch.setattr(lab.tools, "path", path)
    monkeypatch.setattr(lab.os, "geteuid", lambda: 0)  # the tools are checked for root, too
    with pytest.raises(lab.LabUnavailable, match=says):
        lab.check_available()


def test_check_flags_errors_unpaced_throttles_and_missing_hops():
    ok = {"case": "c", "label": "x", "run": 1, "throttle": "", "errors": 0, "achieved_qps": 99.5,
          "offered_qps": 100, "codes": {200: 995}, "rate": None, "hop_problems": []}
    assert run.check([ok]) == []
    assert run.check([{**ok, "errors": 3, "codes": {200: 992, 503: 3}}])
    assert run.check([{**ok, "achieved_qps": 80.0}])
    assert run.check([{**ok, "hop_problems": ["hop a -> b: missing"]}]) == ["c | x (run 1): hop a -> b: missing"]
    paced = {**ok, "throttle": "below", "rate": 50, "achieved_qps": 50.1, "throttle_stats": {"queued": 40}}
    assert run.check([paced]) == []
    assert run.check([{**paced, "achieved_qps": 99.0}])
    assert run.check([{**paced, "throttle_stats": {"queued": 0}}]) == [
        "c | x (run 1): the throttle held no request (queued = 0) below the offered load"]


# A throttle below the load paces the answers 200 at its rate; a cluster-scope rule may refuse at
# arrival up to half of the requests (the line's reckoning, engine/README.md), process scope none.
def _paced_row(*, cluster: bool, ok: int, refused: int, rate: float = 10.0, duration_s: float = 4.0) -> dict:
    requests = ok + refused
    return {"case": "ci", "label": "waypoints" if cluster else "waypoint", "run": 1, "throttle": "below",
            "cluster_scope": cluster, "rate": rate, "offered_qps": 20, "requests": requests,
            "achieved_qps": requests / duration_s, "errors": refused, "codes": {200: ok, 429: refused},
            "hop_problems": [], "throttle_stats": {"queued": ok}}


def test_cluster_scope_may_refuse_at_arrival_within_half() -> None:
    assert run.check([_paced_row(cluster=True, ok=40, refused=15)]) == []


def test_cluster_scope_refusing_more_than_half_fails() -> None:
    problems = run.check([_paced_row(cluster=True, ok=40, refused=41)])
    assert any("answered 429 at the cluster rule" in p for p in problems), problems


def test_process_scope_may_not_refuse() -> None:
    problems = run.check([_paced_row(cluster=False, ok=40, refused=1)])
    assert any("errors" in p for p in problems), problems


def test_the_paced_rate_is_that_of_the_answers_200() -> None:
    problems = run.check([_paced_row(cluster=True, ok=60, refused=2)])  # 15/s answered 200 for a 10/s rule
    assert any("answered 200 with the throttle at 10.0/s" in p for p in problems), problems
