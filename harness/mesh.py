"""A real Istio control plane on this machine, with Bookinfo-shaped services in its mesh.

    python -m harness.mesh [--keep]

starts etcd, kube-apiserver and istiod (harness/controlplane.py), pushes the built filter's OCI
image to the registry there with `make k8s-image-push`'s code (tools/wasm_image.py), applies
`k8s/overlays/sidecar` (Bookinfo and its Fortio client, sidecar injection on) with `istio/waypoint`
and three changes of its own (`details` without a sidecar, in ambient mode, behind the waypoint;
the Fortio client in ambient mode, so that its traffic to `details` goes through the waypoint),
runs one pod per Deployment (harness/kubelet.py: productpage, reviews and ratings with sidecars,
details and the client in ambient, the waypoint), prints exactly one JSON line on stdout

    {"kubeconfig": "<path>", "namespace": "bookinfo",
     "image": {"url": "oci://<registry>/envoy-throttle:0.1.0", "sha256": "<hex>"},
     "client": ["ip", "netns", "exec", "<client pod's namespace>"],
     "services": {"productpage": {"url": "http://productpage.bookinfo.svc.cluster.local:9080/...",
                                  "arrivals": "<file: one arrival time per line, seconds since the epoch>"},
                  "details": {...}, "reviews": {...}, "ratings": {...}}}

and runs until SIGTERM (or SIGINT), then stops everything it started, by PID, and removes its
network namespaces (`tie-<pid>-*`). Diagnostics go to stderr. Apply a WasmPlugin with
`kubectl --kubeconfig <kubeconfig> apply -f plugin.yaml` (url and sha256 from "image"), run load
with `<client> fortio load ... <url>`, and read the arrivals at the application: istio/README.md,
"A real control plane on one machine".

`Mesh` is the same machinery for the tests (tests/istio_e2e): control plane, kubelet, image.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from harness import meshpatches
from harness.controlplane import ControlPlane
from harness.kubelet import Kubelet, Pod
from harness.netns import Network, check_available, clean_stale
from harness.procs import ROOT, WASM
from tools import engine_image, wasm_image

PREFIX = "tie-"  # network namespaces: tie-<pid>-<node>
IMAGE_TAG = "envoy-throttle:0.1.0"
NAMESPACE = "bookinfo"
# A digest for k8s/engine/image.env, which the cluster-scope overlays need to build; no image is
# pulled here (harness/kubelet.py runs the engine's binaries), so it is the sha256 of a string.
LOCAL_ENGINE_DIGEST = "sha256:" + hashlib.sha256(b"harness.mesh: not an image").hexdigest()


def log(msg: str) -> None:
    print(f"harness.mesh: {msg}", file=sys.stderr, flush=True)


class Mesh:
    """Network namespaces, the control plane, the kubelet and the pushed image. Use as a context
    manager; everything stops on exit (and at interpreter exit)."""

    def __init__(self, workdir: Path | None = None, istiod_env: dict[str, str] | None = None):
        check_available(PREFIX)
        removed = clean_stale(PREFIX)
        if removed:
            log(f"removed namespaces of earlier runs that are gone: {', '.join(removed)}")
        if not WASM.exists():
            raise FileNotFoundError(f"{WASM.relative_to(ROOT)} missing: run `make build`")
        self._own_dir = workdir is None
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="istio-e2e-"))
        self.dir.chmod(0o755)
        self.net = Network(PREFIX, workdir=self.dir)
        self.istiod_env = istiod_env
        self.cp: ControlPlane | None = None
        self.kubelet: Kubelet | None = None
        self.image_url = ""
        self.image_sha256 = ""
        self.manifests = self.dir / "manifests"

    def __enter__(self) -> Mesh:
        self.net.__enter__()
        try:
            self.cp = ControlPlane(self.net, istiod_env=self.istiod_env).start()
            self.kubelet = Kubelet(self.cp)
            self.cp.kube.apply([meshpatches.TELEMETRY_NO_ISTIO_STATS])
            self.push_image()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.kubelet is not None:
            self.kubelet.stop_all()
        if self.cp is not None:
            self.cp.stop()
        self.net.down()
        # Logs, keys and configs of the run; ISTIO_E2E_KEEP=1 keeps them for a look afterwards.
        if self._own_dir and os.environ.get("ISTIO_E2E_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)
        elif self._own_dir:
            log(f"kept {self.dir}")

    @property
    def kube(self) -> Any:
        assert self.cp is not None
        return self.cp.kube

    def push_image(self) -> None:
        """`make k8s-image-push IMAGE=<registry>/envoy-throttle:0.1.0`, the registry being the
        control plane's: the push (tools/wasm_image.py) goes through the host's forward, and the
        url the manifests name is the registry as the pods reach it. Then a copy of istio/ and k8s/
        with that url and digest in istio/image/image.env, as `make k8s-image-push` writes it."""
        assert self.cp is not None
        pushed = wasm_image.push(f"{self.cp.registry_host_from_host}/{IMAGE_TAG}", WASM, insecure=True)
        self.image_sha256 = pushed.removeprefix("sha256:")
        self.image_url = f"oci://{self.cp.registry_host}/{IMAGE_TAG}"
        for top in ("istio", "k8s"):
            shutil.rmtree(self.manifests / top, ignore_errors=True)
            shutil.copytree(ROOT / top, self.manifests / top, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
        wasm_image.set_image(url=self.image_url, sha256=self.image_sha256,
                             env=self.manifests / wasm_image.IMAGE_ENV.relative_to(ROOT))
        engine_image.set_digest(LOCAL_ENGINE_DIGEST, env=self.manifests / engine_image.IMAGE_ENV.relative_to(ROOT))
        log(f"pushed {self.image_url} (sha256:{self.image_sha256[:12]}...)")

    def apply_k(self, path: str | Path) -> str:
        """`kubectl apply -k` of a kustomization of the configured copy (e.g. "k8s/overlays/sidecar")."""
        return str(self.kube.apply_k(self.manifests / path))

    def bookinfo(self) -> dict[str, Pod]:
        """The composition `python -m harness.mesh` runs (module docstring); {service: pod}."""
        assert self.kubelet is not None
        k = self.manifests / "harness-mesh"
        k.mkdir(exist_ok=True)
        no_sidecar = {"sidecar.istio.io/inject": "false", "istio.io/dataplane-mode": "ambient"}

        def relabel(kind: str, name: str, labels: dict[str, str], template: bool) -> dict[str, Any]:
            meta = {"labels": labels}
            body: dict[str, Any] = {"apiVersion": "apps/v1" if kind == "Deployment" else "v1", "kind": kind,
                                    "metadata": {"name": name, "namespace": NAMESPACE}}
            if template:
                body["spec"] = {"template": {"metadata": meta}}
            else:
                body["metadata"].update(meta)
            return {"patch": yaml.safe_dump(body)}

        (k / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": ["../k8s/overlays/sidecar", "../istio/waypoint"],
            "patches": [relabel("Deployment", "details-v1", no_sidecar, True),
                        relabel("Deployment", "fortio", no_sidecar, True),
                        relabel("Service", "details", {"istio.io/use-waypoint": "waypoint"}, False)]}))
        self.apply_k("harness-mesh")
        self.kube.apply([meshpatches.waypoint_envoyfilter(NAMESPACE)])
        pods: dict[str, Pod] = {}
        for svc in ("ratings", "reviews", "details", "productpage"):
            (pods[svc],) = self.kubelet.start_deployment(NAMESPACE, f"{svc}-v{2 if svc == 'reviews' else 1}", replicas=1)
            log(f"{svc}: pod {pods[svc].name} ({pods[svc].mode}) at {pods[svc].ip}")
        self.kubelet.start_waypoint(NAMESPACE)
        (client,) = self.kubelet.start_deployment(NAMESPACE, "fortio", replicas=1)
        pods["client"] = client
        return pods


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    from perf.bookinfo.services import PATHS

    with Mesh() as mesh:
        pods = mesh.bookinfo()
        client = pods.pop("client")
        out = {"kubeconfig": str(mesh.cp.kubeconfig if mesh.cp else ""), "namespace": NAMESPACE,
               "image": {"url": mesh.image_url, "sha256": mesh.image_sha256},
               "client": ["ip", "netns", "exec", client.node.ns],
               "services": {name: {"url": f"http://{name}.{NAMESPACE}.svc.cluster.local:9080{PATHS[name]}",
                                   "arrivals": str(pod.arrivals)} for name, pod in pods.items()}}
        print(json.dumps(out), flush=True)
        log("ready; SIGTERM stops it")
        while not stop.wait(1):
            pass
        log("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
