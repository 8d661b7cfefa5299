"""Failure policy: what Envoy does when a Wasm VM fails, per `failure_policy`.

The throttle has no known way to crash (the one found by this suite, a
non-UTF-8 :path over HTTP/2, is fixed), so a test-only filter (crasher/,
traps on a request header `x-crash`) is put in front of it, with the policy
under test, and crashed. Envoy's policy is per plugin and the same for any
VM. The throttle's own failure policy for a shared schedule that cannot be
updated (contention: fail closed with 429) is covered by the core tests
(unit and property tests); under the floods of this suite `contention` stays 0."""

from __future__ import annotations

import copy
import subprocess
import time

import pytest

from harness.configs import render
from harness.envoy import Envoy
from harness.net import free_port, http_get, wait_until
from harness.procs import ROOT

pytestmark = pytest.mark.reliability

CRASHER_DIR = ROOT / "tests" / "reliability" / "crasher"
CRASHER = ROOT / "target" / "crasher" / "wasm32-wasip1" / "release" / "crasher.wasm"


@pytest.fixture(scope="session")
def crasher() -> str:
    subprocess.run(["cargo", "build", "--release", "--target", "wasm32-wasip1", "--manifest-path",
                    str(CRASHER_DIR / "Cargo.toml"), "--target-dir", str(ROOT / "target" / "crasher")],
                   check=True, cwd=ROOT)
    return str(CRASHER)


def with_crasher(cfg: dict, crasher: str, policy: dict) -> dict:
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    f = copy.deepcopy(hcm["http_filters"][0])
    f["name"] = "crasher"
    w = f["typed_config"]["config"]
    w.update({"name": "crasher", "root_id": ""})
    w.pop("configuration")
    w.pop("failure_policy")
    w["vm_config"]["vm_id"] = "crasher"
    w["vm_config"]["code"]["local"]["filename"] = crasher
    w.update(policy)
    hcm["http_filters"].insert(0, f)
    return cfg


# Envoy's default backoff before FAIL_RELOAD reloads a failed VM (`reload_config`).
RELOAD_BACKOFF_S = 1.0
# How long the policies that do not reload are watched after the crash: well past
# the backoff, so a policy that reloaded would have been seen serving again.
WATCH_S = 2.5

# policy -> (status of the crashing request, status right after, status once the
# reload backoff has passed (FAIL_RELOAD: waited for; the others: for WATCH_S))
CASES: dict[str, tuple[dict, int, int, int]] = {
    "FAIL_CLOSED": ({"failure_policy": "FAIL_CLOSED"}, 503, 503, 503),
    "default (unset)": ({}, 503, 503, 503),
    "FAIL_OPEN": ({"failure_policy": "FAIL_OPEN"}, 503, 200, 200),
    "FAIL_RELOAD": ({"failure_policy": "FAIL_RELOAD"}, 503, 503, 200),
    "fail_open: true (deprecated)": ({"fail_open": True}, 200, 200, 200),
}


@pytest.mark.parametrize("case", CASES)
def test_vm_failure_policy(case, crasher, wasm, upstream):
    policy, crash_status, after_status, later_status = CASES[case]
    cfg = render("demo.yaml", listen_port=free_port(), admin_port=free_port(), upstream_port=upstream.port,
                 plugin={"rules": [{"name": "default", "rate": "100/s"}]}, wasm=wasm)
    envoy = Envoy(with_crasher(cfg, crasher, policy), concurrency=1)  # one worker: one VM to crash
    with envoy:
        assert http_get(envoy.url + "/", timeout=10)[0] == 200
        crashed_at = time.monotonic()
        crash = http_get(envoy.url + "/", timeout=10, headers={"x-crash": "1"})[0]
        after = [http_get(envoy.url + "/", timeout=10)[0] for _ in range(3)]
        # Every request sent until the policy has shown what it does later: FAIL_RELOAD until
        # the first one served (the VM reloaded), the others for WATCH_S after the crash.
        watched: list[int] = []

        def reloaded_or_watched() -> bool:
            watched.append(http_get(envoy.url + "/", timeout=10)[0])
            if later_status == 200 and after_status != 200:
                return watched[-1] == 200
            return time.monotonic() - crashed_at >= WATCH_S

        wait_until(reloaded_or_watched, 10, f"{case}: the VM reloaded" if later_status == 200 else
                   f"{case}: {WATCH_S} s watched", interval=0.05)
        recovered_s = time.monotonic() - crashed_at
        later = [http_get(envoy.url + "/", timeout=10)[0] for _ in range(3)]
        stats = envoy.rule_stats()
        print(f"\n{case}: crash -> {crash}, right after {after}, then {len(watched)} requests "
              f"({sorted(set(watched))}) over {recovered_s:.2f} s, then {later}; throttle {stats}")
        assert crash == crash_status
        assert after == [after_status] * 3
        assert later == [later_status] * 3
        if later_status == 200 and after_status != 200:  # FAIL_RELOAD
            assert watched[:-1] == [after_status] * (len(watched) - 1) and watched[-1] == 200, watched
            assert recovered_s >= 0.9 * RELOAD_BACKOFF_S, \
                f"served again after {recovered_s:.2f} s, before Envoy's {RELOAD_BACKOFF_S} s reload backoff"
        else:
            assert watched == [later_status] * len(watched), watched
        # The throttle (its own VM, behind the crashed filter) saw exactly the requests that passed.
        passed = 1 + (crash == 200) + after.count(200) + watched.count(200) + later.count(200)
        assert stats["admitted"] + stats["queued"] == passed
        assert envoy.proc is not None and envoy.proc.poll() is None
