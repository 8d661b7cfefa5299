"""Clients for the tests that need each response's own status, headers and latency (Fortio
aggregates them): many raw HTTP/1.1 connections at once (asyncio: a burst, or thousands of
held requests from one process), pipelined requests on one connection, and HTTP/2 over
cleartext with prior knowledge (h2c, hyper-h2: gRPC calls too). All can send what a
well-behaved client would not (raw bytes in header values)."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events

from harness.rawhttp import read_response, request_bytes


@dataclass
class Answer:
    status: int = 0          # 0: no response (error or cancelled)
    body: bytes = b""
    sent_at: float = 0.0     # monotonic seconds
    done_at: float = 0.0
    error: str | None = None
    headers: dict = field(default_factory=dict)

    @property
    def latency_s(self) -> float:
        return self.done_at - self.sent_at

    @property
    def latency_ms(self) -> float:
        return 1000 * self.latency_s


class Crowd:
    """N clients, each on its own connection, each sending one request.

    `connect()` opens the connections (in parallel, bounded), `send()` sends
    every request and starts reading, `cancel(k)` makes k clients give up
    (close their socket), `wait()` collects the answers (bounded by timeout)."""

    def __init__(self, port: int, n: int, request: bytes | list[bytes], timeout: float = 60.0):
        self.port, self.n, self.timeout = port, n, timeout
        self.requests = request if isinstance(request, list) else [request] * n
        self.answers = [Answer() for _ in range(n)]
        self.conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None] = [None] * n
        self.tasks: list[asyncio.Task] = []
        self.cancelled: set[int] = set()

    async def connect(self, parallel: int = 200) -> None:
        sem = asyncio.Semaphore(parallel)

        async def one(i: int) -> None:
            async with sem:
                for attempt in range(5):
                    try:
                        self.conns[i] = await asyncio.open_connection("127.0.0.1", self.port)
                        return
                    except OSError as e:  # listen backlog full: retry shortly
                        if attempt == 4:
                            self.answers[i].error = f"connect: {e!r}"
                        await asyncio.sleep(0.05 * (attempt + 1))

        await asyncio.gather(*(one(i) for i in range(self.n)))

    async def _exchange(self, i: int) -> None:
        a = self.answers[i]
        conn = self.conns[i]
        if conn is None:
            return
        reader, writer = conn
        a.sent_at = time.monotonic()
        try:
            writer.write(self.requests[i])
            await writer.drain()
            a.status, a.headers, a.body = await asyncio.wait_for(read_response(reader), self.timeout)
        except asyncio.CancelledError:
            a.error = "cancelled by the client"
        except Exception as e:
            a.error = repr(e)
        finally:
            a.done_at = time.monotonic()
            writer.close()

    async def send(self) -> None:
        self.tasks = [asyncio.create_task(self._exchange(i)) for i in range(self.n)]
        await asyncio.sleep(0)

    def cancel(self, indices) -> None:
        for i in indices:
            self.cancelled.add(i)
            self.tasks[i].cancel()

    async def wait(self) -> list[Answer]:
        await asyncio.wait(self.tasks, timeout=self.timeout + 5)
        for t in self.tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        return self.answers


def burst(port: int, n: int, path: str = "/", *, request: bytes | None = None, timeout: float = 30.0) -> list[Answer]:
    """n requests (GET `path`, or these raw bytes) sent at the same instant, each on its own
    connection; every answer with its status, headers and latency."""
    async def go() -> list[Answer]:
        crowd = Crowd(port, n, request or request_bytes(path), timeout=timeout)
        await crowd.connect()
        await crowd.send()
        return await crowd.wait()
    return asyncio.run(go())


def pipelined(port: int, requests: list[bytes], batch: int = 200, timeout: float = 30.0) -> dict[int, int]:
    """Sends raw HTTP/1.1 requests on one keep-alive connection, `batch` at a
    time (pipelined), and returns a count of response statuses."""
    async def go() -> dict[int, int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        counts: dict[int, int] = {}
        try:
            for i in range(0, len(requests), batch):
                writer.write(b"".join(requests[i:i + batch]))
                for _ in requests[i:i + batch]:
                    status = (await asyncio.wait_for(read_response(reader), timeout))[0]
                    counts[status] = counts.get(status, 0) + 1
        finally:
            writer.close()
        return counts
    return asyncio.run(go())


@dataclass
class H2Reply:
    """One h2c stream's answer: headers and trailers as received (repeats kept), in order."""
    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    trailers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    done_at: float = 0.0     # monotonic seconds
    error: str | None = None

    def all(self, name: str) -> list[str]:
        """Every value of a header or trailer (to see duplicates)."""
        return [v for k, v in self.headers + self.trailers if k == name]


def h2c(port: int, requests: list[tuple[list[tuple[Any, Any]], bytes]], timeout: float = 30.0) -> list[H2Reply]:
    """Sends several requests as concurrent streams of one h2c connection (prior knowledge),
    each (headers as str or raw byte pairs, body), and returns each stream's answer. Headers
    are not validated on our side, so a test can send bytes a good client would not."""
    cfg = h2.config.H2Configuration(client_side=True, header_encoding=None, validate_outbound_headers=False,
                                    normalize_outbound_headers=False, validate_inbound_headers=False)
    conn = h2.connection.H2Connection(config=cfg)
    conn.initiate_connection()
    replies: dict[int, H2Reply] = {}

    def text(fields: Any) -> list[tuple[str, str]]:
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in fields]

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            for headers, body in requests:
                sid = conn.get_next_available_stream_id()
                replies[sid] = H2Reply()
                conn.send_headers(sid, [tuple(x.encode() if isinstance(x, str) else x for x in h) for h in headers],
                                  end_stream=not body)
                # Bodies must fit the initial flow-control windows (64 KiB per connection).
                for i in range(0, len(body), 16384):
                    conn.send_data(sid, body[i:i + 16384], end_stream=i + 16384 >= len(body))
            sock.sendall(conn.data_to_send())
            deadline = time.monotonic() + timeout
            open_streams = set(replies)
            while open_streams and time.monotonic() < deadline:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                data = sock.recv(65536)
                if not data:
                    break
                for ev in conn.receive_data(data):
                    r = replies.get(getattr(ev, "stream_id", -1))
                    if r is None:
                        continue
                    if isinstance(ev, h2.events.ResponseReceived):
                        r.headers = text(ev.headers)
                        r.status = int(dict(r.headers)[":status"])
                    elif isinstance(ev, h2.events.TrailersReceived):
                        r.trailers = text(ev.headers)
                    elif isinstance(ev, h2.events.DataReceived):
                        r.body += ev.data
                        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                        r.done_at = time.monotonic()
                        if isinstance(ev, h2.events.StreamReset):
                            r.error = f"reset {ev.error_code!r}"
                        open_streams.discard(ev.stream_id)
                if pending := conn.data_to_send():
                    sock.sendall(pending)
        except OSError as e:
            for r in replies.values():
                r.error = r.error or repr(e)
    return [replies[s] for s in sorted(replies)]


def grpc_headers(port: int, path: str = "/pkg.Service/Method") -> list[tuple[str, str]]:
    """Request headers of a unary gRPC call."""
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", f"127.0.0.1:{port}"),
            ("content-type", "application/grpc"), ("te", "trailers")]


GRPC_EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"
