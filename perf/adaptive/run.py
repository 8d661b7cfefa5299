"""The adaptive-pacing benchmark: each scenario of perf/adaptive/scenarios.yaml
against each arm, one after the other, on 127.0.0.1: the backend emulator
(perf/adaptive/emulator.py) with the scenario's schedule, Envoy with the arm's
filter, open-loop load (Vegeta; the retrying client for S9). Writes to
perf/results/adaptive-<run-id>/ (or --out):

  runs/<scenario>--<arm>.json   figures per phase, the series for the charts,
                                Envoy's counters, the backend's record
  summary.md, report.html, <scenario>.png   (perf/adaptive/report.py)
  info.json                     versions, load average before and after

  python -m perf.adaptive.run --set full          # or quick
  python -m perf.adaptive.run --set full --scenarios S1 S3 --arms none throttle-low
  python -m perf.adaptive.report perf/results/adaptive-<run-id>   # re-render
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from harness.procs import ROOT, Envoy, envoy_bin, free_port, go_bin, http_get, stop, wait_until
from perf.adaptive import load, metrics, report
from perf.adaptive.arms import envoy_config

HERE = Path(__file__).resolve().parent
SPEC = HERE / "scenarios.yaml"
RESULTS = ROOT / "perf" / "results"
STAT_PREFIXES = ("wasmcustom.throttle.", "http.ingress.adaptive_concurrency.", "http.ingress.admission_control.",
                 "cluster.upstream.upstream_rq_", "cluster.upstream.upstream_cx_active")


def load_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    return spec


def _post(port: int, path: str, body: dict[str, Any] | None = None) -> None:
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body or {}).encode(),
                                 method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


class Emulator:
    """The backend emulator as our own process."""

    def __init__(self, schedule: list[dict[str, Any]], seed: int = 1):
        self.port = free_port()
        self.schedule = schedule
        self.seed = seed
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Emulator:
        self.log = tempfile.NamedTemporaryFile(prefix="emulator-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "perf.adaptive.emulator", "--port", str(self.port),
             "--schedule", json.dumps(self.schedule), "--seed", str(self.seed)], cwd=ROOT,
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(self._up, 15, f"emulator on :{self.port}")
        return self

    def _up(self) -> bool:
        try:
            return http_get(f"http://127.0.0.1:{self.port}/_health", timeout=0.5)[0] == 200
        except OSError:
            return False

    def start(self) -> float:
        _post(self.port, "/_start")
        return time.time()

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(http_get(f"http://127.0.0.1:{self.port}/_record", timeout=10)[2])
        return out

    def __exit__(self, *exc: object) -> None:
        stop(self.proc)
        self.log.close()


def envoy_stats(admin_port: int) -> dict[str, int]:
    body = http_get(f"http://127.0.0.1:{admin_port}/stats?format=json", timeout=5)[2]
    out: dict[str, int] = {}
    for s in json.loads(body).get("stats", []):
        name, value = s.get("name", ""), s.get("value")
        if isinstance(value, int) and name.startswith(STAT_PREFIXES):
            out[name] = value
    return out


def refusal(log: str) -> str:
    """The line in which Envoy (or the filter) refused a configuration."""
    for line in log.splitlines():
        if "config refused: " in line:
            return line.split("config refused: ", 1)[1].strip()
    for key in ("error initializing configuration", "Unable to create"):
        for line in log.splitlines():
            if key in line:
                return line.split("] ", 3)[-1].strip()
    return log.strip().splitlines()[-1] if log.strip() else "envoy exited"


def run_one(scenario: str, sc: dict[str, Any], arm_name: str, arm: dict[str, Any]) -> dict[str, Any]:
    """One scenario against one arm; its result (figures, series, counters, record)."""
    duration = float(sc["duration"])
    result: dict[str, Any] = {"scenario": scenario, "arm": arm_name, "what": sc["what"], "arm_what": arm["what"]}
    with Emulator(sc["phases"]) as emu:
        cfg = envoy_config(arm, listen_port=free_port(), admin_port=free_port(), upstream_port=emu.port,
                           max_queue_delay=sc.get("max_queue_delay", "300ms"))
        envoy = Envoy(cfg)
        try:
            envoy.start()
        except RuntimeError:
            envoy.stop()
            result["refused"] = refusal(envoy.log())
            return result
        try:
            url = f"{envoy.url}/work"
            for _ in range(20):  # warm-up (before the backend's record starts)
                http_get(url, timeout=2)
            t0 = emu.start()
            if sc.get("client") == "retry":
                attempts = load.retry_run(url, int(sc["offered"]), duration, t0,
                                          timeout_s=_seconds(sc.get("client_timeout", "1s")),
                                          retries=int(sc.get("retries", 3)))
            else:
                attempts = load.vegeta_run(url, int(sc["offered"]), duration, t0)
            time.sleep(0.5)
            record = emu.record()
            result["envoy_stats"] = envoy_stats(envoy.admin_port)
        finally:
            envoy.stop()
    windows = record["windows"][: round(duration / metrics.WINDOW_S)]
    r = metrics.Run(attempts, windows, duration)
    offered = float(sc["offered"])
    figures = [r.phase(a, b, cap, offered).as_dict() for a, b, cap in metrics.phases(sc["phases"], duration)]
    result.update({
        "offered": offered,
        "duration": duration,
        "phases": figures,
        "requests": len({x.request for x in attempts}),
        "attempts": len(attempts),
        "series": r.series(),
        "applied": record["applied"],
    })
    if sc.get("client") == "retry" and len(figures) >= 3:
        back = figures[2]
        result["recovery_s"] = metrics.recovery(r, back["at_s"], offered, back["end_s"])
    return result


def _seconds(text: str) -> float:
    text = str(text).strip()
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    return float(text.rstrip("s"))


def _versions() -> dict[str, str]:
    def out(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"
    return {
        "envoy": out([envoy_bin(), "--version"]).split("version:")[-1].strip(),
        "vegeta": "v12.13.0 (go install github.com/tsenart/vegeta/v12@v12.13.0)" if _has_vegeta() else "missing",
        "git": out(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "uptime_before": out(["uptime"]),
        "nproc": str(os.cpu_count()),
    }


def _has_vegeta() -> bool:
    try:
        go_bin("vegeta")
        return True
    except FileNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="quick", help="set of perf/adaptive/scenarios.yaml (default quick)")
    ap.add_argument("--scenarios", nargs="*", help="only these scenarios of the set")
    ap.add_argument("--arms", nargs="*", help="only these arms of the set")
    ap.add_argument("--out", type=Path, help="results directory (default perf/results/adaptive-<run-id>)")
    args = ap.parse_args(argv)
    spec = load_spec()
    chosen = spec["sets"].get(args.set)
    if chosen is None:
        print(f"perf.adaptive: no set {args.set!r} (sets: {', '.join(spec['sets'])})", file=sys.stderr)
        return 2
    scenarios = [s for s in chosen["scenarios"] if not args.scenarios or s in args.scenarios]
    arms = [a for a in chosen["arms"] if not args.arms or a in args.arms]
    if not _has_vegeta():
        print("perf.adaptive: vegeta not found: run `make perf-adaptive-setup`", file=sys.stderr)
        return 2
    run_id = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS / f"adaptive-{run_id}"
    (out / "runs").mkdir(parents=True, exist_ok=True)
    info = {"run_id": run_id, "set": args.set, "scenarios": scenarios, "arms": arms, **_versions()}
    print(f"perf.adaptive: {len(scenarios)} scenario(s) x {len(arms)} arm(s) -> {out}", flush=True)
    for scenario in scenarios:
        for arm in arms:
            t = time.monotonic()
            res = run_one(scenario, spec["scenarios"][scenario], arm, spec["arms"][arm])
            (out / "runs" / f"{scenario}--{arm}.json").write_text(json.dumps(res, indent=1))
            what = res.get("refused") or " | ".join(
                f"{p['at_s']:.0f}s good {p['goodput_share']:.0%} err {p['local_429'] + p['upstream_429'] + p['e503'] + p['e504'] + p['other_5xx'] + p['no_answer']}"
                for p in res["phases"])
            print(f"  {scenario:8} {arm:18} {time.monotonic() - t:5.1f}s  {what}", flush=True)
    info["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    (out / "info.json").write_text(json.dumps(info, indent=1))
    report.render(out)
    print(f"perf.adaptive: report {out / 'summary.md'}, {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
