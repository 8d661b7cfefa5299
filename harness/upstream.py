"""A small HTTP/1.1 upstream that counts requests in flight (asyncio, loopback).

Endpoints (any method):
  /slow?ms=N         answer 200 after N ms
  /status?code=C     answer with status C at once
  /reset?ms=N        wait N ms, then close the connection without answering
  /stats             JSON: {"in_flight", "max_in_flight", "served", "resets", "aborted"}
  /stats/clear       reset max_in_flight, served and resets
  anything else      200 at once, echoing the request headers as JSON

`in_flight` counts requests between the end of their headers and the end of
the answer (or reset, or the client closing the connection during /slow:
`aborted`); /stats itself is not counted. `arrivals` holds the monotonic time
of each counted request's arrival (end of its headers); with `tag_header`,
`tags` holds that header's value for each (None when absent), in the same
order: which proxy sent it, when several share one upstream; `paths` holds each
one's path (without the query), in the same order: which rule it matched, when
several rules share one lab. Run it in a thread of the test process
(`Upstream().start()`) or as `python -m harness.upstream PORT`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

from harness.net import can_connect, free_port, wait_until


class Upstream:
    def __init__(self, port: int | None = None, tag_header: str | None = None):
        self.port = port or free_port()
        self.tag_header = tag_header.lower() if tag_header else None
        self.in_flight = 0
        self.max_in_flight = 0
        self.served = 0
        self.resets = 0
        self.aborted = 0
        self.arrivals: list[float] = []
        self.tags: list[str | None] = []
        self.paths: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    # -- lifecycle -------------------------------------------------------
    def start(self) -> Upstream:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", self.port, backlog=1024))
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        wait_until(lambda: can_connect(self.port), 10, f"upstream on :{self.port}")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        loop, server = self._loop, self._server

        async def shutdown() -> None:
            if server is not None:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        if self._thread:
            self._thread.join(10)
        loop.close()
        self._loop = None

    def __enter__(self) -> Upstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict:
        return {"in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                "served": self.served, "resets": self.resets, "aborted": self.aborted}

    def clear(self) -> None:
        self.max_in_flight = self.in_flight
        self.served = 0
        self.resets = 0
        self.aborted = 0
        self.arrivals = []
        self.tags = []
        self.paths = []

    # -- protocol --------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(length) if length else b""
                url = urlsplit(target)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path == "/stats":
                    await self._send(writer, 200, json.dumps(self.stats()).encode())
                    continue
                if url.path == "/stats/clear":
                    self.clear()
                    await self._send(writer, 200, b"{}")
                    continue
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                self.arrivals.append(time.monotonic())
                self.paths.append(url.path)
                if self.tag_header is not None:
                    self.tags.append(headers.get(self.tag_header))
                try:
                    if url.path == "/slow":
                        # Like a server that cancels work when its client (Envoy)
                        # closes the connection: stop counting it as in flight.
                        sleep = asyncio.ensure_future(asyncio.sleep(int(q.get("ms", "10")) / 1000))
                        eof = asyncio.ensure_future(reader.read(1))
                        await asyncio.wait([sleep, eof], return_when=asyncio.FIRST_COMPLETED)
                        if not sleep.done():
                            sleep.cancel()
                            self.aborted += 1
                            return
                        eof.cancel()
                        await asyncio.gather(eof, return_exceptions=True)
                        await self._send(writer, 200, b"slow\n")
                    elif url.path == "/status":
                        await self._send(writer, int(q.get("code", "500")), b"status\n")
                    elif url.path == "/reset":
                        await asyncio.sleep(int(q.get("ms", "0")) / 1000)
                        self.resets += 1
                        writer.transport.abort()
                        return
                    else:
                        echo = {"method": method, "path": target, "headers": headers, "body_len": len(body)}
                        await self._send(writer, 200, json.dumps(echo).encode())
                    self.served += 1
                finally:
                    self.in_flight -= 1
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError,
                asyncio.CancelledError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s"
                     % (status, len(body), body))
        await writer.drain()


if __name__ == "__main__":
    up = Upstream(int(sys.argv[1]) if len(sys.argv) > 1 else None).start()
    print(f"upstream on 127.0.0.1:{up.port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        up.stop()
