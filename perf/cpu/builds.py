"""The throttle's .wasm at another git ref (e.g. main), for before/after
listeners in one Envoy: a detached checkout under /tmp, built with the
release profile into target/perf-ref/<sha>/throttle.wasm (kept: a second run
at the same commit builds nothing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from harness.procs import ROOT

REF_BUILDS = ROOT / "target" / "perf-ref"


def resolve(ref: str, repo: Path = ROOT) -> str:
    """The full commit id of `ref` in this repository."""
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise ValueError(f"git ref {ref!r}: {r.stderr.strip() or 'not found'}")
    return r.stdout.strip()


def wasm_at(ref: str, repo: Path = ROOT, log: Callable[[str], object] = print) -> Path:
    """The .wasm built at `ref` (built now if not yet)."""
    sha = resolve(ref, repo)
    out = REF_BUILDS / sha / "throttle.wasm"
    if out.exists():
        log(f"build {ref} ({sha[:10]}): {out} (present)")
        return out
    checkout = Path(tempfile.mkdtemp(prefix=f"throttle-{sha[:10]}-"))
    checkout.rmdir()  # git worktree add wants to create it
    log(f"build {ref} ({sha[:10]}): checking out under {checkout}, cargo build --release (a few minutes)")
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(checkout), sha], check=True,
                   capture_output=True, text=True)
    try:
        env = dict(os.environ, CARGO_TARGET_DIR=str(REF_BUILDS / "cargo"))
        r = subprocess.run(["nice", "-n", "10", "cargo", "build", "--release", "--target", "wasm32-wasip1",
                            "-p", "throttle-wasm"], cwd=checkout, env=env, capture_output=True, text=True,
                           timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"cargo build at {ref} ({sha[:10]}) failed:\n{r.stderr[-3000:]}")
        built = REF_BUILDS / "cargo" / "wasm32-wasip1" / "release" / "throttle.wasm"
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, out)
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(checkout)],
                       capture_output=True, text=True)
    log(f"build {ref} ({sha[:10]}): {out} ({out.stat().st_size} bytes)")
    return out
