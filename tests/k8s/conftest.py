"""Fixtures for the Istio/Kubernetes checks (`make k8s-check`).

These tests need tools that `tools/setup-k8s.sh` installs or builds (istioctl from
the Istio Go module, promtool, kustomize, kubeconform, crane, docker-registry,
Prometheus). `make k8s-check` runs setup first and sets K8S_CHECK=1; a plain
`pytest tests` (the `integration` target) leaves this folder to that target.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for p in (ROOT, ROOT / "tools", HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from k8sutil import KUSTOMIZATIONS, TOOLS_JSON, run  # noqa: E402

if os.environ.get("K8S_CHECK") != "1":
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def tools() -> dict[str, str]:
    if not TOOLS_JSON.exists():
        pytest.fail(f"{TOOLS_JSON.relative_to(ROOT)} missing: run `make k8s-setup`")
    t = json.loads(TOOLS_JSON.read_text())
    for name, path in t.items():
        assert Path(path).exists(), f"{name}: {path} missing: run `make k8s-setup`"
    return t


@pytest.fixture(scope="session")
def rendered(tools, tmp_path_factory) -> dict[str, Path]:
    """`kustomize build` of every overlay and of k8s/monitoring, as files."""
    out = tmp_path_factory.mktemp("rendered")
    files = {}
    for k in KUSTOMIZATIONS:
        r = run([tools["kustomize"], "build", str(ROOT / k)])
        assert r.returncode == 0, f"kustomize build {k}:\n{r.stderr}"
        f = out / (k.replace("/", "_") + ".yaml")
        f.write_text(r.stdout)
        files[k] = f
    return files


@pytest.fixture(scope="session")
def schemas(tools, tmp_path_factory) -> Path:
    """Local kubeconform schemas (tools/k8s_schemas.py), made once per session."""
    out = tmp_path_factory.mktemp("schemas")
    r = run([sys.executable, str(ROOT / "tools" / "k8s_schemas.py"), str(out), "--istioctl", tools["istioctl"],
             "--istio-module", tools["istio_module"]])
    assert r.returncode == 0, r.stderr[-3000:]
    print(r.stdout)
    return out


@pytest.fixture(scope="session")
def registry(tools):
    """Debian's docker-registry on loopback, for the whole session."""
    import wasm_image  # noqa: PLC0415

    with wasm_image.LocalRegistry() as reg:
        yield reg


@pytest.fixture(scope="session")
def pushed(registry, wasm) -> tuple[str, str]:
    """The built .wasm's image pushed to the local registry under the repository and
    tag the shipped manifests use (only the registry host differs): (ref, digest)."""
    import wasm_image  # noqa: PLC0415
    from k8sutil import image_path  # noqa: PLC0415

    ref = f"{registry.host}/{image_path()}"
    return ref, wasm_image.push(ref, wasm, insecure=True)
