"""The lab: "nodes" as Linux network namespaces joined by veth pairs to a bridge.

Every namespace is created by the lab with a unique prefix (`tml-<pid>-`), and
only those are ever removed. Addresses come from a private range that exists
only inside these namespaces, so no lab traffic leaves them. Processes inside a
node are started with `ip netns exec` (which execs, so the PID we hold is the
process itself) and stopped by that PID.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from harness import netns, tools
from harness.envoy import Envoy
from harness.procs import stop

if TYPE_CHECKING:
    from perf.meshlab.istiod import LabMesh

SUBNET = "10.254.7"  # /24, only inside the lab's namespaces
# One node per workload, as with one pod per node and anti-affinity; the waypoint has its own node.
NODE_ADDRS = {"client": f"{SUBNET}.1", "productpage": f"{SUBNET}.2", "details": f"{SUBNET}.3",
              "reviews": f"{SUBNET}.4", "ratings": f"{SUBNET}.5", "waypoint": f"{SUBNET}.6",
              "waypoint2": f"{SUBNET}.8"}
ALL_NODES = tuple(NODE_ADDRS)
CP_ADDR = f"{SUBNET}.7"  # the control plane's node (perf/meshlab/istiod.py), when there is one
FIRST_POD_ADDR = 20  # nodes added later without an address (the engine's pods) get .20, .21, ...
NAMESPACE = "default"  # the Kubernetes namespace of the services: their names and SPIFFE identities


def service_host(service: str) -> str:
    """The name a workload dials a service by; each node's /etc/hosts says where it is."""
    return f"{service}.{NAMESPACE}.svc.cluster.local"
CAPTURE_PORT = 9080   # the services' port: outbound connections to it are captured
OUTBOUND_PORT = 15001  # where a node's proxy takes captured outbound connections


class LabUnavailable(RuntimeError):
    """Namespaces cannot be created here (not root, no `ip`, no netns support)."""


def check_available() -> None:
    """Raises LabUnavailable with a clear reason when the lab cannot run here."""
    if shutil.which("ip") is None:
        raise LabUnavailable("`ip` (iproute2) not found: install iproute2")
    if os.geteuid() != 0:
        raise LabUnavailable("network namespaces need root (run as root or skip the mesh lab)")
    try:
        tools.path("iptables")
    except FileNotFoundError as e:
        raise LabUnavailable(f"iptables (traffic capture, as Istio does): {e}") from None
    probe = f"tml-{os.getpid()}-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        raise LabUnavailable(f"`ip netns add` failed: {r.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


class Node(netns.Node):
    """One namespace with one address on the lab bridge (harness/netns.py's node: processes as
    another user, /etc/hosts), and the lab's traffic capture."""

    def __init__(self, lab: Lab, name: str, addr: str):
        super().__init__(lab, name, addr)  # type: ignore[arg-type]  # the lab is the node's network
        self.lab = lab

    def popen(self, cmd: list[str], log: IO[bytes] | Path, env: dict[str, str] | None = None,  # type: ignore[override]
              **kw: object) -> subprocess.Popen:
        """Starts `cmd` inside this node (`ip netns exec` execs: the PID is the process's own),
        stopped with the lab at the latest. `log`: an open file, or a path to append to."""
        if isinstance(log, Path):
            return super().popen(cmd, log, env=env, **kw)  # type: ignore[arg-type]
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], stdout=log, stderr=subprocess.STDOUT, env=env)
        self.lab.procs.append(proc)
        return proc

    def run(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
        return super().run(cmd, timeout, env=env, check=check)

    def capture(self, to_port: int = OUTBOUND_PORT, extra: tuple[str, ...] = ()) -> None:
        """Redirects this node's outbound TCP connections to any lab address (and the `extra`
        ranges: Service addresses) on the services' port to its local proxy on `to_port`, with an
        iptables REDIRECT in the node's own namespace (nat OUTPUT), as ambient's in-pod capture
        does. The proxy's own connections go to other ports (15008) or to 127.0.0.1, so they are
        not captured again."""
        for cidr in (f"{SUBNET}.0/24", *extra):
            r = self.run(["iptables", "-w", "5", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", cidr,
                          "--dport", str(CAPTURE_PORT), "-j", "REDIRECT", "--to-ports", str(to_port)], timeout=30)
            if r.returncode != 0:
                raise RuntimeError(f"iptables REDIRECT in {self.ns}: {r.stderr.strip()}")

    def uncapture(self) -> None:
        """Removes this node's capture rules (only the nat OUTPUT chain of the lab's own namespace)."""
        self.run(["iptables", "-w", "5", "-t", "nat", "-F", "OUTPUT"], timeout=30)

    def captured(self) -> bool:
        r = self.run(["iptables", "-w", "5", "-t", "nat", "-S", "OUTPUT"], timeout=30)
        return "REDIRECT" in r.stdout

    def can_connect(self, host: str, port: int) -> bool:
        r = self.run(["python3", "-c", f"import socket; socket.create_connection(({host!r}, {port}), timeout=0.5)"],
                     timeout=10)
        return r.returncode == 0


class Lab:
    """Nodes joined by a bridge in a switch namespace. Use as a context manager;
    teardown also runs at interpreter exit if the `with` block is skipped."""

    def __init__(self, nodes: tuple[str, ...] = ALL_NODES):
        # The application the tests run in the lab, and its control plane (set by whoever starts them).
        self.app: BookinfoApp | None = None
        self.mesh: LabMesh | None = None
        self.prefix = f"tml-{os.getpid()}-"
        self.node_names = nodes
        self.nodes: dict[str, Node] = {}
        self.created: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.dir = Path(tempfile.mkdtemp(prefix="meshlab-"))

    def __enter__(self) -> Lab:
        atexit.register(self.down)
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _add_ns(self, name: str) -> str:
        ns = f"{self.prefix}{name}"
        _ip("netns", "add", ns)
        self.created.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        return ns

    def up(self) -> None:
        sw = self._add_ns("sw")
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for name in self.node_names:
            self.add(name, NODE_ADDRS[name])
        self.set_hosts({service_host(n): NODE_ADDRS[n] for n in ALL_NODES})

    def add(self, name: str, addr: str | None = None) -> Node:
        """One more node at `addr` (the control plane's, perf/meshlab/istiod.py), or at the next free
        address from .FIRST_POD_ADDR (pods the kubelet runs in the lab: the engine's)."""
        if addr is None:
            used = {n.addr for n in self.nodes.values()}
            addr = next(a for a in (f"{SUBNET}.{i}" for i in range(FIRST_POD_ADDR, 255)) if a not in used)
        sw = f"{self.prefix}sw"
        node = Node(self, name, addr)
        ns = self._add_ns(name)
        port = f"p{addr.rsplit('.', 1)[1]}-{name}"[:15]  # unique by address
        # Created inside the switch namespace: nothing appears in the host namespace.
        _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", sw, "link", "set", port, "master", "br0")
        _ip("-n", sw, "link", "set", port, "up")
        _ip("-n", ns, "addr", "add", f"{node.addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        self.nodes[name] = node
        return node

    def set_hosts(self, hosts: dict[str, str]) -> None:
        """Where every node's /etc/hosts says the services are (node addresses without a mesh,
        Service addresses where istiod's proxies expect them); the applications resolve the names
        at each new connection."""
        for node in self.nodes.values():
            node.set_hosts(hosts)

    def remove(self, name: str) -> None:
        """Removes one node's namespace (its processes stopped first), and with it its veth pair: a
        pod the kubelet stopped."""
        node = self.nodes.pop(name)
        subprocess.run(["ip", "netns", "del", node.ns], capture_output=True)
        shutil.rmtree(netns.NETNS_ETC / node.ns, ignore_errors=True)
        if node.ns in self.created:
            self.created.remove(node.ns)

    def down(self) -> None:
        """Stops every process the lab started (by PID) and removes only the namespaces it created."""
        for proc in reversed(self.procs):
            stop(proc, timeout=5)
        self.procs.clear()
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(netns.NETNS_ETC / ns, ignore_errors=True)
        self.created.clear()
        # Per-run keys, configs and logs; MESHLAB_KEEP=1 keeps them for debugging.
        if os.environ.get("MESHLAB_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def leftover_namespaces(self) -> list[str]:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in out.splitlines() if line.startswith(self.prefix)]


class NodeEnvoy(Envoy):
    """A real Envoy inside a node (started with the node's `ip netns exec`), its files and
    its admin Unix socket (the config's `admin.address.pipe`, reachable from the host
    whatever the namespace) in the lab directory."""

    def __init__(self, node: Node, name: str, config: dict, concurrency: int = 2):
        super().__init__(config, concurrency=concurrency, log_level="warning", workdir=node.lab.dir / name)
        self.node, self.name = node, name

    def spawn(self, argv: list[str], log: IO[bytes]) -> subprocess.Popen:
        return self.node.popen(argv, log)

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)


class BookinfoApp:
    """The Bookinfo-shaped application (perf/bookinfo): each service on its own node, port 9080,
    calling the others by name (`service_host`), as Bookinfo does. Long-running, as a deployment
    is: between topologies `reset_pools` makes the callers drop their pooled connections, so that
    none made before the capture (or the names' addresses) changed is reused."""

    PORT = CAPTURE_PORT

    def __init__(self, lab: Lab):
        from perf.bookinfo import services

        self.lab = lab
        self.commands = services.commands({name: service_host(name) for name in services.SERVICES}, port=self.PORT)
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, timeout: float = 60.0) -> BookinfoApp:
        for name, cmd in self.commands.items():
            node = self.lab[name]
            env = {**os.environ, **cmd.env}
            log = self.lab.dir / f"{name}.log"
            with open(log, "wb") as f:
                self.procs[name] = node.popen(cmd.argv, f, env=env)
        deadline = time.monotonic() + timeout
        for name, proc in self.procs.items():
            while self.get(name, "/health", timeout=1.0) is None:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start:\n" + (self.lab.dir / f"{name}.log").read_text(
                        errors="replace")[-3000:])
                time.sleep(0.1)
        return self

    def stop(self) -> None:
        for proc in self.procs.values():
            stop(proc, timeout=5)
            if proc in self.lab.procs:
                self.lab.procs.remove(proc)
        self.procs.clear()

    def get(self, name: str, path: str, timeout: float = 5.0) -> dict | None:
        """GET http://127.0.0.1:9080<path> inside the service's own node (never captured: loopback);
        the JSON body, or None when it does not answer 200."""
        code = ("import json, sys, urllib.request\n"
                "try:\n"
                f"    r = urllib.request.urlopen('http://127.0.0.1:{self.PORT}' + sys.argv[1], timeout={timeout})\n"
                "    print(r.read().decode())\n"
                "except Exception as e:\n"
                "    sys.exit(1)\n")
        r = self.lab[name].run(["python3", "-c", code, path], timeout=timeout + 10)
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)

    def reset_pools(self) -> None:
        from perf.bookinfo.services import CALLS

        for name in self.procs:
            if CALLS[name] and self.get(name, "/internal/reset") is None:
                raise RuntimeError(f"{name}: /internal/reset did not answer")

    def check_running(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n" + (self.lab.dir / f"{name}.log").read_text(
                    errors="replace")[-3000:])

    def counters(self) -> dict[str, dict[str, int]]:
        """Each service's own request counters: {service: {requests, from_loopback}}."""
        out = {}
        for name in self.procs:
            c = self.get(name, "/internal/requests")
            if c is None:
                raise RuntimeError(f"{name}: /internal/requests did not answer")
            out[name] = c
        return out
