"""The lab: "nodes" as Linux network namespaces joined by veth pairs to a bridge.

Every namespace is created by the lab with a unique prefix (`tml-<pid>-`), and
only those are ever removed. Addresses come from a private range that exists
only inside these namespaces, so no lab traffic leaves them. Processes inside a
node are started with `ip netns exec` (which execs, so the PID we hold is the
process itself) and stopped by that PID.
"""

from __future__ import annotations

import atexit
import http.client
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness import procstats
from harness.procs import stop, wait_until

SUBNET = "10.254.7"  # /24, only inside the lab's namespaces
NODE_ADDRS = {"client": f"{SUBNET}.1", "app": f"{SUBNET}.2", "waypoint": f"{SUBNET}.3"}


class LabUnavailable(RuntimeError):
    """Namespaces cannot be created here (not root, no `ip`, no netns support)."""


def check_available() -> None:
    """Raises LabUnavailable with a clear reason when the lab cannot run here."""
    if shutil.which("ip") is None:
        raise LabUnavailable("`ip` (iproute2) not found: install iproute2")
    if os.geteuid() != 0:
        raise LabUnavailable("network namespaces need root (run as root or skip the mesh lab)")
    probe = f"tml-{os.getpid()}-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        raise LabUnavailable(f"`ip netns add` failed: {r.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


class Node:
    """One namespace with one address on the lab bridge."""

    def __init__(self, lab: Lab, name: str, addr: str):
        self.lab, self.name, self.addr = lab, name, addr
        self.ns = f"{lab.prefix}{name}"

    def popen(self, cmd: list[str], log: Path) -> subprocess.Popen:
        with open(log, "wb") as f:
            proc = subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], stdout=f, stderr=subprocess.STDOUT)
        self.lab.procs.append(proc)
        return proc

    def run(self, cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns, *cmd], capture_output=True, text=True, errors="replace",
                              timeout=timeout)

    def can_connect(self, host: str, port: int) -> bool:
        r = self.run(["python3", "-c", f"import socket; socket.create_connection(({host!r}, {port}), timeout=0.5)"],
                     timeout=10)
        return r.returncode == 0


class Lab:
    """Nodes joined by a bridge in a switch namespace. Use as a context manager;
    teardown also runs at interpreter exit if the `with` block is skipped."""

    def __init__(self, nodes: tuple[str, ...] = ("client", "app", "waypoint")):
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
            node = Node(self, name, NODE_ADDRS[name])
            ns = self._add_ns(name)
            port = f"p-{name}"[:15]
            # Created inside the switch namespace: nothing appears in the host namespace.
            _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", sw, "link", "set", port, "master", "br0")
            _ip("-n", sw, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{node.addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            self.nodes[name] = node

    def down(self) -> None:
        """Stops every process the lab started (by PID) and removes only the namespaces it created."""
        for proc in reversed(self.procs):
            stop(proc, timeout=5)
        self.procs.clear()
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created.clear()
        # Per-run keys, configs and logs; MESHLAB_KEEP=1 keeps them for debugging.
        if os.environ.get("MESHLAB_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def leftover_namespaces(self) -> list[str]:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in out.splitlines() if line.startswith(self.prefix)]


# --- processes: per-process CPU and memory (harness/procstats.py) -------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads)."""
    return procstats.cpu_seconds(pid)


def rss_mb(pid: int) -> float:
    """Resident set size of one process, MiB."""
    return procstats.rss_kib(pid) / 1024


# --- Envoy admin over a Unix socket (reachable from the host whatever the namespace) -----

class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def admin_get(sock: Path, path: str, timeout: float = 5.0) -> tuple[int, str]:
    conn = _UnixHTTPConnection(str(sock), timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


class NodeEnvoy:
    """A real Envoy inside a node, admin on a Unix socket in the lab directory."""

    def __init__(self, node: Node, name: str, config: dict, concurrency: int = 2):
        import yaml

        from harness.procs import envoy_bin, free_port

        self.node, self.name, self.config = node, name, config
        d = node.lab.dir / name
        d.mkdir(parents=True, exist_ok=True)
        self.admin = Path(config["admin"]["address"]["pipe"]["path"])
        self.config_path = d / "envoy.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = d / "envoy.log"
        self.cmd = [envoy_bin(), "-c", str(self.config_path), "--concurrency", str(concurrency),
                    "--log-level", "warning", "--base-id", str(free_port()), "--disable-hot-restart"]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> NodeEnvoy:
        self.proc = self.node.popen(self.cmd, self.log_path)
        try:
            wait_until(self._ready, timeout, f"envoy {self.name} ready")
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"envoy {self.name} did not start:\n{self.log()[-3000:]}") from None
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"envoy {self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            return admin_get(self.admin, "/ready", timeout=0.5)[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        stop(self.proc, timeout=5)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stats(self, regex: str) -> dict[str, int]:
        """Counters and gauges matching `regex` (Envoy's /stats?filter=)."""
        _, body = admin_get(self.admin, f"/stats?filter={regex}")
        out = {}
        for line in body.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


class AppServer:
    """The app: `fortio server` on the app node, all addresses, port 8080."""

    PORT = 8080

    def __init__(self, node: Node, fortio: str):
        self.node = node
        self.cmd = [fortio, "server", "-http-port", f"0.0.0.0:{self.PORT}", "-grpc-port", "disabled",
                    "-redirect-port", "disabled", "-tcp-port", "disabled", "-udp-port", "disabled",
                    "-loglevel", "warning"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> AppServer:
        self.proc = self.node.popen(self.cmd, self.node.lab.dir / "app.log")
        deadline = time.monotonic() + 15
        while not self.node.can_connect(self.node.addr, self.PORT):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("fortio server did not start: " + (self.node.lab.dir / "app.log").read_text())
            time.sleep(0.1)
        return self
