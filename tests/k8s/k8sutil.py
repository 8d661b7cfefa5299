"""Helpers shared by the Istio/Kubernetes tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
OVERLAYS = sorted(p.name for p in (ROOT / "k8s" / "overlays").iterdir() if (p / "kustomization.yaml").exists())
KUSTOMIZATIONS = [f"k8s/overlays/{o}" for o in OVERLAYS] + ["k8s/monitoring"]
TOOLS_JSON = ROOT / "build" / "k8s" / "tools.json"


def run(cmd: list[str], timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kubeconform(tools, schemas: Path, files: list[Path]) -> subprocess.CompletedProcess:
    return run([tools["kubeconform"], "-strict", "-summary", "-output", "text",
                "-schema-location", str(schemas / "kubernetes" / "{{.ResourceKind}}{{.KindSuffix}}.json"),
                "-schema-location", str(schemas / "crds" / "{{.Group}}" / "{{.ResourceKind}}_{{.ResourceAPIVersion}}.json"),
                *map(str, files)])


def image_path() -> str:
    """`repo:tag` of the one image every shipped WasmPlugin/EnvoyFilter refers to (oci://<host>/<repo>:<tag>)."""
    import re  # noqa: PLC0415

    urls = set()
    for f in (ROOT / "istio").rglob("*.yaml"):
        urls |= set(re.findall(r"(?:url|uri): oci://[^/\s]+/(\S+)", f.read_text()))
    assert len(urls) == 1, f"the shipped resources refer to several images: {urls}"
    return urls.pop()
