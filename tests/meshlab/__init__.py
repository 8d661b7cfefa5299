"""The mesh lab's tests: configs (integration), the lab itself (marker `lab`: root + network namespaces)."""
