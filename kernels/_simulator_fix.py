"""Make numba-cuda's simulator allocate a block's shared arrays atomically.

The simulator runs each CUDA thread as a Python thread, and ``cuda.shared.array`` looks the
block's array up by call site and, on a thread's first call, allocates it if it is missing —
without a lock (numba-cuda 0.30). Two threads that reach the call together can each allocate
their own array: writes to one are never seen by readers of the other, who read uninitialized
memory. In CI this showed as an attention kernel's softmax sum of 0 (``math domain error`` in
``log``). Real GPUs are unaffected; this only serializes the simulator's allocation.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

_LOCK = threading.Lock()


def install() -> None:
    """Replace the simulator's ``FakeCUDAShared.array`` with a locked one (idempotent)."""
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared
    if getattr(shared, "_pagedkv_atomic", False):
        return
    unlocked = shared.array

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory, or the simulator's refusal
            return unlocked(self, shape, dtype, alignment)
        if isinstance(dtype, kernelapi.types.Type):
            dtype = kernelapi.numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)
        site = (frame.f_code.co_filename, frame.f_lineno)  # what the simulator keys on
        with _LOCK:
            found = self._allocations.get(site)
            if found is None:
                found = self._allocations[site] = np.empty(shape, dtype)
        return found

    shared.array = array
    shared._pagedkv_atomic = True
