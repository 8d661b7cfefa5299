"""The rate limit service's image digest for k8s/engine (cluster scope's engine).

k8s/engine/ratelimit.yaml names the image by tag (docker.io/envoyproxy/ratelimit:<commit>,
the commit the tests run); k8s/engine/kustomization.yaml appends `@sha256:<digest>` from
k8s/engine/image.env. The file ships without a digest (none was found in public
material, and this repository's machines cannot reach Docker Hub), so k8s/engine and the
cluster-scope overlays do not build until an operator pins it, as the throttle's own
image does not until `istio/image/image.env` names it (tools/wasm_image.py).

    python -m tools.engine_image pin                       # ask the registry (crane digest), write the digest
    python -m tools.engine_image set-digest sha256:<hex>   # write a digest you checked yourself
    python -m tools.engine_image show                      # the image reference the manifests will carry
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tools import wasm_image

ROOT = Path(__file__).resolve().parent.parent
ENGINE_DIR = ROOT / "k8s" / "engine"
IMAGE_ENV = ENGINE_DIR / "image.env"
DEPLOYMENT = ENGINE_DIR / "ratelimit.yaml"
KEY = "ratelimit_digest"
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
LINE_RE = re.compile(rf"^{KEY}=.*$", re.M)


def image_tag(deployment: Path = DEPLOYMENT) -> str:
    """`registry/repository:tag` of the ratelimit container, as written in the manifest."""
    for doc in yaml.safe_load_all(deployment.read_text()):
        if doc and doc.get("kind") == "Deployment":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c["name"] == "ratelimit":
                    image: str = c["image"]
                    if "@" in image:
                        raise ValueError(f"{deployment}: image {image!r} carries a digest; it belongs in image.env")
                    return image
    raise ValueError(f"{deployment}: no Deployment with a `ratelimit` container")


def check_digest(digest: str) -> str:
    """`digest` if it is a real-looking manifest digest; ValueError naming the problem otherwise."""
    if not DIGEST_RE.fullmatch(digest):
        raise ValueError(f"{KEY}: expected sha256:<64 lowercase hex digits>, got {digest!r}")
    if len(set(digest.removeprefix("sha256:"))) == 1:
        raise ValueError(f"{KEY}: {digest!r} is a placeholder, not the digest of an image")
    return digest


def read_digest(env: Path = IMAGE_ENV) -> str | None:
    return wasm_image.read_image_env(env).get(KEY)


def set_digest(digest: str, env: Path = IMAGE_ENV) -> None:
    """Writes ratelimit_digest= into image.env, keeping its comments."""
    line = f"{KEY}={check_digest(digest)}"
    text = env.read_text()
    text = LINE_RE.sub(lambda m: line, text) if LINE_RE.search(text) else text.rstrip("\n") + "\n" + line + "\n"
    env.write_text(text)


def registry_digest(tag: str) -> str:
    """The manifest digest the registry serves for `tag` (crane digest; needs the registry)."""
    r = subprocess.run([wasm_image.crane(), "digest", tag], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"crane digest {tag} failed: {r.stderr.strip()}")
    return r.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.engine_image", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("pin", help="ask the registry for the tag's digest (crane) and write it")
    sd = sub.add_parser("set-digest", help="write a digest you checked yourself")
    sd.add_argument("digest")
    sub.add_parser("show", help="the image reference the manifests will carry")
    args = parser.parse_args(argv)
    try:
        tag = image_tag()
        if args.cmd == "pin":
            set_digest(registry_digest(tag))
        elif args.cmd == "set-digest":
            set_digest(args.digest)
        digest = read_digest()
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if digest is None:
        print(f"{tag} (no digest yet: k8s/engine does not build; run `make k8s-engine-pin`)")
        return 1 if args.cmd != "show" else 0
    print(f"{tag}@{digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
