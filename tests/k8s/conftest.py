"""Fixtures of the Istio/Kubernetes checks (marker `k8s`; `make k8s-check`).

These tests need tools that `tools/setup-k8s.sh` installs or builds (istioctl from
the Istio Go module, promtool, kustomize, kubeconform, crane, docker-registry,
Prometheus); `make k8s-check` runs that setup first. A missing tool fails the
test that needs it, naming the command to run."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.k8s import (
    KUSTOMIZATIONS,
    ROOT,
    TEST_IMAGE_URL,
    TOOLS_JSON,
    cluster_scope_plugins,
    configured_copy,
    image_path,
    istio_clusters,
    kustomize_build,
    run,
)
from tools import wasm_image


@pytest.fixture(scope="session")
def tools() -> dict[str, str]:
    if not TOOLS_JSON.exists():
        pytest.fail(f"{TOOLS_JSON.relative_to(ROOT)} missing: run `make k8s-setup`")
    t: dict[str, str] = json.loads(TOOLS_JSON.read_text())
    for name, path in t.items():
        assert Path(path).exists(), f"{name}: {path} missing: run `make k8s-setup`"
    return t


@pytest.fixture(scope="session")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of istio/ and k8s/ with the image configured the way an operator does it
    (`tools/wasm_image.py set-url`, which `make k8s-image-push` runs): url TEST_IMAGE_URL
    (a `.test` host, RFC 6761: it never resolves), the shipped sha256 pin."""
    return configured_copy(tmp_path_factory.mktemp("configured"), TEST_IMAGE_URL)


@pytest.fixture(scope="session")
def rendered(tools: dict[str, str], configured: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`kustomize build` of every overlay and of k8s/monitoring (image configured), as files."""
    return kustomize_build(tools, configured, KUSTOMIZATIONS, tmp_path_factory.mktemp("rendered"))


@pytest.fixture(scope="session")
def schemas(tools: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Local kubeconform schemas (tools/k8s_schemas.py), made once per session."""
    out = tmp_path_factory.mktemp("schemas")
    r = run([sys.executable, str(ROOT / "tools" / "k8s_schemas.py"), str(out), "--istioctl", tools["istioctl"],
             "--istio-module", tools["istio_module"]])
    assert r.returncode == 0, r.stderr[-3000:]
    print(r.stdout)
    return out


@pytest.fixture(scope="session")
def registry(tools: dict[str, str]) -> Iterator[wasm_image.LocalRegistry]:
    """Debian's docker-registry on loopback, for the whole session."""
    with wasm_image.LocalRegistry() as reg:
        yield reg


@pytest.fixture(scope="session")
def pushed(registry: wasm_image.LocalRegistry, wasm: Path) -> tuple[str, str]:
    """The built .wasm's image pushed to the local registry under the repository and
    tag the configured manifests use (only the registry host differs): (ref, digest)."""
    ref = f"{registry.host}/{image_path(TEST_IMAGE_URL)}"
    return ref, wasm_image.push(ref, wasm, insecure=True)




@pytest.fixture(scope="session")
def engine_clusters(tools: dict[str, str], rendered: dict[str, Path]) -> dict[str, dict[str, dict[str, dict]]]:
    """For every rendered kustomization with cluster-scope WasmPlugins: the clusters istiod
    would push to the proxies they run on, by Istio's own code (tools/istio/istioclusters):
    {kustomization: {proxy: {cluster name: cluster}}}."""
    out = {}
    for k, f in rendered.items():
        proxies = sorted({proxy for _, proxy, _ in cluster_scope_plugins(f)})
        if proxies:
            out[k] = istio_clusters(tools, [f], proxies)
    return out
