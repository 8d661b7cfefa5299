"""The repository's own files, for the tests that read its text (tests/docs, tests/k8s)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# Not the repository's text: tools, build outputs, caches (pruned, never walked into).
SKIP_DIRS = {".git", ".venv", "target", "build", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache",
             ".pytest_cache"}
# Generated or recorded output: checked by their own tests, not read as prose.
SKIP_PREFIXES = ("perf/reports",)


def files(*suffixes: str, names: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> Iterator[Path]:
    """Files under the repository with one of `suffixes` or `names`, sorted, outside the
    skipped folders (SKIP_DIRS, `bazel-*`, `.venv*`, SKIP_PREFIXES, and `skip` names)."""
    pruned = SKIP_DIRS | set(skip)
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        dirnames[:] = [d for d in dirnames if d not in pruned and not d.startswith(("bazel-", ".venv"))
                       and not os.path.normpath(os.path.join(rel, d)).startswith(SKIP_PREFIXES)]
        for f in filenames:
            if f.endswith(suffixes) or f in names:
                found.append(Path(dirpath) / f)
    yield from sorted(found)


def stat_features() -> dict[str, str]:
    """Each rule stat's feature (`core`, `enforce`, `cluster`, ...), from the filter README's
    generated statistics tables, one per feature under a heading that ends in (`<feature>`): a
    rule defines only the stats of its features."""
    text = (ROOT / "filters/throttle/README.md").read_text()
    block = text[text.index("<!-- stats-reference:start"):text.index("<!-- stats-reference:end -->")]
    out: dict[str, str] = {}
    feature = ""
    for line in block.splitlines():
        if m := re.fullmatch(r"### .*\(`(\w+)`\)", line):
            feature = m.group(1)
        elif (m := re.match(r"\| `(\w+)` \|", line)) and feature:
            out[m.group(1)] = feature
    return out
