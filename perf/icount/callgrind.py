"""Reading callgrind's output: one dump (`callgrind.out.<n>`) as totals, the
instructions of each part of Envoy's address space, and the calls between
the Wasm code V8 compiled (JIT) and the rest.

The Envoy binary is stripped, so callgrind names functions by address; what
tells the parts apart is the ELF object callgrind gives each function
(`ob=`) and, for functions it finds in no object (`ob=???`), where their
address lies:

- `envoy`: functions of the Envoy ELF (Envoy, V8's runtime and builtins);
- `tcmalloc`: Envoy's `google_malloc` and `malloc_hook` sections, which
  valgrind does not count as the ELF's text (so `ob=???`) at their vaddr plus
  the load base of the binary (`/proc/<pid>/maps`; fixed under valgrind);
- `libc`: the system's shared libraries (libc, libm, the loader);
- `jit`: every other `ob=???` function: code in anonymous executable memory,
  i.e. the Wasm modules V8 compiled and its wrappers (a plain Envoy has none);
- `other`: anything else (valgrind's preload).

A call from a `jit` function to a function of another part is a call out of
the compiled Wasm: a host call (the proxy-wasm ABI, WASI) or a V8 builtin.
Its inclusive cost is what the call cost, everything it did included."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

PARTS = ("envoy", "tcmalloc", "libc", "jit", "other")
#: Envoy's tcmalloc sections (readelf -S): outside what valgrind takes as the ELF's text.
TCMALLOC_SECTIONS = ("google_malloc", "malloc_hook")
SYSTEM_LIBS = re.compile(r"/(libc|libm|libpthread|librt|libdl|ld-linux[^/]*)[.-][^/]*$")


class FormatError(ValueError):
    pass


@dataclass(frozen=True)
class Layout:
    """Where the parts of the process lie: the tcmalloc ranges (absolute addresses)."""
    tcmalloc: tuple[tuple[int, int], ...] = ()

    def part(self, obj: str, fn: str) -> str:
        if obj == "???":
            try:
                addr = int(fn, 16)
            except ValueError:
                return "other"
            if any(lo <= addr < hi for lo, hi in self.tcmalloc):
                return "tcmalloc"
            return "jit"
        if SYSTEM_LIBS.search(obj):
            return "libc"
        if obj.rsplit("/", 1)[-1] == "envoy":
            return "envoy"
        return "other"


@dataclass
class Calls:
    """Calls along one kind of edge: how many, and their inclusive cost."""
    count: int = 0
    inclusive: int = 0

    def add(self, count: int, inclusive: int) -> None:
        self.count += count
        self.inclusive += inclusive


@dataclass
class Dump:
    """One callgrind dump, reduced to what the report needs."""
    summary: int                       # Ir of the dump (callgrind's `summary:`)
    totals: int                        # the sum of every cost line (`totals:`)
    trigger: str
    self_ir: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    #: calls out of JIT code, by callee (part, function): count and inclusive Ir
    out_of_jit: dict[tuple[str, str], Calls] = field(default_factory=dict)
    #: calls into JIT code from another part (the host entering the Wasm code)
    into_jit: Calls = field(default_factory=Calls)

    @property
    def calls_out(self) -> Calls:
        c = Calls()
        for v in self.out_of_jit.values():
            c.add(v.count, v.inclusive)
        return c


_NAME = re.compile(r"^\((\d+)\)(?: (.*))?$")


class _Names:
    """callgrind's name compression: `(id) name` defines, `(id)` refers."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        m = _NAME.match(text)
        if not m:
            return text
        key, name = m.groups()
        if name is not None:
            self.ids[key] = name
            return name
        if key not in self.ids:
            raise FormatError(f"name id ({key}) used before it was defined")
        return self.ids[key]


def _cost(line: str) -> int:
    """The Ir of a cost line `<position> <Ir>` (positions: line; Ir the only event)."""
    parts = line.split()
    if len(parts) < 2:
        return 0
    return int(parts[1])


def parse(lines: Iterable[str], layout: Layout) -> Dump:
    """One dump's text (with `--compress-pos` either way; one event, Ir)."""
    objs, files, fns = _Names(), _Names(), _Names()
    header: dict[str, str] = {}
    self_ir = dict.fromkeys(PARTS, 0)
    out: dict[tuple[str, str], Calls] = {}
    into = Calls()
    ob = fn = "???"
    part = "other"
    cob: str | None = None
    cfn: str | None = None
    pending_calls: int | None = None
    for raw in lines:
        line = raw.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        if pending_calls is not None:  # the cost line of a call: its inclusive cost
            callee_ob = cob if cob is not None else ob
            callee = layout.part(callee_ob, cfn or "???")
            inc = _cost(line)
            if part == "jit" and callee != "jit":
                out.setdefault((callee, cfn or "???"), Calls()).add(pending_calls, inc)
            elif part != "jit" and callee == "jit":
                into.add(pending_calls, inc)
            pending_calls, cob, cfn = None, None, None
            continue
        c = line[0]
        if c.isdigit() or c in "+-*":
            self_ir[part] += _cost(line)
            continue
        key, sep, value = line.partition("=")
        if sep:
            if key == "ob":
                ob = objs(value)
                part = layout.part(ob, fn)
            elif key == "fn":
                fn = fns(value)
                part = layout.part(ob, fn)
            elif key in ("fl", "fi", "fe", "cfi", "cfl"):
                files(value)
            elif key == "cob":
                cob = objs(value)
            elif key == "cfn":
                cfn = fns(value)
            elif key == "calls":
                pending_calls = int(value.split()[0])
            # jump=, jcnd= (only with --collect-jumps): ignored
            continue
        key, sep, value = line.partition(":")
        if sep:
            key, value = key.strip(), value.strip()
            if key == "desc" and value.startswith("Trigger:"):
                key, value = "trigger", value.removeprefix("Trigger:").strip()
            header[key] = value
    try:
        summary = int(header["summary"])
    except (KeyError, ValueError):
        raise FormatError("no summary: line (not a callgrind dump?)") from None
    totals = int(header.get("totals", summary))
    return Dump(summary=summary, totals=totals, trigger=header.get("trigger", ""), self_ir=self_ir,
                out_of_jit=out, into_jit=into)


def read(path: Path, layout: Layout) -> Dump:
    with open(path, errors="replace") as f:
        try:
            return parse(f, layout)
        except FormatError as e:
            raise FormatError(f"{path}: {e}") from None


# -- where the parts lie ----------------------------------------------------------

def elf_sections(data: bytes) -> Iterator[tuple[str, int, int, int]]:
    """(name, vaddr, file offset, size) of every section of a 64-bit little-endian ELF."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise FormatError("not a 64-bit little-endian ELF")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    for h in headers:
        name = names[h[0]:names.index(b"\0", h[0])].decode()
        yield name, h[3], h[4], h[5]


def load_base(maps: str, binary: Path) -> int:
    """The address the binary's first mapping (file offset 0) starts at, from `/proc/<pid>/maps`."""
    target = str(binary)
    for line in maps.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5] == target and int(parts[2], 16) == 0:
            return int(parts[0].split("-")[0], 16)
    raise FormatError(f"{binary} is not mapped at offset 0 in the process's maps")


def layout_of(binary: Path, base: int) -> Layout:
    """The tcmalloc ranges of `binary` loaded at `base`."""
    with open(binary, "rb") as f:
        data = f.read()
    ranges = tuple((base + vaddr, base + vaddr + size) for name, vaddr, _, size in elf_sections(data)
                   if name in TCMALLOC_SECTIONS and size)
    return Layout(tcmalloc=ranges)


def build_id(binary: Path) -> str:
    """The GNU build id of an ELF (hex), or "?"."""
    with open(binary, "rb") as f:
        data = f.read()
    for name, _, offset, size in elf_sections(data):
        if name == ".note.gnu.build-id" and size > 16:
            namesz, descsz = struct.unpack_from("<II", data, offset)
            start = offset + 12 + (namesz + 3) // 4 * 4
            return data[start:start + descsz].hex()
    return "?"
