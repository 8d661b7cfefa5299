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

from harness.procs import ROOT, Envoy, free_port, http_get, render

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


# policy -> (status of the crashing request, status right after, status 2.5 s later)
CASES = {
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
        crash = http_get(envoy.url + "/", timeout=10, headers={"x-crash": "1"})[0]
        after = [http_get(envoy.url + "/", timeout=10)[0] for _ in range(3)]
        time.sleep(2.5)  # FAIL_RELOAD's default backoff is 1 s
        later = [http_get(envoy.url + "/", timeout=10)[0] for _ in range(3)]
        stats = envoy.rule_stats()
        print(f"\n{case}: crash -> {crash}, right after {after}, 2.5 s later {later}; throttle {stats}")
        assert crash == crash_status
        assert after == [after_status] * 3
        assert later == [later_status] * 3
        # The throttle (its own VM, behind the crashed filter) saw exactly the requests that passed.
        passed = 1 + (crash == 200) + after.count(200) + later.count(200)
        assert stats["admitted"] + stats["queued"] == passed
        assert envoy.proc.poll() is None
