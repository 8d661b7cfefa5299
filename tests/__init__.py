"""The tests. Tiers are pytest markers (pyproject.toml); tests/README.md says which make target runs which."""
