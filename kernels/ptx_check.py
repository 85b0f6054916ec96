"""Compile every kernel configuration to PTX for a GPU architecture, without a GPU.

    python -m pagedkv.kernels.ptx_check [--cc 9.0] [--head-dim 128]

Needs NVVM and NVRTC libraries (a CUDA toolkit, or the nvidia-cuda-nvrtc wheel on
LD_LIBRARY_PATH) but no driver: it catches code that the CUDA simulator accepts but the real
compiler rejects, and reports, per configuration, whether local memory is used (spilled local
arrays) and which global load widths were emitted. Exit status 1 if anything fails to compile.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import types


def _allow_compiling_without_a_driver(cc: tuple[int, int]) -> None:
    """numba-cuda asks the current device for its compute capability while typing some
    overloads (e.g. ``array.view``); without a driver, answer with ``cc``."""
    import numba.cuda.dispatcher as dispatcher

    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", default="9.0", help="compute capability, e.g. 9.0")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args(argv)
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        print("unset NUMBA_ENABLE_CUDASIM: the simulator cannot compile PTX", file=sys.stderr)
        return 2
    cc = tuple(int(x) for x in args.cc.split("."))
    _allow_compiling_without_a_driver(cc)

    from numba import cuda
    from numba import types as nt

    from . import cache_ops
    from ._attention_kernels import attention_kernel, reduce_partitions
    from ._validate import word_bytes
    from .attention import default_config

    def arr(dtype, ndim):
        return nt.Array(dtype, ndim, "C")

    words = {8: nt.int64, 4: nt.int32, 2: nt.int16}
    f32, i32 = nt.float32, nt.int32
    failures = 0
    d, bs = args.head_dim, args.block_size
    for kind, eb in (("f16", 2), ("bf16", 2), ("f32", 4)):
        wb = word_bytes(d, eb)
        wt = words[wb]
        for group in (1, 2, 4, 8):
            for prefill in (False, True):
                cfg = default_config(d, group, kind, prefill=prefill)
                for split in (False, True):
                    kern = attention_kernel(d, wb, kind, group, bs, cfg, split)
                    sig = (arr(f32, 3), arr(wt, 4), arr(wt, 4), arr(i32, 2), arr(i32, 1),
                           arr(i32, 1), arr(i32, 1), arr(i32, 2), f32, i32, arr(f32, 3),
                           arr(f32, 4), arr(f32, 3))
                    label = (f"{kind} group={group} {'prefill' if prefill else 'decode'}"
                             f"{' split' if split else ''} {cfg}")
                    try:
                        ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=cc)
                    except Exception as exc:  # report every failing configuration
                        failures += 1
                        print(f"FAIL {label}: {type(exc).__name__}: {exc}".splitlines()[0])
                        continue
                    loads = sorted(set(re.findall(r"ld\.global(?:\.nc)?\.(\S+)\s", ptx)))
                    local = "ld.local" in ptx or "st.local" in ptx
                    print(f"ok   {label}: local memory {'YES' if local else 'no'}, "
                          f"global loads {loads}")
    others = [
        (reduce_partitions, (arr(f32, 4), arr(f32, 3), arr(f32, 3))),
        (cache_ops._write_kv_kernel, (arr(nt.int64, 3), arr(nt.int64, 3), arr(nt.int64, 4),
                                      arr(nt.int64, 4), arr(nt.int64, 1), nt.int64)),
        (cache_ops._copy_blocks_kernel, (arr(nt.int64, 2), arr(nt.int64, 2), arr(i32, 2))),
    ]
    for kern, sig in others:
        try:
            cuda.compile_ptx(kern.py_func, sig, cc=cc)
            print(f"ok   {kern.py_func.__name__}")
        except Exception as exc:  # report every failing kernel
            failures += 1
            print(f"FAIL {kern.py_func.__name__}: {type(exc).__name__}: {exc}".splitlines()[0])
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
