"""The S9 client, since Vegeta has no retries: arrivals at a constant rate (asyncio, one
task per request), each request tried again at once after a timeout, a 5xx or a 429, up to
`retries` times; each attempt on a pooled keep-alive connection (a connection whose attempt
timed out is dropped). Returns `Attempt`s with times in seconds from `t0` (the caller's
`time.time()` when the backend's clock started)."""

from __future__ import annotations

import asyncio
import time

from perf.adaptive.metrics import Attempt


class _Pool:
    """Keep-alive HTTP/1.1 connections to one host:port."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, path: str, timeout: float) -> tuple[int, bool]:
        """(status, upstream shed) of one GET; (0, False) on timeout or error."""
        conn = self.idle.pop() if self.idle else None
        try:
            if conn is None:
                conn = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), timeout)
            reader, writer = conn
            writer.write(f"GET {path} HTTP/1.1\r\nhost: {self.host}\r\n\r\n".encode())
            status, shed = await asyncio.wait_for(self._read(reader), timeout)
            self.idle.append(conn)
            return status, shed
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
            if conn is not None:
                conn[1].close()
            return 0, False

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> tuple[int, bool]:
        status = int((await reader.readline()).split()[1])
        length, shed = 0, False
        while True:
            line = (await reader.readline()).decode("latin-1").strip().lower()
            if not line:
                break
            if line.startswith("content-length:"):
                length = int(line.split(":", 1)[1])
            elif line.startswith("x-emulator:"):
                shed = True
        if length:
            await reader.readexactly(length)
        return status, shed


def retry_run(url: str, rate: int, duration_s: float, t0: float, timeout_s: float = 1.0,
              retries: int = 3) -> list[Attempt]:
    """Open-loop requests at `rate`/s for `duration_s`, each retried at once up to `retries` times."""
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    return asyncio.run(_retry_main(host, int(port), "/" + path, rate, duration_s, t0, timeout_s, retries))


async def _retry_main(host: str, port: int, path: str, rate: int, duration_s: float, t0: float,
                      timeout_s: float, retries: int) -> list[Attempt]:
    pool = _Pool(host, port)
    attempts: list[Attempt] = []
    tasks: list[asyncio.Task[None]] = []

    async def one(n: int) -> None:
        for k in range(retries + 1):
            start = time.time()
            code, shed = await pool.get(path, timeout_s)
            attempts.append(Attempt(start - t0, time.time() - start, code, shed, n, k))
            if code and code < 500 and code != 429:
                return

    loop_start = time.monotonic()
    n = 0
    total = int(rate * duration_s)
    while n < total:
        due = loop_start + n / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(n)))
        n += 1
    await asyncio.gather(*tasks)
    return attempts
