"""What the docs name exists: every `make` target, repository path and Rust item written in
code (backticks, fenced blocks) in the Markdown files, in the comments of YAML, shell, make
and Bazel files, and in Python docstrings.

- `make <target>`: a rule of Makefile or mk/*.mk.
- a path whose first part is a top-level entry of the repository (`tests/k8s/...`), or an
  entry of the folder the text lives in (`base/` in k8s/README.md): it exists, relative to
  the repository or to that folder. Build outputs (target/, build/, .venv, bazel-*, results
  folders) and `<placeholder>` parts are not checked past the placeholder.
- a relative Markdown link: its target exists.
- Rust: `a::b::Item` and `fn item` name an item defined in the repository's Rust code
  (paths into std, proxy_wasm, serde... are not checked); a bare `CamelCase` name is a word
  of some source file (Rust, Python, Go, YAML, JSON, shell, Bazel), so a renamed type
  cannot linger in the docs.
Rust source comments are not scanned (the filter's own docs are rustdoc, built with
warnings denied by `make check`)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from harness import tools
from tests.support.repo import ROOT, SKIP_DIRS, files

# Where builds and runs put things: named in the docs, absent from a clean clone.
# perf/reports/<family>/: runs write there; the families that commit no run have no folder in a clean clone.
OUTPUT_PREFIXES = ("target/", "build/", ".venv", "bazel-", "perf/reports/bench", "perf/reports/mesh/")
EXTERNAL_CRATES = {"std", "core", "alloc", "proxy_wasm", "serde", "serde_json", "proptest", "crate", "self", "super"}
CODE_EXT = (".rs", ".py", ".go", ".yaml", ".yml", ".json", ".sh", ".bzl", ".bazel", ".toml", ".mk")


def repo_files(*suffixes: str, names: tuple[str, ...] = ()) -> list[Path]:
    return list(files(*suffixes, names=names))


# ---------------------------------------------------------------- the texts and their code

def markdown_code(text: str) -> list[str]:
    """Fenced blocks and backtick spans of a Markdown text."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    return blocks + re.findall(r"`([^`\n]+)`", prose)


def comments(text: str) -> str:
    """The comments of a YAML, shell, make or Bazel file."""
    return "\n".join(m.group(1) for m in re.finditer(r"(?:^|\s)#+ ?(.*)$", text, re.M))


def docstrings(text: str) -> str:
    """A Python file's docstrings."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            out.append(ast.get_docstring(node) or "")
    return "\n".join(out)


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def texts() -> list[tuple[Path, list[str], str]]:
    """(file, its code spans and blocks, its whole prose): paths are looked for in the prose,
    make targets and Rust items in the code only ("make sure" is English)."""
    out = [(p, markdown_code(t), t) for p in repo_files(".md") for t in [p.read_text()]]
    out += [(p, spans(c), c) for p in repo_files(".yaml", ".yml", ".sh", ".mk", ".bzl", ".bazel", ".toml",
                                                 names=("Makefile", "run", "bazel"))
            for c in [comments(p.read_text())]]
    out += [(p, spans(d), d) for p in repo_files(".py") if p != Path(__file__).resolve()
            for d in [docstrings(p.read_text())]]
    return [(p, code, prose) for p, code, prose in out if prose.strip()]


TEXTS = texts()


# ---------------------------------------------------------------- what exists

@cache
def make_targets() -> set[str]:
    text = "\n".join(p.read_text() for p in [ROOT / "Makefile", *sorted((ROOT / "mk").glob("*.mk"))])
    targets = set(re.findall(r"^([a-z0-9][a-z0-9-]*):", text, re.M))
    # The pattern rule `tool-%`: one target per row of tools/tools.tsv, and `tool-<row>` itself.
    if re.search(r"^tool-%:", text, re.M):
        targets |= {"tool-"} | {f"tool-{name}" for name in tools.rows()}
    return targets


@cache
def rust_items() -> set[str]:
    text = "\n".join(p.read_text() for p in repo_files(".rs"))
    kinds = r"(?:struct|enum|trait|fn|const|static|type|mod|macro_rules!)"
    items = set(re.findall(rf"\b{kinds}\s+([A-Za-z_][A-Za-z0-9_]*)", text))
    items |= set(re.findall(r"^\s*([A-Z][A-Za-z0-9_]*)\s*[,({=]", text, re.M))  # enum variants
    return items


@cache
def code_words() -> set[str]:
    words: set[str] = set()
    for p in repo_files(*CODE_EXT, names=("Makefile",)):
        if p == Path(__file__).resolve():  # its examples name what does not exist
            continue
        words |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", p.read_text(errors="replace")))
    return words


def top_level() -> set[str]:
    return {p.name for p in ROOT.iterdir()} - SKIP_DIRS


# ---------------------------------------------------------------- what the texts name

def make_refs(code: list[str]) -> set[str]:
    out = set()
    for c in code:
        out |= set(re.findall(r"(?:^|[\s;&|(])make[ \t]+([a-z][a-z0-9-]*)", c, re.M))
    return out


PATH_RE = re.compile(r"(?<![\w./:<>@$*-])\.?[A-Za-z0-9_][\w.-]*/[\w./<>*-]*")


def path_refs(prose: str, here: Path) -> set[str]:
    """Path-like words whose first part is a top-level entry or an entry of `here`."""
    firsts = top_level() | {p.name for p in here.iterdir()}
    out = set()
    for m in PATH_RE.finditer(prose):
        word = m.group(0).rstrip(".,:;)")
        if word.split("/")[0] in firsts and "//" not in word:
            out.add(word)
    return out


def path_exists(word: str, here: Path) -> bool:
    word = word.split("<")[0].split("#")[0]  # up to a placeholder or an anchor
    if word.startswith(OUTPUT_PREFIXES) or word.rstrip("/") == "":
        return True
    if re.match(r"perf/reports/[^/]+/latest(/|$)", word):
        return True  # the link each run writes (harness/results.py), not in git
    if "*" in word:
        return any(ROOT.glob(word)) or any(here.glob(word))
    return (ROOT / word).exists() or (here / word).exists()


def rust_refs(code: list[str]) -> set[str]:
    """`a::b::Item` (last part) and `fn item` names; bare CamelCase names are checked apart."""
    out = set()
    for c in code:
        if "\n" in c:  # a code block: shell, YAML, JSON; not Rust
            continue
        for m in re.finditer(r"\b([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)+)", c):
            parts = m.group(1).split("::")
            if parts[0] not in EXTERNAL_CRATES:
                out.add(parts[-1])
        out |= set(re.findall(r"^fn ([a-z_][a-z0-9_]*)", c))
    return out


def camel_refs(code: list[str]) -> set[str]:
    return {c for c in code if re.fullmatch(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+", c)}


# ---------------------------------------------------------------- the tests

def test_the_texts_are_found():
    found = {str(p.relative_to(ROOT)) for p, _, _ in TEXTS}
    assert {"README.md", "istio/README.md", "filters/throttle/README.md"} <= found
    assert any(f.endswith(".yaml") for f in found) and any(f.endswith(".py") for f in found)


def broken_links(path: Path) -> list[str]:
    """Relative Markdown link targets that do not exist (from the file's folder)."""
    if path.suffix != ".md":
        return []
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+:|#", target):
            continue
        if not (path.parent / target.split("#")[0]).exists():
            out.append(f"link {target}")
    return out


@pytest.mark.parametrize("path, code, prose", TEXTS, ids=[str(p.relative_to(ROOT)) for p, _, _ in TEXTS])
def test_named_things_exist(path, code, prose):
    here = path.parent
    missing = [f"make {t}" for t in sorted(make_refs(code) - make_targets())]
    missing += [p for p in sorted(path_refs(prose, here)) if not path_exists(p, here)]
    missing += [f"Rust item {r}" for r in sorted(rust_refs(code) - rust_items())]
    missing += [f"`{w}` (no source file has this word)" for w in sorted(camel_refs(code) - code_words())]
    missing += broken_links(path)
    assert not missing, f"{path.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_checks_can_fail():
    """Each kind of reference is caught when it points at nothing."""
    text = ("Run `make k8s-image`, see tests/k8s/test_dashboards.py and `base/` and "
            "`schedule::TatStore` and `TatStore`.\n")
    code = markdown_code(text)
    assert make_refs(code) - make_targets() == {"k8s-image"}
    assert {p for p in path_refs(text, ROOT / "k8s") if not path_exists(p, ROOT / "k8s")} \
        == {"tests/k8s/test_dashboards.py"}
    assert rust_refs(code) - rust_items() == {"TatStore"}
    assert camel_refs(code) - code_words() == {"TatStore"}
