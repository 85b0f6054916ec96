"""``pagedkv simulate``: replay a serving workload through the engine front door.

A continuous-batching scheduler of its own drives ``pagedkv.engine.KVCacheManager`` (the
checked allocator, ``checked=True``) step by step:

- FCFS: running requests first, in admission order, then waiting ones (a preempted request
  goes back to the head of the queue); a token budget per step (``token_budget``) and at most
  ``max_running`` running requests; chunked prefill (a prompt takes what the budget leaves);
- a running request whose ``allocate_slots`` fails preempts the most recently admitted running
  request (``KVCacheManager.preempt``: preemption by recompute; its prefix may still hit the
  cache when it is re-admitted), and retries; no admission in a step that preempted. With
  ``preempt="swap"`` (``--preempt swap``) the victim's KV is copied to a host tier instead
  (``SwapTier``) and copied back when it is readmitted, so nothing is recomputed;
- admission: ``get_computed_blocks`` then ``allocate_slots`` with the hit blocks, then
  ``record_prefix_cache_stats``; a request that does not fit waits (head of line);
- one launch per step: ``publish`` every scheduled request, (with ``--kv``) write the KV and
  run the attention, then ``complete`` it; each request whose computed tokens reached its
  length samples one token (``append_token``; the workload fixes which); a request that has
  sampled all its output tokens is freed (``free``), and the next turn of its conversation
  (if any) arrives ``think`` steps later.

Only the front-door calls are timed (``perf_counter``): the allocator figures are requests
and tokens per second of allocator time. A request longer than the pool (its blocks exceed
the usable blocks) is rejected before the run, with its later turns.

KV check (``kv=True``): a ``KVCachePool`` (default model shape: 2 layers, 2 KV heads, 4
query heads, head dim 16, fp32) is attached to the allocator. The KV of a token is a
pseudo-random function of (cache salt, the token ids up to and including it, its position,
the layer), so the expected KV of every position is known without reading the pool (and a
hit across salts is wrong KV). Every step copies the launch's copy-on-write blocks, writes
K/V for the scheduled positions through ``launch.slot_mapping``, and runs attention for each
request through ``launch.block_tables``: the numba kernels on a GPU (checked launch mode,
with the allocator's block generations), else the torch references of
``pagedkv.kernels.reference`` on CPU. Every output is compared with dense attention over the
regenerated K/V (float64), by relative error ``max|out - ref| / max|ref|`` (NaN: inf; the
pool starts NaN-poisoned). ``kernel_hook`` sees (and may corrupt) what is handed to the
kernels, so tests can plant a KV bug and watch the check catch it.

The report (``simulate(...).report``; ``--json`` writes it with ``series`` added):
``command``; ``workload`` (source, requests, follow-ups, salts, prompt / output length
statistics, longest request); ``config`` (pool, scheduler, model shape, bytes per token and
per block, reserved bytes); ``finished``, ``rejected``, ``rejected_ids``; ``steps`` (launches)
and ``simulated_steps`` (time, idle steps included); ``wall_seconds``; ``allocator`` (seconds
in front-door calls, requests/s and tokens/s of that time, us per step, per-call counts and
seconds); ``tokens`` (scheduled = prefill + decode + recomputed, prefix-hit tokens);
``concurrency`` (peak / mean running, peak waiting); ``occupancy`` (blocks held by requests,
peak and mean, as a fraction of the usable blocks and in bytes against the reserved bytes;
table positions); ``tail_waste`` (slots reserved past each table's last position);
``prefix_cache`` (hit rate of the admission lookups, first admissions and re-admissions after
preemption apart; evictable cached blocks); ``preemptions`` (by recompute, tokens recomputed;
``swap``: None, or swapped out / in, tokens swapped back in, preemptions that fell back to
recompute, host blocks); ``admission_headroom`` (``num_blocks - held``:
min, mean, final); ``paged_vs_contiguous`` (contiguous = reserved bytes / (max length x bytes
per token) requests, against the peak concurrency paged reached and what limited it);
``kv_check`` (None without ``--kv``: backend, outputs checked, max relative error, tolerance,
passed, the first failures). ``series``: per launch, ``SERIES_KEYS``, from the allocator's
``stats()`` right after ``publish`` (the null block taken out).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import CliError
from .units import fmt_bytes
from .workloads import Workload, WorkloadRequest

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
KV_DTYPES = ("fp32", "fp16", "bf16")
KV_BACKENDS = ("auto", "reference", "kernels")
MAX_FAILURES_KEPT = 20
PREEMPT_MODES = ("recompute", "swap")
SWAP_NOTE = ("off: every preemption is by recompute (--preempt swap copies a preempted "
             "request's KV to a host tier and back)")

#: Test seam: when set, ``simulate`` uses it as the ``kernel_hook`` (see ``KernelInputs``).
KERNEL_HOOK: Callable[[KernelInputs], None] | None = None


class SimulationError(CliError):
    """The simulation cannot go on (a request that can never be admitted, too many steps)."""

    exit_code = 1


@dataclass(frozen=True)
class ModelShape:
    """The model shape the KV pool (``--kv``) and the byte figures use."""

    layers: int = 2
    kv_heads: int = 2
    heads: int = 4
    head_dim: int = 16
    dtype: str = "fp32"

    def check(self, kv: bool) -> None:
        for name, v in (("layers", self.layers), ("kv-heads", self.kv_heads),
                        ("heads", self.heads), ("head-dim", self.head_dim)):
            if v < 1:
                raise CliError(f"--{name} must be >= 1, got {v}")
        if self.heads % self.kv_heads:
            raise CliError(f"--heads {self.heads} must be a multiple of --kv-heads "
                           f"{self.kv_heads} (grouped-query attention)")
        if self.dtype not in DTYPE_BYTES:
            raise CliError(f"unknown --dtype {self.dtype!r}")
        if kv and self.dtype not in KV_DTYPES:
            raise CliError(f"--kv and --preempt swap need a KV dtype the kernels take "
                           f"({', '.join(KV_DTYPES)}), got {self.dtype}")

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]


@dataclass
class SimConfig:
    num_blocks: int = 2048
    block_size: int = 16
    token_budget: int = 2048
    max_running: int = 64
    prefix_caching: bool = True
    checked: bool = True  # the allocator's checked mode (False only to time the difference)
    kv: bool = False
    shape: ModelShape = field(default_factory=ModelShape)
    kv_backend: str = "auto"
    kv_tolerance: float | None = None  # None: the kernels' fp tolerance for the dtype
    contiguous_max_len: int | None = None  # None: the workload's longest request
    max_steps: int = 10_000_000
    preempt: str = "recompute"  # or "swap": to a host tier, recompute where that fails
    host_blocks: int | None = None  # the host tier's blocks (swap); None: num_blocks

    def check(self) -> None:
        for name in ("num_blocks", "block_size", "token_budget", "max_running", "max_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CliError(f"--{name.replace('_', '-')} must be an int >= 1, got {v!r}")
        if self.num_blocks < 2:
            raise CliError(f"--num-blocks must be >= 2 (block 0 is the null block), got "
                           f"{self.num_blocks}")
        if self.kv_backend not in KV_BACKENDS:
            raise CliError(f"--kv-backend must be one of {', '.join(KV_BACKENDS)}")
        if self.kv_tolerance is not None and not (math.isfinite(self.kv_tolerance)
                                                  and self.kv_tolerance > 0):
            raise CliError(f"--kv-tolerance must be a finite number > 0, got "
                           f"{self.kv_tolerance}")
        if self.contiguous_max_len is not None and self.contiguous_max_len < 1:
            raise CliError(f"--contiguous-max-len must be >= 1, got {self.contiguous_max_len}")
        if self.preempt not in PREEMPT_MODES:
            raise CliError(f"--preempt must be one of {', '.join(PREEMPT_MODES)}, got "
                           f"{self.preempt!r}")
        if self.host_blocks is not None:
            if self.preempt != "swap":
                raise CliError("--host-blocks sizes the host tier of --preempt swap")
            if isinstance(self.host_blocks, bool) or not isinstance(self.host_blocks, int) or (
                    self.host_blocks < 1):
                raise CliError(f"--host-blocks must be an int >= 1, got {self.host_blocks!r}")
        self.shape.check(self.kv or self.preempt == "swap")


@dataclass
class KernelInputs:
    """What one step hands to the kernels (copies of the launch's arrays; the allocator's
    launch is not touched). ``kernel_hook`` may change them in place to plant a bug."""

    step: int
    rids: tuple[Any, ...]
    block_tables: np.ndarray  # int32 [n, width], -1 padded
    seq_lens: np.ndarray  # int32 [n]
    query_lens: np.ndarray  # int32 [n]
    slot_mapping: np.ndarray  # int64 [sum(query_lens)]
    copies: np.ndarray  # int32 [k, 2]
    table_generations: np.ndarray  # int32 like block_tables


# ---- expected KV ---------------------------------------------------------------------------
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping)."""
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _salt_key(salt: str | None) -> np.uint64:
    import hashlib

    raw = b"\x00" if salt is None else b"\x01" + salt.encode()
    return np.uint64(int.from_bytes(hashlib.sha256(raw).digest()[:8], "little"))


def prefix_keys(tokens: np.ndarray, salt: str | None) -> np.ndarray:
    """One uint64 per position: a function of the salt, the token ids up to and including the
    position, and the position (a weighted prefix sum, then mixed)."""
    n = len(tokens)
    pos = np.arange(n, dtype=np.uint64)
    weights = _mix(pos ^ np.uint64(0x5851F42D4C957F2D)) | np.uint64(1)
    with np.errstate(over="ignore"):
        acc = np.cumsum((tokens.astype(np.uint64) + np.uint64(1)) * weights, dtype=np.uint64)
    return _mix(acc ^ _mix(pos) ^ _salt_key(salt))


def _values(keys: np.ndarray, tags: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1): ``[len(keys), *tags.shape]`` from (key, tag) pairs."""
    with np.errstate(over="ignore"):
        z = _mix(keys.reshape(-1, *([1] * tags.ndim)) ^ tags[None])
    return ((z >> np.uint64(40)).astype(np.float32) * np.float32(2.0 / (1 << 24))) - 1.0


class _Expected:
    """The K/V (and queries) a request's positions must hold, from its true tokens."""

    def __init__(self, spec: WorkloadRequest, shape: ModelShape, torch_dtype: Any) -> None:
        import torch

        tokens = np.concatenate([spec.prompt, spec.output])[: max(spec.max_positions, 1)]
        self.keys = prefix_keys(tokens, spec.salt)
        s = shape
        kv_tags = np.arange(s.layers * 2 * s.kv_heads * s.head_dim, dtype=np.uint64)
        self._kv_tags = _mix(kv_tags * np.uint64(0x9E3779B1) + np.uint64(11))
        q_tags = np.arange(s.layers * s.heads * s.head_dim, dtype=np.uint64)
        self._q_tags = _mix(q_tags * np.uint64(0x85EBCA77) + np.uint64(29))
        self.shape = shape
        self.dtype = torch_dtype
        self.kv = torch.empty((len(self.keys), s.layers, 2, s.kv_heads, s.head_dim),
                              dtype=torch_dtype)
        self.upto = 0

    def ensure(self, n: int) -> None:
        import torch

        if n > self.upto:
            s = self.shape
            v = _values(self.keys[self.upto:n], self._kv_tags)
            self.kv[self.upto:n] = torch.from_numpy(
                v.reshape(n - self.upto, s.layers, 2, s.kv_heads, s.head_dim)).to(self.dtype)
            self.upto = n

    def queries(self, a: int, b: int) -> Any:
        """Queries of positions [a, b): ``[b - a, layers, heads, head_dim]``."""
        import torch

        s = self.shape
        v = _values(self.keys[a:b], self._q_tags).reshape(b - a, s.layers, s.heads, s.head_dim)
        return torch.from_numpy(v).to(self.dtype)


def dense_attention(q: Any, k: Any, v: Any, first: int, scale: float) -> Any:
    """Causal GQA attention in float64 over contiguous K/V, written apart from the kernels'
    reference (batched matmuls): query ``i`` sits at position ``first + i`` and sees keys
    ``0..first + i``. q ``[n, H, D]``, k/v ``[L, Hkv, D]``; returns ``[n, H, D]``."""
    import torch

    n, H, D = q.shape
    L, Hkv, _ = k.shape
    g = H // Hkv
    kt = k.double().permute(1, 2, 0)  # [Hkv, D, L]
    vt = v.double().permute(1, 0, 2)  # [Hkv, L, D]
    out = torch.empty((n, H, D), dtype=torch.float64)
    keys = torch.arange(L)
    step = max(1, (1 << 22) // max(1, Hkv * g * L))  # bound the score matrix
    for a in range(0, n, step):
        b = min(n, a + step)
        qa = q[a:b].double().reshape(b - a, Hkv, g, D).permute(1, 0, 2, 3)
        scores = torch.matmul(qa.reshape(Hkv, (b - a) * g, D), kt) * scale
        scores = scores.view(Hkv, b - a, g, L)
        if first + a < L - 1:  # some key lies after some query of the chunk
            hidden = keys[None, :] > (first + torch.arange(a, b))[:, None]  # [b - a, L]
            scores = scores.masked_fill(hidden[None, :, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).view(Hkv, (b - a) * g, L)
        o = torch.matmul(probs, vt).view(Hkv, b - a, g, D).permute(1, 0, 2, 3)
        out[a:b] = o.reshape(b - a, H, D)
    return out


def relative_error(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| in float64; inf if ``out`` has a NaN or an inf."""
    import torch

    o = torch.as_tensor(out).double().cpu()
    r = torch.as_tensor(ref).double().cpu()
    if not torch.isfinite(o).all():
        return math.inf
    return float((o - r).abs().max() / r.abs().max().clamp_min(1e-30))


def pick_backend(requested: str) -> tuple[str, str, str]:
    """(backend, device, description): ``kernels`` on a real GPU (numba sees one, not the
    simulator, and torch has CUDA), else ``reference`` on CPU; ``kernels`` may be forced
    under the CUDA simulator (CPU, slow)."""
    import torch
    from numba import config as numba_config
    from numba import cuda

    sim = bool(numba_config.ENABLE_CUDASIM)
    gpu = not sim and cuda.is_available()
    torch_cuda = torch.cuda.is_available()
    if requested == "reference" or (requested == "auto" and not (gpu and torch_cuda)):
        why = ""
        if requested == "auto":
            why = (" (the CUDA simulator is on)" if sim else " (no GPU)" if not gpu else
                   " (torch has no CUDA)")
        return "reference", "cpu", f"torch reference on CPU{why}"
    if sim:
        return "kernels", "cpu", "numba kernels in the CUDA simulator (CPU)"
    if not gpu:
        raise CliError("--kv-backend kernels needs a CUDA GPU (or NUMBA_ENABLE_CUDASIM=1)")
    if not torch_cuda:
        raise CliError("--kv-backend kernels needs torch with CUDA for the pool on the GPU")
    return "kernels", "cuda", f"numba kernels on {torch.cuda.get_device_name(0)}"


def kv_torch_dtype(name: str) -> Any:
    """The torch dtype of a KV dtype name of ``KV_DTYPES``."""
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


class KVCheck:
    """The KV pool, the writes and attention per step, and the dense comparison."""

    def __init__(self, cfg: SimConfig, allocator: Any) -> None:
        from pagedkv.kernels import KVCachePool
        from pagedkv.kernels.errors import KernelError
        from pagedkv.kernels.testing import tolerance

        s = cfg.shape
        self.shape = s
        self.backend, self.device, self.description = pick_backend(cfg.kv_backend)
        self.dtype = kv_torch_dtype(s.dtype)
        try:
            self.pool = KVCachePool(s.layers, cfg.num_blocks, cfg.block_size, s.kv_heads,
                                    s.head_dim, dtype=self.dtype, device=self.device)
        except KernelError as exc:
            raise CliError(f"--kv: cannot allocate the KV pool: {exc}") from None
        self.pool.fill_(float("nan"))  # a read of a slot never written is NaN: inf error
        allocator.attach_pool(self.pool)
        self.allocator = allocator
        self.tolerance = cfg.kv_tolerance if cfg.kv_tolerance is not None else tolerance(
            self.dtype)
        self.scale = 1.0 / math.sqrt(s.head_dim)
        self.expected: dict[Any, _Expected] = {}
        self.max_rel_error = 0.0
        self.outputs = 0
        self.tokens = 0
        self.launches = 0
        self.copies = 0
        self.failures: list[dict[str, Any]] = []
        self.num_failures = 0
        self.seconds = 0.0
        # The tensors are small (one request, a few heads): torch's thread pool costs more than
        # it gains, badly so on a loaded machine. One thread while the check runs on CPU.
        self.threads = 1 if self.device == "cpu" else 0

    def track(self, spec: WorkloadRequest) -> None:
        if spec.rid not in self.expected:
            self.expected[spec.rid] = _Expected(spec, self.shape, self.dtype)

    def forget(self, rid: Any) -> None:
        self.expected.pop(rid, None)

    def _fail(self, step: int, rid: Any, err: float, what: str) -> None:
        self.num_failures += 1
        if len(self.failures) < MAX_FAILURES_KEPT:
            self.failures.append({"step": step, "request": str(rid), "rel_error": err,
                                  "what": what})

    def run(self, inp: KernelInputs) -> None:
        """Copies, writes, attention and the dense comparison of one launch."""
        import torch

        t0 = time.perf_counter()
        threads = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            self._run(inp)
        finally:
            torch.set_num_threads(threads)
            self.seconds += time.perf_counter() - t0

    def _run(self, inp: KernelInputs) -> None:
        import torch

        from pagedkv.kernels import reference as ref
        from pagedkv.kernels.errors import KernelError

        s, dev = self.shape, self.device
        kernels = self.backend == "kernels"
        exp = [self.expected[rid] for rid in inp.rids]
        seq = inp.seq_lens.astype(np.int64)
        ql = inp.query_lens.astype(np.int64)
        for e, n in zip(exp, seq.tolist(), strict=True):
            e.ensure(int(n))
        rows = [(int(n) - int(q), int(n)) for n, q in zip(seq, ql, strict=True)]
        written = torch.cat([e.kv[a:b] for e, (a, b) in zip(exp, rows, strict=True)])
        queries = torch.cat([e.queries(a, b) for e, (a, b) in zip(exp, rows, strict=True)])
        self.launches += 1
        self.copies += int(inp.copies.shape[0])
        self.tokens += int(written.shape[0])
        decode = bool((ql == 1).all())
        outs = []
        try:
            if kernels:
                from pagedkv.kernels import (
                    paged_attention_decode,
                    paged_attention_prefill,
                    write_kv,
                )

                if inp.copies.shape[0]:
                    self.pool.copy_blocks(inp.copies)
                slots = torch.from_numpy(inp.slot_mapping).to(dev)
                tables = torch.from_numpy(inp.block_tables).to(dev)
                lens = torch.from_numpy(inp.seq_lens).to(dev)
                qlens = torch.from_numpy(inp.query_lens).to(dev)
                gens = torch.from_numpy(self.allocator.block_generations()).to(dev)
                tgens = torch.from_numpy(inp.table_generations).to(dev)
                written_d, queries_d = written.to(dev), queries.to(dev)
                for layer in range(s.layers):
                    k_cache, v_cache = self.pool.layer(layer)
                    write_kv(written_d[:, layer, 0].contiguous(),
                             written_d[:, layer, 1].contiguous(), k_cache, v_cache, slots)
                for layer in range(s.layers):
                    k_cache, v_cache = self.pool.layer(layer)
                    q = queries_d[:, layer].contiguous()
                    kw = dict(scale=self.scale, check=True, block_generations=gens,
                              table_generations=tgens)
                    if decode:
                        o = paged_attention_decode(q, k_cache, v_cache, tables, lens, **kw)
                    else:
                        o = paged_attention_prefill(q, k_cache, v_cache, tables, lens, qlens,
                                                    **kw)
                    outs.append(o.cpu())
            else:
                for layer in range(s.layers):
                    k_cache, v_cache = self.pool.layer(layer)
                    if inp.copies.shape[0]:
                        ref.copy_blocks_reference(k_cache, v_cache, inp.copies)
                    ref.write_kv_reference(written[:, layer, 0], written[:, layer, 1], k_cache,
                                           v_cache, torch.from_numpy(inp.slot_mapping))
                for layer in range(s.layers):
                    k_cache, v_cache = self.pool.layer(layer)
                    q = queries[:, layer]
                    if decode:
                        o = ref.paged_attention_decode_reference(
                            q, k_cache, v_cache, inp.block_tables, inp.seq_lens,
                            scale=self.scale)
                    else:
                        o = ref.paged_attention_prefill_reference(
                            q, k_cache, v_cache, inp.block_tables, inp.seq_lens,
                            inp.query_lens, scale=self.scale)
                    outs.append(o)
        except (KernelError, RuntimeError, IndexError) as exc:
            # a corrupted launch may make the kernels refuse it (checked mode) or index out
            # of the pool: a failed check, not a crash
            for rid in inp.rids:
                self._fail(inp.step, rid, math.inf, f"{type(exc).__name__}: {exc}")
            self.outputs += len(inp.rids)
            self.max_rel_error = math.inf
            return
        paged = torch.stack(outs, dim=1)  # [tokens, layers, heads, dim]
        start = 0
        for rid, e, (a, b) in zip(inp.rids, exp, rows, strict=True):
            n = b - a
            k = e.kv[:b, :, 0].reshape(b, s.layers * s.kv_heads, s.head_dim)
            v = e.kv[:b, :, 1].reshape(b, s.layers * s.kv_heads, s.head_dim)
            q = queries[start:start + n].reshape(n, s.layers * s.heads, s.head_dim)
            dense = dense_attention(q, k, v, a, self.scale)
            got = paged[start:start + n].reshape(n, s.layers * s.heads, s.head_dim)
            err = relative_error(got, dense)
            self.outputs += 1
            if not err <= self.max_rel_error:
                self.max_rel_error = err
            if not err <= self.tolerance:
                self._fail(inp.step, rid, err, f"attention over positions [0, {b}) of "
                           f"{n} query token(s) differs from dense attention")
            start += n

    def report(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device": self.device,
            "description": self.description,
            "model_shape": vars(self.shape),
            "launches": self.launches,
            "outputs_checked": self.outputs,
            "tokens_written": self.tokens,
            "copy_on_write_copies": self.copies,
            "max_rel_error": self.max_rel_error,
            "tolerance": self.tolerance,
            "passed": self.num_failures == 0,
            "num_failures": self.num_failures,
            "failures": self.failures,
            "seconds": self.seconds,
        }


# ---- the scheduler -------------------------------------------------------------------------
class SwapTier:
    """Preemption by swap (``--preempt swap``): an ``engine.offload.Swapper`` over the device KV
    pool (the KV check's, else one of the model shape) and a host pool of ``host_blocks``
    blocks shaped like it. The copies run on the CPU, so a swap completes when it is made.
    A victim with nothing computed, or for which the host tier has no room, is preempted by
    recompute; so is a swapped-out request whose host copies the host tier evicted (for later
    swaps) by the time it is readmitted."""

    def __init__(self, cfg: SimConfig, manager: Any, kv: KVCheck | None,
                 call: Callable[..., Any]) -> None:
        from pagedkv.engine.offload import Swapper
        from pagedkv.kernels import KVCachePool

        if kv is not None:
            device = kv.pool
        else:
            s = cfg.shape
            device = KVCachePool(s.layers, cfg.num_blocks, cfg.block_size, s.kv_heads,
                                 s.head_dim, dtype=kv_torch_dtype(s.dtype), device="cpu")
        self.host_blocks = cfg.host_blocks or cfg.num_blocks
        self.swapper = Swapper(manager, device, device.like(self.host_blocks),
                               checked=cfg.checked)
        self.call = call
        self.figures = dict.fromkeys(("swapped_out", "swapped_in", "tokens_swapped_in",
                                      "host_full", "host_lost"), 0)

    def _out(self, req: Any) -> Any:
        t = self.swapper.swap_out(req)
        self.swapper.complete(t)
        return t

    def out(self, req: Any) -> bool:
        """Swap the running request ``req`` out (it is then PREEMPTED, its device blocks free);
        False: not done (preempt it by recompute)."""
        from pagedkv.allocator.errors import OutOfBlocks

        if req.num_computed_tokens == 0:
            return False
        try:
            self.call("swap_out", self._out, req)
        except OutOfBlocks:  # it needs more blocks than the host tier can free
            self.figures["host_full"] += 1
            return False
        self.figures["swapped_out"] += 1
        return True

    def _in(self, req: Any) -> Any:
        t = self.swapper.swap_in(req)
        self.swapper.complete(t)
        return t

    def back(self, req: Any) -> bool | None:
        """Swap ``req`` back in (RUNNING, its computed tokens restored): True; None: not enough
        device blocks now (it waits); False: the host tier lost some of its blocks (forgotten:
        admit it by recompute)."""
        from pagedkv.allocator.errors import OutOfBlocks
        from pagedkv.engine.offload import SwapError

        try:
            t = self.call("swap_in", self._in, req)
        except OutOfBlocks:
            return None
        except SwapError:
            self.swapper.forget(req)
            self.figures["host_lost"] += 1
            return False
        self.figures["swapped_in"] += 1
        self.figures["tokens_swapped_in"] += t.num_tokens
        return True

    def report(self) -> dict[str, Any]:
        return {**self.figures, "host_blocks": self.host_blocks}


class _Req:
    __slots__ = ("spec", "engine", "high_water", "admitted", "finished", "swapped")

    def __init__(self, spec: WorkloadRequest) -> None:
        self.spec = spec
        self.engine: Any = None  # EngineRequest, made at the first admission
        self.high_water = 0  # positions ever computed (recompute accounting)
        self.admitted = 0
        self.finished = False
        self.swapped = False  # preempted by swap: its KV waits on the host tier


REPORT_KEYS = ("command", "workload", "config", "finished", "rejected", "rejected_ids", "steps",
               "simulated_steps", "wall_seconds", "allocator", "tokens", "concurrency",
               "occupancy", "tail_waste", "prefix_cache", "preemptions", "admission_headroom",
               "paged_vs_contiguous", "kv_check")
SERIES_KEYS = ("step", "running", "batch", "waiting", "held_blocks", "occupancy_blocks",
               "occupancy_tokens", "evictable_cached", "admission_headroom",
               "allocatable_now", "tail_waste_slots")
CALLS = ("new_step_starts", "get_computed_blocks", "allocate_slots", "record_prefix_cache_stats",
         "preempt", "publish", "complete", "append_token", "free", "swap_out", "swap_in")


@dataclass
class SimResult:
    report: dict[str, Any]
    series: dict[str, list[int]]

    @property
    def passed(self) -> bool:
        kv = self.report.get("kv_check")
        return kv is None or bool(kv["passed"])


def _usable(cfg: SimConfig) -> int:
    return cfg.num_blocks - 1  # the null block


def simulate(workload: Workload, cfg: SimConfig,
             progress: Callable[[int], Any] | None = None,
             kernel_hook: Callable[[KernelInputs], None] | None = None) -> SimResult:
    """Run the workload to completion (module docstring); returns the report and the series."""
    cfg.check()
    from pagedkv.engine import EngineRequest, KVCacheManager, RequestStatus

    hook = kernel_hook if kernel_hook is not None else KERNEL_HOOK
    B = cfg.block_size
    wall0 = time.perf_counter()
    m = KVCacheManager(cfg.num_blocks, B, cfg.prefix_caching, cfg.checked)
    kv = KVCheck(cfg, m.allocator) if cfg.kv else None
    seconds = dict.fromkeys(CALLS, 0.0)
    counts = dict.fromkeys(CALLS, 0)
    clock = time.perf_counter

    def call(name: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        t0 = clock()
        try:
            return fn(*args, **kw)
        finally:
            seconds[name] += clock() - t0
            counts[name] += 1

    swap = SwapTier(cfg, m, kv, call) if cfg.preempt == "swap" else None

    # -- the requests, their arrivals and their follow-ups ---------------------------------
    reqs = {r.rid: _Req(r) for r in workload.requests}
    children: dict[str, list[_Req]] = {}
    for r in reqs.values():
        if r.spec.parent is not None:
            if r.spec.parent not in reqs:
                raise CliError(f"request {r.spec.rid!r} follows unknown request "
                               f"{r.spec.parent!r}")
            children.setdefault(r.spec.parent, []).append(r)
    rejected: list[str] = []
    usable = _usable(cfg)

    def reject(r: _Req) -> None:
        rejected.append(r.spec.rid)
        r.finished = True
        if progress is not None:
            progress(1)
        for c in children.get(r.spec.rid, ()):
            reject(c)

    arrivals: list[tuple[int, int, str]] = []
    order = 0
    for r in reqs.values():
        if r.spec.parent is None:
            if -(-r.spec.max_positions // B) > usable:
                reject(r)
            else:
                heapq.heappush(arrivals, (r.spec.arrival, order, r.spec.rid))
                order += 1
    # follow-ups longer than the pool are rejected when they would arrive

    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    series: dict[str, list[int]] = {k: [] for k in SERIES_KEYS}
    tok = dict(scheduled=0, prefill=0, decode=0, recomputed=0, hit=0)
    preemptions = 0
    finished = 0
    steps = 0
    step = 0
    n_total = len(reqs)

    while finished + len(rejected) < n_total:
        if not waiting and not running:
            if not arrivals:  # pragma: no cover - every request arrives or is rejected
                raise SimulationError("no request left to arrive but the workload is not done")
            step = max(step, arrivals[0][0])
        while arrivals and arrivals[0][0] <= step:
            r = reqs[heapq.heappop(arrivals)[2]]
            if -(-r.spec.max_positions // B) > usable:
                reject(r)
                continue
            waiting.append(r)
        if not waiting and not running:
            continue
        if steps >= cfg.max_steps:
            raise SimulationError(f"the workload is not done after {cfg.max_steps} steps")
        call("new_step_starts", m.new_step_starts)
        budget = cfg.token_budget
        scheduled: list[tuple[_Req, int]] = []
        preempted_now = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            req = r.engine
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            new = None
            while True:
                new = call("allocate_slots", m.allocate_slots, req, n)
                if new is not None:
                    break
                victim = running.pop()
                if swap is not None and swap.out(victim.engine):
                    victim.swapped = True
                else:
                    call("preempt", m.preempt, victim.engine)
                    preemptions += 1
                preempted_now = True
                waiting.appendleft(victim)
                if victim is r:
                    break
            if new is None:
                break
            scheduled.append((r, n))
            budget -= n
            i += 1
        if not preempted_now:
            while budget > 0 and waiting and len(running) < cfg.max_running:
                r = waiting[0]
                if r.engine is None:
                    r.engine = EngineRequest(r.spec.rid, r.spec.prompt.tolist(),
                                             cache_salt=r.spec.salt)
                    if kv is not None:
                        kv.track(r.spec)
                req = r.engine
                if r.swapped:
                    back = swap.back(req) if swap is not None else False
                    if back is None:
                        break  # the head waits for device blocks
                    r.swapped = False
                    if back:
                        waiting.popleft()
                        running.append(r)
                        n = min(req.num_tokens - req.num_computed_tokens, budget)
                        if call("allocate_slots", m.allocate_slots, req, n) is None:
                            break  # running again; its next tokens wait for the next step
                        scheduled.append((r, n))
                        budget -= n
                        continue
                blocks, hits, _ = call("get_computed_blocks", m.get_computed_blocks, req)
                n = min(req.num_tokens - hits, budget)
                new = call("allocate_slots", m.allocate_slots, req, n, hits, blocks,
                           has_scheduled_reqs=bool(running))
                if new is None:
                    break
                call("record_prefix_cache_stats", m.record_prefix_cache_stats, req, hits)
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = hits
                tok["hit"] += hits
                waiting.popleft()
                r.admitted = step
                running.append(r)
                scheduled.append((r, n))
                budget -= n
        if not scheduled:
            if not running and not preempted_now:
                head = waiting[0].spec
                raise SimulationError(
                    f"request {head.rid!r} ({head.max_positions} positions) cannot be admitted "
                    f"with nothing running: the pool has {usable} usable blocks of {B}")
            step += 1
            continue

        launch = call("publish", m.publish, [r.engine for r, _ in scheduled])
        st = m.stats()
        held = st["held"] - 1  # the null block
        for key, value in (("step", step), ("running", len(running)), ("batch", len(scheduled)),
                           ("waiting", len(waiting)), ("held_blocks", held),
                           ("occupancy_blocks", st["occupancy_blocks"] - 1),
                           ("occupancy_tokens", st["occupancy_tokens"] - 1),
                           ("evictable_cached", st["cached"]),
                           ("admission_headroom", st["admission_headroom"]),
                           ("allocatable_now", st["allocatable_now"]),
                           ("tail_waste_slots", st["tail_waste_slots"] - (B - 1))):
            series[key].append(int(value))
        ns = [n for _, n in scheduled]
        if launch.query_lens.tolist() != ns:  # pragma: no cover - a front-door discrepancy
            raise SimulationError(f"step {step}: the launch writes {launch.query_lens.tolist()} "
                                  f"positions, the scheduler scheduled {ns}")
        if kv is not None:
            inp = KernelInputs(step, tuple(launch.rids), launch.block_tables.copy(),
                               launch.seq_lens.copy(), launch.query_lens.copy(),
                               launch.slot_mapping.copy(), launch.copies.copy(),
                               launch.table_generations.copy())
            if hook is not None:
                hook(inp)
            kv.run(inp)
        call("complete", m.complete, launch)
        steps += 1

        for r, n in scheduled:
            req = r.engine
            before = req.num_computed_tokens
            req.num_computed_tokens = before + n
            again = max(0, min(before + n, r.high_water) - before)
            tok["recomputed"] += again
            if n == 1 and again == 0 and req.num_output_tokens > 0:
                tok["decode"] += 1
            else:
                tok["prefill"] += n - again
            tok["scheduled"] += n
            r.high_water = max(r.high_water, before + n)
            if req.num_computed_tokens < req.num_tokens:
                continue  # chunked prefill goes on next step
            out_i = req.num_output_tokens
            call("append_token", m.append_token, req, int(r.spec.output[out_i]))
            if out_i + 1 < r.spec.output_len:
                continue
            req.status = RequestStatus.FINISHED_LENGTH_CAPPED
            running.remove(r)
            call("free", m.free, req)
            r.finished = True
            finished += 1
            if kv is not None:
                kv.forget(r.spec.rid)
            if progress is not None:
                progress(1)
            for c in children.get(r.spec.rid, ()):
                heapq.heappush(arrivals, (step + 1 + c.spec.think, order, c.spec.rid))
                order += 1
        step += 1

    wall = time.perf_counter() - wall0
    prefix = m.make_prefix_cache_stats()
    report = _report(workload, cfg, m, kv, series, seconds, counts, tok, preemptions, finished,
                     rejected, steps, step, prefix, wall, swap)
    return SimResult(report, series)


# ---- the report ----------------------------------------------------------------------------
def _stat(xs: list[int]) -> tuple[int, float, int]:
    if not xs:
        return 0, 0.0, 0
    return max(xs), float(np.mean(xs)), min(xs)


def _report(workload: Workload, cfg: SimConfig, m: Any, kv: KVCheck | None,
            series: dict[str, list[int]], seconds: dict[str, float], counts: dict[str, int],
            tok: dict[str, int], preemptions: int, finished: int, rejected: list[str],
            steps: int, end_step: int, prefix: Any, wall: float,
            swap: SwapTier | None = None) -> dict[str, Any]:
    B = cfg.block_size
    shape = cfg.shape
    bpt = shape.bytes_per_token
    bpb = bpt * B
    final = m.stats()
    if kv is not None:  # the attached pool's own figures
        bpb = int(final["bytes_per_block"])
    reserved = cfg.num_blocks * bpb
    usable = _usable(cfg)
    alloc_s = sum(seconds.values())
    peak_held, mean_held, _ = _stat(series["held_blocks"])
    peak_occ_tok, mean_occ_tok, _ = _stat(series["occupancy_tokens"])
    peak_occ_blk, mean_occ_blk, _ = _stat(series["occupancy_blocks"])
    peak_run, mean_run, _ = _stat(series["running"])
    peak_wait, _, _ = _stat(series["waiting"])
    peak_cached, mean_cached, _ = _stat(series["evictable_cached"])
    _, mean_head, min_head = _stat(series["admission_headroom"])
    peak_waste, mean_waste, _ = _stat(series["tail_waste_slots"])
    occ_slots = sum(series["occupancy_blocks"]) * B
    waste_frac = sum(series["tail_waste_slots"]) / occ_slots if occ_slots else 0.0
    summary = workload.summary()
    max_len = cfg.contiguous_max_len or summary["max_len"]
    contiguous_exact = reserved / (max_len * bpt) if max_len else 0.0
    contiguous = math.floor(contiguous_exact)
    if peak_run >= cfg.max_running:
        limited_by = "--max-running"
    elif preemptions or (swap is not None and swap.figures["swapped_out"]) or (
            peak_held >= usable):
        limited_by = "the pool"
    else:
        limited_by = "the workload (the pool never filled)"
    queries = prefix.queries if prefix is not None else 0
    hits = prefix.hits if prefix is not None else 0
    return {
        "command": "simulate",
        "workload": summary,
        "config": {
            "num_blocks": cfg.num_blocks, "usable_blocks": usable, "block_size": B,
            "token_budget": cfg.token_budget, "max_running": cfg.max_running,
            "prefix_caching": cfg.prefix_caching, "checked": cfg.checked,
            "model_shape": vars(shape), "bytes_per_token": bpt, "bytes_per_block": bpb,
            "reserved_bytes": reserved, "kv": cfg.kv, "preempt": cfg.preempt,
        },
        "finished": finished,
        "rejected": len(rejected),
        "rejected_ids": rejected[:20],
        "steps": steps,
        "simulated_steps": end_step,
        "wall_seconds": wall,
        "allocator": {
            "seconds": alloc_s,
            "requests_per_s": finished / alloc_s if alloc_s else 0.0,
            "tokens_per_s": tok["scheduled"] / alloc_s if alloc_s else 0.0,
            "us_per_step": 1e6 * alloc_s / steps if steps else 0.0,
            "calls": {k: {"n": counts[k], "seconds": seconds[k]} for k in CALLS},
        },
        "tokens": {"scheduled": tok["scheduled"], "prefill": tok["prefill"],
                   "decode": tok["decode"], "recomputed": tok["recomputed"],
                   "prefix_hit": tok["hit"]},
        "concurrency": {"peak_running": peak_run, "mean_running": mean_run,
                        "peak_waiting": peak_wait,
                        "capped_by_max_running": peak_run >= cfg.max_running},
        "occupancy": {
            "peak_held_blocks": peak_held, "mean_held_blocks": mean_held,
            "peak_fraction": peak_held / usable, "mean_fraction": mean_held / usable,
            "peak_held_bytes": peak_held * bpb, "reserved_bytes": reserved,
            "peak_table_blocks": peak_occ_blk, "mean_table_blocks": mean_occ_blk,
            "peak_tokens": peak_occ_tok, "mean_tokens": mean_occ_tok,
            "peak_token_bytes": peak_occ_tok * bpt,
        },
        "tail_waste": {"peak_slots": peak_waste, "mean_slots": mean_waste,
                       "fraction_of_table_slots": waste_frac, "peak_bytes": peak_waste * bpt},
        "prefix_cache": {
            "hit_rate": hits / queries if queries else 0.0,
            "queries": queries, "hits": hits,
            "requests": prefix.requests if prefix is not None else 0,
            "preempted_requests": prefix.preempted_requests if prefix is not None else 0,
            "preempted_queries": prefix.preempted_queries if prefix is not None else 0,
            "preempted_hits": prefix.preempted_hits if prefix is not None else 0,
            "prefix_hit_tokens": int(final["prefix_hit_tokens"]),
            "peak_evictable_cached_blocks": peak_cached,
            "mean_evictable_cached_blocks": mean_cached,
        },
        "preemptions": {"recompute": preemptions, "recomputed_tokens": tok["recomputed"],
                        "swap": swap.report() if swap is not None else None,
                        "swap_note": None if swap is not None else SWAP_NOTE},
        "admission_headroom": {"min_blocks": min_head, "mean_blocks": mean_head,
                               "final_blocks": int(final["admission_headroom"])},
        "paged_vs_contiguous": {
            "max_len": max_len,
            "max_len_source": "--contiguous-max-len" if cfg.contiguous_max_len else
            "the longest request (prompt + output)",
            "contiguous_exact": contiguous_exact, "contiguous_requests": contiguous,
            "paged_peak_concurrency": peak_run,
            "ratio": peak_run / contiguous if contiguous else None,
            "paged_limited_by": limited_by,
        },
        "kv_check": kv.report() if kv is not None else None,
    }


def _swap_words(sw: dict[str, Any]) -> str:
    return (f"{sw['swapped_out']:,} swapped out to {sw['host_blocks']:,} host blocks, "
            f"{sw['swapped_in']:,} swapped back in ({sw['tokens_swapped_in']:,} tokens not "
            f"recomputed); by recompute instead: {sw['host_full']:,} with the host tier full, "
            f"{sw['host_lost']:,} whose host copies were evicted")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def render(rep: dict[str, Any]) -> str:
    """The printed report."""
    w, c, a = rep["workload"], rep["config"], rep["allocator"]
    s = c["model_shape"]
    t = rep["tokens"]
    cc, occ, tw = rep["concurrency"], rep["occupancy"], rep["tail_waste"]
    pc, pre, hd, pv = (rep["prefix_cache"], rep["preemptions"], rep["admission_headroom"],
                       rep["paged_vs_contiguous"])
    rej = f", {rep['rejected']} rejected (longer than the pool)" if rep["rejected"] else ""
    lines = [
        f"simulate: {w['source']}, {w['requests']} requests ({w['tenants']} salts, "
        f"{w['follow_ups']} follow-up turns; prompt mean {w['prompt_tokens']['mean']:,.0f} / "
        f"max {w['prompt_tokens']['max']:,} tokens, output mean "
        f"{w['output_tokens']['mean']:,.0f}){rej}",
        f"  pool: {c['num_blocks']:,} blocks x {c['block_size']} tokens (1 null block), "
        f"{fmt_bytes(c['bytes_per_block'])} per block ({s['layers']} layers x {s['kv_heads']} "
        f"kv heads x {s['head_dim']} head dim x {s['dtype']}), {fmt_bytes(c['reserved_bytes'])} "
        "reserved",
        f"  scheduler: FCFS, token budget {c['token_budget']:,}/step, max {c['max_running']} "
        f"running, chunked prefill, preemption by {c['preempt']}; allocator "
        + ("checked" if c["checked"] else "UNCHECKED (--unchecked)")
        + ("" if c["prefix_caching"] else ", prefix caching off"),
        f"steps: {rep['steps']:,} (simulated time {rep['simulated_steps']:,} steps), "
        f"{rep['finished']:,} requests finished, wall {rep['wall_seconds']:.2f} s",
        f"allocator (front-door calls only): {a['seconds']:.3f} s -> "
        f"{a['requests_per_s']:,.0f} requests/s, {a['tokens_per_s']:,.0f} tokens/s, "
        f"{a['us_per_step']:,.0f} us/step ({t['scheduled']:,} tokens: {t['prefill']:,} "
        f"prefill + {t['decode']:,} decode + {t['recomputed']:,} recomputed)",
        f"concurrency: peak {cc['peak_running']} running"
        + (" (capped by --max-running)" if cc["capped_by_max_running"] else "")
        + f", mean {cc['mean_running']:.1f}; peak {cc['peak_waiting']} waiting",
        f"occupancy: peak {occ['peak_held_blocks']:,} of {c['usable_blocks']:,} blocks "
        f"({_pct(occ['peak_fraction'])}) = {fmt_bytes(occ['peak_held_bytes'])} of "
        f"{fmt_bytes(occ['reserved_bytes'])} reserved; mean {_pct(occ['mean_fraction'])}; "
        f"peak {occ['peak_tokens']:,} tokens in tables ({occ['peak_table_blocks']:,} table "
        "entries)",
        f"tail waste: mean {tw['mean_slots']:,.0f} slots "
        f"({_pct(tw['fraction_of_table_slots'])} of table slots), peak {tw['peak_slots']:,} "
        f"slots = {fmt_bytes(tw['peak_bytes'])}",
        f"prefix cache: hit rate {_pct(pc['hit_rate'])} ({pc['hits']:,} of {pc['queries']:,} "
        f"tokens looked up at {pc['requests']:,} admissions; {pc['preempted_requests']:,} "
        f"re-admissions after preemption apart: {pc['preempted_hits']:,} of "
        f"{pc['preempted_queries']:,}); peak {pc['peak_evictable_cached_blocks']:,} evictable "
        "cached blocks",
        f"preemptions: {pre['recompute']:,} by recompute ({pre['recomputed_tokens']:,} tokens "
        f"recomputed); swap: " + (pre["swap_note"] if pre["swap"] is None else _swap_words(
            pre["swap"])),
        f"admission headroom: min {hd['min_blocks']:,} blocks, mean {hd['mean_blocks']:,.0f}, "
        f"at the end {hd['final_blocks']:,}",
    ]
    ratio = f" ({pv['ratio']:.1f}x)" if pv["ratio"] else ""
    cap = f" (limited by {pv['paged_limited_by']})"
    lines.append(
        f"paged vs contiguous (max length {pv['max_len']:,} tokens, {pv['max_len_source']}): "
        f"contiguous {pv['contiguous_exact']:.2f} -> {pv['contiguous_requests']} requests; "
        f"paged peak {pv['paged_peak_concurrency']} concurrent{cap}{ratio}")
    kv = rep["kv_check"]
    if kv is not None:
        verdict = "passed" if kv["passed"] else f"FAILED ({kv['num_failures']} outputs)"
        lines.append(
            f"KV check ({kv['description']}): {kv['outputs_checked']:,} attention outputs in "
            f"{kv['launches']:,} launches ({kv['tokens_written']:,} tokens written, "
            f"{kv['copy_on_write_copies']} copy-on-write copies), max rel error "
            f"{kv['max_rel_error']:.3g} (tolerance {kv['tolerance']:.3g}): {verdict}, "
            f"{kv['seconds']:.2f} s")
        for f in kv["failures"][:5]:
            lines.append(f"  step {f['step']}, request {f['request']}: rel error "
                         f"{f['rel_error']:.3g}: {f['what']}")
    return "\n".join(lines)


def plot(series: dict[str, list[int]], rep: dict[str, Any], path: Any) -> None:
    """Occupancy, evictable cached blocks, admission headroom and running requests over
    time (matplotlib, imported here)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError("--plot needs matplotlib, which is not installed (pip install "
                       "matplotlib)") from None
    x = series["step"]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})
    usable = rep["config"]["usable_blocks"]
    # cached blocks are part of the headroom (num_blocks - held): drawn as an area under it
    ax.fill_between(x, series["evictable_cached"], step="post", color="C1", alpha=0.35, lw=0,
                    label="evictable cached (zero-ref, hashed)")
    ax.step(x, series["admission_headroom"], where="post", color="C2", lw=1.0,
            label="admission headroom (num_blocks - held)")
    ax.step(x, series["held_blocks"], where="post", color="C0", lw=1.2,
            label="held by requests (occupancy)")
    ax.axhline(usable, color="grey", ls="--", lw=0.8, label=f"usable blocks ({usable:,})")
    ax.set_ylabel("blocks")
    bpb = rep["config"]["bytes_per_block"]
    ax.set_title(f"pagedkv simulate: {rep['workload']['source']}, "
                 f"{rep['config']['num_blocks']:,} blocks x {rep['config']['block_size']} "
                 f"({fmt_bytes(bpb * rep['config']['num_blocks'])} reserved)")
    ax.legend(loc="upper right", fontsize=8)
    ax2.step(x, series["running"], where="post", label="running", lw=1.0, color="C3")
    ax2.step(x, series["waiting"], where="post", label="waiting", lw=0.8, color="C4")
    ax2.set_ylabel("requests")
    ax2.set_xlabel("step")
    ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise CliError(f"--plot {path}: cannot write it ({exc.strerror or exc})") from exc
    finally:
        plt.close(fig)


__all__ = [
    "CALLS", "KERNEL_HOOK", "KVCheck", "KernelInputs", "ModelShape", "REPORT_KEYS", "SERIES_KEYS",
    "SimConfig", "SimResult",
    "SimulationError", "dense_attention", "pick_backend", "plot", "prefix_keys", "relative_error",
    "render", "simulate",
]
