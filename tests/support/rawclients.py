"""Clients for the reliability suite: many raw HTTP/1.1 connections at once
(asyncio, thousands of held requests from one process), and HTTP/2 over
cleartext with prior knowledge (h2c, hyper-h2), which can also send what a
well-behaved client would not (raw bytes in header values)."""

from __future__ import annotations

import asyncio
import resource
import socket
import time
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events


def raise_file_limit(want: int) -> int:
    """Raises this process's open-file limit (inherited by the Envoy we start next)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def heap_allocated(admin_port: int) -> int:
    """Bytes in use in Envoy's heap (tcmalloc `allocated`, admin /memory). Unlike
    RSS it goes down when memory is freed (the allocator keeps freed pages)."""
    import json
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/memory", timeout=5) as r:
        return int(json.loads(r.read())["allocated"])


@dataclass
class Answer:
    status: int = 0          # 0: no response (error or cancelled)
    body: bytes = b""
    sent_at: float = 0.0     # monotonic seconds
    done_at: float = 0.0
    error: str | None = None
    headers: dict | None = None

    @property
    def latency_s(self) -> float:
        return self.done_at - self.sent_at


def request_bytes(path: str = "/", *, method: str = "GET", host: str | None = "test", headers: dict | None = None,
                  body: bytes = b"", version: str = "HTTP/1.1") -> bytes:
    lines = [f"{method} {path} {version}"]
    if host is not None:
        lines.append(f"Host: {host}")
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
    """Reads one HTTP/1.x response (content-length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    return status, headers, body


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


def h2c_exchange(port: int, requests: list[tuple[list[tuple[bytes, bytes]], bytes]],
                 timeout: float = 30.0) -> list[Answer]:
    """Sends several requests as concurrent streams of one h2c connection (prior
    knowledge). Each request: (headers as raw byte pairs, body). Headers are not
    validated on our side, so a test can send bytes a good client would not."""
    cfg = h2.config.H2Configuration(client_side=True, header_encoding=None, validate_outbound_headers=False,
                                    normalize_outbound_headers=False, validate_inbound_headers=False)
    conn = h2.connection.H2Connection(config=cfg)
    conn.initiate_connection()
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    answers: dict[int, Answer] = {}
    try:
        sock.sendall(conn.data_to_send())
        for headers, body in requests:
            sid = conn.get_next_available_stream_id()
            answers[sid] = Answer(sent_at=time.monotonic(), headers={})
            conn.send_headers(sid, headers, end_stream=not body)
            # Bodies must fit the initial flow-control windows (64 KiB per connection).
            for i in range(0, len(body), 16384):
                conn.send_data(sid, body[i:i + 16384], end_stream=i + 16384 >= len(body))
        sock.sendall(conn.data_to_send())
        deadline = time.monotonic() + timeout
        open_streams = set(answers)
        while open_streams and time.monotonic() < deadline:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            data = sock.recv(65536)
            if not data:
                break
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived):
                    hdrs = {k.decode(): v.decode("latin-1") for k, v in ev.headers}
                    answers[ev.stream_id].status = int(hdrs[":status"])
                    answers[ev.stream_id].headers = hdrs
                elif isinstance(ev, h2.events.DataReceived):
                    answers[ev.stream_id].body += ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                    a = answers[ev.stream_id]
                    a.done_at = time.monotonic()
                    if isinstance(ev, h2.events.StreamReset):
                        a.error = f"reset {ev.error_code!r}"
                    open_streams.discard(ev.stream_id)
            pending = conn.data_to_send()
            if pending:
                sock.sendall(pending)
    except OSError as e:
        for sid in answers:
            answers[sid].error = answers[sid].error or repr(e)
    finally:
        sock.close()
    return [answers[s] for s in sorted(answers)]
