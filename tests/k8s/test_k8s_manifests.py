"""The shipped manifests, rendered by kustomize, pass the real validators:
kubeconform (strict, Kubernetes schemas from kubernetes-validate, Istio and
Gateway API CRD schemas from istioctl / the gateway-api module), `istioctl
validate` and `istioctl analyze` (Istio's own validation code, offline). And a
deliberately broken resource of each kind is rejected by the tool named in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.units import seconds as duration_s
from tests.support.k8s import KUSTOMIZATIONS, OVERLAYS, docs, kubeconform, plugin_configs, run

pytestmark = pytest.mark.k8s

BROKEN = sorted((Path(__file__).parent / "broken").glob("*.yaml"))


def test_overlays_exist():
    assert set(OVERLAYS) == {"nomesh", "sidecar", "sidecar-throttle", "sidecar-throttle-envoyfilter",
                             "sidecar-throttle-cluster", "ambient", "ambient-waypoint", "ambient-waypoint-throttle",
                             "ambient-waypoint-throttle-cluster"}


@pytest.mark.parametrize("k", KUSTOMIZATIONS)
def test_kubeconform_strict(k, tools, rendered, schemas):
    r = kubeconform(tools, schemas, [rendered[k]])
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"Valid: (\d+), Invalid: (\d+), Errors: (\d+), Skipped: (\d+)", r.stdout)
    assert m, r.stdout
    valid, invalid, errors, skipped = map(int, m.groups())
    assert (invalid, errors, skipped) == (0, 0, 0), r.stdout
    assert valid == len(docs(rendered[k]))


# istioctl gives every EnvoyFilter this warning (IST0133 in analyze): inherent to the API.
ENVOYFILTER_NOTE = "EnvoyFilter exposes internal implementation details that may change at any time"


def validate_problems(r) -> list[str]:
    """What `istioctl validate` reports, except the generic EnvoyFilter note. It reports some
    real errors (e.g. an EnvoyFilter patch value that is not a valid Envoy proto) only as
    warnings with exit code 0, so every reported line counts."""
    out = r.stdout + r.stderr
    lines = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("* ") or "Error" in ln]
    lines = [ln for ln in lines if ENVOYFILTER_NOTE not in ln]
    if r.returncode != 0 and not lines:
        lines = [f"exit code {r.returncode}"]
    lines += [ln for ln in out.splitlines() if "may not provide Istio metrics" in ln]
    return lines


def analyze_problems(r) -> list[str]:
    """Findings of `istioctl analyze` (any level), except the generic EnvoyFilter note."""
    out = r.stdout + r.stderr
    found = [ln for ln in out.splitlines() if re.match(r"^(Error|Warning|Info) \[IST\d+\]", ln)]
    found = [ln for ln in found if ENVOYFILTER_NOTE not in ln]
    if r.returncode != 0 and not found:
        found = [f"exit code {r.returncode}"]
    return found


@pytest.mark.parametrize("k", KUSTOMIZATIONS)
def test_istioctl_validate(k, tools, rendered):
    r = run([tools["istioctl"], "validate", "-f", str(rendered[k])])
    assert r.returncode == 0 and not validate_problems(r), r.stdout + r.stderr
    assert "is valid" in r.stdout + r.stderr or "has warnings" in r.stdout + r.stderr


@pytest.mark.parametrize("k", [f"k8s/overlays/{o}" for o in OVERLAYS])
def test_istioctl_analyze(k, tools, rendered):
    """Offline analysis of each overlay as a whole (references between resources): no
    finding at any level except the generic EnvoyFilter note."""
    r = run([tools["istioctl"], "analyze", "-A", "--use-kube=false", str(rendered[k])])
    assert r.returncode == 0 and not analyze_problems(r), r.stdout + r.stderr


# ---- broken fixtures: each names the tool that must reject it and the message it must give

def _header(path: Path, key: str) -> str:
    m = re.search(rf"^# {key}: (.+)$", path.read_text(), re.M)
    assert m, f"{path.name}: missing '# {key}:' header"
    return m.group(1).strip()


def test_a_broken_fixture_for_every_shipped_kind(rendered):
    shipped = {d["kind"] for f in rendered.values() for d in docs(f)}
    broken = {d["kind"] for f in BROKEN for d in docs(f)}
    assert shipped <= broken, f"no broken fixture for {sorted(shipped - broken)}"


@pytest.mark.parametrize("path", BROKEN, ids=[p.stem for p in BROKEN])
def test_broken_is_rejected(path, tools, schemas):
    tool, expect = _header(path, "rejected-by"), _header(path, "error")
    if tool == "kubeconform":
        r = kubeconform(tools, schemas, [path])
        rejected = r.returncode != 0
    elif tool == "istioctl-validate":
        r = run([tools["istioctl"], "validate", "-f", str(path)])
        rejected = bool(validate_problems(r))
    elif tool == "istioctl-analyze":
        r = run([tools["istioctl"], "analyze", "-A", "--use-kube=false", str(path)])
        rejected = r.returncode != 0 and bool(analyze_problems(r))
    else:
        raise AssertionError(f"{path.name}: unknown tool {tool}")
    out = r.stdout + r.stderr
    assert rejected, f"{tool} accepted {path.name}:\n{out}"
    assert expect in out, f"{tool} rejected {path.name} but without {expect!r}:\n{out}"


# ---- what the overlays must say (deployment topology of the comparison)

def _by_kind(path: Path, kind: str) -> list[dict]:
    return [d for d in docs(path) if d["kind"] == kind]


def _ns_labels(path: Path) -> dict:
    (ns,) = [d for d in _by_kind(path, "Namespace") if d["metadata"]["name"] == "bookinfo"]
    return ns["metadata"].get("labels", {})


@pytest.mark.parametrize("overlay, labels", [
    ("nomesh", {}),
    ("sidecar", {"istio-injection": "enabled"}),
    ("ambient", {"istio.io/dataplane-mode": "ambient"}),
    ("ambient-waypoint", {"istio.io/dataplane-mode": "ambient", "istio.io/use-waypoint": "waypoint"}),
])
def test_mesh_mode_labels(overlay, labels, rendered):
    got = _ns_labels(rendered[f"k8s/overlays/{overlay}"])
    assert {k: v for k, v in got.items() if k.startswith(("istio", "kubernetes.io/metadata"))} == labels


def _keyed(path: Path) -> dict[tuple[str, str, str], dict]:
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs(path)}


@pytest.mark.parametrize("with_t, without", [
    ("sidecar-throttle", "sidecar"), ("sidecar-throttle-envoyfilter", "sidecar"),
    ("sidecar-throttle-cluster", "sidecar"),
    ("ambient-waypoint-throttle", "ambient-waypoint"), ("ambient-waypoint-throttle-cluster", "ambient-waypoint"),
])
def test_throttle_overlays_add_only_istio_resources_and_the_engine(with_t, without, rendered):
    """A throttle overlay is its mesh overlay plus Istio resources, and for cluster scope the
    engine (k8s/engine) exactly as it renders alone: nothing of Bookinfo changes."""
    a = _keyed(rendered[f"k8s/overlays/{with_t}"])
    b = _keyed(rendered[f"k8s/overlays/{without}"])
    assert all(a[k] == b[k] for k in b), f"{with_t} changes resources of {without}"
    engine = _keyed(rendered["k8s/engine"]) if with_t.endswith("-cluster") else {}
    assert all(a.get(k) == engine[k] for k in engine), f"{with_t} changes resources of k8s/engine"
    added = {k[0] for k in set(a) - set(b) - set(engine)}
    assert added and added <= {"WasmPlugin", "EnvoyFilter", "VirtualService", "HTTPRoute"}, added


def test_waypoint_gateway(rendered):
    (gw,) = _by_kind(rendered["k8s/overlays/ambient-waypoint"], "Gateway")
    assert gw["spec"]["gatewayClassName"] == "istio-waypoint"
    assert gw["metadata"]["name"] == _ns_labels(rendered["k8s/overlays/ambient-waypoint"])["istio.io/use-waypoint"]
    for o in ("ambient-waypoint-throttle", "ambient-waypoint-throttle-cluster"):
        for wp in _by_kind(rendered[f"k8s/overlays/{o}"], "WasmPlugin"):
            assert "selector" not in wp["spec"] and wp["spec"]["targetRefs"], (o, wp["metadata"]["name"])


def test_bookinfo_topology(rendered):
    """2 replicas on different nodes, on server nodes; Fortio only on client nodes, never next to Bookinfo."""
    deps = _by_kind(rendered["k8s/overlays/nomesh"], "Deployment")
    apps = [d for d in deps if d["metadata"]["name"] != "fortio"]
    assert {d["metadata"]["labels"]["app"] for d in apps} == {"productpage", "details", "reviews", "ratings"}
    for d in apps:
        spec = d["spec"]["template"]["spec"]
        assert d["spec"]["replicas"] == 2
        anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert anti["topologyKey"] == "kubernetes.io/hostname"
        assert anti["labelSelector"]["matchLabels"] == d["spec"]["selector"]["matchLabels"]
        node = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert node["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["server"]
        (c,) = spec["containers"]
        assert re.fullmatch(r"docker\.io/istio/examples-bookinfo-[a-z]+-v\d:\d+\.\d+\.\d+", c["image"]), c["image"]
    (fortio,) = [d for d in deps if d["metadata"]["name"] == "fortio"]
    spec = fortio["spec"]["template"]["spec"]
    node = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert node["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["client"]
    anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert set(anti["labelSelector"]["matchExpressions"][0]["values"]) == {"productpage", "details", "reviews",
                                                                           "ratings"}
    assert re.fullmatch(r"docker\.io/fortio/fortio:\d+\.\d+\.\d+", spec["containers"][0]["image"])


def test_timeouts_exceed_max_queue_delay(rendered):
    """Every route timeout shipped with the throttle is longer than the longest max_queue_delay."""
    longest = max(duration_s(r.get("max_queue_delay", "1s")) for _, _, cfg in plugin_configs() for r in cfg["rules"])
    for o in [o for o in OVERLAYS if "throttle" in o]:
        f = rendered[f"k8s/overlays/{o}"]
        timeouts = [h["timeout"] for vs in _by_kind(f, "VirtualService") for h in vs["spec"]["http"]]
        timeouts += [r["timeouts"]["request"] for hr in _by_kind(f, "HTTPRoute") for r in hr["spec"]["rules"]]
        assert timeouts, o
        assert all(duration_s(t) > longest for t in timeouts), (o, timeouts, longest)


def test_class_headers_are_set_by_a_trusted_hop(rendered):
    """Safe defaults of priority classes (filters/throttle/README.md "Priority classes"): a class
    that matches on a header is claimable only because a VirtualService shipped beside it sets
    that header on some routes and removes it on every other route of the service, so no client
    can promote itself; a class on the caller's principal needs no such hop. The timeouts of
    those routes exceed every class's max_queue_delay."""
    checked = 0
    for k, where, cfg in plugin_configs():
        header_classes = {(h, v) for r in cfg["rules"] for c in r.get("classes", [])
                          for h, v in (c.get("match") or {}).get("headers", {}).items()}
        if not header_classes:
            continue
        vss = _by_kind(rendered[k], "VirtualService")
        assert vss, f"{where}: classes match on headers {header_classes} but no VirtualService sets them"
        longest = max(duration_s(c.get("max_queue_delay", r.get("max_queue_delay", "1s")))
                      for r in cfg["rules"] for c in r.get("classes", []))
        for name, value in header_classes:
            routes = [h for vs in vss for h in vs["spec"]["http"]]
            sets = [h for h in routes if h.get("headers", {}).get("request", {}).get("set", {}).get(name) == value]
            removes = [h for h in routes if name in h.get("headers", {}).get("request", {}).get("remove", [])]
            assert sets, f"{where}: no route sets {name}: {value}"
            assert all(h.get("match") for h in sets), f"{where}: {name} is set for every caller"
            assert len(sets) + len(removes) == len(routes), f"{where}: a route passes a client's {name} through"
            assert all(duration_s(h["timeout"]) > longest for h in routes), (where, longest)
            checked += 1
    assert checked, "no shipped plugin with a header class"
