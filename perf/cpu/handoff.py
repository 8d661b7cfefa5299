"""Concurrency hand-off: how fast a freed slot reaches the next waiter, on
the same worker and on the other one.

The listener spreads connections with Envoy's exact balance (each new
connection to the worker with the fewest), and `open_on_workers` checks
where each one landed from Envoy's per-worker listener statistics. The
clients then run a closed loop (send, read the answer, send again), bounded
by a request count and a deadline. Their order at the gate is fixed first:
the first `slots` requests ask the upstream for a long delay, so they hold
every slot while the others queue one by one (each waits until Envoy counted
it: its HTTP connection manager's downstream_rq_total, which moves in the
same event-loop turn in which the filter saw the request and, every slot
being held, queued it); from then on a closed loop keeps that order as long
as no client answers late. In `cross`
placement the order is blocks of `slots` connections alternating between
the workers, so the request that takes a freed slot is always on the other
worker; in `same`, every connection is on one worker.

Envoy's access log (HANDOFF_LOG_FORMAT in perf/cpu/config.py) gives, per request,
the client's port (so its worker), when it went upstream and when its answer
came back (its slot freed): pair_handoffs (perf/cpu/stats.py) measures each
hand-off's gap and whether it crossed workers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from harness.envoy import Envoy
from harness.rawhttp import read_response, request_bytes

T = TypeVar("T")


@dataclass
class Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    local_port: int
    worker: int


@dataclass(frozen=True)
class LogRecord:
    start: float          # wall clock, s
    port: int             # the client's port
    released: float | None  # request sent upstream (wall clock, s)
    freed: float | None   # answer received from upstream
    status: int


def parse_log(text: str) -> list[LogRecord]:
    """Lines of HANDOFF_LOG_FORMAT: `start port us_tx_beg_us us_rx_end_us status`
    ("-" where a time point was not reached)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 5:
            continue
        start, port, tx, rx, status = parts

        def at(us: str, start: str = start) -> float | None:
            return None if us == "-" else float(start) + int(us) / 1e6

        out.append(LogRecord(float(start), int(port), at(tx), at(rx), int(status) if status.isdigit() else 0))
    return out


def worker_counts(envoy: Envoy, listener_port: int) -> dict[int, int]:
    """Active downstream connections of one listener, per worker."""
    found = envoy.stats_matching(rf"^listener\.127\.0\.0\.1_{listener_port}\.worker_[0-9]+\.downstream_cx_active$")
    return {int(k.split(".worker_")[1].split(".")[0]): v for k, v in found.items()}


async def _wait(pred: Callable[[], T | None], timeout: float, what: str, interval: float = 0.002) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        await asyncio.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


async def open_on_workers(port: int, envoy: Envoy, n: int) -> list[Conn]:
    """Opens `n` connections one at a time and finds each one's worker."""
    conns = []
    for _ in range(n):
        before = worker_counts(envoy, port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        def counted(before: dict[int, int] = before) -> dict[int, int] | None:
            c = worker_counts(envoy, port)
            return c if sum(c.values()) > sum(before.values()) else None

        after = await _wait(counted, 5, "Envoy to count the new connection")
        grown = [w for w in after if after[w] > before.get(w, 0)]
        if len(grown) != 1:
            raise RuntimeError(f"cannot tell the worker of a connection: {before} -> {after}")
        conns.append(Conn(reader, writer, writer.get_extra_info("sockname")[1], grown[0]))
    return conns


async def close_all(conns: list[Conn]) -> None:
    for c in conns:
        c.writer.close()
    for c in conns:
        with contextlib.suppress(OSError):
            await c.writer.wait_closed()


async def request(c: Conn, path: str) -> int:
    """One HTTP/1.1 keep-alive request; the status (the body is read and dropped)."""
    c.writer.write(request_bytes(path, host="handoff"))
    await c.writer.drain()
    return (await read_response(c.reader))[0]


async def closed_loop(conns: list[Conn], *, path: str, first_path: str, requests: int, slots: int,
                      arrived_count: Callable[[], int], timeout_s: float) -> dict:
    """Every connection sends `path` again as soon as it has its answer,
    until `requests` were sent or `timeout_s` passed. The first `slots`
    connections start with `first_path` (a long hold); the others queue
    behind them. Each first request waits for the one before it
    (`arrived_count()` must grow by one: Envoy has seen it), so the tickets
    follow the list order."""
    budget = requests
    codes: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s

    async def loop(c: Conn, first: str) -> None:
        nonlocal budget
        p = first
        while budget > 0 and time.monotonic() < deadline:
            budget -= 1
            status = await request(c, p)
            codes[status] = codes.get(status, 0) + 1
            p = path

    tasks = []
    for i, c in enumerate(conns):
        n0 = arrived_count()
        tasks.append(asyncio.create_task(loop(c, first_path if i < slots else path)))
        def seen(n0: int = n0) -> bool | None:
            return arrived_count() > n0 or None

        await _wait(seen, 10, f"Envoy to see connection {i}'s first request", interval=0.001)
    t0 = time.monotonic()
    done, pending = await asyncio.wait(tasks, timeout=max(deadline - time.monotonic(), 1) + 30)
    for t in pending:
        t.cancel()
    for t in done:
        if t.exception():
            raise t.exception()  # type: ignore[misc]
    return {"codes": codes, "sent": requests - budget, "loop_s": time.monotonic() - t0,
            "timed_out": bool(pending) or budget > 0}
