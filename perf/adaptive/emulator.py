"""A backend whose capacity changes while it runs: `workers` requests served at
once, each taking a lognormal service time (mean `service_ms`, CV 0.3), the rest
waiting in arrival order (unbounded; a request whose client left is still served:
dead work); optionally an internal token-bucket limit (`limit` per second, burst a
tenth of it) beyond which it answers 429 with `Retry-After: 1` at once.

It records its own arrivals, answers, requests in service and waiting, per 100 ms
window from the start (`POST /_start`), and changes its settings at given times
(the schedule) or at once (`POST /_control`).

  python -m perf.adaptive.emulator --port 18080 --schedule '[{"at": 0, "workers": 25, "service_ms": 100}]'

Endpoints: any other path is work (GET, HTTP/1.1 keep-alive); `POST /_start`
starts the schedule's clock and the record; `POST /_control` with a JSON body of
any of workers, service_ms, limit (null: none) applies it now; `GET /_record`
returns the record as JSON; `GET /_health` answers 200; `/_fail/<status>` (a
broken endpoint, or a client's own bad requests) answers that status at once,
with `Retry-After: N` for `?retry_after=N`, whatever the load, and counts it in
the record's `failed` apart from the work.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import random
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.net import free_port, http_get
from harness.procs import ROOT, Child

WINDOW_S = 0.1
CV = 0.3


@dataclass
class Settings:
    workers: int = 25
    service_ms: float = 100.0
    limit: float | None = None

    def apply(self, change: dict[str, Any]) -> None:
        if "workers" in change:
            self.workers = max(0, int(change["workers"]))
        if "service_ms" in change:
            self.service_ms = max(0.0, float(change["service_ms"]))
        if "limit" in change:
            self.limit = None if change["limit"] is None else max(0.0, float(change["limit"]))

    def capacity(self) -> float:
        """Requests per second it can serve: workers / service time, or its limit if lower."""
        by_workers = self.workers * 1000.0 / self.service_ms if self.service_ms > 0 else math.inf
        return by_workers if self.limit is None else min(by_workers, self.limit)


@dataclass
class Window:
    arrivals: int = 0
    failed: int = 0
    ok: int = 0
    shed: int = 0
    busy_max: int = 0
    waiting_max: int = 0
    latency_ms_sum: float = 0.0
    capacity: float = 0.0


@dataclass
class Backend:
    settings: Settings
    schedule: list[dict[str, Any]]
    seed: int = 1
    started: float | None = None
    busy: int = 0
    waiters: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)
    tokens: float = 0.0
    tokens_at: float = 0.0
    windows: list[Window] = field(default_factory=list)
    applied: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        sigma2 = math.log(1 + CV * CV)
        self.sigma = math.sqrt(sigma2)
        self.mu_shift = -sigma2 / 2

    # -- the clock and the record
    def now(self) -> float:
        return time.monotonic() - self.started if self.started is not None else 0.0

    def window(self) -> Window | None:
        if self.started is None:
            return None
        i = int(self.now() / WINDOW_S)
        while len(self.windows) <= i:
            self.windows.append(Window(capacity=self.settings.capacity()))
        return self.windows[i]

    def note(self) -> None:
        w = self.window()
        if w is not None:
            w.busy_max = max(w.busy_max, self.busy)
            w.waiting_max = max(w.waiting_max, len(self.waiters))
            w.capacity = self.settings.capacity()

    def start(self) -> None:
        self.started = time.monotonic()
        self.windows.clear()
        self.applied.clear()
        asyncio.get_running_loop().create_task(self.follow_schedule())

    async def follow_schedule(self) -> None:
        for step in sorted(self.schedule, key=lambda s: float(s.get("at", 0))):
            delay = float(step.get("at", 0)) - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            self.control({k: v for k, v in step.items() if k != "at"})

    def control(self, change: dict[str, Any]) -> None:
        self.settings.apply(change)
        self.applied.append({"t": round(self.now(), 3), **change})
        self.release()
        self.note()

    # -- the work
    def release(self) -> None:
        """Hands free workers to waiters, oldest first (after a release or more workers)."""
        while self.waiters and self.busy < self.settings.workers:
            fut = self.waiters.popleft()
            if not fut.done():
                self.busy += 1
                fut.set_result(None)

    def take_token(self) -> bool:
        limit = self.settings.limit
        if limit is None:
            return True
        t = time.monotonic()
        burst = max(1.0, limit / 10)
        self.tokens = min(burst, self.tokens + (t - self.tokens_at) * limit)
        self.tokens_at = t
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    async def work(self) -> tuple[int, dict[str, str]]:
        t0 = time.monotonic()
        w = self.window()
        if w is not None:
            w.arrivals += 1
        if not self.take_token():
            if w is not None:
                w.shed += 1
            return 429, {"retry-after": "1", "x-emulator": "shed"}
        if self.busy < self.settings.workers and not self.waiters:
            self.busy += 1
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            self.note()
            await fut
        self.note()
        mean = self.settings.service_ms / 1000
        service = math.exp(math.log(mean) + self.mu_shift + self.sigma * self.rng.gauss(0, 1)) if mean > 0 else 0
        try:
            await asyncio.sleep(service)
        finally:
            self.busy -= 1
            self.release()
            self.note()
        done = self.window()
        if done is not None:
            done.ok += 1
            done.latency_ms_sum += (time.monotonic() - t0) * 1000
        return 200, {}

    def fail(self, path: str) -> tuple[int, dict[str, str]]:
        """`/_fail/<status>[?retry_after=N]`: that status at once (500 if unreadable)."""
        target, _, query = path.partition("?")
        try:
            status = int(target.rsplit("/", 1)[-1])
        except ValueError:
            status = 500
        w = self.window()
        if w is not None:
            w.failed += 1
        extra = {"x-emulator": "fail"}
        for part in query.split("&"):
            key, _, value = part.partition("=")
            if key == "retry_after" and value.isdigit():
                extra["retry-after"] = value
        return (status if 200 <= status <= 599 else 500), extra

    def record(self) -> dict[str, Any]:
        return {
            "window_s": WINDOW_S,
            "applied": self.applied,
            "windows": [vars(w) for w in self.windows],
        }


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) < 2:
        return None
    method, path = parts[0], parts[1]
    headers: dict[str, str] = {}
    while True:
        h = await reader.readline()
        if not h or h in (b"\r\n", b"\n"):
            break
        name, _, value = h.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = b""
    n = int(headers.get("content-length", "0") or 0)
    if n > 0:
        body = await reader.readexactly(n)
    return method, path, headers, body


def _response(status: int, body: bytes, headers: dict[str, str], keep_alive: bool) -> bytes:
    reason = {200: "OK", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error",
              503: "Service Unavailable"}.get(status, "OK")
    lines = [f"HTTP/1.1 {status} {reason}", f"content-length: {len(body)}", "content-type: application/json"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if not keep_alive:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def _serve(backend: Backend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            req = await _read_request(reader)
            if req is None:
                break
            method, path, headers, body = req
            keep_alive = headers.get("connection", "").lower() != "close"
            extra: dict[str, str] = {}
            if path == "/_health":
                status, out = 200, b"{}"
            elif path == "/_start" and method == "POST":
                backend.start()
                status, out = 200, b"{}"
            elif path == "/_control" and method == "POST":
                backend.control(json.loads(body or b"{}"))
                status, out = 200, json.dumps(vars(backend.settings)).encode()
            elif path == "/_record":
                status, out = 200, json.dumps(backend.record()).encode()
            elif path.startswith("/_fail/"):
                status, extra = backend.fail(path)
                out = b'{"failed": true}'
            else:
                status, extra = await backend.work()
                out = b'{"ok": true}' if status == 200 else b'{"shed": true}'
            writer.write(_response(status, out, extra, keep_alive))
            await writer.drain()
            if not keep_alive:
                break
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
        pass  # the client left, or the emulator is stopping with requests still waiting
    finally:
        writer.close()


async def serve(port: int, settings: Settings, schedule: list[dict[str, Any]], seed: int = 1) -> None:
    backend = Backend(settings, schedule, seed)
    server = await asyncio.start_server(lambda r, w: _serve(backend, r, w), "127.0.0.1", port, backlog=4096)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--schedule", default="[]", help="JSON list of {at, workers, service_ms, limit}")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    schedule = json.loads(args.schedule)
    settings = Settings()
    first = [s for s in schedule if float(s.get("at", 0)) <= 0]
    for s in first:
        settings.apply(s)
    asyncio.run(serve(args.port, settings, schedule, args.seed))
    return 0



class Process(Child):
    """The emulator as our own process (python -m perf.adaptive.emulator), stopped by PID."""

    def __init__(self, schedule: list[dict[str, Any]], seed: int = 1):
        self.port = free_port()
        self.schedule = schedule
        self.seed = seed
        self.log_path = Path(tempfile.mkstemp(prefix="emulator-", suffix=".log")[1])

    def __enter__(self) -> Process:
        self.start_and_wait([sys.executable, "-m", "perf.adaptive.emulator", "--port", str(self.port),
                             "--schedule", json.dumps(self.schedule), "--seed", str(self.seed)],
                            self._up, f"emulator on :{self.port}", 15, cwd=ROOT)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _up(self) -> bool:
        try:
            return http_get(f"http://127.0.0.1:{self.port}/_health", timeout=0.5)[0] == 200
        except OSError:
            return False

    def begin(self) -> float:
        """Starts the schedule's clock and the record; the wall-clock time it did."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/_start", data=b"{}", method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()
        return time.time()

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(http_get(f"http://127.0.0.1:{self.port}/_record", timeout=10)[2])
        return out


if __name__ == "__main__":
    raise SystemExit(main())
