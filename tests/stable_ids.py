"""Test ids that are the same in every process (pytest-xdist workers must collect alike)."""

import re

_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def stable_id(value: object) -> str:
    """``repr(value)`` without memory addresses, a set's items sorted (its order follows
    the process's hash seed)."""
    if isinstance(value, set | frozenset):
        return f"{type(value).__name__}({sorted(map(stable_id, value))})"
    return _ADDRESS.sub("", repr(value))
