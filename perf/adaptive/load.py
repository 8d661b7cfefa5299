"""Open-loop load for the adaptive benchmark, as one list of attempts.

`vegeta_run`: Vegeta (`go install github.com/tsenart/vegeta/v12@v12.13.0`,
perf/adaptive/setup.sh) at a constant arrival rate, client timeout 2 s,
keep-alive, as many connections as the open loop needs (an attack whose
responses are slow opens more rather than sending less).

`retry_run`: the S9 client, since Vegeta has no retries: arrivals at a constant
rate (asyncio, one task per request), each request tried again at once after a
timeout, a 5xx or a 429, up to `retries` times; each attempt on a pooled
keep-alive connection (a connection whose attempt timed out is dropped).

Both return `Attempt`s with times in seconds from `t0` (the caller's
`time.time()` when the backend's clock started)."""

from __future__ import annotations

import asyncio
import base64
import csv
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.procs import go_bin


@dataclass(frozen=True)
class Attempt:
    start: float
    latency: float
    code: int  # 0: no answer (timeout, reset)
    shed_upstream: bool  # the backend's own 429 (its x-emulator: shed header came through)
    request: int  # which client request (retries share it)
    attempt: int  # 0 first, 1.. retries


def vegeta_run(url: str, rate: int, duration_s: float, t0: float, timeout_s: float = 2.0) -> list[Attempt]:
    """One constant-rate Vegeta attack on `url`."""
    with tempfile.TemporaryDirectory(prefix="vegeta-") as d:
        results = Path(d) / "results.bin"
        target = f"GET {url}\n"
        subprocess.run(
            [go_bin("vegeta"), "attack", f"-rate={rate}/1s", f"-duration={duration_s}s", f"-timeout={timeout_s}s",
             "-keepalive=true", "-workers=64", "-max-workers=4096", f"-output={results}"],
            input=target.encode(), check=True, timeout=duration_s + timeout_s + 60,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        encoded = subprocess.run([go_bin("vegeta"), "encode", "--to", "csv", str(results)], check=True,
                                 capture_output=True, timeout=120).stdout.decode()
    out = []
    for row in csv.reader(encoded.splitlines()):
        if len(row) < 9:
            continue
        headers = base64.b64decode(row[11]).decode("latin-1", "replace").lower() if len(row) > 11 else ""
        out.append(Attempt(
            start=int(row[0]) / 1e9 - t0,
            latency=int(row[2]) / 1e9,
            code=int(row[1]),
            shed_upstream="x-emulator" in headers,
            request=int(row[8]),
            attempt=0,
        ))
    return out


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
