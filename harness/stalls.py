"""How late this machine runs things: a thread that asks to wake every few
milliseconds and records how much later than asked it did.

On a shared machine every process (Envoy, Fortio, the upstream in this very
process) is held up alike when the cores are busy; a held-up Envoy releases
its held requests late, and the upstream reads them late, so timing figures
measured at the upstream carry that lateness. `StallMonitor` measures it in
the same run, so an allowance for it can be stated and measured rather than
guessed. The sleep below is the measurement itself, not a synchronisation.
"""

from __future__ import annotations

import bisect
import threading
import time
from types import TracebackType


class StallMonitor:
    """Records (when it woke, how late it woke) every `period_s` until stopped."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.times: list[float] = []
        self.lateness: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-monitor", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = time.monotonic() + self.period_s
            time.sleep(self.period_s)
            woke = time.monotonic()
            self.times.append(woke)
            self.lateness.append(max(0.0, woke - asked))

    def start(self) -> StallMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def __enter__(self) -> StallMonitor:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def worst(self, start: float, end: float) -> float:
        """The longest lateness (s) of a wake-up in `[start, end)`; a wake-up
        that came after `end` but was due inside counts too."""
        lo = bisect.bisect_left(self.times, start)
        hi = bisect.bisect_left(self.times, end)
        if hi < len(self.times):
            hi += 1  # the first wake-up after `end` covers the stretch up to it
        return max(self.lateness[lo:hi], default=0.0)
