"""What an operator meets on a first `kubectl apply -k`: the throttle overlays name one image,
set in one place (istio/image/image.env), and refuse to build until it is set, so a first apply
cannot point Istio at an image nobody pushed (which, with a fail-closed strategy, makes every
request 403). The docs next to the apply commands say what must be done before (node labels,
the image), and agree with the manifests on the details an operator acts on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.k8s import (
    KUSTOMIZATIONS,
    OVERLAYS,
    PLUGIN_KUSTOMIZATIONS,
    ROOT,
    TEST_ENGINE_DIGEST,
    TEST_IMAGE_URL,
    configured_copy,
    docs,
    run,
)
from tests.support.repo import files as repo_files
from tools import engine_image, wasm_image

pytestmark = pytest.mark.k8s

THROTTLE_OVERLAYS = [f"k8s/overlays/{o}" for o in OVERLAYS if "throttle" in o]
# The kustomizations that deploy the engine (k8s/engine): they also need the rate limit
# service's digest (k8s/engine/image.env, tools/engine_image.py).
ENGINE_KUSTOMIZATIONS = ["k8s/engine"] + [f"k8s/overlays/{o}" for o in OVERLAYS if "../../engine" in
                                          (ROOT / "k8s" / "overlays" / o / "kustomization.yaml").read_text()]
PIN = wasm_image.read_image_env()["sha256"]
NO_URL = ("fieldPath `data.url` is missing", "throttle-image")
NO_DIGEST = ("fieldPath `data.ratelimit_digest` is missing", "engine-image")


def markdown_files() -> list[Path]:
    return list(repo_files(".md"))


def test_the_shipped_image_env_names_no_image():
    env = wasm_image.read_image_env()
    assert set(env) == {"sha256"}, f"{wasm_image.IMAGE_ENV.relative_to(ROOT)} must ship without url=: {env}"
    assert re.fullmatch(r"[0-9a-f]{64}", env["sha256"])


@pytest.mark.parametrize("k", THROTTLE_OVERLAYS + PLUGIN_KUSTOMIZATIONS + ["k8s/engine"])
def test_as_shipped_a_throttle_kustomization_does_not_build(k, tools):
    """`kubectl apply -k` builds first: a build error applies nothing, Bookinfo included."""
    r = run([tools["kustomize"], "build", str(ROOT / k)])
    assert r.returncode != 0, f"{k} builds without its images set:\n{r.stdout[:2000]}"
    missing = NO_DIGEST if k in ENGINE_KUSTOMIZATIONS else NO_URL
    assert all(m in r.stderr for m in missing), r.stderr


@pytest.mark.parametrize("k", ENGINE_KUSTOMIZATIONS)
def test_each_image_setting_is_needed(k, tools, tmp_path):
    """With the engine's digest set, the cluster-scope overlays still refuse to build until the
    throttle's url is set, and k8s/engine alone (no throttle image) builds."""
    copy = configured_copy(tmp_path, TEST_IMAGE_URL)
    (copy / wasm_image.IMAGE_ENV.relative_to(ROOT)).write_text(wasm_image.IMAGE_ENV.read_text())  # no url again
    r = run([tools["kustomize"], "build", str(copy / k)])
    if k == "k8s/engine":
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode != 0 and all(m in r.stderr for m in NO_URL), r.stderr


@pytest.mark.parametrize("k", [f"k8s/overlays/{o}" for o in OVERLAYS if "throttle" not in o] + ["k8s/monitoring"])
def test_as_shipped_the_other_kustomizations_build(k, tools):
    r = run([tools["kustomize"], "build", str(ROOT / k)])
    assert r.returncode == 0, f"{k}:\n{r.stderr}"


def test_only_image_env_names_an_image():
    """One image reference under istio/: no url, uri or sha256 written in a resource."""
    for f in sorted((ROOT / "istio").rglob("*.yaml")):
        text = f.read_text()
        assert not re.search(r"oci://|^\s*(url|uri|sha256):", text, re.M), f"{f.relative_to(ROOT)} names an image"


def test_configured_image_reaches_every_plugin(rendered):
    """With url= set, every WasmPlugin and EnvoyFilter carries that url and the one pin, and the
    ConfigMap that carries them is not applied (kustomize local-config)."""
    seen = 0
    for k in KUSTOMIZATIONS:
        for d in docs(rendered[k]):
            assert not (d["kind"] == "ConfigMap" and d["metadata"]["name"] == "throttle-image"), k
            if d["kind"] == "WasmPlugin":
                assert (d["spec"]["url"], d["spec"]["sha256"]) == (TEST_IMAGE_URL, PIN), (k, d["metadata"]["name"])
                seen += 1
            elif d["kind"] == "EnvoyFilter":
                for p in d["spec"].get("configPatches", []):
                    if p["applyTo"] == "EXTENSION_CONFIG":
                        remote = p["patch"]["value"]["typed_config"]["config"]["vm_config"]["code"]["remote"]
                        assert (remote["http_uri"]["uri"], remote["sha256"]) == (TEST_IMAGE_URL, PIN), k
                        seen += 1
    assert seen >= 7, seen


def test_configured_engine_digest_reaches_the_service(rendered):
    """With ratelimit_digest= set, the ratelimit container runs the tag pinned to that digest,
    and the ConfigMap that carries it is not applied."""
    for k in ENGINE_KUSTOMIZATIONS:
        (dep,) = [d for d in docs(rendered[k]) if d["kind"] == "Deployment" and d["metadata"]["name"] == "ratelimit"]
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert c["image"] == f"{engine_image.image_tag()}@{TEST_ENGINE_DIGEST}", (k, c["image"])
        assert not [d for d in docs(rendered[k]) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "engine-image"]


@pytest.mark.parametrize("url", [
    "oci://ghcr.io/example/envoy-throttle:0.1.0",   # the url the manifests used to ship
    "oci://<registry>/envoy-throttle:0.1.0",
    "oci://registry.example.com/envoy-throttle:0.1.0",
    "oci://ghcr.io/acme/envoy-throttle",            # no tag
    "ghcr.io/acme/envoy-throttle:0.1.0",            # no scheme
])
def test_set_url_refuses_placeholders_and_malformed_urls(url, tmp_path):
    env = tmp_path / "image.env"
    env.write_text(wasm_image.IMAGE_ENV.read_text())
    with pytest.raises(ValueError, match=r"^url: "):
        wasm_image.set_image(url=url, env=env)
    assert env.read_text() == wasm_image.IMAGE_ENV.read_text()


def test_set_url_writes_the_one_place(tmp_path):
    env = tmp_path / "image.env"
    env.write_text(wasm_image.IMAGE_ENV.read_text())
    wasm_image.set_image(url="oci://registry.internal:5000/team/envoy-throttle:1.2.3", env=env)
    wasm_image.set_image(url="oci://registry.internal:5000/team/envoy-throttle:1.2.4", env=env)
    assert wasm_image.read_image_env(env) == {"sha256": PIN, "url": "oci://registry.internal:5000/team/envoy-throttle:1.2.4"}


def test_every_image_example_in_the_docs_is_refused():
    """Copying an example from the docs cannot configure an image nobody pushed."""
    examples = []
    for md in markdown_files():
        for m in re.finditer(r"(?:IMAGE=|set-url )(\S+)", md.read_text()):
            examples.append((md.relative_to(ROOT), m.group(1).strip("`")))
    assert examples, "no image example in the docs"
    for where, url in examples:
        with pytest.raises(ValueError):
            wasm_image.check_url(url if url.startswith("oci://") else "oci://" + url)
            raise AssertionError(f"{where}: example {url!r} is accepted as a real image")


def test_shipped_failure_policy_is_open(rendered):
    """istio/README.md "Which failStrategy": FAIL_OPEN, so a missing or unverifiable module
    leaves the service up (unthrottled) instead of answering 403 to everything."""
    for k in KUSTOMIZATIONS:
        for d in docs(rendered[k]):
            if d["kind"] == "WasmPlugin":
                assert d["spec"]["failStrategy"] == "FAIL_OPEN", (k, d["metadata"]["name"])
            elif d["kind"] == "EnvoyFilter":
                for p in d["spec"].get("configPatches", []):
                    if p["applyTo"] == "EXTENSION_CONFIG":
                        assert p["patch"]["value"]["typed_config"]["config"]["failure_policy"] == "FAIL_OPEN", k
    readme = (ROOT / "istio" / "README.md").read_text()
    assert "## Which failStrategy" in readme


# ---- the docs next to the apply commands

def node_roles_in_manifests() -> set[str]:
    text = (ROOT / "k8s" / "base" / "bookinfo.yaml").read_text() + (ROOT / "k8s" / "base" / "fortio.yaml").read_text()
    return set(re.findall(r"key: perf\.throttle\.dev/role, operator: In, values: \[(\w+)\]", text))


def md_sections(text: str) -> list[str]:
    """The text split at its headings (not at `#` comments inside fenced code)."""
    sections: list[str] = []
    current: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if line.startswith("#") and not fenced and current:
            sections.append("\n".join(current))
            current = []
        current.append(line)
    return [*sections, "\n".join(current)]


def test_every_apply_of_an_overlay_says_to_label_the_nodes_first():
    """k8s/base schedules nothing until nodes carry perf.throttle.dev/role; each Markdown
    section that applies an overlay shows the labelling before it, with the manifests' roles."""
    roles = node_roles_in_manifests()
    assert roles == {"server", "client"}, roles
    found = 0
    for md in markdown_files():
        for section in md_sections(md.read_text()):
            apply = section.find("kubectl apply -k k8s/overlays/")
            if apply < 0:
                continue
            found += 1
            before = section[:apply]
            labelled = set(re.findall(r"kubectl label nodes? .*perf\.throttle\.dev/role=(\w+)", before))
            assert labelled == roles, f"{md.relative_to(ROOT)}: section applying an overlay labels {labelled or 'no'} " \
                                      f"node roles before it, the manifests need {roles}"
    assert found >= 2, found


def test_fortio_is_in_the_mesh_as_the_comments_say(rendered):
    """Fortio is injected like the services (it must be meshed for ambient's waypoint to see
    its traffic); no manifest comment may say it opts out."""
    for o in ("sidecar", "sidecar-throttle", "sidecar-throttle-envoyfilter"):
        (fortio,) = [d for d in docs(rendered[f"k8s/overlays/{o}"]) if d["kind"] == "Deployment"
                     and d["metadata"]["name"] == "fortio"]
        meta = fortio["spec"]["template"]["metadata"]
        inject = {**meta.get("labels", {}), **meta.get("annotations", {})}.get("sidecar.istio.io/inject")
        assert inject in (None, "true"), (o, inject)
    for f in sorted((ROOT / "k8s").rglob("*.yaml")):
        comments = "\n".join(line for line in f.read_text().splitlines() if line.lstrip().startswith("#"))
        assert not re.search(r"opts? out|not injected|without (a )?sidecar", comments, re.I), \
            f"{f.relative_to(ROOT)}: a comment says Fortio is not meshed, the manifests mesh it"


def test_the_docs_name_the_shared_data_keys_the_filter_uses():
    """`throttle/v<N>/...` keys in the docs are the ones the filter's code writes."""
    code = "\n".join(p.read_text() for p in (ROOT / "filters" / "throttle").rglob("*.rs"))
    versions = set(re.findall(r'"throttle/(v\d+)/', code))
    assert len(versions) == 1, versions
    for md in markdown_files():
        for v in re.findall(r"\bthrottle/(v\d+)/", md.read_text()):
            assert {v} == versions, f"{md.relative_to(ROOT)}: shared-data key throttle/{v}/..., the filter uses {versions}"
