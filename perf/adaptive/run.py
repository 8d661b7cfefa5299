"""The adaptive-pacing benchmark: each scenario of perf/adaptive/scenarios.yaml against
each arm, one after the other, on 127.0.0.1: the backend emulator (perf/adaptive/
emulator.py) with the scenario's schedule, Envoy with the arm's filter, open-loop load
(`harness.vegeta`; the retrying client of perf/adaptive/retry.py for S9). Writes
perf/reports/adaptive/<run-id>/ (or --out):

  runs/<scenario>--<arm>.json   figures per phase, the series for the charts, Envoy's
                                counters (or the filter's refusal)
  summary.md, report.html, <scenario>.png   (perf/adaptive/report.py)
  environment.json              host, cores, load, versions (harness.results)

  python -m perf.adaptive.run --set full          # or quick
  python -m perf.adaptive.run --set full --scenarios S1 S3 --arms none throttle-low
  python -m perf.adaptive.report perf/reports/adaptive/latest   # re-render
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from harness import tools, vegeta
from harness.envoy import Envoy
from harness.net import free_port, http_get
from harness.results import environment, run_dir
from harness.schema import check
from harness.units import seconds
from perf.adaptive import emulator, metrics, report, retry
from perf.adaptive.arms import envoy_config

HERE = Path(__file__).resolve().parent
SPEC = HERE / "scenarios.yaml"
SCHEMA = HERE / "scenarios.schema.yaml"
STAT_PREFIXES = ("wasmcustom.throttle.", "http.ingress.adaptive_concurrency.", "http.ingress.admission_control.",
                 "cluster.upstream.upstream_rq_", "cluster.upstream.upstream_cx_active")


class SpecError(ValueError):
    """perf/adaptive/scenarios.yaml is not what the runner can run; the message names the field."""


def load_spec(path: Path = SPEC) -> dict[str, Any]:
    """The benchmark's data file, its shape (scenarios.schema.yaml) and its cross-field rules checked."""
    spec: dict[str, Any] = yaml.safe_load(path.read_text())
    check(spec, SCHEMA, path.name, SpecError)
    for name, s in spec["sets"].items():
        for key in ("scenarios", "arms"):
            unknown = [x for x in s[key] if x not in spec[key]]
            if unknown:
                raise SpecError(f"{path.name}: sets.{name}.{key}: unknown {', '.join(unknown)}")
    for name, sc in spec["scenarios"].items():
        ats = [p["at"] for p in sc["phases"]]
        if ats[0] != 0 or ats != sorted(ats) or ats[-1] >= sc["duration"]:
            raise SpecError(f"{path.name}: scenarios.{name}.phases: must start at 0, in order, "
                            f"within the duration ({sc['duration']} s)")
        attack = sc.get("attack")
        if attack and not attack["from"] < attack["to"] <= sc["duration"]:
            raise SpecError(f"{path.name}: scenarios.{name}.attack: from < to <= the duration ({sc['duration']} s)")
    for name, arm in spec["arms"].items():
        if ("filter" in arm) != ("config" in arm) or ("filter" in arm and "throttle" in arm):
            raise SpecError(f"{path.name}: arms.{name}: either `filter` with its `config`, or `throttle`, or neither")
    return spec


def envoy_stats(envoy: Envoy) -> dict[str, int]:
    body = envoy.admin("/stats?format=json")[1]
    out: dict[str, int] = {}
    for s in json.loads(body).get("stats", []):
        name, value = s.get("name", ""), s.get("value")
        if isinstance(value, int) and name.startswith(STAT_PREFIXES):
            out[name] = value
    return out


def refusal(log: str) -> str:
    """The line in which the filter (or Envoy) refused a configuration."""
    for line in log.splitlines():
        if "config refused: " in line:
            return line.split("config refused: ", 1)[1].strip()
    for key in ("error initializing configuration", "Unable to create"):
        for line in log.splitlines():
            if key in line:
                return line.split("] ", 3)[-1].strip()
    return log.strip().splitlines()[-1] if log.strip() else "envoy exited"


def learner_lines(log: str, t0: float) -> list[str]:
    """The learner's moves in an Envoy log: `<seconds since t0 (the scenario's start)> <what>`."""
    out: list[str] = []
    for line in log.splitlines():
        if "adaptive rate " not in line:
            continue
        stamp = line[1:24]  # [2026-11-25 17:29:22.123]
        try:
            t = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + float(stamp[19:])
        except ValueError:
            continue
        out.append(f"{t - t0:8.3f} {line.split('rule ', 1)[-1]}")
    return out


CUTS = ("(shed", "(failed", "(queue")


def first_cuts(lines: list[str], phases: list[dict[str, Any]]) -> dict[str, float | None]:
    """For each change of the backend after the start: seconds from it to the learner's
    first cut (for shed or failed answers, or a queue) at or after it (None: none before
    the next change)."""
    cuts = [float(x.split()[0]) for x in lines if any(c in x for c in CUTS)]
    ats = sorted(float(p["at"]) for p in phases)
    out: dict[str, float | None] = {}
    for i, at in enumerate(ats[1:], 1):
        end = ats[i + 1] if i + 1 < len(ats) else float("inf")
        first = next((t for t in cuts if at <= t < end), None)
        out[f"{at:g}"] = None if first is None else round(first - at, 3)
    return out


def run_one(scenario: str, sc: dict[str, Any], arm_name: str, arm: dict[str, Any]) -> dict[str, Any]:
    """One scenario against one arm; its result (figures, series, counters)."""
    duration = float(sc["duration"])
    result: dict[str, Any] = {"scenario": scenario, "arm": arm_name, "what": sc["what"], "arm_what": arm["what"]}
    with emulator.Process(sc["phases"]) as emu:
        cfg = envoy_config(arm, listen_port=free_port(), admin_port=free_port(), upstream_port=emu.port,
                           max_queue_delay=sc.get("max_queue_delay", "300ms"))
        learns = "adaptive" in arm.get("throttle", {})
        # The adaptive arm logs each move of its learner (wasm debug lines).
        envoy = Envoy(cfg, extra_args=["--component-log-level", "wasm:debug"] if learns else [])
        try:
            envoy.start()
        except RuntimeError:
            envoy.stop()
            result["refused"] = refusal(envoy.log())
            return result
        try:
            url = f"{envoy.url}/work"
            for _ in range(20):  # warm-up, before the backend's record starts
                http_get(url, timeout=2)
            t0 = emu.begin()
            attack = sc.get("attack")
            attacked: dict[str, Any] = {}
            attacker = _attack(f"{envoy.url}{attack['path']}", attack, attacked) if attack else None
            if sc.get("client") == "retry":
                attempts = retry.retry_run(url, int(sc["offered"]), duration, t0,
                                           timeout_s=seconds(sc.get("client_timeout", "1s")),
                                           retries=int(sc.get("retries", 3)))
            else:
                got = vegeta.Load(url, rate=float(sc["offered"]), duration_s=duration, timeout_s=2.0,
                                  workers=64, max_workers=4096).run()
                attempts = metrics.from_vegeta(got.hits, t0)
            if attacker is not None:
                attacker.join(float(sc["duration"]) + 30)
            time.sleep(0.5)
            record = emu.record()
            result["envoy_stats"] = envoy_stats(envoy)
        finally:
            envoy.stop()
        if learns:
            result["learner_log"] = learner_lines(envoy.log(), t0)
            result["first_cut_s"] = first_cuts(result["learner_log"], sc["phases"])
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
    if attack:
        result["attack"] = {**attack, "codes": attacked.get("codes", {})}
    if sc.get("client") == "retry" and len(figures) >= 3:
        back = figures[2]
        result["recovery_s"] = metrics.recovery(r, back["at_s"], offered, back["end_s"])
    return result


def _attack(url: str, attack: dict[str, Any], out: dict[str, Any]) -> threading.Thread:
    """The scenario's attacker: Vegeta at its rate from `from` to `to` s after now, in a
    thread; its answers by status go into `out["codes"]`."""
    def run() -> None:
        time.sleep(float(attack["from"]))
        hits = vegeta.Load(url, rate=float(attack["rate"]), duration_s=float(attack["to"]) - float(attack["from"]),
                           timeout_s=2.0, workers=16, max_workers=512).run().hits
        codes: dict[str, int] = {}
        for h in hits:
            codes[str(h.code)] = codes.get(str(h.code), 0) + 1
        out["codes"] = codes
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="quick", help="set of perf/adaptive/scenarios.yaml (default quick)")
    ap.add_argument("--scenarios", nargs="*", help="only these scenarios of the set")
    ap.add_argument("--arms", nargs="*", help="only these arms of the set")
    ap.add_argument("--out", type=Path, help="results directory (default perf/reports/adaptive/<run-id>)")
    args = ap.parse_args(argv)
    try:
        spec = load_spec()
    except SpecError as e:
        print(f"perf.adaptive: {e}", file=sys.stderr)
        return 2
    chosen = spec["sets"].get(args.set)
    if chosen is None:
        print(f"perf.adaptive: no set {args.set!r} (sets: {', '.join(spec['sets'])})", file=sys.stderr)
        return 2
    scenarios = [s for s in chosen["scenarios"] if not args.scenarios or s in args.scenarios]
    arms = [a for a in chosen["arms"] if not args.arms or a in args.arms]
    try:
        tools.path("vegeta")
    except FileNotFoundError as e:
        print(f"perf.adaptive: {e}", file=sys.stderr)
        return 2
    run_id, out = run_dir("adaptive", args.set, args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    env = environment(run_id, set=args.set, scenarios=scenarios, arms=arms, vegeta=vegeta.VERSION)
    print(f"perf.adaptive: {len(scenarios)} scenario(s) x {len(arms)} arm(s) -> {out}", flush=True)
    for scenario in scenarios:
        for arm in arms:
            t = time.monotonic()
            res = run_one(scenario, spec["scenarios"][scenario], arm, spec["arms"][arm])
            if "learner_log" in res:
                lines = res.pop("learner_log")
                (out / "runs" / f"{scenario}--{arm}.learner.log").write_text("\n".join(lines) + "\n")
            (out / "runs" / f"{scenario}--{arm}.json").write_text(json.dumps(res, indent=1))
            what = res.get("refused") or " | ".join(
                f"{p['at_s']:.0f}s good {p['goodput_share']:.0%} err {metrics.errors(p)}" for p in res["phases"])
            print(f"  {scenario:8} {arm:18} {time.monotonic() - t:5.1f}s  {what}", flush=True)
    env["loadavg_end"] = os.getloadavg()
    (out / "environment.json").write_text(json.dumps(env, indent=1))
    report.render(out)
    print(f"perf.adaptive: report {out / 'summary.md'}, {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
