"""Local JSON schemas for kubeconform, made from real sources, no download at test time.

    python tools/k8s_schemas.py OUT_DIR --istioctl PATH [--gateway-api DIR]

- Kubernetes: the strict schemas shipped in the PyPI package `kubernetes-validate`
  (one file per kind, `$ref`s into a shared `_definitions.json` addressed as
  `/api/_definitions.json`). Each file is made self-contained: the definitions it
  reaches are copied into its own `$defs` and the refs point there. Layout
  `OUT/kubernetes/{kind}-{group}-{version}.json` (kubeconform's
  `{{.ResourceKind}}{{.KindSuffix}}.json`).
- CRDs: every CustomResourceDefinition in `istioctl manifest generate` (Istio's own
  CRDs) and in the Gateway API module's standard CRDs (sigs.k8s.io/gateway-api,
  the version Istio's go.mod pins, from the Go module cache). Converted like
  kubeconform's openapi2jsonschema: `openAPIV3Schema` per served version,
  `additionalProperties: false` on every object with `properties` (strict) unless it
  preserves unknown fields, int-or-string as oneOf. Layout
  `OUT/crds/{group}/{kind}_{version}.json`.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

K8S_VERSION = "v1.37.0"


def kubernetes_validate_dir() -> Path:
    import kubernetes_validate

    d = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"{K8S_VERSION}-local-strict"
    if not d.is_dir():
        raise FileNotFoundError(f"{d} missing: kubernetes-validate without {K8S_VERSION} schemas")
    return d


REF_PREFIX = "/api/_definitions.json#/$defs/"  # in the per-kind files
LOCAL_PREFIX = "#/$defs/"  # inside _definitions.json


def _refs(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            for prefix in (REF_PREFIX, LOCAL_PREFIX):
                if ref.startswith(prefix):
                    out.add(ref[len(prefix):])
        for v in node.values():
            _refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out)


def _rewrite(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: ("#/$defs/" + v[len(REF_PREFIX):] if k == "$ref" and isinstance(v, str)
                    and v.startswith(REF_PREFIX) else _rewrite(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_rewrite(v) for v in node]
    return node


def kubernetes_schemas(out: Path) -> int:
    src = kubernetes_validate_dir()
    defs = json.loads((src / "_definitions.json").read_text())["$defs"]
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in sorted(src.glob("*.json")):
        if f.name.startswith("_") or f.name == "all.json":
            continue
        schema = json.loads(f.read_text())
        schema.pop("$id", None)
        todo: set[str] = set()
        _refs(schema, todo)
        seen: set[str] = set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            if name not in defs:
                raise KeyError(f"{f.name}: $ref to unknown definition {name}")
            _refs(defs[name], todo)
        schema = _rewrite(schema)
        schema["$defs"] = {k: _rewrite(defs[k]) for k in sorted(seen)}
        (out / f.name).write_text(json.dumps(schema))
        n += 1
    return n


def _strict(node: Any, in_props: bool = False) -> Any:
    """openapi2jsonschema's strict conversion, recursively."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: (_strict(v, k == "properties") if not in_props else _strict(v)) for k, v in node.items()}
    if in_props:
        return node
    if node.get("x-kubernetes-int-or-string"):
        node.pop("type", None)
        node.pop("format", None)
        node["oneOf"] = [{"type": "string"}, {"type": "integer"}]
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        node["additionalProperties"] = False
    return node


def crd_schemas(crds: list[dict], out: Path) -> list[str]:
    written = []
    for crd in crds:
        spec = crd["spec"]
        group, kind = spec["group"], spec["names"]["kind"]
        for version in spec["versions"]:
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if not schema or not version.get("served", True):
                continue
            schema = _strict(copy.deepcopy(schema))
            schema.setdefault("properties", {})
            schema["properties"]["apiVersion"] = {"type": "string", "enum": [f"{group}/{version['name']}"]}
            schema["properties"]["kind"] = {"type": "string", "enum": [kind]}
            schema["properties"].setdefault("metadata", {"type": "object"})
            d = out / group
            d.mkdir(parents=True, exist_ok=True)
            path = d / f"{kind.lower()}_{version['name']}.json"
            path.write_text(json.dumps(schema))
            written.append(f"{group}/{kind}/{version['name']}")
    return written


def crds_from(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "CustomResourceDefinition"]


def istio_crds(istioctl: str) -> list[dict]:
    r = subprocess.run([istioctl, "manifest", "generate"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"istioctl manifest generate failed: {r.stderr[-2000:]}")
    crds = crds_from(r.stdout)
    if not any(c["spec"]["names"]["kind"] == "WasmPlugin" for c in crds):
        raise RuntimeError("no WasmPlugin CRD in istioctl manifest generate output")
    return crds


def gateway_api_dir(istio_module_dir: Path) -> Path:
    """The Gateway API module that the Istio module pins (from go.mod), in the module cache."""
    gomod = (istio_module_dir / "go.mod").read_text()
    m = re.search(r"^\s*sigs\.k8s\.io/gateway-api (v\S+)", gomod, re.M)
    if not m:
        raise RuntimeError("sigs.k8s.io/gateway-api not in the Istio module's go.mod")
    modcache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    d = Path(modcache) / f"sigs.k8s.io/gateway-api@{m.group(1)}" / "config" / "crd" / "standard"
    if not d.is_dir():
        raise FileNotFoundError(f"{d} missing: `go mod download sigs.k8s.io/gateway-api@{m.group(1)}`")
    return d


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--istioctl", required=True)
    ap.add_argument("--istio-module", type=Path, required=True, help="istio.io/istio module dir (go list -m -f {{.Dir}})")
    a = ap.parse_args(argv)
    n = kubernetes_schemas(a.out / "kubernetes")
    crds = istio_crds(a.istioctl)
    gw = gateway_api_dir(a.istio_module)
    for f in sorted(gw.glob("*.yaml")):
        crds += crds_from(f.read_text())
    written = crd_schemas(crds, a.out / "crds")
    print(f"schemas: {n} Kubernetes kinds ({K8S_VERSION}, kubernetes-validate), "
          f"{len(written)} CRD versions (istioctl manifest generate + gateway-api {gw.parent.parent.parent.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
