"""Sizes of the bounded test runs, from the environment (CI runs smaller versions)."""

from __future__ import annotations

import os


def env_int(name: str, default: int) -> int:
    """The integer in environment variable `name`, or `default`; a clear error if it is not one."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {raw!r}") from None
