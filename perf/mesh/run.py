"""Runs the mesh comparison on a real Kubernetes cluster (it cannot run on a
machine without one; its parsing and tables are tested offline in
tests/k8s/test_k8s_perf_mesh.py).

    python -m perf.mesh.run [--out DIR] [--install] [--configs ...] [--loads ...]

For each overlay in k8s/overlays (scenarios.CONFIGS): recreates namespace
bookinfo from it (`kubectl apply -k`), waits for the rollouts (and the waypoint),
then drives the in-cluster Fortio through its REST API (kubectl port-forward) for
each load (scenarios.LOADS), saves Fortio's JSON as <out>/<config>/<load>.json,
and at the end prints the tables (results.py). Results go to perf/reports/mesh/<run-id>/ by default.

Cluster requirements: >= 2 nodes labelled perf.throttle.dev/role=server (Bookinfo,
2 replicas on different nodes) and >= 1 labelled perf.throttle.dev/role=client
(Fortio), kubectl and istioctl on PATH (or --istioctl). --install installs Istio
with the ambient profile (ztunnel, CNI, istiod; sidecar injection still works by
namespace label) and the Gateway API CRDs from the module Istio pins.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from harness.net import free_port, wait_until
from harness.procs import stop
from harness.results import run_dir

from .results import collect, tables
from .scenarios import CONFIGS, LOADS

ROOT = Path(__file__).resolve().parent.parent.parent
NS = "bookinfo"
ROLE = "perf.throttle.dev/role"


def sh(*cmd: str, timeout: float = 600, check: bool = True) -> str:
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def preflight() -> None:
    nodes = json.loads(sh("kubectl", "get", "nodes", "-o", "json"))["items"]
    roles = [n["metadata"].get("labels", {}).get(ROLE) for n in nodes]
    if roles.count("server") < 2 or roles.count("client") < 1:
        raise SystemExit(f"label >= 2 nodes {ROLE}=server and >= 1 {ROLE}=client (now: {roles})")


def install(istioctl: str) -> None:
    gw = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api"], cwd=ROOT / "tools" / "istio",
                        capture_output=True, text=True, check=True).stdout.strip()
    sh("kubectl", "apply", "--server-side", "-f", f"{gw}/config/crd/standard")
    sh(istioctl, "install", "-y", "--set", "profile=ambient", timeout=900)


def deploy(config: str) -> None:
    sh("kubectl", "delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=600)
    sh("kubectl", "apply", "-k", str(ROOT / "k8s" / "overlays" / config))
    for d in json.loads(sh("kubectl", "-n", NS, "get", "deploy", "-o", "json"))["items"]:
        sh("kubectl", "-n", NS, "rollout", "status", f"deploy/{d['metadata']['name']}", "--timeout=600s", timeout=660)
    if "waypoint" in config:
        sh("kubectl", "-n", NS, "wait", "--for=condition=Programmed", "gateway/waypoint", "--timeout=300s", timeout=330)


class PortForward:
    def __init__(self, target: str, remote: int):
        self.port = free_port()
        self.cmd = ["kubectl", "-n", NS, "port-forward", target, f"{self.port}:{remote}"]

    def __enter__(self) -> PortForward:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: _get(f"http://127.0.0.1:{self.port}/fortio/rest/status"), 30, "port-forward")
        return self

    def __exit__(self, *exc: object) -> None:
        stop(self.proc)


def _get(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def fortio_run(port: int, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/fortio/rest/run?jsonPath=.metadata",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="results directory (default perf/reports/mesh/<run-id>)")
    ap.add_argument("--install", action="store_true", help="install Istio (ambient profile) and Gateway API CRDs")
    ap.add_argument("--istioctl", default="istioctl")
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS))
    ap.add_argument("--loads", nargs="*", default=[x.name for x in LOADS])
    ap.add_argument("--duration", default="60s")
    ap.add_argument("--warmup", default="10s")
    a = ap.parse_args(argv)
    preflight()
    _, results = run_dir("mesh", "cluster", a.out)
    if a.install:
        install(a.istioctl)
    loads = [x for x in LOADS if x.name in a.loads]
    for config in a.configs:
        deploy(config)
        with PortForward("deploy/fortio", 8080) as pf:
            for load in loads:
                body = load.fortio_request()
                warm = json.loads(json.dumps(body))
                warm["metadata"]["t"] = a.warmup
                fortio_run(pf.port, warm, timeout=120)  # warm-up, not recorded
                body["metadata"]["t"] = a.duration
                result = fortio_run(pf.port, body, timeout=600)
                out = results / config / f"{load.name}.json"
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(result, indent=1))
                print(f"{config} {load.name}: {result.get('ActualQPS', 0):.1f} req/s, codes {result.get('RetCodes')}")
                time.sleep(5)
    print(tables(collect(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
