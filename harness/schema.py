"""The shape of a benchmark's configuration file, checked with JSON Schema: the first
violation is raised naming the file and the field (`where: cpu.listeners[0].runtime:
'wavm' is not one of [...]`). Rules that relate fields stay in the family's code."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml


@cache
def _validator(path: Path) -> jsonschema.protocols.Validator:
    schema = yaml.safe_load(path.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def check(data: Any, schema: Path, where: str, error: type[Exception] = ValueError) -> None:
    """Raises `error` for the most specific violation of `schema` (a YAML or JSON file): the
    deepest in `data`, or the first of those; prefixed by `where` and the field's path."""
    errors = list(_validator(schema).iter_errors(data))
    if errors:
        deepest = max(len(e.absolute_path) for e in errors)
        found = jsonschema.exceptions.best_match(e for e in errors if len(e.absolute_path) == deepest)
        assert found is not None
        at = found.json_path.removeprefix("$").removeprefix(".")  # cpu.listeners[0].wasm
        raise error(f"{where}: {at + ': ' if at else ''}{found.message}")
