"""The lab itself (root + `ip netns` + iptables): namespaces are created with the run's own prefix,
joined by veth, and always removed, also when the body fails; the Bookinfo-shaped application runs
in them; each topology carries every hop of the fan-out the way it promises (capture by iptables,
istiod's sidecars with mutual TLS, HBONE, istiod's waypoint), the hop check catches a call that
bypasses the mesh, and the throttle (a WasmPlugin) paces."""

from __future__ import annotations

import subprocess

import pytest

from harness import fortio, netns
from perf.bookinfo.services import PATHS
from perf.meshlab import hops, run, topologies
from perf.meshlab.lab import NODE_ADDRS, BookinfoApp, Lab
from perf.meshlab.run import fortio_load, snapshot

pytestmark = pytest.mark.lab
Topology = topologies.Topology


def _netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_lab_creates_only_its_own_namespaces_and_removes_them(runtimes_ok):
    before = set(_netns())
    with Lab() as lab:
        mine = set(_netns()) - before
        assert mine == {f"{lab.prefix}{n}" for n in ("sw", "client", "productpage", "details", "reviews", "ratings",
                                                     "waypoint", "waypoint2")}
        app = BookinfoApp(lab).start()
        assert lab["client"].can_connect(NODE_ADDRS["productpage"], BookinfoApp.PORT)
        # The lab's addresses and links exist only inside its namespaces, not in the host's.
        host_addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        assert "10.254.7." not in host_addrs
        host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert "p1-client" not in host_links and "br0" not in host_links
        procs = list(app.procs.values())
    assert set(_netns()) == before
    assert not list(netns.NETNS_ETC.glob(f"{lab.prefix}*")), "a namespace's /etc/netns files were left"
    assert all(p.poll() is not None for p in procs), "a service still runs after teardown"


def test_lab_is_removed_when_the_body_fails():
    before = set(_netns())
    with pytest.raises(RuntimeError, match="boom"), Lab(nodes=("client",)):
        assert len(set(_netns()) - before) == 2
        raise RuntimeError("boom")
    assert set(_netns()) == before


def _load(lab, dep, tmp_path, qps=20, conns=2, seconds=2.0) -> tuple[dict, dict, fortio.Result]:
    """Load through a deployed topology; (before, after, Fortio summary)."""
    lab.app.reset_pools()
    fortio_load(lab, dep.url, qps, conns, True, 0.5)
    before = snapshot(lab.app, dep)
    s = fortio_load(lab, dep.url, qps, conns, True, seconds)
    return before, snapshot(lab.app, dep), s


@pytest.mark.parametrize("topo", [t for t in topologies.ALL if not t.throttle], ids=lambda t: t.key)
def test_each_topology_carries_every_hop_of_the_fan_out(lab, lab_certs, topo, tmp_path):
    dep = topologies.deploy(lab, topo, "productpage", lab_certs, 20, 2)
    try:
        before, after, s = _load(lab, dep, tmp_path)
    finally:
        dep.stop()
    assert s.errors == 0 and s.requests >= 20, s
    assert hops.check(topo.key, "productpage", before, after, s.requests) == []


def test_capture_is_an_iptables_redirect_in_the_callers_namespaces(lab, lab_certs):
    dep = topologies.deploy(lab, Topology("ambient", ""), "productpage", lab_certs, 20, 2)
    try:
        assert {n: lab[n].captured() for n in ("client", "productpage", "details", "reviews", "ratings")} == {
            "client": True, "productpage": True, "details": False, "reviews": True, "ratings": False}
        rules = lab["client"].run(["iptables", "-t", "nat", "-S", "OUTPUT"], timeout=10).stdout
        assert "-d 10.254.7.0/24 -p tcp -m tcp --dport 9080 -j REDIRECT --to-ports 15001" in rules
    finally:
        dep.stop()
    assert not any(lab[n].captured() for n in ("client", "productpage", "reviews"))


def test_the_hop_check_fails_when_a_call_bypasses_the_mesh(lab, lab_certs, tmp_path):
    """Without productpage's capture rule, its calls go straight to details and reviews: the load
    still succeeds, and the hop check names exactly those two hops."""
    dep = topologies.deploy(lab, Topology("ambient", ""), "productpage", lab_certs, 20, 2)
    try:
        lab["productpage"].uncapture()
        before, after, s = _load(lab, dep, tmp_path)
    finally:
        dep.stop()
    assert s.errors == 0, s
    problems = hops.check("ambient", "productpage", before, after, s.requests)
    assert problems, "the check passed although productpage's calls bypassed the mesh"
    hops_named = {p.split(":")[0].split(" (")[0] for p in problems}
    assert hops_named == {"hop productpage -> details", "hop productpage -> reviews"}, problems
    assert any("bypassed the mesh" in p for p in problems)


def test_sidecar_inbound_takes_only_mutual_tls_from_the_meshs_ca(lab, lab_certs, certs):
    """istiod's sidecars under the lab's PeerAuthentication STRICT: details' port answers a client
    presenting a certificate of the mesh's CA (ALPN `istio-http/1.1`, as a sidecar sends), and
    refuses plaintext and a certificate of another CA."""
    dep = topologies.deploy(lab, Topology("sidecar", ""), "productpage", lab_certs, 20, 2)
    try:
        lab.app.reset_pools()
        # From the control plane's node: not in the mesh, so not captured by a sidecar.
        plain = lab["cp"].run(["python3", "-c", TLS_GET, "", "", "", NODE_ADDRS["details"], "9080"], timeout=30)
        assert "HTTP/1.1 200" not in plain.stdout, plain.stdout
        assert "HTTP/1.1 200" not in _tls_get(lab, certs["productpage"], "details")  # another CA
        assert _tls_get(lab, lab_certs["productpage"], "details").startswith("HTTP/1.1 200")
    finally:
        dep.stop()


TLS_GET = """
import socket, ssl, sys
try:
    with socket.create_connection((sys.argv[4], int(sys.argv[5])), timeout=5) as raw:
        if sys.argv[1]:
            ctx = ssl.create_default_context(cafile=sys.argv[3])
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["istio-http/1.1"])
            ctx.load_cert_chain(sys.argv[1], sys.argv[2])
            s = ctx.wrap_socket(raw)
        else:
            s = raw
        s.sendall(b"GET /details/0 HTTP/1.1\\r\\nHost: details\\r\\nConnection: close\\r\\n\\r\\n")
        print(s.recv(4096).decode(errors="replace"))
except (OSError, ssl.SSLError) as e:
    print("refused:", e)
"""


def _tls_get(lab, ident: dict, service: str) -> str:
    r = lab["cp"].run(["python3", "-c", TLS_GET, ident["cert"], ident["key"], ident["ca"], NODE_ADDRS[service],
                       "9080"], timeout=30)
    return r.stdout


@pytest.mark.parametrize("key", ["sidecar", "waypoint", "waypoints"])
def test_throttle_below_offered_load_paces_to_its_rate(lab, lab_certs, key, tmp_path):
    """50/s under 100/s offered; with 2 waypoint replicas in cluster scope, 50/s for both together
    (in process scope they would admit 100/s), measured after the warm-up the runs give a
    cluster-scope rule (run.CLUSTER_WARMUP_S: its first seconds refuse some requests)."""
    topo = Topology(key, "below")
    dep = topologies.deploy(lab, topo, "details", lab_certs, 100, 10)
    names = {"sidecar": ["sidecar-details"], "waypoint": ["waypoint"], "waypoints": ["waypoint-0", "waypoint-1"]}[key]
    try:
        lab.app.reset_pools()
        if topo.cluster_scope:
            fortio_load(lab, dep.url, 100, 10, True, run.CLUSTER_WARMUP_S)
        s = fortio_load(lab, dep.url, 100, 10, True, 3)
        stats: dict[str, int] = {}
        for name in names:
            for k, v in dep.proxy(name).stats_matching(r"^wasmcustom\.throttle\.rule\.default\.").items():
                stats[k] = stats.get(k, 0) + v
    finally:
        dep.stop()
    assert dep.url.endswith(PATHS["details"])
    assert s.errors == 0, s.codes
    # The rate is 50/s and Fortio offers 100/s; 3 s runs see Fortio's start: +-20%.
    assert 40 <= s.qps <= 60, s
    assert stats["wasmcustom.throttle.rule.default.queued"] > 0, stats
    assert s.ms(50) > 50, s  # requests waited in the queue
