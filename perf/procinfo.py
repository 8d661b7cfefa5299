"""What a process costs: resident memory and CPU time, read from /proc."""

from __future__ import annotations

import os
import threading
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_kb(pid: int) -> int:
    """VmRSS of one process in KiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process, all its threads."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # after the command name: state(0) ppid(1) ... utime(11) stime(12)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid: int) -> list[int]:
    """Direct children of a process (e.g. nginx workers of a master)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(d.name))
    return out


class Sampler:
    """Samples the summed RSS of some processes every `interval` s while a run
    lasts; reports the peak RSS (MB) and the CPU seconds spent in between."""

    def __init__(self, pids: list[int], interval: float = 0.05):
        self.pids = pids
        self.interval = interval
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._cpu0 = 0.0
        self.cpu_s = 0.0

    def _sample(self) -> None:
        self.peak_kb = max(self.peak_kb, sum(rss_kb(p) for p in self.pids))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "Sampler":
        self._cpu0 = sum(cpu_s(p) for p in self.pids)
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.cpu_s = sum(cpu_s(p) for p in self.pids) - self._cpu0

    @property
    def peak_mb(self) -> float:
        return self.peak_kb / 1024


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
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            pass
