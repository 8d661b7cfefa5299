"""The .wasm as an OCI image, end to end without Docker: built and pushed with
crane to a real registry on loopback (Debian's docker-registry), pulled back
with crane, and fetched by Istio's own image fetcher (istio.io/istio/pkg/wasm,
built from the pinned module: tools/istio/wasmfetch), which must return the
module byte-for-byte; its digest is the one the shipped resources pin."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import urllib.request

import pytest

from tests.support.k8s import run
from tools import wasm_image

pytestmark = pytest.mark.k8s


def test_image_is_istio_compat_form(pushed, tools):
    ref, digest = pushed
    r = run([tools["crane"], "manifest", "--insecure", ref])
    assert r.returncode == 0, r.stderr
    manifest = json.loads(r.stdout)
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    assert "sha256:" + hashlib.sha256(r.stdout.encode()).hexdigest() == digest


def test_pull_back_with_crane(pushed, tools, wasm, tmp_path):
    ref, _ = pushed
    out = tmp_path / "fs.tar"
    r = run([tools["crane"], "export", "--insecure", ref, str(out)])
    assert r.returncode == 0, r.stderr
    with tarfile.open(out) as tar:
        assert tar.getnames() == ["plugin.wasm"]
        member = tar.extractfile("plugin.wasm")
        assert member is not None, "plugin.wasm is not a regular file"
        assert member.read() == wasm.read_bytes()


def test_istio_fetcher_returns_the_module(pushed, tools, wasm, tmp_path):
    ref, digest = pushed
    out = tmp_path / "fetched.wasm"
    r = run([tools["wasmfetch"], ref, str(out)], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"digest {digest}" in r.stdout
    assert out.read_bytes() == wasm.read_bytes()


def test_shipped_pins_match_the_built_image(pushed, wasm):
    """The one sha256 pin (istio/image/image.env) is this image's digest (`make k8s-pin` rewrites it)."""
    _, digest = pushed
    pins = wasm_image.pins()
    assert pins == {wasm_image.IMAGE_ENV: {digest.removeprefix("sha256:")}}, \
        f"the pin differs from the built image {digest}: run `make k8s-pin`\n{pins}"


def test_image_is_reproducible(registry, pushed, wasm):
    _, digest = pushed
    assert wasm_image.push(f"{registry.host}/envoy-throttle-again:test", wasm, insecure=True) == digest


def _put_blob(host: str, repo: str, data: bytes) -> dict:
    """Uploads a blob through the registry API (monolithic upload)."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    req = urllib.request.Request(f"http://{host}/v2/{repo}/blobs/uploads/", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        location = r.headers["Location"]
    sep = "&" if "?" in location else "?"
    url = location if location.startswith("http") else f"http://{host}{location}"
    req = urllib.request.Request(f"{url}{sep}digest={digest}", data=data, method="PUT",
                                 headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 201
    return {"digest": digest, "size": len(data)}


def test_fetcher_rejects_single_layer_wasm_artifact(registry, tools, wasm, tmp_path):
    """An OCI artifact whose only layer is the raw module, media type
    application/vnd.module.wasm.content.layer.v1+wasm, is not accepted by Istio:
    not the compat form (layer not tar+gzip) nor its *oci* variant (needs 2 layers)."""
    repo = "envoy-throttle-artifact"
    config = _put_blob(registry.host, repo, b"{}")
    layer = _put_blob(registry.host, repo, wasm.read_bytes())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.module.wasm.config.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.module.wasm.content.layer.v1+wasm", **layer}],
    }
    req = urllib.request.Request(f"http://{registry.host}/v2/{repo}/manifests/v1", method="PUT",
                                 data=json.dumps(manifest).encode(),
                                 headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 201
    ref = f"{registry.host}/{repo}:v1"
    got = json.loads(run([tools["crane"], "manifest", "--insecure", ref]).stdout)
    assert [x["mediaType"] for x in got["layers"]] == ["application/vnd.module.wasm.content.layer.v1+wasm"]
    r = run([tools["wasmfetch"], ref, str(tmp_path / "x.wasm")], timeout=120)
    assert r.returncode != 0, r.stdout
    assert "could not parse as compat variant" in r.stderr, r.stderr
    assert "number of layers must be 2 but got 1" in r.stderr, r.stderr
    assert not (tmp_path / "x.wasm").exists()


def test_layer_bytes_are_a_plain_tar_gz():
    data = wasm_image.layer_bytes(b"\0asm\1\0\0\0")
    assert data == wasm_image.layer_bytes(b"\0asm\1\0\0\0")
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        (m,) = tar.getmembers()
        assert (m.name, m.mtime, m.mode, m.size) == ("plugin.wasm", 0, 0o644, 8)
