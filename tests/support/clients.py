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


@dataclass
class H2Reply:
    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    trailers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    error: str | None = None

    def all(self, name: str) -> list[str]:
        """Every value of a header or trailer (to see duplicates)."""
        return [v for k, v in self.headers + self.trailers if k == name]


def h2c_requests(port: int, requests: list[list[tuple[str, str]]], body: bytes = b"",
                 timeout: float = 10.0) -> list[H2Reply]:
    """Concurrent streams on one h2c connection (prior knowledge), each with
    these headers and body; returns each answer's header and trailer lists."""
    import h2.config
    import h2.connection
    import h2.events

    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    replies: dict[int, H2Reply] = {}
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        for headers in requests:
            sid = conn.get_next_available_stream_id()
            replies[sid] = H2Reply()
            conn.send_headers(sid, headers, end_stream=not body)
            if body:
                conn.send_data(sid, body, end_stream=True)
        sock.sendall(conn.data_to_send())
        open_streams = set(replies)
        deadline = time.monotonic() + timeout
        while open_streams and time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                break
            for ev in conn.receive_data(data):
                r = replies.get(getattr(ev, "stream_id", -1))
                if r is None:
                    continue
                if isinstance(ev, h2.events.ResponseReceived):
                    r.headers = [(str(k), str(v)) for k, v in ev.headers]
                    r.status = int(dict(r.headers)[":status"])
                elif isinstance(ev, h2.events.TrailersReceived):
                    r.trailers = [(str(k), str(v)) for k, v in ev.headers]
                elif isinstance(ev, h2.events.DataReceived):
                    r.body += ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                    if isinstance(ev, h2.events.StreamReset):
                        r.error = f"reset {ev.error_code!r}"
                    open_streams.discard(ev.stream_id)
            if pending := conn.data_to_send():
                sock.sendall(pending)
    return [replies[s] for s in sorted(replies)]


def grpc_headers(port: int, path: str = "/pkg.Service/Method") -> list[tuple[str, str]]:
    """Request headers of a unary gRPC call."""
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", f"127.0.0.1:{port}"),
            ("content-type", "application/grpc"), ("te", "trailers")]


GRPC_EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"
