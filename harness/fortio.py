"""Fortio: the upstream (`FortioServer`) and the one load runner of the harness.

A `Load` is what `fortio load` is asked (bounded by a count or a duration, and always by a
timeout); `run()` waits for it, `start()` runs it in the background (`Running.result()`),
and both give a `Result`: the figures of Fortio's JSON report. `prefix` wraps the command
(`["ip", "netns", "exec", NS]` to load from inside a network namespace)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import tools
from harness.net import can_connect, free_port
from harness.procs import Child, stop

PERCENTILES = (50.0, 75.0, 90.0, 99.0, 99.9)


@dataclass(frozen=True)
class Result:
    """One `fortio load` run, from its JSON report. Times in ms."""

    requests: int
    qps: float  # every answer per second (Fortio's ActualQPS)
    duration_s: float
    codes: dict[int, int]  # status -> count (-1: socket errors)
    avg_ms: float
    max_ms: float
    percentiles: dict[float, float]  # e.g. {50.0: 1.2, 99.9: 8.0}
    sockets: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # Fortio's own JSON

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        h = data["DurationHistogram"]
        return cls(requests=h["Count"], qps=data["ActualQPS"], duration_s=data["ActualDuration"] / 1e9,
                   codes={int(k): v for k, v in data.get("RetCodes", {}).items()}, avg_ms=h["Avg"] * 1000,
                   max_ms=h["Max"] * 1000, percentiles={float(p["Percentile"]): p["Value"] * 1000
                                                       for p in h.get("Percentiles") or []},
                   sockets=sum(data.get("Sockets") or [0]), raw=data)

    @property
    def histogram(self) -> list[dict[str, Any]]:
        """The duration histogram's buckets, {Start, End, Count} (seconds)."""
        return list(self.raw.get("DurationHistogram", {}).get("Data") or [])

    @property
    def ok(self) -> int:
        """Answers 200."""
        return self.codes.get(200, 0)

    @property
    def errors(self) -> int:
        """Everything but 200 (other statuses and socket errors)."""
        return self.requests - self.ok

    def ms(self, percentile: float) -> float:
        """One of the percentiles the load asked for, in ms."""
        return self.percentiles[float(percentile)]

    def summary(self) -> dict[str, Any]:
        """The figures as one flat dict (`p50_ms`, ...), as results files keep them."""
        return {"requests": self.requests, "qps": self.qps, "duration_s": self.duration_s, "codes": self.codes,
                "ok": self.ok, "errors": self.errors, "avg_ms": self.avg_ms, "max_ms": self.max_ms,
                "sockets": self.sockets, **{f"p{p:g}_ms": v for p, v in self.percentiles.items()}}


@dataclass(frozen=True)
class Load:
    """The arguments of one `fortio load` (HTTP/1.1; keep-alive unless told)."""

    url: str
    connections: int
    qps: float = 0  # 0: as fast as possible
    requests: int | None = None  # -n
    duration_s: float | None = None  # -t; None: Fortio's default; below 0: none (-n spreads exactly)
    uniform: bool = False  # connections staggered over the interval, not in step
    keepalive: bool = True
    percentiles: Sequence[float] = PERCENTILES
    resolution_s: float | None = None  # histogram bucket width (-r; Fortio's default 1 ms)
    request_timeout_s: float = 30.0
    allow_initial_errors: bool = False  # a limiter may answer a connection's first request with 429
    headers: Sequence[str] = ()  # extra request headers, "name: value"
    # Go's net/http client (Fortio's -stdclient) instead of Fortio's own: slower, but it closes a
    # connection whose answer says `connection: close` and opens another, as HTTP clients do (Fortio's
    # own client ignores the header: it kept a draining connection several seconds).
    std_client: bool = False

    def argv(self, json_path: Path, fortio: str) -> list[str]:
        """`fortio load`'s argv, with `fortio` the binary's path."""
        cmd = [fortio, "load", "-c", str(self.connections), "-qps", str(self.qps),
               "-json", str(json_path), "-loglevel", "error", "-timeout", f"{self.request_timeout_s:g}s",
               "-p", ",".join(f"{p:g}" for p in self.percentiles)]
        cmd += ["-n", str(self.requests)] if self.requests is not None else []
        cmd += ["-t", f"{self.duration_s:g}s"] if self.duration_s is not None else []
        cmd += ["-r", f"{self.resolution_s:g}"] if self.resolution_s is not None else []
        cmd += ["-uniform"] if self.uniform else []
        cmd += [] if self.keepalive else ["-keepalive=false"]
        cmd += ["-allow-initial-errors"] if self.allow_initial_errors else []
        cmd += ["-stdclient"] if self.std_client else []
        cmd += [a for h in self.headers for a in ("-H", h)]
        return [*cmd, self.url]

    def run(self, *, timeout_s: float = 120.0, prefix: Sequence[str] = (), cpus: set[int] | None = None) -> Result:
        """Runs the load to its end (at most `timeout_s`); `cpus` pins Fortio to those cores."""
        return self.start(prefix=prefix, cpus=cpus).result(timeout_s)

    def start(self, *, prefix: Sequence[str] = (), cpus: set[int] | None = None) -> Running:
        return Running(self, prefix, cpus)


class Running:
    """A `fortio load` started in the background; the process is ours (stopped by PID)."""

    def __init__(self, load: Load, prefix: Sequence[str], cpus: set[int] | None):
        self.load = load
        fd, path = tempfile.mkstemp(prefix="fortio-", suffix=".json")
        os.close(fd)
        self.json_path = Path(path)
        self.json_path.unlink()
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.started = time.monotonic()
        self.proc = subprocess.Popen([*prefix, *load.argv(self.json_path, tools.path("fortio"))], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, preexec_fn=pin)

    def result(self, timeout_s: float | None = None) -> Result:
        """Waits for the end (at most `timeout_s` after the start; by default the planned
        time and one request's timeout) and reads the report."""
        if timeout_s is None:  # the calls at the offered rate, or the duration
            load = self.load
            planned = load.requests / load.qps if load.requests and load.qps else load.duration_s
            if not planned or planned < 0:
                raise ValueError("fortio load without a rate and count or a duration: give a timeout")
            timeout_s = planned + load.request_timeout_s
        try:
            _, err = self.proc.communicate(timeout=max(1.0, self.started + timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"fortio load of {self.load.url} ran past {timeout_s:.0f} s") from None
        try:
            return Result.from_json(json.loads(self.json_path.read_text()))
        except (FileNotFoundError, ValueError):
            raise RuntimeError(f"fortio load of {self.load.url} gave no result (rc {self.proc.returncode}): "
                               f"{err.decode(errors='replace')[-2000:]}") from None
        finally:
            self.json_path.unlink(missing_ok=True)

    def kill(self) -> None:
        stop(self.proc)
        self.json_path.unlink(missing_ok=True)


def load(url: str, *, timeout_s: float = 120.0, **fields: Any) -> Result:
    """`Load(url, **fields).run(timeout_s=...)`: the common case."""
    return Load(url, **fields).run(timeout_s=timeout_s)


class FortioServer(Child):
    """`fortio server` on loopback: the real upstream. Its echo handler answers after
    `?delay=` (a Go timer), up to `max_echo_delay`."""

    def __init__(self, port: int | None = None, max_echo_delay: str = "1.5s"):
        self.port = port or free_port()
        self.max_echo_delay = max_echo_delay
        fd, log_path = tempfile.mkstemp(prefix="fortio-server-", suffix=".log")
        os.close(fd)  # kept on disk for a failed test's reader
        self.log_path = Path(log_path)

    def __enter__(self) -> FortioServer:
        argv = [tools.path("fortio"), "server", "-http-port", f"127.0.0.1:{self.port}", "-grpc-port", "disabled",
                "-redirect-port", "disabled", "-loglevel", "warning", "-max-echo-delay", self.max_echo_delay]
        self.start_and_wait(argv, lambda: can_connect(self.port), f"fortio server on :{self.port}", 15)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
