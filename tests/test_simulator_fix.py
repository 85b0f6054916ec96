"""The simulator's shared arrays are one array per block and call site, however threads race."""

import threading
import time

import numpy as np
import pytest
from numba import cuda, float32

from pagedkv.kernels._backend import SIMULATOR

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="numba-cuda simulator only")


def _first_calls_racing(monkeypatch, threads=8):
    """Every thread's first call at one site, with allocation slowed so their calls overlap."""
    from numba.cuda.simulator import kernelapi

    real_empty = np.empty

    def slow_empty(*args, **kwargs):
        time.sleep(0.01)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(kernelapi.np, "empty", slow_empty)
    shared = kernelapi.FakeCUDAShared(0)
    start = threading.Barrier(threads)
    got = []

    def first_call():
        start.wait()
        got.append(shared.array((4,), np.float32))

    workers = [threading.Thread(target=first_call) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return shared, got


def test_racing_first_calls_get_one_array(monkeypatch):
    _, got = _first_calls_racing(monkeypatch)
    assert len(got) == 8
    assert all(a is got[0] for a in got), f"{len({id(a) for a in got})} distinct arrays"


def test_call_sites_stay_distinct_and_numba_dtypes_convert():
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared(0)
    a = shared.array((3,), float32)
    b = shared.array((3,), float32)
    assert a is not b and a.dtype == np.float32 and a.shape == (3,)
    again = [shared.array((2, 2), np.int32) for _ in range(2)]  # one site, called twice
    assert again[0] is again[1]


@cuda.jit
def _rotate_through_shared(out):
    t = cuda.threadIdx.x
    a = cuda.shared.array(64, float32)
    a[t] = t
    cuda.syncthreads()
    out[t] = a[(t + 1) % 64]


def test_a_kernel_sees_every_threads_shared_write():
    for _ in range(5):
        out = np.full(64, np.nan, np.float32)
        _rotate_through_shared[1, 64](out)
        np.testing.assert_array_equal(out, (np.arange(64) + 1) % 64)
