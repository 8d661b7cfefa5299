"""The one rate and duration grammar of the Python side, the filter's own
(filters/throttle/core/src/units.rs): a rate is `"<n>/s"`, `"<n>/m"`, `"<n>/h"`
or a number per second; a duration is `"<n>ms"`, `"<n>s"`, `"<n>m"` or `"<n>h"`
(here a bare number is also taken as seconds). `<n>` is a plain decimal: no
sign, exponent, `inf` or `nan`. Errors are ValueError with the filter's wording."""

from __future__ import annotations

import re

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_RATE = re.compile(rf"\s*{_NUMBER}\s*/\s*(s|m|h)\s*")
_DURATION = re.compile(rf"\s*{_NUMBER}\s*(ms|s|m|h)\s*")
_RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_UNITS = {"ms": 0.001, **_RATE_UNITS}


def per_second(rate: str | float) -> float:
    """A rate in requests per second: `per_second("18000/m") == 300.0`."""
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        return float(rate)
    m = _RATE.fullmatch(rate) if isinstance(rate, str) else None
    if m is None:
        raise ValueError(f'expected "<n>/s", "<n>/m", "<n>/h" or a number per second, got {rate!r}')
    return float(m.group(1)) / _RATE_UNITS[m.group(2)]


def seconds(duration: str | float) -> float:
    """A duration in seconds: `seconds("250ms") == 0.25`; a number is seconds already."""
    if isinstance(duration, (int, float)) and not isinstance(duration, bool):
        return float(duration)
    m = _DURATION.fullmatch(duration) if isinstance(duration, str) else None
    if m is None:
        raise ValueError(f'expected a duration such as "250ms", "2s", "1m" or "1h", got {duration!r}')
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]
