"""Loopback networking: free ports, a plain HTTP GET, and waiting for a condition."""

from __future__ import annotations

import functools
import itertools
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

# Ports handed out come from below the kernel's ephemeral range, so that no
# outgoing connection (a client's, or Envoy's to its upstream) can take one
# between the moment it is chosen and the moment its server binds it: a port
# the kernel chose (bind to port 0) is an ephemeral one, and was seen taken
# that way ("Address already in use"). Each process walks its own stretch
# of the range (from an offset its pid gives), never handing a port out twice
# while another is free, and skips any port it cannot bind now.
_LOW, _HIGH = 20000, 32768


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _HIGH


@functools.cache
def _stretch() -> tuple[range, Iterator[int]]:
    """This process's ports: the range below the ephemeral one, and an endless walk over
    it from an offset the pid gives."""
    ports = range(_LOW, min(_HIGH, _ephemeral_low()))
    walk = (ports[i % len(ports)] for i in itertools.count(os.getpid() * 211)) if ports else iter(())
    return ports, walk


def free_port() -> int:
    """A loopback TCP port nothing listens on, outside the ephemeral range."""
    ports, walk = _stretch()
    if not ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for port in itertools.islice(walk, len(ports)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {ports}")


def can_connect(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP connection to host:port is accepted (within 0.2 s)."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def http_get(url: str, timeout: float = 5.0, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one GET; an HTTP error status is an answer, not an exception."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Polls `predicate` every `interval` s until it returns something truthy, and returns
    that; TimeoutError naming `what` after `timeout` s. The way tests wait for a condition."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
