"""Array plumbing shared by the launchers: numpy arrays and torch tensors (CPU or CUDA) in,
what a numba kernel accepts out, and the stream a launch goes on.

In the CUDA simulator a torch CPU tensor travels as a numpy view of the same memory (bf16 as an
int16 view); on a real GPU a torch CUDA tensor passes straight in through ``__dlpack__`` and the
launch goes on torch's current stream.

torch is optional and never imported here: a torch tensor can only exist once its caller has
imported torch, so ``_torch()`` looks the module up in ``sys.modules`` (None when torch is not
loaded, and then nothing is a tensor). numpy arrays work without torch installed.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import numpy as np
from numba import config as _numba_config
from numba import cuda

from .errors import KernelDeviceError, KernelTypeError

SIMULATOR: bool = bool(_numba_config.ENABLE_CUDASIM)
if SIMULATOR:
    from . import _simulator_fix

    _simulator_fix.install()

# Element kinds of a KV cache: name -> bytes per element.
KV_KINDS = {"f32": 4, "f16": 2, "bf16": 2}
_WORD_NP = {8: np.int64, 4: np.int32, 2: np.int16}


def _torch() -> Any:
    """The torch module if it has been imported (by whoever made a tensor), else None."""
    return sys.modules.get("torch")


def is_torch(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_cuda_tensor(x: Any) -> bool:
    return is_torch(x) and x.is_cuda


def on_host(x: Any) -> bool:
    """Whether reading ``x`` on the host needs no device-to-host copy (numpy, CPU tensor)."""
    return not is_cuda_tensor(x)


def check_array(name: str, x: Any) -> None:
    if not (isinstance(x, np.ndarray) or is_torch(x)):
        raise KernelTypeError(f"{name} must be a numpy array or a torch tensor, got {type(x)!r}")


def kv_kind(name: str, x: Any) -> str:
    """The element kind of a KV array: 'f32', 'f16' or 'bf16'."""
    torch = _torch()
    if is_torch(x):
        table = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
        kind = table.get(x.dtype)
    else:
        kind = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}.get(x.dtype)
    if kind is None:
        raise KernelTypeError(f"{name} has dtype {x.dtype}; expected float16, bfloat16 or float32")
    return kind


def is_float_array(x: Any) -> bool:
    torch = _torch()
    if is_torch(x):
        return x.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    return x.dtype in (np.float16, np.float32, np.float64)


def is_int_array(x: Any) -> bool:
    torch = _torch()
    if is_torch(x):
        return x.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
    return np.issubdtype(x.dtype, np.integer)


def device_of(x: Any) -> str:
    if is_torch(x):
        return str(x.device)
    return "cpu"


def same_device(names_and_arrays: list[tuple[str, Any]]) -> str:
    """Check every array lives on one device; return it. CUDA tensors need a real GPU."""
    devices = {device_of(a) for _, a in names_and_arrays}
    if len(devices) != 1:
        listing = ", ".join(f"{n}: {device_of(a)}" for n, a in names_and_arrays)
        raise KernelDeviceError(f"arguments live on different devices ({listing})")
    dev = devices.pop()
    if dev != "cpu" and SIMULATOR:
        raise KernelDeviceError("CUDA tensors cannot be used under the CUDA simulator")
    return dev


def host_copy(x: Any) -> np.ndarray:
    """A numpy copy/view of an index array, for validation on the host."""
    if is_torch(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def is_contiguous(x: Any) -> bool:
    if is_torch(x):
        return x.is_contiguous()
    return bool(x.flags.c_contiguous)


def kernel_arg(x: Any) -> Any:
    """What a numba kernel is given for ``x`` (no copy)."""
    torch = _torch()
    if is_torch(x):
        if x.is_cuda:
            return x.detach()
        t = x.detach()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        return t.numpy()
    return x


def word_view(x: Any, word_bytes: int) -> Any:
    """``x`` (contiguous, last dim a multiple of the word) reinterpreted as integer words."""
    torch = _torch()
    if is_torch(x):
        t = x.detach()
        wt = {8: torch.int64, 4: torch.int32, 2: torch.int16}[word_bytes]
        return kernel_arg(t.view(wt))
    return x.view(_WORD_NP[word_bytes])


def index_arg(x: Any, like: Any, dtype: str = "int32") -> Any:
    """An index array (numpy or torch, any device) as a contiguous kernel argument of ``dtype``
    on the device of ``like`` (the caches)."""
    torch = _torch()
    if is_cuda_tensor(like):
        if not is_torch(x):
            # torch wraps no read-only array (a launch's tables are): copy one first
            x = np.asarray(x)
            t = torch.from_numpy(x if x.flags.writeable else x.copy())
        else:
            t = x.detach()
        return t.to(device=like.device, dtype=getattr(torch, dtype)).contiguous()
    out = np.ascontiguousarray(host_copy(x), dtype=dtype)
    # Kernels copy numpy arguments back after they ran: never a read-only launch array.
    return out if out.flags.writeable else out.copy()


def empty(like: Any, shape: tuple[int, ...], dtype: str = "float32") -> Any:
    """An uninitialised array on the device of ``like`` (torch tensor or numpy array)."""
    torch = _torch()
    if is_torch(like):
        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    return np.empty(shape, dtype=dtype)


def stream_for(x: Any) -> Any:
    """The stream to launch on: torch's current stream for CUDA tensors, else the default."""
    torch = _torch()
    if is_cuda_tensor(x) and not SIMULATOR:
        return cuda.external_stream(torch.cuda.current_stream(x.device).cuda_stream)
    return 0


def num_sms(x: Any) -> int:
    """Streaming multiprocessors of the device ``x`` lives on (132 assumed in the simulator)."""
    torch = _torch()
    if is_cuda_tensor(x) and not SIMULATOR:
        return int(torch.cuda.get_device_properties(x.device).multi_processor_count)
    if not SIMULATOR:
        try:
            return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
        except Exception:  # no usable GPU: assume an H100/H200-sized count
            return 132
    return 132


# How torch CUDA tensors reach a kernel: "dlpack" (passed straight in; numba-cuda >= 0.28) or
# "cai" (wrapped with cuda.as_cuda_array(sync=False)). If the first is refused while preparing
# arguments (before anything runs), the launch is retried with the second, which then sticks.
_cuda_arg_mode = os.environ.get("PAGEDKV_CUDA_ARGS", "dlpack")


def launch(kernel: Any, grid: Any, block: int, stream: Any, *args: Any) -> None:
    """``kernel[grid, block, stream](*args)``, with the CUDA-tensor fallback described above."""
    global _cuda_arg_mode
    if _cuda_arg_mode == "dlpack" or not any(is_cuda_tensor(a) for a in args):
        try:
            kernel[grid, block, stream](*args)
            return
        except (TypeError, BufferError) as exc:
            if not any(is_cuda_tensor(a) for a in args):
                raise
            warnings.warn(
                f"passing torch CUDA tensors through __dlpack__ failed ({exc}); "
                "using cuda.as_cuda_array instead",
                RuntimeWarning,
                stacklevel=2,
            )
            _cuda_arg_mode = "cai"
    wrapped = [cuda.as_cuda_array(a, sync=False) if is_cuda_tensor(a) else a for a in args]
    kernel[grid, block, stream](*wrapped)
