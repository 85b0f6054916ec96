"""Byte sizes with suffixes: ``250KB`` = 250e3, ``2GiB`` = 2 * 2**30; decimal output."""

from __future__ import annotations

import math
import re

from .errors import BadSize

_DECIMAL = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9,
            "GB": 10**9, "T": 10**12, "TB": 10**12}
_BINARY = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, what: str = "size") -> float:
    """A non-negative number of bytes: a plain number, or one with a unit.

    Units (case-insensitive): B; K/KB, M/MB, G/GB, T/TB (powers of 1000);
    KiB, MiB, GiB, TiB (powers of 1024).
    """
    m = _SIZE.match(str(text))
    if m is None:
        raise BadSize(f"{what}: cannot read {text!r} as a size (e.g. 250KB, 1.5GB, 4096)")
    number, unit = float(m.group(1)), m.group(2).upper()
    scale = _DECIMAL.get(unit, _BINARY.get(unit))
    if scale is None:
        raise BadSize(f"{what}: unknown unit {m.group(2)!r} in {text!r} "
                      "(use B, KB, MB, GB, TB or KiB, MiB, GiB, TiB)")
    value = number * scale
    if not math.isfinite(value):
        raise BadSize(f"{what}: {text!r} is not a finite size")
    return value


def fmt_bytes(n: float) -> str:
    """Decimal units, up to four significant digits: 6.25 GB, 2.048 GB, 150 MB, 4 B."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.4g} B"


def fmt_num(x: float) -> str:
    """An exact-looking decimal: integers without a point, others to ten significant digits."""
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:.10g}"
