"""Vegeta: open-loop load at a constant arrival rate, beside `harness.fortio` (closed loop).

A `Load` is what `vegeta attack` is asked (a rate, a duration, headers; each request has a
timeout); `run()` waits for it, `start()` runs it in the background (`Running.result()`), and
both give a `Result`: every request's start, status and latency (from `vegeta encode --to
csv`), and its response headers. An open loop keeps sending at its rate whatever the answers
take: it opens more connections (up to `max_workers`) rather than sending less, as independent
clients would.

Vegeta (tools/tools.tsv: `go install github.com/tsenart/vegeta/v12@v12.13.0`) is installed by
`make tool-vegeta`, on which every target that runs it depends."""

from __future__ import annotations

import base64
import csv
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness import tools
from harness.procs import stop

VERSION = tools.version("vegeta")


@dataclass(frozen=True)
class Hit:
    """One request: when it started (Unix ns), its status (0: no answer), its latency (ns), its
    response's header lines in lower case ("name: value\n..."), its number in the attack."""

    start_ns: int
    code: int
    latency_ns: int
    headers: str = ""
    seq: int = 0

    @property
    def sent(self) -> float:
        """When it started, wall-clock seconds (Unix time)."""
        return self.start_ns / 1e9

    @property
    def latency_s(self) -> float:
        return self.latency_ns / 1e9


@dataclass(frozen=True)
class Result:
    hits: tuple[Hit, ...]

    @classmethod
    def from_csv(cls, text: str) -> Result:
        """`vegeta encode --to csv`: timestamp (ns), code, latency (ns), bytes out, bytes in,
        error, body (base64), attack, seq, method, url, headers (base64)."""
        hits = [Hit(int(row[0]), int(row[1]), int(row[2]),
                    base64.b64decode(row[11]).decode("latin-1", "replace").lower() if len(row) > 11 else "",
                    int(row[8]) if len(row) > 8 and row[8] else 0)
                for row in csv.reader(text.splitlines()) if len(row) >= 3]
        return cls(tuple(sorted(hits, key=lambda h: h.start_ns)))

    @property
    def requests(self) -> int:
        return len(self.hits)

    def codes(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for h in self.hits:
            out[h.code] = out.get(h.code, 0) + 1
        return out

    def latencies_ms(self, code: int | None = None) -> list[float]:
        """Latencies in ms, sorted, of the requests answered `code` (all if None)."""
        return sorted(h.latency_ns / 1e6 for h in self.hits if code is None or h.code == code)


@dataclass(frozen=True)
class Load:
    """The arguments of one `vegeta attack` of GET `url`."""

    url: str
    rate: float  # requests per second
    duration_s: float
    headers: Sequence[str] = ()  # "name: value"
    timeout_s: float = 5.0
    workers: int = 32  # connections opened at the start
    max_workers: int = 2000  # at most this many at once (each one request in flight)
    keepalive: bool = True

    def argv(self, out: Path, vegeta: str) -> list[str]:
        """`vegeta attack`'s argv, with `vegeta` the binary's path."""
        cmd = [vegeta, "attack", f"-rate={self.rate:g}/1s", f"-duration={self.duration_s:g}s",
               f"-timeout={self.timeout_s:g}s", f"-keepalive={str(self.keepalive).lower()}", f"-workers={self.workers}",
               f"-max-workers={self.max_workers}", f"-output={out}"]
        return cmd + [a for h in self.headers for a in ("-header", h)]

    def run(self, timeout_s: float | None = None) -> Result:
        return self.start().result(timeout_s)

    def start(self) -> Running:
        return Running(self)


class Running:
    """A `vegeta attack` in the background; the process is ours (stopped by PID)."""

    def __init__(self, load: Load):
        self.load = load
        fd, path = tempfile.mkstemp(prefix="vegeta-", suffix=".bin")
        os.close(fd)
        self.out = Path(path)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(load.argv(self.out, tools.path("vegeta")), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"GET {load.url}\n".encode())
        self.proc.stdin.close()
        self.proc.stdin = None  # the targets are written: communicate() only reads

    def result(self, timeout_s: float | None = None) -> Result:
        """Waits for the end (by default the duration and one request's timeout, plus 30 s)
        and reads every request's result."""
        limit = timeout_s if timeout_s is not None else self.load.duration_s + self.load.timeout_s + 30
        try:
            _, err = self.proc.communicate(timeout=max(1.0, self.started + limit - time.monotonic()))
            if self.proc.returncode != 0:
                raise RuntimeError(f"vegeta attack failed (rc {self.proc.returncode}): "
                                   f"{err.decode(errors='replace')[-2000:]}")
            encoded = subprocess.run([tools.path("vegeta"), "encode", "--to", "csv", str(self.out)],
                                     check=True, capture_output=True, timeout=120).stdout.decode()
            return Result.from_csv(encoded)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"vegeta attack of {self.load.url} ran past {limit:.0f} s") from None
        finally:
            self.out.unlink(missing_ok=True)

    def kill(self) -> None:
        stop(self.proc)
        self.out.unlink(missing_ok=True)
