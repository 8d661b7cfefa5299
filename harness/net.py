"""Loopback networking: free ports, a plain HTTP GET, and waiting for a condition."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
