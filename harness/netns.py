"""A small "cluster network" of Linux network namespaces: one namespace per node or pod, joined by
veth pairs to a bridge that lives in a switch namespace of its own. Nothing is created in the host's
namespace: the addresses exist only inside these namespaces, so no traffic leaves them.

Every namespace is named `<prefix><pid>-<name>` (the prefix names the user, the PID the run), and
only those are ever removed: on `down()`, at interpreter exit, and by `clean_stale(prefix)` for runs
whose process is gone. Processes are started with `ip netns exec` (which execs, so the PID held is
the process itself), optionally as another user and with a scratch directory over `/var/lib` in a
mount namespace of their own, and stopped by that PID.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness.procs import stop

NETNS_ETC = Path("/etc/netns")


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be created here (not root, no `ip`, no netns support)."""


def check_available(prefix: str) -> None:
    """Raises NetnsUnavailable with the reason when namespaces cannot be made here."""
    if shutil.which("ip") is None:
        raise NetnsUnavailable("`ip` (iproute2) not found: install iproute2")
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root")
    probe = f"{prefix}{os.getpid()}-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        raise NetnsUnavailable(f"`ip netns add` failed: {r.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(prefix: str) -> list[str]:
    """Removes the namespaces (and their /etc/netns files) of earlier runs with this prefix whose
    process is gone; returns their names. Namespaces of live runs are left alone."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    removed = []
    for name in (line.split()[0] for line in out.splitlines() if line.strip()):
        m = re.match(re.escape(prefix) + r"(\d+)-", name)
        if m and not _pid_alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
            removed.append(name)
    return removed


class Node:
    """One network namespace with one address on the bridge (and loopback up)."""

    def __init__(self, net: Network, name: str, addr: str):
        self.net, self.name, self.addr = net, name, addr
        self.ns = f"{net.prefix}{name}"
        self.hosts: dict[str, str] = {}

    def set_hosts(self, hosts: dict[str, str]) -> None:
        """This namespace's /etc/hosts (`ip netns exec` binds /etc/netns/<ns>/hosts over it).
        Written in place, so processes started earlier see the change too."""
        self.hosts.update(hosts)
        d = NETNS_ETC / self.ns
        d.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost"] + [f"{ip} {name}" for name, ip in sorted(self.hosts.items())]
        path = d / "hosts"
        with open(path, "a+") as f:  # same inode: existing bind mounts keep seeing it
            f.seek(0)
            f.truncate()
            f.write("\n".join(lines) + "\n")

    def argv(self, cmd: list[str], user: int | None = None, var_lib: Path | None = None) -> list[str]:
        """`cmd` run in this namespace; as uid/gid `user` (setpriv) and with `var_lib` mounted
        over /var/lib in a private mount namespace (unshare), when given. Every step execs."""
        inner = list(cmd)
        if user is not None:
            inner = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *inner]
        if var_lib is not None:
            inner = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                     'mount --bind "$0" /var/lib && exec "$@"', str(var_lib), *inner]
        return ["ip", "netns", "exec", self.ns, *inner]

    def popen(self, cmd: list[str], log: Path, env: dict[str, str] | None = None, user: int | None = None,
              var_lib: Path | None = None, cwd: Path | None = None) -> subprocess.Popen:
        with open(log, "ab") as f:
            proc = subprocess.Popen(self.argv(cmd, user, var_lib), stdout=f, stderr=subprocess.STDOUT,
                                    env=env, cwd=cwd, start_new_session=True)
        self.net.procs.append(proc)
        return proc

    def run(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
        r = subprocess.run(self.argv(cmd), capture_output=True, text=True, errors="replace", timeout=timeout,
                           env=env)
        if check and r.returncode != 0:
            raise RuntimeError(f"in {self.ns}: {' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-2000:]}"
                               f"{r.stderr[-2000:]}")
        return r

    def route(self, cidr: str) -> None:
        """Routes `cidr` out of eth0 (Service addresses: nothing answers them, the capture takes them)."""
        _ip("-n", self.ns, "route", "add", cidr, "dev", "eth0")


class Network:
    """Nodes joined by a bridge in a switch namespace. Use as a context manager; teardown also
    runs at interpreter exit if the `with` block is skipped."""

    def __init__(self, prefix: str, subnet: str = "10.244.0", workdir: Path | None = None):
        self.prefix = f"{prefix}{os.getpid()}-"
        self.subnet = subnet
        self.nodes: dict[str, Node] = {}
        self.created: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.dir = workdir or Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
        self._next = 2
        self._up = False

    def __enter__(self) -> Network:
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
        self._up = True

    def add(self, name: str) -> Node:
        """A new node with the next free address of the subnet."""
        if name in self.nodes:
            raise ValueError(f"node {name} exists")
        if self._next > 254:
            raise RuntimeError(f"subnet {self.subnet}.0/24 is full")
        node = Node(self, name, f"{self.subnet}.{self._next}")
        self._next += 1
        ns = self._add_ns(name)
        sw = f"{self.prefix}sw"
        port = f"p{node.addr.rsplit('.', 1)[1]}"
        # Created inside the switch namespace: nothing appears in the host namespace.
        _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", sw, "link", "set", port, "master", "br0")
        _ip("-n", sw, "link", "set", port, "up")
        _ip("-n", ns, "addr", "add", f"{node.addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        node.set_hosts({})
        self.nodes[name] = node
        return node

    def remove(self, name: str) -> None:
        """Removes one node's namespace (its processes must be stopped first)."""
        node = self.nodes.pop(name)
        subprocess.run(["ip", "netns", "del", node.ns], capture_output=True)
        shutil.rmtree(NETNS_ETC / node.ns, ignore_errors=True)
        if node.ns in self.created:
            self.created.remove(node.ns)

    def down(self) -> None:
        """Stops every process started here (by PID) and removes only the namespaces made here."""
        for proc in reversed(self.procs):
            stop(proc, timeout=10)
        self.procs.clear()
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        self.created.clear()
        self.nodes.clear()

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def leftover(self) -> list[str]:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in out.splitlines() if line.startswith(self.prefix)]
