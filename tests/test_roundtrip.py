"""Allocator <-> kernel round trip.

Requests are driven through ``BlockAllocator``; every launch's copy-on-write copies run with
``copy_blocks``, its new tokens' K/V are written with ``write_kv`` through the launch's slot
mapping, and attention runs through the launch's tables (checked mode, with generations). The
output must equal contiguous attention over the request's tokens, including after prefix hits,
forks (with copy-on-write of a shared partial block) and preemption / re-admission.

K, V and q of a position are a fixed function of (token id, position), as in a model whose
layers are all this one: a cached block is right exactly when it holds the same tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedkv.allocator import BlockAllocator
from pagedkv.kernels import (
    KVCachePool,
    attention_reference,
    copy_blocks,
    paged_attention_decode,
    paged_attention_prefill,
    step_inputs,
    write_kv,
)
from pagedkv.kernels.testing import device_for_tests, rel_error, tolerance

DEVICE = device_for_tests()


class Model:
    """Deterministic per-(token, position) q/K/V, and the engine loop around the allocator."""

    def __init__(self, *, num_blocks, block_size, kv_heads, group, head_dim, dtype, vocab=50):
        gen = torch.Generator().manual_seed(1234)
        self.dtype = dtype
        self.hkv, self.group, self.d = kv_heads, group, head_dim
        heads = kv_heads * group
        self.emb_q = torch.randn(vocab, heads, head_dim, generator=gen)
        self.emb_k = torch.randn(vocab, kv_heads, head_dim, generator=gen)
        self.emb_v = torch.randn(vocab, kv_heads, head_dim, generator=gen)
        self.pos = torch.randn(4096, 1, head_dim, generator=gen) * 0.5
        self.alloc = BlockAllocator(num_blocks, block_size, prefix_caching=True, checked=True)
        self.pool = KVCachePool(1, num_blocks, block_size, kv_heads, head_dim, dtype,
                                device=DEVICE)
        self.pool.fill_(float("nan"))  # a block read before it is written poisons the output
        self.alloc.attach_pool(self.pool)
        self.tokens: dict[str, list[int]] = {}
        self.once_per_step = False

    def embed(self, table, tokens, positions):
        t = torch.as_tensor(tokens, dtype=torch.long)
        p = torch.as_tensor(positions, dtype=torch.long)
        return (table[t] + self.pos[p]).to(self.dtype)

    def add(self, rid, prompt) -> int:
        self.tokens[rid] = list(prompt)
        return self.alloc.add_request(rid, prompt)

    def fork(self, parent, child):
        self.alloc.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])

    def generate(self, rid, token):
        self.tokens[rid].append(token)
        self.alloc.append_tokens(rid, [token])

    def step(self, rids, *, decode=False):
        """Allocate every request to its full length, publish, copy, write, attend, check.
        With ``self.once_per_step`` the kernels take ``step_inputs``' arrays unchecked (the
        launch's host metadata checked once, moved to the device once) instead of checking
        the launch's arrays in every call."""
        for rid in rids:
            self.alloc.allocate(rid, len(self.tokens[rid]))
        launch = self.alloc.publish(rids)
        k_cache, v_cache = self.pool.layer(0)
        if self.once_per_step:
            return self._step_once(rids, launch, k_cache, v_cache, decode)
        if len(launch.copies):
            copy_blocks(k_cache, v_cache, launch.copies)
        tokens, positions = [], []
        for rid, n, ql in zip(rids, launch.seq_lens, launch.query_lens, strict=True):
            assert n == len(self.tokens[rid])
            positions += list(range(n - ql, n))
            tokens += self.tokens[rid][n - ql : n]
        key = self.embed(self.emb_k, tokens, positions).to(DEVICE)
        value = self.embed(self.emb_v, tokens, positions).to(DEVICE)
        write_kv(key, value, k_cache, v_cache, launch.slot_mapping)
        q = self.embed(self.emb_q, tokens, positions).to(DEVICE)
        checked = dict(check=True, block_generations=self.alloc.block_generations(),
                       table_generations=launch.table_generations)
        if decode:
            assert (launch.query_lens == 1).all()
            out = paged_attention_decode(q, k_cache, v_cache, launch.block_tables,
                                         launch.seq_lens, **checked)
        else:
            out = paged_attention_prefill(q, k_cache, v_cache, launch.block_tables,
                                          launch.seq_lens, launch.query_lens, **checked)
        return self._finish(rids, launch, q, out)

    def _step_once(self, rids, launch, k_cache, v_cache, decode):
        inp = step_inputs(launch, k_cache, block_generations=self.alloc.block_generations())
        if len(inp.copies):
            copy_blocks(k_cache, v_cache, inp.copies)
        key, value, q = self._qkv(rids, launch)
        write_kv(key, value, k_cache, v_cache, inp.slot_mapping)  # default: no D2H copy
        if decode:
            out = paged_attention_decode(q, k_cache, v_cache, inp.block_tables, inp.seq_lens,
                                         max_seq_len=inp.max_seq_len)
        else:
            out = paged_attention_prefill(q, k_cache, v_cache, inp.block_tables, inp.seq_lens,
                                          inp.query_lens, max_seq_len=inp.max_seq_len)
        return self._finish(rids, launch, q, out)

    def _qkv(self, rids, launch):
        tokens, positions = [], []
        for rid, n, ql in zip(rids, launch.seq_lens, launch.query_lens, strict=True):
            positions += list(range(n - ql, n))
            tokens += self.tokens[rid][n - ql : n]
        return tuple(self.embed(t, tokens, positions).to(DEVICE)
                     for t in (self.emb_k, self.emb_v, self.emb_q))

    def _finish(self, rids, launch, q, out):
        launch.complete()
        start = 0
        for rid, ql in zip(rids, launch.query_lens, strict=True):
            n = len(self.tokens[rid])
            self.alloc.commit(rid, n)
            want = self.contiguous(rid, q[start : start + ql].cpu(), n - ql)
            got = out[start : start + ql]
            assert not torch.isnan(got).any(), f"{rid}: read an unwritten slot"
            err = rel_error(got, want)
            assert err < tolerance(self.dtype), f"{rid}: relative error {err}"
            start += ql
        return launch

    def contiguous(self, rid, q, first_pos):
        toks = self.tokens[rid]
        pos = list(range(len(toks)))
        k = self.embed(self.emb_k, toks, pos)
        v = self.embed(self.emb_v, toks, pos)
        positions = torch.arange(first_pos, first_pos + q.shape[0])
        return attention_reference(q, k, v, positions, self.d ** -0.5)


CASES = [
    pytest.param(dict(num_blocks=24, block_size=4, kv_heads=1, group=2, head_dim=8,
                      dtype=torch.float32), id="sim-f32-B4"),
    pytest.param(dict(num_blocks=24, block_size=4, kv_heads=2, group=1, head_dim=8,
                      dtype=torch.float16), id="sim-f16-B4"),
    pytest.param(dict(num_blocks=256, block_size=16, kv_heads=8, group=4, head_dim=128,
                      dtype=torch.bfloat16), marks=pytest.mark.gpu, id="gpu-bf16-B16"),
]


def scale(m: Model, n: int) -> int:
    """Lengths in block units, so the GPU case uses longer sequences."""
    return n * m.alloc.block_size // 4


@pytest.mark.parametrize("once", [False, True], ids=["checked-per-call", "step-inputs"])
@pytest.mark.parametrize("cfg", CASES)
def test_prefix_hit_then_decode(cfg, once):
    m = Model(**cfg)
    m.once_per_step = once
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 50, scale(m, 10)).tolist()  # 2.5 blocks
    assert m.add("a", prompt) == 0
    m.step(["a"])
    for _ in range(3):
        m.generate("a", int(rng.integers(0, 50)))
        m.step(["a"], decode=True)
    # b shares a's first two full blocks, then diverges: a prefix hit
    prompt_b = prompt[: scale(m, 8)] + rng.integers(0, 50, scale(m, 5)).tolist()
    hit = m.add("b", prompt_b)
    assert hit == scale(m, 8)
    launch = m.step(["b"])
    assert launch.query_lens.tolist() == [len(prompt_b) - hit]
    assert m.alloc.block_table("b")[:2] == m.alloc.block_table("a")[:2]
    m.generate("a", 7)
    m.generate("b", 9)
    m.step(["a", "b"], decode=True)


@pytest.mark.parametrize("once", [False, True], ids=["checked-per-call", "step-inputs"])
@pytest.mark.parametrize("cfg", CASES)
def test_fork_copy_on_write(cfg, once):
    m = Model(**cfg)
    m.once_per_step = once
    rng = np.random.default_rng(1)
    m.add("p", rng.integers(0, 50, scale(m, 6)).tolist())  # 1.5 blocks: shared partial block
    m.step(["p"])
    m.fork("p", "c")
    assert m.alloc.block_table("c") == m.alloc.block_table("p")
    m.generate("p", 3)
    m.generate("c", 4)  # different continuations: the partial block must be copied
    launch = m.step(["p", "c"], decode=True)
    assert len(launch.copies) >= 1  # the shared partial block is copied before the writes
    assert m.alloc.block_table("c")[-1] != m.alloc.block_table("p")[-1]
    for _ in range(scale(m, 3)):
        m.generate("p", int(rng.integers(0, 50)))
        m.generate("c", int(rng.integers(0, 50)))
        m.step(["c", "p"], decode=True)


@pytest.mark.parametrize("cfg", CASES)
def test_preemption_and_readmission(cfg):
    m = Model(**cfg)
    rng = np.random.default_rng(2)
    m.add("x", rng.integers(0, 50, scale(m, 9)).tolist())
    m.add("y", rng.integers(0, 50, scale(m, 5)).tolist())
    m.step(["x", "y"])
    for _ in range(2):
        m.generate("x", int(rng.integers(0, 50)))
        m.step(["x"], decode=True)
    # preempt x (free) and re-admit it with everything it has so far: its full blocks are
    # found in the prefix cache, the rest is recomputed into fresh blocks
    tokens = list(m.tokens["x"])
    m.alloc.free("x")
    hit = m.add("x", tokens)
    assert 0 < hit < len(tokens)
    launch = m.step(["x", "y"][:1])
    assert launch.query_lens.tolist() == [len(tokens) - hit]
    m.generate("x", 11)
    m.generate("y", 12)
    m.step(["y", "x"], decode=True)
