"""Plain concurrent HTTP/1.1 clients for tests that need each response's own
status, headers and latency (Fortio aggregates them)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Reply:
    status: int
    headers: dict = field(default_factory=dict)
    latency_ms: float = 0.0
    error: str | None = None


def burst(port: int, n: int, path: str = "/", timeout: float = 30.0) -> list[Reply]:
    """n requests sent at the same instant, each on its own connection."""
    replies: list[Reply | None] = [None] * n
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=timeout) for _ in range(n)]
    for c in conns:
        c.connect()
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        c = conns[i]
        barrier.wait()
        t0 = time.monotonic()
        try:
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            replies[i] = Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, (time.monotonic() - t0) * 1000)
        except Exception as e:
            replies[i] = Reply(0, {}, (time.monotonic() - t0) * 1000, repr(e))
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return [r or Reply(0, error="no reply") for r in replies]


def open_and_abandon(port: int, n: int, path: str = "/") -> list[socket.socket]:
    """Sends n requests on raw sockets and returns the sockets (close them to give up)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        socks.append(s)
    return socks


def pipelined(port: int, requests: list[bytes], batch: int = 200, timeout: float = 30.0) -> dict[int, int]:
    """Sends raw HTTP/1.1 requests on one keep-alive connection, `batch` at a
    time (pipelined), and returns a count of response statuses."""
    counts: dict[int, int] = {}
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        f = s.makefile("rb")
        for i in range(0, len(requests), batch):
            chunk = requests[i:i + batch]
            s.sendall(b"".join(chunk))
            for _ in chunk:
                status = int(f.readline().split()[1])
                length = 0
                while (line := f.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                f.read(length)
                counts[status] = counts.get(status, 0) + 1
    return counts
