"""Compiled paged-attention kernels, one per configuration (cached).

One kernel serves decode and prefill. A thread block handles one work item (a sequence and a
tile of ``q_tile`` of its query tokens), one KV head and one key partition. Its query *rows* are
(query token, query head of the GQA group) pairs: ``rows = q_tile * group``. Threads are laid out
as ``(slot, row, lane)``: ``lanes`` threads share a row's head_dim (each holds ``head_dim/lanes``
elements of q and of the output accumulator, and loads that slice of every K/V row it visits
with 2/4/8-byte integer loads); ``slots`` groups of threads walk different keys side by side,
``unroll`` keys each per tile. Each tile costs one barrier: lanes publish partial dot products
to a double-buffered shared array, every lane sums its row's partials, and keeps an online
softmax (running max, sum, accumulator) over the keys its slot saw. At the end the slots'
states are merged through shared memory. There are no warp shuffles, so the same code runs in
numba's CUDA simulator and on a GPU.

With ``split`` the block writes its partition's normalised output and log-sum-exp, and
``reduce_partitions`` merges the partitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
from numba import cuda, float32, uint32

from .errors import KernelInputError, KernelTypeError

NEG_INF = float32(-np.inf)
_WORD_NP = {8: np.int64, 4: np.int32, 2: np.int16}
_ELEM_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
SHARED_LIMIT = 48 * 1024


@dataclass(frozen=True)
class KernelConfig:
    """Thread layout of the attention kernel (see the module docstring)."""

    lanes: int = 2
    slots: int = 2
    unroll: int = 2
    q_tile: int = 1

    def threads(self, group: int) -> int:
        return self.slots * self.q_tile * group * self.lanes

    def shared_bytes(self, group: int, head_dim: int) -> int:
        rows = self.q_tile * group
        partial = 2 * self.slots * self.unroll * rows * self.lanes
        merge = self.slots * rows * (head_dim + 2)
        return 4 * (partial + merge)


def check_config(cfg: KernelConfig, group: int, head_dim: int, words: int) -> KernelConfig:
    """Validate a thread layout; return it with plain-int fields (numpy integers accepted)."""
    if not isinstance(cfg, KernelConfig):
        raise KernelTypeError(f"config must be a KernelConfig, got {type(cfg).__name__}")
    fields = {}
    for name in ("lanes", "slots", "unroll", "q_tile"):
        value = getattr(cfg, name)
        if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
            raise KernelTypeError(f"KernelConfig.{name} must be a positive int, got {value!r}")
        if value < 1:
            raise KernelInputError(f"KernelConfig.{name} must be a positive int, got {value!r}")
        fields[name] = int(value)
    cfg = KernelConfig(**fields)
    if words % cfg.lanes:
        raise KernelInputError(
            f"KernelConfig.lanes={cfg.lanes} must divide the {words} words of a head row"
        )
    if cfg.threads(group) > 1024:
        raise KernelInputError(f"{cfg} with group {group} needs {cfg.threads(group)} threads")
    if cfg.shared_bytes(group, head_dim) > SHARED_LIMIT:
        raise KernelInputError(f"{cfg} needs more than {SHARED_LIMIT} bytes of shared memory")
    return cfg


def _converter(kind: str, ce: int):
    """Device function: elements ``[r*ce, (r+1)*ce)`` of a local word buffer -> float32 dst."""
    if kind == "f16":

        @cuda.jit(device=True)
        def conv(words, r, dst):
            h = words.view(np.float16)
            for e in range(ce):
                dst[e] = float32(h[r * ce + e])

    elif kind == "bf16":

        @cuda.jit(device=True)
        def conv(words, r, dst):
            h = words.view(np.uint16)
            bits = dst.view(np.uint32)
            for e in range(ce):
                bits[e] = uint32(h[r * ce + e]) << 16

    else:

        @cuda.jit(device=True)
        def conv(words, r, dst):
            f = words.view(np.float32)
            for e in range(ce):
                dst[e] = f[r * ce + e]

    return conv


@cache
def attention_kernel(
    head_dim: int,
    word_bytes: int,
    kind: str,
    group: int,
    block_size: int,
    cfg: KernelConfig,
    split: bool,
):
    """Compile (once per configuration) the attention kernel; see the module docstring."""
    D = head_dim
    EB = _ELEM_BYTES[kind]
    W = D * EB // word_bytes  # words per head row
    L = cfg.lanes
    CW = W // L  # words per lane
    CE = CW * word_bytes // EB  # elements per lane
    S = cfg.slots
    R = cfg.unroll
    G = group
    Q = cfg.q_tile
    ROWS = Q * G
    T = S * ROWS * L
    TILE = S * R
    RCW = R * CW  # words of K (or V) a thread holds per tile
    B = block_size
    SPLIT = split
    word_t = _WORD_NP[word_bytes]
    conv = _converter(kind, CE)

    @cuda.jit
    def kernel(q, kw, vw, tables, seq_lens, q_starts, q_lens, work, scale, part_size,
               out, part_out, part_lse):
        tid = cuda.threadIdx.x
        c = tid % L
        row = (tid // L) % ROWS
        s = tid // (L * ROWS)
        seq = work[cuda.blockIdx.x, 0]
        qt0 = work[cuda.blockIdx.x, 1]
        kvh = cuda.blockIdx.y
        part = cuda.blockIdx.z
        qi = row // G
        head = kvh * G + row % G
        qlen = q_lens[seq]
        slen = seq_lens[seq]
        n_q = min(Q, qlen - qt0)  # query tokens of this tile
        tok0 = q_starts[seq] + qt0
        active = qi < n_q
        # keys visible to this row: causal, query qi sits at position slen - qlen + qt0 + qi
        limit = slen - qlen + qt0 + qi + 1
        if not active:
            limit = 0
        start = part * part_size
        end = min(start + part_size, slen - qlen + qt0 + n_q)
        row_end = min(end, limit)

        qreg = cuda.local.array(CE, float32)
        acc = cuda.local.array(CE, float32)
        kf = cuda.local.array(CE, float32)
        vf = cuda.local.array(CE, float32)
        kwords = cuda.local.array(RCW, word_t)
        vwords = cuda.local.array(RCW, word_t)
        scores = cuda.local.array(R, float32)
        for e in range(CE):
            acc[e] = float32(0.0)
            qreg[e] = float32(0.0)
        if active:
            for e in range(CE):
                qreg[e] = float32(q[tok0 + qi, head, c * CE + e]) * scale
        m = NEG_INF
        lsum = float32(0.0)

        partial = cuda.shared.array((2, TILE, ROWS, L), float32)
        it = 0
        t0 = start
        while t0 < end:
            buf = it % 2
            for r in range(R):
                t = t0 + r * S + s
                if t < row_end:
                    blk = tables[seq, t // B]
                    off = t % B
                    for w in range(CW):
                        kwords[r * CW + w] = kw[blk, off, kvh, c * CW + w]
                        vwords[r * CW + w] = vw[blk, off, kvh, c * CW + w]
            for r in range(R):
                t = t0 + r * S + s
                if t < row_end:
                    conv(kwords, r, kf)
                    dot = float32(0.0)
                    for e in range(CE):
                        dot += qreg[e] * kf[e]
                    partial[buf, r * S + s, row, c] = dot
            cuda.syncthreads()
            tile_max = NEG_INF
            for r in range(R):
                t = t0 + r * S + s
                sc = NEG_INF
                if t < row_end:
                    sc = float32(0.0)
                    for cc in range(L):
                        sc += partial[buf, r * S + s, row, cc]
                scores[r] = sc
                tile_max = max(tile_max, sc)
            if tile_max > NEG_INF:
                m_new = max(m, tile_max)
                alpha = math.exp(m - m_new)
                lsum *= alpha
                for e in range(CE):
                    acc[e] *= alpha
                for r in range(R):
                    t = t0 + r * S + s
                    if t < row_end:
                        p = math.exp(scores[r] - m_new)
                        lsum += p
                        conv(vwords, r, vf)
                        for e in range(CE):
                            acc[e] += p * vf[e]
                m = m_new
            t0 += TILE
            it += 1

        # merge the slots' softmax states
        sm_m = cuda.shared.array((S, ROWS), float32)
        sm_l = cuda.shared.array((S, ROWS), float32)
        sm_acc = cuda.shared.array((S, ROWS, D), float32)
        for e in range(CE):
            sm_acc[s, row, c * CE + e] = acc[e]
        if c == 0:
            sm_m[s, row] = m
            sm_l[s, row] = lsum
        cuda.syncthreads()
        for idx in range(tid, ROWS * D, T):
            r2 = idx // D
            d = idx % D
            qi2 = r2 // G
            if qi2 < n_q:
                tok = tok0 + qi2
                head2 = kvh * G + r2 % G
                mx = NEG_INF
                for ss in range(S):
                    mx = max(mx, sm_m[ss, r2])
                if mx > NEG_INF:
                    tot = float32(0.0)
                    val = float32(0.0)
                    for ss in range(S):
                        ms = sm_m[ss, r2]
                        if ms > NEG_INF:
                            wgt = math.exp(ms - mx)
                            tot += sm_l[ss, r2] * wgt
                            val += sm_acc[ss, r2, d] * wgt
                    if SPLIT:
                        part_out[tok, head2, part, d] = val / tot
                        if d == 0:
                            part_lse[tok, head2, part] = mx + math.log(tot)
                    else:
                        out[tok, head2, d] = val / tot
                elif SPLIT and d == 0:
                    part_lse[tok, head2, part] = NEG_INF

    return kernel


@cuda.jit
def reduce_partitions(part_out, part_lse, out):
    """out[t, h, :] = softmax-weighted merge over partitions of part_out[t, h, p, :]."""
    n_tok = out.shape[0]
    n_head = out.shape[1]
    dim = out.shape[2]
    n_part = part_lse.shape[2]
    total = n_tok * n_head * dim
    start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    stride = cuda.gridDim.x * cuda.blockDim.x
    for idx in range(start, total, stride):
        d = idx % dim
        th = idx // dim
        h = th % n_head
        t = th // n_head
        mx = NEG_INF
        for p in range(n_part):
            mx = max(mx, part_lse[t, h, p])
        tot = float32(0.0)
        val = float32(0.0)
        for p in range(n_part):
            lse = part_lse[t, h, p]
            if lse > NEG_INF:
                wgt = math.exp(lse - mx)
                tot += wgt
                val += wgt * part_out[t, h, p, d]
        out[t, h, d] = val / tot
