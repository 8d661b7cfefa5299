"""Checks over the repository's own text (pure, in `make check`): examples parse, names agree, references exist."""
