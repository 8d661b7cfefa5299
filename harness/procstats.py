"""What a process costs: resident memory and CPU time (psutil), the one reader the
tests, the benchmarks and the mesh lab share.

A process that is gone raises `ProcessLookupError` naming its pid: a reading of a
process that died is an error, not a zero. Only `Sampler`, which follows
processes through a run during which some may end (nginx workers), counts an
ended process as 0 from then on, and says so.

RSS is what the kernel reports as resident (the `VmRSS` of /proc/<pid>/status);
CPU time is user + system of all the process's threads, not of its children."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import psutil

T = TypeVar("T")


def _read(pid: int, what: Callable[[psutil.Process], T]) -> T:
    try:
        return what(psutil.Process(pid))
    except psutil.NoSuchProcess:
        raise ProcessLookupError(f"pid {pid}: no such process") from None


def rss_kib(pid: int) -> int:
    """Resident set size of one process, KiB."""
    return _read(pid, lambda p: int(p.memory_info().rss) // 1024)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads)."""
    return _read(pid, lambda p: float(p.cpu_times().user + p.cpu_times().system))


def children(pid: int) -> list[int]:
    """Direct children of a process (e.g. the nginx workers of a master)."""
    return _read(pid, lambda p: [c.pid for c in p.children(recursive=False)])


def _or_zero(read: Callable[[int], float], pid: int) -> float:
    try:
        return read(pid)
    except ProcessLookupError:
        return 0.0


class Sampler:
    """Samples the summed RSS of some processes every `interval` s while a run
    lasts; reports the peak RSS (MB) and the CPU seconds spent in between. A
    process that ends during the run counts as 0 from then on (its CPU time up
    to its end is lost: the kernel keeps no record we can read)."""

    def __init__(self, pids: list[int], interval: float = 0.05) -> None:
        self.pids = pids
        self.interval = interval
        self.peak_kib = 0
        self.cpu_s = 0.0
        self._cpu0 = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        self.peak_kib = max(self.peak_kib, int(sum(_or_zero(rss_kib, p) for p in self.pids)))

    def _cpu(self) -> float:
        return float(sum(_or_zero(cpu_seconds, p) for p in self.pids))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> Sampler:
        self._cpu0 = self._cpu()
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.cpu_s = self._cpu() - self._cpu0

    @property
    def peak_mb(self) -> float:
        return self.peak_kib / 1024


def threads(pid: int) -> list[int]:
    """Thread ids of a process (empty if it is gone)."""
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """CPU nanoseconds (user + system, the scheduler's exact sum: the first
    field of /proc/<pid>/task/<tid>/schedstat) of each live thread, by thread
    name ("name#tid" when names repeat)."""
    out: dict[str, int] = {}
    for tid in threads(pid):
        base = Path(f"/proc/{pid}/task/{tid}")
        try:
            name = (base / "comm").read_text().strip()
            ns = int((base / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        out[f"{name}#{tid}" if name in out else name] = ns
    return out


def set_affinity(pid: int, cpus: set[int]) -> None:
    """Pins every thread of a process to `cpus`."""
    for tid in threads(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(tid, cpus)
