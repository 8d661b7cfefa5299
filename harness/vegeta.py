"""Vegeta: open-loop load at a constant arrival rate, beside `harness.fortio` (which is
closed-loop per connection: when answers slow down, Fortio sends less; Vegeta keeps the
rate and opens more connections). `go install github.com/tsenart/vegeta/v12@v12.13.0`
(`make perf-adaptive-setup`).

A `Load` is what `vegeta attack` is asked (a rate and a duration, one GET target, a
per-request timeout); `run()` waits for it, `start()` runs it in the background
(`Running.result()`); both give a `Result`: every request, from Vegeta's own results
(`vegeta encode --to csv`): when it was sent, how long it took, its status (0: no
answer) and its response headers."""

from __future__ import annotations

import base64
import csv
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.procs import go_bin, stop

VERSION = "v12.13.0"


@dataclass(frozen=True)
class Request:
    """One request of an attack. `sent` is wall-clock seconds (Unix time)."""

    sent: float
    latency_s: float
    code: int  # 0: no answer (timeout, refused, reset)
    headers: str  # the response's header lines, lower case ("name: value\n...")
    seq: int


@dataclass(frozen=True)
class Result:
    requests: list[Request]

    @property
    def codes(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.requests:
            out[r.code] = out.get(r.code, 0) + 1
        return out


@dataclass(frozen=True)
class Load:
    """The arguments of one `vegeta attack` on one GET target."""

    url: str
    rate: float  # requests per second, constant
    duration_s: float
    timeout_s: float = 2.0
    keepalive: bool = True
    workers: int = 64  # initial workers; more are added (up to max_workers) to keep the rate
    max_workers: int = 4096
    headers: Sequence[str] = ()  # "name: value"

    def argv(self, targets: Path, out: Path) -> list[str]:
        cmd = [go_bin("vegeta"), "attack", f"-targets={targets}", f"-rate={self.rate:g}/1s",
               f"-duration={self.duration_s:g}s",
               f"-timeout={self.timeout_s:g}s", f"-keepalive={str(self.keepalive).lower()}",
               f"-workers={self.workers}", f"-max-workers={self.max_workers}", f"-output={out}"]
        return cmd + [a for h in self.headers for a in ("-header", h)]

    def run(self, *, timeout_s: float | None = None) -> Result:
        return self.start().result(timeout_s)

    def start(self) -> Running:
        return Running(self)


class Running:
    """A `vegeta attack` started in the background; the process is ours (stopped by PID)."""

    def __init__(self, load: Load):
        self.load = load
        self.dir = Path(tempfile.mkdtemp(prefix="vegeta-"))
        self.out = self.dir / "results.bin"
        self.targets = self.dir / "targets.txt"
        self.targets.write_text(f"GET {load.url}\n")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(load.argv(self.targets, self.out), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def result(self, timeout_s: float | None = None) -> Result:
        """Waits for the end (by default the duration, one request's timeout and a margin)
        and decodes Vegeta's results."""
        if timeout_s is None:
            timeout_s = self.load.duration_s + self.load.timeout_s + 30
        try:
            _, err = self.proc.communicate(timeout=max(1.0, self.started + timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"vegeta attack on {self.load.url} ran past {timeout_s:.0f} s") from None
        if self.proc.returncode != 0:
            raise RuntimeError(f"vegeta attack failed (rc {self.proc.returncode}): "
                               f"{(err or b'').decode(errors='replace')[-2000:]}")
        try:
            encoded = subprocess.run([go_bin("vegeta"), "encode", "--to", "csv", str(self.out)], check=True,
                                     capture_output=True, timeout=120).stdout.decode()
            return Result(parse_csv(encoded))
        finally:
            self.out.unlink(missing_ok=True)
            self.targets.unlink(missing_ok=True)
            self.dir.rmdir()

    def kill(self) -> None:
        stop(self.proc)


def parse_csv(text: str) -> list[Request]:
    """Vegeta's CSV encoding: timestamp (ns), code, latency (ns), bytes out, bytes in, error,
    body (base64), attack, seq, method, URL, headers (base64)."""
    out = []
    for row in csv.reader(text.splitlines()):
        if len(row) < 9:
            continue
        headers = base64.b64decode(row[11]).decode("latin-1", "replace").lower() if len(row) > 11 else ""
        out.append(Request(sent=int(row[0]) / 1e9, latency_s=int(row[2]) / 1e9, code=int(row[1]),
                           headers=headers, seq=int(row[8])))
    return out
