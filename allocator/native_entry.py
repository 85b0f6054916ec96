"""Native loops called through their compiled entry points, past numba's type dispatch.

A numba dispatcher types every argument of every call to choose a compiled version; for a
loop of nine arguments that costs about as much as the loop itself on one block. A hot path
whose arguments always have the same types (arrays it made itself) can call the compiled
version directly: ``entry(loop, *types)``. The compiled code trusts its arguments -- an
array's dtype, dimensions and layout are not checked -- so each argument must have exactly
its declared type; a block list from a caller is declared ``ANY_VEC`` (any strides)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import types

I64 = types.int64
VEC = types.Array(types.int64, 1, "C")  # a contiguous int64 vector (np.empty(n, np.int64))
ANY_VEC = types.Array(types.int64, 1, "A")  # any int64 vector: a view, reversed, strided
MAT = types.Array(types.int64, 2, "C")  # a contiguous int64 matrix
I32_MAT = types.Array(types.int32, 2, "C")  # TableRows' blocks and generations
POOL = (MAT, VEC, MAT, VEC, VEC)  # NativePool's B, M, H, K, X
STEP = (*POOL, MAT, MAT)  # NativeAllocator's arrays: the pool's, R and T


def entry(loop: Any, *arg_types: Any) -> Callable[..., Any]:
    """``loop`` (a numba dispatcher) compiled for exactly ``arg_types``, or loaded from
    numba's cache: the bare compiled function."""
    compiled = loop.compile(tuple(arg_types))
    if not callable(compiled):  # pragma: no cover - numba's compile returns the entry point
        raise TypeError(f"numba returned no entry point for {loop.__name__}")
    return compiled


# The pool loops' argument types: the pool's own arrays, caller block lists as ``ANY_VEC``.
POOL_SIGNATURES: dict[str, tuple[Any, ...]] = {
    "take_many": (*POOL, I64, I64, VEC, MAT),
    "release_many": (*POOL, I64, ANY_VEC, I64, MAT),
    "share_many": (*POOL, I64, ANY_VEC, I64),
    "end_write_many": (*POOL, ANY_VEC, I64),
    "first_failing": (*POOL, ANY_VEC, I64),
    "registered_prefix": (VEC, VEC, I64, VEC),
    "cache_many": (*POOL, I64, ANY_VEC, VEC, I64),
    "share_prefix": (*POOL, I64, VEC, I64, VEC),
    "admit": (*POOL, I64, VEC, I64, I64, VEC, MAT),
    "finish": (*POOL, I64, ANY_VEC, I64, MAT),
    # each_<name>(B, M, H, K, X, blocks, n, <the other parameters>): only the block varies
    "each_publish": (*POOL, ANY_VEC, I64, I64),
    "each_begin_write": (*POOL, ANY_VEC, I64, I64, I64),
}


class _Entries(dict):  # type: ignore[type-arg]
    """Entry points by transition name, each made on first use."""

    def __init__(self, make: Callable[[str], Callable[..., Any]]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, name: str) -> Callable[..., Any]:
        fn = self[name] = self._make(name)
        return fn


class PoolLoops:
    """The generated module's pool loops a ``NativePool`` calls on its hot paths, as entry
    points for the argument types it passes them (``POOL_SIGNATURES``; ``run[name]``:
    ``run_<name>`` over a parameter matrix, ``one[name]``: ``one_<name>`` on one scalar).
    Each is made on first use: numba loads it from its cache then (tens of milliseconds), so
    a process pays only for the calls it makes. One per module (``pool_loops``)."""

    def __init__(self, mod: Any) -> None:
        self._mod = mod
        self.run = _Entries(lambda name: entry(getattr(mod, f"run_{name}"), *POOL, MAT, I64))
        self.one = _Entries(lambda name: entry(getattr(mod, f"one_{name}"), *POOL, I64))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """(Called for a loop not made yet: made, then kept as an attribute.)"""
        try:
            arg_types = POOL_SIGNATURES[name]
        except KeyError:
            raise AttributeError(name) from None
        fn = entry(getattr(self._mod, name), *arg_types)
        setattr(self, name, fn)
        return fn


def pool_loops(mod: Any) -> PoolLoops:
    """``PoolLoops`` of the generated module ``mod`` (built once per module, kept on it)."""
    loops = getattr(mod, "_pool_loops", None)
    if loops is None:
        loops = mod._pool_loops = PoolLoops(mod)
    return loops


class StepLoops:
    """The step loops a ``NativeAllocator`` calls each step, as entry points: its own
    arrays, its scratch outputs, and row / count vectors as ``ANY_VEC``."""

    def __init__(self, mod: Any) -> None:
        self.grow_running = entry(mod.grow_running, *STEP, ANY_VEC, VEC, ANY_VEC, I64, MAT,
                                  VEC, VEC, I32_MAT, I32_MAT, VEC, VEC)
        self.launch_plan = entry(mod.launch_plan, *STEP, ANY_VEC, I64)
        self.launch_rows = entry(mod.launch_rows, *STEP, ANY_VEC, I64, VEC, VEC, VEC, VEC)
        self.complete_and_commit = entry(mod.complete_and_commit, *STEP, VEC, I64, I64,
                                         ANY_VEC, I64, VEC, MAT)
        self.launch_complete_commit = entry(mod.launch_complete_commit, *STEP, ANY_VEC, I64,
                                            VEC, VEC, VEC, VEC, VEC, MAT)
        self.count_known = entry(mod.count_known, VEC, MAT, ANY_VEC, I64, VEC)
        self.put_grown = entry(mod.put_grown, MAT, MAT, MAT, ANY_VEC, VEC, I64, I32_MAT,
                               I32_MAT, VEC, VEC)
        self.cache_filled = entry(mod.cache_filled, *STEP, ANY_VEC, MAT, I64, VEC, VEC, VEC)
        self.current_prefix = entry(mod.current_prefix, VEC, VEC, VEC, VEC, VEC, I64)


def step_loops(mod: Any) -> StepLoops:
    """``StepLoops`` of the generated module ``mod`` (built once per module, kept on it)."""
    loops = getattr(mod, "_step_loops", None)
    if loops is None:
        loops = mod._step_loops = StepLoops(mod)
    return loops
