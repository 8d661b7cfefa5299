"""A real Kubernetes API server and a real istiod on one machine, inside a network namespace.

The control-plane node (harness/netns.py) runs
- etcd (Debian `etcd-server`) on its loopback,
- kube-apiserver (built from k8s.io/kubernetes, tools/setup-istio-e2e.sh) on :6443, with a static
  admin token, service-account token signing (audiences: the API server's and `istio-ca`) and
  AlwaysAllow authorization; no controller-manager, scheduler or kubelet (harness/kubelet.py plays
  the kubelet and the endpoint-slice controller),
- istiod (`pilot-discovery`, built from istio.io/istio) as the mesh's CA and xDS server, reached
  by the pods as `istiod.istio-system.svc:15012`,
- Debian's `docker-registry` on :5000, where the filter's OCI image is pushed.

The host reaches the API server through `harness.nsforward` (127.0.0.1:<port>), so a `kubectl`
outside the namespaces works with the kubeconfig written here (`kubeconfig`). What differs from a
real installation of Istio, and why, is in harness/meshpatches.py.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from harness import meshpatches
from harness.net import http_get, wait_until
from harness.netns import Network, Node
from harness.nsforward import Forward, call_in
from harness.procs import ROOT
from harness.tools import path as tool_path

TOOLS_JSON = ROOT / "build" / "istio-e2e" / "tools.json"
K8S_TOOLS_JSON = ROOT / "build" / "k8s" / "tools.json"
SERVICE_CIDR = "10.96.0.0/16"
ISTIOD_HOST = "istiod.istio-system.svc"
REGISTRY_PORT = 5000
APISERVER_PORT = 6443


def load_tools() -> dict[str, str]:
    """Paths of the binaries `make istio-e2e-setup` built or installed (and `make k8s-setup`'s)."""
    tools: dict[str, str] = {}
    for path, target in ((TOOLS_JSON, "istio-e2e-setup"), (K8S_TOOLS_JSON, "k8s-setup")):
        if not path.exists():
            raise FileNotFoundError(f"{path.relative_to(ROOT)} missing: run `make {target}`")
        tools.update(json.loads(path.read_text()))
    for name in ("kube-apiserver", "kubectl", "pilot-discovery", "pilot-agent", "etcd", "crane"):
        if not Path(tools[name]).exists():
            raise FileNotFoundError(f"{name}: {tools[name]} missing: run `make istio-e2e-setup`")
    return tools


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}: {r.stderr.strip()}")


class Kube:
    """`kubectl` (the one built with the API server) against this API server, from the host."""

    def __init__(self, kubectl: str, kubeconfig: Path):
        self.kubectl, self.kubeconfig = kubectl, kubeconfig

    def run(self, *args: str, input: str | None = None, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([self.kubectl, "--kubeconfig", str(self.kubeconfig), *args], input=input,
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: exit {r.returncode}\n{r.stderr[-3000:]}")
        return r

    def apply(self, docs: str | list[dict[str, Any]], server_side: bool = False) -> str:
        text = docs if isinstance(docs, str) else yaml.safe_dump_all(docs)
        extra = ["--server-side", "--force-conflicts"] if server_side else []
        return self.run("apply", *extra, "-f", "-", input=text).stdout

    def apply_k(self, path: Path) -> str:
        """`kubectl apply -k <path>`, as a user applies an overlay."""
        return self.run("apply", "-k", str(path)).stdout

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        ns = ["-n", namespace] if namespace else []
        self.run("delete", kind, name, *ns, "--ignore-not-found", "--wait=false")

    def get(self, kind: str, name: str | None = None, namespace: str | None = None,
            selector: str | None = None) -> dict[str, Any]:
        args = ["get", kind] + ([name] if name else [])
        args += ["-n", namespace] if namespace else (["-A"] if not name else [])
        args += ["-l", selector] if selector else []
        out: dict[str, Any] = json.loads(self.run(*args, "-o", "json").stdout)
        return out

    def items(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
        return list(self.get(kind, namespace=namespace, selector=selector).get("items", []))

    def exists(self, kind: str, name: str, namespace: str | None = None) -> bool:
        ns = ["-n", namespace] if namespace else []
        return self.run("get", kind, name, *ns, check=False).returncode == 0

    def patch_status(self, kind: str, name: str, namespace: str, status: dict[str, Any]) -> None:
        self.run("patch", kind, name, "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": status}))

    def token(self, service_account: str, namespace: str, audience: str = "istio-ca") -> str:
        """A service account token (TokenRequest), what the kubelet projects into a pod."""
        return self.run("create", "token", service_account, "-n", namespace, "--audience", audience,
                        "--duration", "24h").stdout.strip()


class ControlPlane:
    """etcd, kube-apiserver, istiod and the registry in the node `cp` of `net`. Use as a context
    manager (or start/stop); processes are stopped by PID with the network."""

    def __init__(self, net: Network, tools: dict[str, str] | None = None, istiod_env: dict[str, str] | None = None,
                 node: Node | None = None):
        self.net = net
        self.tools = tools or load_tools()
        self.dir = net.dir / "cp"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.node: Node = node or net.add("cp")  # `node`: one the caller made (the mesh lab's)
        self.admin_token = secrets.token_hex(16)
        self.forwards: list[Forward] = []
        self.procs: dict[str, subprocess.Popen] = {}
        # The istiod settings of meshpatches (each named there), plus the caller's.
        self.istiod_env = {**meshpatches.ISTIOD_ENV, **(istiod_env or {})}
        self.kubeconfig = self.dir / "kubeconfig"
        self.kube = Kube(self.tools["kubectl"], self.kubeconfig)
        self.api_port = 0
        self.registry_port = 0

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> ControlPlane:
        t0 = time.monotonic()
        self.node.set_hosts({ISTIOD_HOST: self.node.addr})
        self._keys()
        self._etcd()
        self._apiserver()
        self._crds()
        self._registry()
        self._istiod()
        self.log(f"control plane up in {time.monotonic() - t0:.1f} s")
        return self

    def stop(self) -> None:
        from harness.procs import stop

        for fwd in self.forwards:
            fwd.stop()
        self.forwards.clear()
        for name in ("prometheus", "istiod", "registry", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop(proc, timeout=15)

    def __enter__(self) -> ControlPlane:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @staticmethod
    def log(msg: str) -> None:
        print(f"controlplane: {msg}", file=sys.stderr, flush=True)

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.procs[name] = self.node.popen(cmd, self.dir / f"{name}.log", env=env, cwd=cwd)

    def logs(self, name: str) -> str:
        try:
            return (self.dir / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.logs(name)[-4000:]}")

    def get(self, port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET http://<cp>:port<path> from inside the namespaces (istiod's debug endpoints)."""
        status, _, body = call_in(self.node.ns, lambda: http_get(f"http://127.0.0.1:{port}{path}", timeout=timeout))
        return status, body

    # -- pieces ----------------------------------------------------------------------------
    def _keys(self) -> None:
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=self.dir)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=self.dir)
        (self.dir / "tokens.csv").write_text(f"{self.admin_token},admin,admin,system:masters\n")

    def _etcd(self) -> None:
        self._spawn("etcd", [self.tools["etcd"], "--name", "cp", "--data-dir", str(self.dir / "etcd"),
                             "--listen-client-urls", "http://127.0.0.1:2379",
                             "--advertise-client-urls", "http://127.0.0.1:2379",
                             "--listen-peer-urls", "http://127.0.0.1:2380",
                             "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                             "--initial-cluster", "cp=http://127.0.0.1:2380", "--log-level", "warn"])

        def healthy() -> bool:
            self._alive("etcd")
            try:
                return call_in(self.node.ns, lambda: http_get("http://127.0.0.1:2379/health", timeout=1))[0] == 200
            except OSError:
                return False

        wait_until(healthy, 60, "etcd healthy", interval=0.2)

    def _apiserver(self) -> None:
        self._spawn("kube-apiserver", [
            self.tools["kube-apiserver"], "--etcd-servers=http://127.0.0.1:2379",
            "--bind-address=0.0.0.0", f"--secure-port={APISERVER_PORT}", f"--advertise-address={self.node.addr}",
            f"--cert-dir={self.dir / 'apiserver'}", f"--token-auth-file={self.dir / 'tokens.csv'}",
            "--authorization-mode=AlwaysAllow",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.dir / 'sa.pub'}",
            f"--service-account-signing-key-file={self.dir / 'sa.key'}",
            "--api-audiences=https://kubernetes.default.svc.cluster.local,istio-ca",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--v=0"])
        fwd = Forward(self.node.ns, "127.0.0.1", APISERVER_PORT)
        self.forwards.append(fwd)
        self.api_port = fwd.port
        self._write_kubeconfig(self.kubeconfig, f"https://127.0.0.1:{fwd.port}")
        self._write_kubeconfig(self.dir / "kubeconfig-inside", f"https://127.0.0.1:{APISERVER_PORT}")

        def ready() -> bool:
            self._alive("kube-apiserver")
            return self.kube.run("get", "--raw", "/readyz", check=False, timeout=10).returncode == 0

        wait_until(ready, 120, "kube-apiserver /readyz", interval=0.5)
        # The default service account of a namespace is made by the controller-manager; there is none.
        wait_until(lambda: self.kube.exists("namespace", "default"), 30, "namespace default")

    def _write_kubeconfig(self, path: Path, server: str) -> None:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "istio-e2e",
            "clusters": [{"name": "istio-e2e", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
            "users": [{"name": "admin", "user": {"token": self.admin_token}}],
            "contexts": [{"name": "istio-e2e", "context": {"cluster": "istio-e2e", "user": "admin"}}]}))

    def _crds(self) -> None:
        """Istio's CRDs (the module's crd-all.gen.yaml) and the Gateway API's standard channel from
        the module Istio pins, applied server-side as `istioctl install` / the Gateway API docs do."""
        istio = Path(self.tools["istio_module"]) / "manifests" / "charts" / "base" / "files" / "crd-all.gen.yaml"
        self.kube.apply(istio.read_text(), server_side=True)
        gw_dir = Path(self.tools["gateway_api_module"]) / "config" / "crd" / "standard"
        for f in sorted(gw_dir.glob("*.yaml")):
            self.kube.apply(f.read_text(), server_side=True)
        self.kube.run("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s", timeout=150)

    def _registry(self) -> None:
        cfg = self.dir / "registry.yml"
        cfg.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                       f"    rootdirectory: {self.dir / 'registry'}\nhttp:\n  addr: 0.0.0.0:{REGISTRY_PORT}\n")
        self._spawn("registry", [tool_path("docker-registry"), "serve", str(cfg)])
        fwd = Forward(self.node.ns, "127.0.0.1", REGISTRY_PORT)
        self.forwards.append(fwd)
        self.registry_port = fwd.port

        def ready() -> bool:
            self._alive("registry")
            try:
                return http_get(f"http://127.0.0.1:{fwd.port}/v2/", timeout=1)[0] == 200
            except OSError:
                return False

        wait_until(ready, 30, "registry /v2/", interval=0.2)

    @property
    def registry_host(self) -> str:
        """The registry as the pods (pilot-agent) reach it."""
        return f"{self.node.addr}:{REGISTRY_PORT}"

    @property
    def registry_host_from_host(self) -> str:
        """The same registry as the host (crane) reaches it."""
        return f"127.0.0.1:{self.registry_port}"

    def _istiod(self) -> None:
        d = self.dir / "istiod"
        d.mkdir(exist_ok=True)
        (d / "mesh.yaml").write_text(yaml.safe_dump(meshpatches.mesh_config(ISTIOD_HOST)))
        env = {**os.environ, "POD_NAME": "istiod-0", "POD_NAMESPACE": "istio-system", "REVISION": "default",
               "CLUSTER_ID": "Kubernetes", "PILOT_CERT_PROVIDER": "istiod", "JWT_POLICY": "third-party-jwt",
               "INJECTION_WEBHOOK_CONFIG_NAME": "", "VALIDATION_WEBHOOK_CONFIG_NAME": "",
               **self.istiod_env}
        self.kube.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}])
        self._spawn("istiod", [self.tools["pilot-discovery"], "discovery",
                               "--kubeconfig", str(self.dir / "kubeconfig-inside"),
                               "--meshConfig", str(d / "mesh.yaml"), "--domain", "cluster.local",
                               "--log_output_level", "default:info"], env=env, cwd=d)

        def ready() -> bool:
            self._alive("istiod")
            try:
                return self.get(8080, "/ready", timeout=1)[0] == 200
            except OSError:
                return False

        wait_until(ready, 180, "istiod /ready", interval=0.5)

    # -- what istiod knows ---------------------------------------------------------------
    def root_cert(self, namespace: str, timeout: float = 60) -> str:
        """The mesh's root certificate, from the ConfigMap istiod writes into every namespace."""
        def read() -> str | None:
            r = self.kube.run("get", "configmap", "istio-ca-root-cert", "-n", namespace, "-o", "json", check=False)
            if r.returncode != 0:
                return None
            return str(json.loads(r.stdout)["data"]["root-cert.pem"])

        return str(wait_until(read, timeout, f"istio-ca-root-cert in {namespace}", interval=0.5))

    def ca_key_pair(self) -> tuple[str, str]:
        """istiod's self-signed CA (secret istio-system/istio-ca-secret): (cert PEM, key PEM)."""
        import base64

        data = self.kube.get("secret", "istio-ca-secret", "istio-system")["data"]
        return base64.b64decode(data["ca-cert.pem"]).decode(), base64.b64decode(data["ca-key.pem"]).decode()

    def syncz(self) -> list[dict[str, Any]]:
        """istiod's /debug/syncz: per connected proxy, what was sent and acknowledged per xDS type."""
        status, body = self.get(8080, "/debug/syncz")
        if status != 200:
            raise RuntimeError(f"istiod /debug/syncz: {status} {body[:300]!r}")
        out: list[dict[str, Any]] = json.loads(body)
        return out

    def config_dump(self, proxy_id: str) -> dict[str, Any]:
        """istiod's view of one proxy's configuration (/debug/config_dump?proxyID=)."""
        status, body = self.get(8080, f"/debug/config_dump?proxyID={proxy_id}", timeout=10)
        if status != 200:
            raise RuntimeError(f"istiod config_dump {proxy_id}: {status} {body[:300]!r}")
        out: dict[str, Any] = json.loads(body)
        return out
