"""Raw HTTP/1.x: the bytes of a request (as a test may want them, not as a well-behaved
client would send them), one response read back from an asyncio stream (content-length or
chunked), and connections opened with one request each and left open (held requests)."""

from __future__ import annotations

import asyncio
import contextlib
import socket


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


def open_held(port: int, n: int, request: bytes | None) -> list[socket.socket]:
    """n connections to 127.0.0.1:port, each with `request` sent (None: idle); close them
    (`close_all`) to give up."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            if request is not None:
                socks[-1].sendall(request)
    except Exception:
        close_all(socks)
        raise
    return socks


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.close()
    socks.clear()
