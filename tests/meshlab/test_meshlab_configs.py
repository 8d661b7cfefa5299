"""Every Envoy config the mesh lab renders passes `envoy --mode validate` (with the built .wasm
and this session's certificates), and has the pieces each topology promises."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from harness.procs import envoy_bin
from perf.meshlab import topologies
from perf.meshlab.lab import NODE_ADDRS

CASES = [(t, qps, conns) for t in topologies.ALL if t.key != "nomesh" for qps, conns in ((100, 10), (4000, 400))]


def _ids(c):
    return f"{c[0].key}-{c[0].throttle or 'none'}-{c[1]}"


def _rendered(topo, certs, tmp_path, qps=100, conns=10):
    return topologies.render(topo, tmp_path, certs, NODE_ADDRS, qps, conns)


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


@pytest.mark.integration
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_config_validates(case, certs, wasm, tmp_path):
    topo, qps, conns = case
    for node, name, cfg in _rendered(topo, certs, tmp_path, qps, conns):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        r = subprocess.run([envoy_bin(), "--mode", "validate", "-c", str(path), "--disable-hot-restart",
                            "--log-level", "warning"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{name} on {node}:\n{(r.stdout + r.stderr)[-3000:]}"
        assert "OK" in r.stdout + r.stderr


def test_sidecar_throttle_sits_in_the_server_sidecar_inbound(certs, tmp_path):
    proxies = {name: cfg for _, name, cfg in _rendered(topologies.Topology("sidecar", "below"), certs, tmp_path)}
    assert set(proxies) == {"sidecar-inbound", "sidecar-outbound"}
    assert _throttle_plugins(proxies["sidecar-outbound"]) == []
    (plugin,) = _throttle_plugins(proxies["sidecar-inbound"])
    assert '"rate": "50/s"' in plugin and '"burst": 0' in plugin
    inbound = proxies["sidecar-inbound"]["static_resources"]["listeners"][0]
    tls = inbound["filter_chains"][0]["transport_socket"]["typed_config"]
    assert tls["require_client_certificate"] is True
    sans = tls["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"]
    assert sans == [{"san_type": "URI", "matcher": {"exact": "spiffe://cluster.local/ns/default/sa/client"}}]


def test_throttle_above_offered_load_gets_a_burst_per_connection(certs, tmp_path):
    proxies = {name: cfg for _, name, cfg in
               _rendered(topologies.Topology("waypoint", "above"), certs, tmp_path, qps=1000, conns=100)}
    (plugin,) = _throttle_plugins(proxies["waypoint"])
    assert '"rate": "2000/s"' in plugin and '"burst": 100' in plugin
    assert _throttle_plugins(proxies["node-app"]) == _throttle_plugins(proxies["node-client"]) == []


def test_ambient_l4_has_no_http_filters_and_speaks_hbone(certs, tmp_path):
    proxies = {name: cfg for _, name, cfg in _rendered(topologies.Topology("ambient", ""), certs, tmp_path)}
    client = proxies["node-client"]["static_resources"]
    tunnel = client["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert tunnel["tunneling_config"]["hostname"] == f"{NODE_ADDRS['app']}:8080"
    (cluster,) = client["clusters"]
    assert cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == \
        {"socket_address": {"address": NODE_ADDRS["app"], "port_value": 15008}}
    assert "http2_protocol_options" in str(cluster["typed_extension_protocol_options"])
    assert cluster["transport_socket"]["typed_config"]["common_tls_context"]["alpn_protocols"] == ["h2"]
    inbound = proxies["node-app"]["static_resources"]["listeners"][0]
    hcm = inbound["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["codec_type"] == "HTTP2" and hcm["http2_protocol_options"]["allow_connect"] is True
    assert [f["name"] for f in hcm["http_filters"]] == ["envoy.filters.http.router"]
    assert all(_throttle_plugins(c) == [] for c in proxies.values())


def test_labels_say_the_node_proxies_are_not_ztunnel():
    for t in topologies.ALL:
        if t.key in ("ambient", "waypoint"):
            assert "(Envoy as HBONE node proxy, not ztunnel)" in t.label(100, 10)


def test_without_root_the_run_skips_with_a_clear_message(monkeypatch, capsys, tmp_path):
    from perf.meshlab import lab, run

    monkeypatch.setattr(lab.os, "geteuid", lambda: 1000)
    with pytest.raises(lab.LabUnavailable, match="need root"):
        lab.check_available()
    assert run.main(["--short", "--out", str(tmp_path)]) == 0
    assert "perf-mesh: SKIPPED: network namespaces need root" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_without_iproute2_the_run_names_it(monkeypatch):
    from perf.meshlab import lab

    monkeypatch.setattr(lab.shutil, "which", lambda name: None)
    with pytest.raises(lab.LabUnavailable, match="iproute2"):
        lab.check_available()


def test_check_flags_errors_and_unpaced_throttles():
    from perf.meshlab.run import check

    ok = {"case": "c", "label": "x", "run": 1, "throttle": "", "errors": 0, "achieved_qps": 99.5,
          "offered_qps": 100, "codes": {200: 995}, "rate": None}
    assert check([ok]) == []
    assert check([{**ok, "errors": 3, "codes": {200: 992, 503: 3}}])
    assert check([{**ok, "achieved_qps": 80.0}])
    paced = {**ok, "throttle": "below", "rate": 50, "achieved_qps": 50.1}
    assert check([paced]) == []
    assert check([{**paced, "achieved_qps": 99.0}])
