"""Where a benchmark run writes, and what it records about the machine and the tools.

One layout for every benchmark family: `perf/reports/<family>/<run-id>/`, the run id being
the UTC start time and a name (`20261125-153000-quick`), and `perf/reports/<family>/latest`
pointing at the newest. Runs are ignored by git (perf/reports/.gitignore); one quoted in a
README is committed with `git add -f`, so the committed reports sit where runs write."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from harness import tools
from harness.procs import ROOT, envoy_bin

REPORTS = ROOT / "perf" / "reports"


def run_dir(family: str, name: str, out: Path | None = None) -> tuple[str, Path]:
    """(run id, directory) of a new run, created: `out` if given, else
    perf/reports/<family>/<run-id>/, then also the family's `latest` link."""
    run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S") + f"-{name}"
    path = out or REPORTS / family / run_id
    path.mkdir(parents=True, exist_ok=True)
    if out is None:
        latest = REPORTS / family / "latest"
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(run_id)
    return run_id, path


def _output(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable: {e}"


def envoy_version() -> str:
    """"envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL" -> "1.40.0"."""
    parts = _output([envoy_bin(), "--version"]).split("version:")[-1].strip().split("/")
    return parts[1] if len(parts) > 1 else parts[0]


def environment(run_id: str, **extra: Any) -> dict[str, Any]:
    """The run's self-description: host, cores, kernel, load average, Envoy and Fortio
    versions, git commit, start time, and whatever the family adds."""
    return {
        "run_id": run_id, "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release(),
        "loadavg_start": os.getloadavg(), "envoy": envoy_version(), "fortio": _output([tools.path("fortio"), "version"]),
        "git": _output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]), **extra,
    }


def first_line(cmd: list[str]) -> str:
    """The first line a tool prints about itself (`java -version`...), or "?"."""
    lines = _output(cmd).splitlines()
    return lines[0] if lines else "?"
