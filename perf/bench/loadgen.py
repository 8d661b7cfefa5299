"""The two load generators, with one result shape:
`ab` (apache2-utils: HTTP/1.0, a new connection per request, like the classic
demo's `ab -c 100 -n 10000`) and `fortio load` (HTTP/1.1 keep-alive)."""

from __future__ import annotations

import math
import re
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from harness import fortio, tools

PERCENTILES = (50, 75, 90, 99, 99.9)


def ab_bin() -> str:
    return tools.path("ab")


def versions() -> dict[str, str]:
    """ab's version (Fortio's is in every run's environment)."""
    ab = subprocess.run([ab_bin(), "-V"], capture_output=True, text=True).stdout
    m = re.search(r"Version (\S+)", ab)
    return {"ab": m.group(1) if m else ab.strip()}


def run(tool: str, url: str, *, connections: int, requests: int | None = None,
        duration_s: float | None = None, qps: float = 0, keepalive: bool = True,
        timeout_s: float = 600) -> dict:
    """One bounded load run. Returns requests, ok (2xx), errors, duration_s,
    achieved_qps (2xx per second), codes, and latency percentiles in ms."""
    if tool == "ab":
        if qps:
            raise ValueError("tool ab cannot offer a fixed qps: use fortio")
        return _ab(url, connections, requests, duration_s, keepalive, timeout_s)
    if tool == "fortio":
        s = fortio.load(url, connections=connections, requests=requests, duration_s=duration_s, qps=qps,
                        keepalive=keepalive, percentiles=PERCENTILES, allow_initial_errors=True, timeout_s=timeout_s)
        ok = sum(v for k, v in s.codes.items() if 200 <= k < 300)
        return {"requests": s.requests, "ok": ok, "errors": s.requests - ok, "codes": s.codes,
                "duration_s": s.duration_s, "achieved_qps": ok / s.duration_s if s.duration_s else 0.0,
                "client_qps": s.qps, **{f"p{p:g}": s.percentiles.get(p) for p in PERCENTILES}, "avg": s.avg_ms, "max": s.max_ms,
                "latency_resolution_ms": None}
    raise ValueError(f"tool: expected ab or fortio, got {tool!r}")


def _ab(url: str, connections: int, requests: int | None, duration_s: float | None,
        keepalive: bool, timeout_s: float) -> dict:
    gnuplot = Path(tempfile.mkstemp(prefix="ab-", suffix=".tsv")[1])
    cmd = [ab_bin(), "-c", str(connections), "-s", "30", "-r", "-q", "-g", str(gnuplot)]
    if requests is not None:
        cmd += ["-n", str(requests)]
    if duration_s is not None:
        cmd += ["-t", str(duration_s), "-n", "1000000"]  # -t alone caps at 50000
    if keepalive:
        cmd += ["-k"]
    cmd.append(url)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    try:
        if r.returncode != 0:
            raise RuntimeError(f"ab failed ({r.returncode}): {r.stderr.strip()[-500:]}")
        out = parse_ab(r.stdout)
        times = sorted(_ab_times(gnuplot))
    finally:
        gnuplot.unlink(missing_ok=True)
    pct = {f"p{p:g}": _percentile(times, p) for p in PERCENTILES}
    out.update(pct)
    out["avg"] = sum(times) / len(times) if times else None
    out["max"] = times[-1] if times else None
    out["latency_resolution_ms"] = 1  # ab records whole milliseconds
    return out


def parse_ab(text: str) -> dict:
    """The figures of ab's report we use."""
    def num(pattern: str, default: float | None = None) -> float:
        m = re.search(pattern, text, re.M)
        if not m:
            if default is None:
                raise ValueError(f"ab output lacks {pattern!r}:\n{text[-1500:]}")
            return default
        return float(m.group(1))

    complete = int(num(r"^Complete requests:\s+(\d+)"))
    non2xx = int(num(r"^Non-2xx responses:\s+(\d+)", 0))
    m = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: (\d+), Exceptions: (\d+)\)", text)
    connect, receive, length, exceptions = (int(g) for g in m.groups()) if m else (0, 0, 0, 0)
    duration = num(r"^Time taken for tests:\s+([\d.]+) seconds")
    errors = non2xx + connect + receive + exceptions
    ok = max(complete - non2xx - receive - exceptions, 0)
    return {
        "requests": complete + connect, "ok": ok, "errors": errors,
        "codes": {"non2xx": non2xx, "connect": connect, "receive": receive, "length": length,
                  "exceptions": exceptions},
        "duration_s": duration, "achieved_qps": ok / duration if duration else 0.0,
        "client_qps": num(r"^Requests per second:\s+([\d.]+)"),
    }


def _ab_times(path: Path) -> list[float]:
    """Total time (ms) of each request from ab's -g file (tab-separated, the 5th column)."""
    return [float(p[4]) for p in (line.split("\t") for line in path.read_text().splitlines()[1:]) if len(p) >= 5]


def _percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(p * len(sorted_values) / 100) - 1))
    return sorted_values[k]
