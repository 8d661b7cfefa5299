"""Paths and tool runners shared by the Istio/Kubernetes checks (tests/k8s)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tools import engine_image, wasm_image

ROOT = Path(__file__).resolve().parent.parent.parent
OVERLAYS = sorted(p.name for p in (ROOT / "k8s" / "overlays").iterdir() if (p / "kustomization.yaml").exists())
# The istio/ kustomizations that hold the throttle: WasmPlugins, or EnvoyFilters with the Wasm
# filter (all take the image from istio/image/). istio/engine-waypoint's EnvoyFilter is not one.
PLUGIN_KUSTOMIZATIONS = sorted(
    f"istio/{p.parent.name}" for p in (ROOT / "istio").glob("*/kustomization.yaml")
    if re.search(r"^kind: WasmPlugin$|filters\.http\.wasm\.v3\.Wasm",
                 "".join(f.read_text() for f in p.parent.glob("*.yaml")), re.M))
# Everything `kustomize build` must render and the validators must accept: the overlays, the
# monitoring stack, the engine, and the examples not used by an overlay (the waypoint Gateway
# plugin; priority classes with the VirtualService that sets their header; the adaptive plugin for
# reviews).
KUSTOMIZATIONS = [f"k8s/overlays/{o}" for o in OVERLAYS] + ["k8s/monitoring", "k8s/engine",
                                                           "istio/wasmplugin-waypoint-gateway",
                                                           "istio/priority-sidecar",
                                                           "istio/wasmplugin-sidecar-adaptive"]
TOOLS_JSON = ROOT / "build" / "k8s" / "tools.json"
# The image the tests configure, as an operator would (`tools/wasm_image.py set-url`). The
# `.test` domain never resolves (RFC 6761); Istio's fetcher is pointed at the local registry.
TEST_IMAGE_URL = "oci://registry.test/envoy-throttle:0.1.0"
# The rate limit service's digest the tests configure (`tools/engine_image.py set-digest`): the
# sha256 of a string, a digest no image has; no test pulls it.
TEST_ENGINE_DIGEST = "sha256:" + hashlib.sha256(b"k8s-check: not an image").hexdigest()


def run(cmd: list[str], timeout: float = 300, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def kustomize_build(tools: dict[str, str], configured: Path, kustomizations: list[str], out: Path) -> dict[str, Path]:
    """`kustomize build` of each kustomization (a path under the configured copy of the
    repository) into a file of `out`: {kustomization: rendered file}."""
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for k in kustomizations:
        r = run([tools["kustomize"], "build", str(configured / k)])
        assert r.returncode == 0, f"kustomize build {k}:\n{r.stderr}"
        f = out / (k.replace("/", "_") + ".yaml")
        f.write_text(r.stdout)
        files[k] = f
    return files


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kubeconform(tools: dict[str, str], schemas: Path, files: list[Path]) -> subprocess.CompletedProcess[str]:
    return run([tools["kubeconform"], "-strict", "-summary", "-output", "text",
                "-schema-location", str(schemas / "kubernetes" / "{{.ResourceKind}}{{.KindSuffix}}.json"),
                "-schema-location", str(schemas / "crds" / "{{.Group}}" / "{{.ResourceKind}}_{{.ResourceAPIVersion}}.json"),
                *map(str, files)])


def configured_copy(dest: Path, url: str, engine_digest: str = TEST_ENGINE_DIGEST) -> Path:
    """A copy of istio/ and k8s/ under `dest` whose image.env names `url` (sha256 as shipped) and
    whose k8s/engine/image.env pins the rate limit service to `engine_digest`."""
    for top in ("istio", "k8s"):
        shutil.copytree(ROOT / top, dest / top, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    wasm_image.set_image(url=url, env=dest / wasm_image.IMAGE_ENV.relative_to(ROOT))
    engine_image.set_digest(engine_digest, env=dest / engine_image.IMAGE_ENV.relative_to(ROOT))
    return dest


def image_path(url: str) -> str:
    """`repo:tag` of an `oci://<host>/<repo>:<tag>` url."""
    return url.removeprefix("oci://").split("/", 1)[1]


def plugin_configs() -> list[tuple[str, str, dict]]:
    """(kustomization, resource, plugin config as written) for every WasmPlugin and throttle
    EnvoyFilter under istio/, e.g. ("istio/wasmplugin-sidecar", "istio/wasmplugin-sidecar:WasmPlugin/x", {...})."""
    out = []
    for k in PLUGIN_KUSTOMIZATIONS:
        for f in sorted((ROOT / k).glob("*.yaml")):
            if f.name == "kustomization.yaml":
                continue
            for d in docs(f):
                where = f"{k}:{d['kind']}/{d['metadata']['name']}"
                if d["kind"] == "WasmPlugin":
                    out.append((k, where, d["spec"]["pluginConfig"]))
                elif d["kind"] == "EnvoyFilter":
                    for p in d["spec"].get("configPatches", []):
                        tc = p["patch"]["value"].get("typed_config", {})
                        if tc.get("@type", "").endswith("filters.http.wasm.v3.Wasm"):
                            out.append((k, where, json.loads(tc["config"]["configuration"]["value"])))
    return out


def istio_clusters(tools: dict[str, str], files: list[Path], proxies: list[str]) -> dict[str, dict[str, dict]]:
    """The clusters istiod would push to each proxy ("sidecar:NS/APP" or "waypoint:NS/GATEWAY"),
    computed by Istio's code (tools/istio/istioclusters) from rendered manifests:
    {proxy: {cluster name: cluster (proto JSON)}}."""
    args = [a for p in proxies for a in ("-" + p.split(":", 1)[0], p.split(":", 1)[1])]
    r = run([tools["istioclusters"], *args, *map(str, files)], timeout=120)
    assert r.returncode == 0, f"istioclusters {' '.join(args)}:\n{r.stderr[-3000:]}"
    return {d["proxy"]: d["clusters"] for d in map(json.loads, r.stdout.splitlines())}


def cluster_scope_plugins(path: Path) -> list[tuple[str, str, dict]]:
    """(WasmPlugin name, the proxy it runs on, its plugin config) for every WasmPlugin of a
    rendered file with a `scope: cluster` rule. The proxy is "sidecar:NS/APP" for a selector
    on `app`, "waypoint:NS/GATEWAY" for targetRefs (a Gateway, or a Service whose namespace
    or own label `istio.io/use-waypoint` names the waypoint)."""
    all_docs = docs(path)
    ns_labels = {d["metadata"]["name"]: d["metadata"].get("labels", {}) for d in all_docs if d["kind"] == "Namespace"}
    svc_labels = {(d["metadata"].get("namespace"), d["metadata"]["name"]): d["metadata"].get("labels", {})
                  for d in all_docs if d["kind"] == "Service"}
    out = []
    for d in all_docs:
        if d["kind"] != "WasmPlugin":
            continue
        cfg = d["spec"].get("pluginConfig", {})
        if not any(r.get("scope") == "cluster" for r in cfg.get("rules", [])):
            continue
        ns, name, spec = d["metadata"]["namespace"], d["metadata"]["name"], d["spec"]
        if "selector" in spec:
            proxy = f"sidecar:{ns}/{spec['selector']['matchLabels']['app']}"
        else:
            (ref,) = spec["targetRefs"]
            if ref["kind"] == "Gateway":
                gateway = ref["name"]
            else:
                labels = {**ns_labels.get(ns, {}), **svc_labels.get((ns, ref["name"]), {})}
                gateway = labels["istio.io/use-waypoint"]
            proxy = f"waypoint:{ns}/{gateway}"
        out.append((name, proxy, cfg))
    return out
