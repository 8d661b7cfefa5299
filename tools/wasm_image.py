"""The throttle's .wasm as an OCI image in Istio's "compat" form, without Docker.

The image has one layer, media type application/vnd.oci.image.layer.v1.tar+gzip,
holding `plugin.wasm` (what istio-agent's fetcher, istio.io/istio/pkg/wasm,
extracts). The layer is made reproducibly (fixed mtime/owner/mode, gzip without
timestamp) and appended to crane's empty OCI base, so the same .wasm always gives
the same manifest digest: the `sha256` a WasmPlugin pins. (A registry computes
that digest over the OCI manifest crane pushes; `crane append -o` tarballs are
docker-save form with another digest, so the digest is taken from a push to a
throwaway registry on loopback: Debian's docker-registry, temp storage.)

The manifests under istio/ take the image's url and sha256 from one file,
istio/image/image.env (a kustomize component puts them into every WasmPlugin and
EnvoyFilter). It ships with the sha256 pin and without a url, so the throttle
overlays do not build until an operator names the image they pushed.

    python tools/wasm_image.py push REGISTRY/REPO:TAG [--insecure]  # push (crane; your docker login), then set url + sha256
    python tools/wasm_image.py set-url oci://REGISTRY/REPO:TAG      # name an image pushed already
    python tools/wasm_image.py digest          # manifest digest of the built .wasm's image
    python tools/wasm_image.py pin [--check]   # rewrite (or check) the sha256 pin in istio/image/image.env
"""

from __future__ import annotations

import gzip
import io
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

from harness import tools
from harness.net import free_port

ROOT = Path(__file__).resolve().parent.parent
WASM = ROOT / "target" / "wasm32-wasip1" / "release" / "throttle.wasm"
IMAGE_ENV = ROOT / "istio" / "image" / "image.env"
PIN_RE = re.compile(r"^(sha256=)([0-9a-f]{64})$", re.M)
URL_RE = re.compile(r"^url=(.*)$", re.M)
# oci://host[:port]/repo[/repo...](:tag | @sha256:hex): what Istio's fetcher accepts.
OCI_URL_RE = re.compile(r"oci://([A-Za-z0-9.-]+(?::\d+)?)/([a-z0-9]+(?:[._/-][a-z0-9]+)*)"
                        r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})")
# Hosts of documentation examples: RFC 2606's example names and .invalid, "your-registry".
PLACEHOLDER_RE = re.compile(r"(^|\.)(example|your-?registry)(\.|:|$)|\.invalid(:|$)")


def crane() -> str:
    return tools.path("crane")


def layer_bytes(wasm: bytes) -> bytes:
    """tar+gzip with a single regular file plugin.wasm; byte-for-byte reproducible."""
    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("plugin.wasm")
        info.size = len(wasm)
        info.mode = 0o644
        info.mtime = 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tar.addfile(info, io.BytesIO(wasm))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(tar_buf.getvalue())
    return out.getvalue()


def push(ref: str, wasm: Path = WASM, insecure: bool = False) -> str:
    """Pushes the image of `wasm` to `ref`; returns the manifest digest (`sha256:<hex>`)."""
    with tempfile.TemporaryDirectory(prefix="wasm-image-") as tmp:
        layer = Path(tmp) / "layer.tar.gz"
        layer.write_bytes(layer_bytes(wasm.read_bytes()))
        cmd = [crane(), "append", "--oci-empty-base", "-f", str(layer), "-t", ref]
        r = subprocess.run(cmd + (["--insecure"] if insecure else []), capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"crane append failed: {r.stderr.strip()}")
    pushed = r.stdout.strip()  # <repo>@sha256:<hex>
    if "@sha256:" not in pushed:
        raise RuntimeError(f"unexpected crane output {pushed!r}")
    return pushed.rsplit("@", 1)[1]


class LocalRegistry:
    """Debian's docker-registry (distribution 2.8) on 127.0.0.1:<free port>,
    storage in a temp dir; stopped by its PID."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="registry-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> LocalRegistry:
        binary = tools.path("docker-registry")
        cfg = self.dir / "config.yml"
        cfg.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                       f"    rootdirectory: {self.dir / 'data'}\nhttp:\n  addr: {self.host}\n")
        self.log = open(self.dir / "registry.log", "wb")
        self.proc = subprocess.Popen([binary, "serve", str(cfg)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"docker-registry did not start: {(self.dir / 'registry.log').read_text()}")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def digest(wasm: Path = WASM) -> str:
    """Manifest digest (hex, no `sha256:`) of the image of `wasm`, as a registry computes it."""
    with LocalRegistry() as reg:
        return push(f"{reg.host}/envoy-throttle:digest", wasm, insecure=True).removeprefix("sha256:")


def check_url(url: str) -> str:
    """`url` if it names a real OCI image; ValueError naming the problem otherwise."""
    if not OCI_URL_RE.fullmatch(url):
        raise ValueError(f"url: expected oci://<registry host>/<repository>:<tag> (or @sha256:<digest>), got {url!r}")
    host = url.removeprefix("oci://").split("/", 1)[0]
    if PLACEHOLDER_RE.search(host) or "/example/" in url:
        raise ValueError(f"url: {url!r} is a placeholder from the documentation: name the registry you pushed to")
    return url


def read_image_env(env: Path = IMAGE_ENV) -> dict[str, str]:
    """The `key=value` lines of an image.env (comments and blank lines skipped)."""
    out = {}
    for line in env.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"{env}: line {line!r} is not key=value")
            out[key.strip()] = value.strip()
    return out


def set_image(url: str | None = None, sha256: str | None = None, env: Path = IMAGE_ENV) -> None:
    """Writes url= and/or sha256= into image.env, keeping its comments."""
    text = env.read_text()
    if sha256 is not None:
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ValueError(f"sha256: expected 64 hex digits, got {sha256!r}")
        if not PIN_RE.search(text):
            raise ValueError(f"{env}: no sha256= line")
        text = PIN_RE.sub(lambda m: m.group(1) + sha256, text)
    if url is not None:
        line = "url=" + check_url(url)
        text = URL_RE.sub(lambda m: line, text) if URL_RE.search(text) else text.rstrip("\n") + "\n" + line + "\n"
    env.write_text(text)


def pins(env: Path = IMAGE_ENV) -> dict[Path, set[str]]:
    """{file: the sha256 pins in it}: image.env is the only file with one."""
    return {env: {m.group(2) for m in PIN_RE.finditer(env.read_text())}}


def pin(check: bool = False, env: Path = IMAGE_ENV) -> int:
    want = digest()
    stale = pins(env)[env] != {want}
    if stale and not check:
        set_image(sha256=want, env=env)
    rel = env.relative_to(ROOT) if env.is_relative_to(ROOT) else env
    if stale:
        print(f"{'stale' if check else 'rewrote'}: {rel}")
    print(f"image digest of {WASM.relative_to(ROOT)}: sha256:{want}")
    if check and stale:
        print("the sha256 pin does not match the built .wasm: run `make k8s-pin`", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "push":
        if not rest:
            print("usage: wasm_image.py push REGISTRY/REPO:TAG [--insecure]", file=sys.stderr)
            return 2
        url = check_url("oci://" + rest[0].removeprefix("oci://"))  # refused before anything is pushed
        pushed = push(url.removeprefix("oci://"), insecure="--insecure" in rest)
        set_image(url=url, sha256=pushed.removeprefix("sha256:"))
        print(f"pushed {url} ({pushed}); {IMAGE_ENV.relative_to(ROOT)}: url and sha256 set")
    elif cmd == "set-url":
        if len(rest) != 1:
            print("usage: wasm_image.py set-url oci://REGISTRY/REPO:TAG", file=sys.stderr)
            return 2
        set_image(url=rest[0])
        print(f"{IMAGE_ENV.relative_to(ROOT)}: url={rest[0]}")
    elif cmd == "digest":
        print("sha256:" + digest())
    elif cmd == "pin":
        return pin(check="--check" in rest)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
