"""The reliability suite: faults, floods, reloads, bad input (marker `reliability`, `make reliability`)."""
