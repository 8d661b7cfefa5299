"""The cluster-scope engine on loopback: Redis and envoyproxy/ratelimit.

    python -m harness.engine [--fault-proxy]

starts Redis (`redis-server --bind 127.0.0.1`, no persistence) and the rate
limit service (HTTP, gRPC and debug listeners on 127.0.0.1, free ports, the
project's own configuration from engine/config/), waits until the service
answers a real `POST /json`, prints exactly one JSON line on stdout,

    {"envoy_cluster": {"name": "throttle_engine", ...}}

the complete Envoy cluster that reaches the service's HTTP port (the filter
calls `POST /json` with `dispatch_http_call`), then runs until SIGTERM (or
SIGINT) and stops everything it started, by PID. Diagnostics go to stderr.

In tests, use `Engine` as a context manager: `service` and `redis` each
`stop()`, `kill()` and `start()` (the service exits at start while Redis is
unreachable); with `fault_proxy=True` the cluster points at a small
loopback HTTP proxy (`FaultProxy`) in front of the service that can make it
slow (`slow(ms)`) or answer nonsense (`nonsense(kind)`), and `healthy()`
undoes both. `claim()` sends one `POST /json` the way the filter does.

Install the binaries first: `make setup-engine` (tools/setup-engine.sh).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from harness import procstats, tools
from harness.net import free_port, http_get
from harness.procs import ROOT, Child

#: The committed service configuration (also the Kubernetes ConfigMap).
CONFIG_FILE = ROOT / "engine" / "config" / "throttle.yaml"
#: The rate limit domain of that configuration.
DOMAIN = "envoy_throttle"
#: The limit of every descriptor in it: never reached, so remaining reveals the counter.
LIMIT = 4_000_000_000
#: Name of the Envoy cluster the filter's `engine.cluster` names.
CLUSTER_NAME = "throttle_engine"


def _log(msg: str) -> None:
    print(f"harness.engine: {msg}", file=sys.stderr, flush=True)


def redis_bin() -> str:
    return tools.path("redis-server")


def ratelimit_bin() -> str:
    return tools.path("ratelimit")


def post_json(port: int, body: dict[str, Any] | bytes, timeout: float = 2.0,
              path: str = "/json") -> tuple[int, bytes]:
    """One `POST /json` to 127.0.0.1:port; returns (status, body)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=data, headers={"content-type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def descriptor(key: str, value: str, hits: int | None) -> dict[str, Any]:
    """A request descriptor in proto3 JSON; `hits` None leaves hits_addend unset."""
    d: dict[str, Any] = {"entries": [{"key": key, "value": value}]}
    if hits is not None:
        d["hitsAddend"] = str(hits)
    return d


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class Redis(Child):
    """`redis-server` on 127.0.0.1:port, nothing saved to disk."""

    def __init__(self, port: int, workdir: Path):
        self.port = port
        self.workdir = workdir
        self.log_path = workdir / "redis.log"

    def start(self, timeout: float = 10.0) -> None:
        if self.running():
            return
        self.start_and_wait([redis_bin(), "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                            "--appendonly", "no", "--protected-mode", "yes", "--daemonize", "no",
                            "--dir", str(self.workdir), "--logfile", str(self.log_path)],
                            lambda: _redis_ping(self.port), f"redis on :{self.port}", timeout)

    def command(self, *args: str) -> str:
        """One command through redis-cli (INFO, FLUSHALL...)."""
        r = subprocess.run([tools.path("redis-cli"), "-h", "127.0.0.1", "-p", str(self.port), *args],
                           capture_output=True, text=True, timeout=10, check=True)
        return r.stdout

    def info(self, section: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in self.command("INFO", section).splitlines():
            k, sep, v = line.strip().partition(":")
            if sep:
                out[k] = v
        return out


class RateLimitService(Child):
    """envoyproxy/ratelimit with the project's configuration, all listeners on loopback."""

    def __init__(self, redis_port: int, workdir: Path, log_level: str = "warn", metrics: bool = False):
        self.port = free_port()
        self.grpc_port = free_port()
        self.debug_port = free_port()
        # With `metrics`, the service's own counters on 127.0.0.1:<metrics_port>/metrics
        # (its Prometheus sink, flushed every second); off by default (it costs the service CPU).
        self.metrics_port = free_port() if metrics else None
        self.redis_port = redis_port
        self.workdir = workdir
        self.log_level = log_level
        self.log_path = workdir / "ratelimit.log"
        runtime = workdir / "runtime"
        (runtime / "throttle" / "config").mkdir(parents=True, exist_ok=True)
        shutil.copy(CONFIG_FILE, runtime / "throttle" / "config" / CONFIG_FILE.name)
        self.runtime = runtime

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR", "LANG")}
        env.update({
            "HOST": "127.0.0.1", "PORT": str(self.port),
            "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(self.grpc_port),
            "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": str(self.debug_port),
            "RUNTIME_ROOT": str(self.runtime), "RUNTIME_SUBDIRECTORY": "throttle",
            "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
            "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": f"127.0.0.1:{self.redis_port}",
            # A dead Redis must fail a call fast, not after the 10 s default.
            "REDIS_TIMEOUT": "1s",
            "USE_STATSD": "false", "USE_PROMETHEUS": "false",
            "LOG_LEVEL": self.log_level, "LOG_FORMAT": "text",
        })
        if self.metrics_port is not None:
            env.update({"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": f"127.0.0.1:{self.metrics_port}",
                        "PROMETHEUS_PATH": "/metrics", "STATS_FLUSH_INTERVAL": "1s"})
        return env

    def metrics(self) -> str:
        """The service's own counters (Prometheus text from its sink); empty when started without `metrics`."""
        if self.metrics_port is None:
            return ""
        return http_get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2.0)[2].decode(errors="replace")

    def start(self, timeout: float = 20.0) -> None:
        if self.running():
            return
        self.start_and_wait([ratelimit_bin()], self._answers, f"ratelimit on :{self.port}", timeout, env=self.env(),
                            cwd=self.workdir)

    def _answers(self) -> bool:
        try:
            # A look (hits_addend 0) at a counter: answers only once config and Redis are in place.
            status, body = post_json(self.port, {"domain": DOMAIN, "descriptors": [
                descriptor("throttle_members", "harness:ready", 0)]}, timeout=1.0)
            return status == 200 and b"OK" in body
        except OSError:
            return False


def hits(metrics: str, key: str) -> int:
    """The hits on one descriptor key of our domain, summed over its values, in the service's
    Prometheus text (read with prometheus-client, which names a counter's sample
    `<family>_total`). key1 is the configuration's key, with `_<value>` when the
    configuration names a value."""
    return int(sum(x.value for f in text_string_to_metric_families(metrics) for x in f.samples
                   if f.name == "ratelimit_service_rate_limit_total_hits" and x.labels.get("domain") == DOMAIN
                   and (x.labels.get("key1") == key or x.labels.get("key1", "").startswith(f"{key}_"))))


#: What `FaultProxy.nonsense` can answer instead of the service.
NONSENSE_KINDS = ("garbage", "status_500", "wrong_count", "over_limit", "above_limit", "empty")


class FaultProxy:
    """A loopback HTTP/1.1 proxy in front of the service: pass, slow, or nonsense.

    Modes change at run time (thread-safe); requests in flight keep the mode
    they started with."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = free_port()
        self._lock = threading.Lock()
        self._delay_s = 0.0
        self._nonsense: str | None = None
        self.forwarded = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                status, answer = proxy._answer(self.path, body)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                try:
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the caller gave up first (a slow answer past its timeout): nothing to deliver

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def slow(self, ms: float) -> None:
        """Answer every request `ms` later than the service does."""
        with self._lock:
            self._delay_s = ms / 1000.0

    def nonsense(self, kind: str) -> None:
        """Answer `kind` (one of NONSENSE_KINDS) instead of forwarding."""
        if kind not in NONSENSE_KINDS:
            raise ValueError(f"nonsense kind must be one of {NONSENSE_KINDS}, got {kind!r}")
        with self._lock:
            self._nonsense = kind

    def healthy(self) -> None:
        with self._lock:
            self._delay_s = 0.0
            self._nonsense = None

    def _answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        with self._lock:
            delay, kind = self._delay_s, self._nonsense
        if kind is None:
            try:
                status, answer = post_json(self.target_port, body, timeout=5.0, path=path)
            except OSError:
                status, answer = 503, b"upstream unreachable"
            self.forwarded += 1
        else:
            status, answer = _nonsense_answer(kind, body)
        if delay > 0:
            time.sleep(delay)  # the fault itself: answering late is what this mode does
        return status, answer


def _nonsense_answer(kind: str, body: bytes) -> tuple[int, bytes]:
    try:
        n = len(json.loads(body).get("descriptors", []))
    except (ValueError, AttributeError):
        n = 1
    ok = {"code": "OK", "currentLimit": {"requestsPerUnit": LIMIT, "unit": "HOUR"},
          "limitRemaining": LIMIT - 1, "durationUntilReset": "1800s"}
    if kind == "garbage":
        return 200, b"<html>not json</html>"
    if kind == "status_500":
        return 500, b"Internal Server Error"
    if kind == "empty":
        return 200, b""
    if kind == "wrong_count":
        return 200, json.dumps({"overallCode": "OK", "statuses": [ok] * (n + 1)}).encode()
    if kind == "over_limit":
        over = dict(ok, code="OVER_LIMIT")
        over.pop("limitRemaining")
        return 200, json.dumps({"overallCode": "OVER_LIMIT", "statuses": [over] * n}).encode()
    if kind == "above_limit":
        # remaining above the limit: a counter below zero, which cannot be.
        bad = dict(ok, limitRemaining=LIMIT + 5)
        return 200, json.dumps({"overallCode": "OK", "statuses": [bad] * n}).encode()
    raise ValueError(kind)


class Engine:
    """Redis + the rate limit service (+ optional fault proxy), stopped on exit."""

    def __init__(self, fault_proxy: bool = False, log_level: str = "warn", metrics: bool = False):
        self.workdir = Path(tempfile.mkdtemp(prefix="throttle-engine-"))
        self.redis = Redis(free_port(), self.workdir)
        self.service = RateLimitService(self.redis.port, self.workdir, log_level, metrics=metrics)
        self.proxy: FaultProxy | None = FaultProxy(self.service.port) if fault_proxy else None

    # -- lifecycle -------------------------------------------------------
    def start(self) -> Engine:
        try:
            self.redis.start()
            self.service.start()
            if self.proxy is not None:
                self.proxy.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        self.service.stop()
        self.redis.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults (and `service`, `redis`: stop(), kill(), start()) -------
    def slow(self, ms: float) -> None:
        self._need_proxy().slow(ms)

    def nonsense(self, kind: str) -> None:
        self._need_proxy().nonsense(kind)

    def healthy(self) -> None:
        self._need_proxy().healthy()

    def _need_proxy(self) -> FaultProxy:
        if self.proxy is None:
            raise RuntimeError("start the Engine with fault_proxy=True to inject faults")
        return self.proxy

    # -- reaching it -------------------------------------------------------
    @property
    def port(self) -> int:
        """The port Envoy's cluster reaches: the fault proxy's, else the service's."""
        return self.proxy.port if self.proxy is not None else self.service.port

    def envoy_cluster(self, name: str = CLUSTER_NAME, connect_timeout: str = "0.25s") -> dict[str, Any]:
        """The Envoy cluster (v3, JSON-compatible) that reaches the service's `POST /json`."""
        return {
            "name": name,
            "type": "STATIC",
            "connect_timeout": connect_timeout,
            "lb_policy": "ROUND_ROBIN",
            # HTTP/1.1 (the service's /json listener is plain net/http); a few
            # kept-alive connections serve every worker of one Envoy.
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                    "socket_address": {"address": "127.0.0.1", "port_value": self.port}}}}]}],
            },
        }

    def claim(self, descriptors: list[dict[str, Any]], timeout: float = 2.0) -> tuple[int, Any]:
        """One `POST /json` with these descriptors; returns (status, parsed JSON or raw bytes)."""
        status, body = post_json(self.port, {"domain": DOMAIN, "descriptors": descriptors}, timeout)
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    def service_calls(self, key: str = "throttle_members") -> int | None:
        """The service's own count of hits on one descriptor key of our domain,
        summed over values (None without `metrics`). For `throttle_members`
        that is the calls carrying one cluster rule (each adds 1 member, and
        looks with 0): the service's view of the calls. It trails by up to
        the service's 1 s flush."""
        if self.service.metrics_port is None:
            return None
        return hits(self.service.metrics(), key)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) used so far by Redis and by the service (0 if not running)."""
        return {name: procstats.cpu_seconds(c.proc.pid) if c.proc is not None and c.running() else 0.0
                for name, c in (("redis", self.redis), ("ratelimit", self.service))}

    def redis_stats(self) -> dict[str, int]:
        """Redis's own counters: total commands, and calls of INCRBY, EXPIRE and GET."""
        stats = self.redis.info("stats")
        cmds = self.redis.info("commandstats")
        out = {"total_commands_processed": int(stats.get("total_commands_processed", 0))}
        for name in ("incrby", "expire", "get"):
            raw = cmds.get(f"cmdstat_{name}", "")
            calls = [p.split("=")[1] for p in raw.split(",") if p.startswith("calls=")]
            out[name] = int(calls[0]) if calls else 0
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault-proxy", action="store_true",
                        help="put the fault-injecting proxy between Envoy and the service")
    parser.add_argument("--log-level", default="warn", help="the service's LOG_LEVEL")
    args = parser.parse_args(argv)

    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    with Engine(fault_proxy=args.fault_proxy, log_level=args.log_level) as engine:
        _log(f"redis pid {engine.redis.proc.pid if engine.redis.proc else '?'} on 127.0.0.1:{engine.redis.port}; "
             f"ratelimit pid {engine.service.proc.pid if engine.service.proc else '?'} http :{engine.service.port} "
             f"grpc :{engine.service.grpc_port} debug :{engine.service.debug_port}")
        print(json.dumps({"envoy_cluster": engine.envoy_cluster()}), flush=True)
        died = False
        while not stopping.is_set():
            for part, alive in (("redis", engine.redis.running()), ("ratelimit", engine.service.running())):
                if not alive:
                    _log(f"{part} exited on its own; stopping the rest")
                    died = True
                    stopping.set()
            stopping.wait(0.5)
        _log("stopping")
    return 1 if died else 0


if __name__ == "__main__":
    sys.exit(main())
