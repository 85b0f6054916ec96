"""Hostile input to every public kernel call: each bad argument raises its documented
``KernelError`` subclass and leaves every array (caches, outputs, inputs) bitwise unchanged;
numpy scalars are accepted wherever an int (or a float) is valid.

The caches are NaN-poisoned where no sequence lives, so a stray write shows; arrays are compared
with ``np.array_equal(..., equal_nan=True)``. Shapes are tiny (the CUDA simulator is slow) and
nearly every case is refused before a kernel runs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from stable_ids import stable_id

from pagedkv.kernels import (
    KernelConfig,
    KernelDeviceError,
    KernelError,
    KernelInputError,
    KernelTypeError,
    KVCachePool,
    choose_partition_size,
    copy_blocks,
    copy_blocks_reference,
    default_config,
    paged_attention_decode,
    paged_attention_prefill,
    write_kv,
    write_kv_reference,
)
from pagedkv.kernels.testing import make_paged_case

TE, IE, DE = KernelTypeError, KernelInputError, KernelDeviceError
NB, BS, HKV, D = 5, 4, 1, 8  # the case's geometry: 3 used blocks + 1 spare + 1 never used
U64_MAX = np.array([2**64 - 1], dtype=np.uint64)


def _case():
    c = make_paged_case([6, 3], num_kv_heads=HKV, head_dim=D, block_size=BS,
                        dtype=torch.float32, spare_blocks=1, table_pad=1, seed=7)
    assert c.num_blocks == NB and c.block_tables.shape == (2, 3)
    return c


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().clone().numpy()
    return np.array(x, copy=True)


def _arrays(args):
    return {k: v for k, v in args.items() if isinstance(v, np.ndarray | torch.Tensor)}


def _snapshot(args):
    return {k: _np(v) for k, v in _arrays(args).items()}


def _assert_unchanged(args, snap):
    now = _arrays(args)
    assert now.keys() == snap.keys()
    for k, before in snap.items():
        after = _np(now[k])
        assert after.dtype == before.dtype and after.shape == before.shape, k
        assert np.array_equal(after, before, equal_nan=True), f"{k} was changed"


def _refused(fn, args, err):
    snap = _snapshot(args)
    with pytest.raises(err) as info:
        fn(**args)
    assert isinstance(info.value, KernelError) and str(info.value)
    _assert_unchanged(args, snap)


def _readonly(x):
    a = _np(x)
    a.flags.writeable = False
    return a


# ---- shared bad values -----------------------------------------------------------------------

NOT_ARRAYS = [("list", [[0, 1]], TE), ("str", "array", TE), ("none", None, TE), ("int", 3, TE)]


def _index_array_cases(name, good_shape, good):
    """Bad values for an integer index array named ``name``."""
    return [
        *[(f"{name}-{i}", {name: v}, e) for i, v, e in NOT_ARRAYS],
        (f"{name}-float", {name: np.zeros(good_shape, dtype=np.float32)}, TE),
        (f"{name}-bool", {name: np.zeros(good_shape, dtype=bool)}, TE),
        (f"{name}-torch-bool", {name: torch.zeros(good_shape, dtype=torch.bool)}, TE),
        (f"{name}-ndim+1", {name: np.asarray(good)[None]}, IE),
    ]


def _scalar_cases():
    """Bad scale / partition_size / max_seq_len / config / check (same for decode, prefill)."""
    return [
        ("scale-str", {"scale": "0.5"}, TE),
        ("scale-bool", {"scale": True}, TE),
        ("scale-np-bool", {"scale": np.bool_(True)}, TE),
        ("scale-complex", {"scale": 1j}, TE),
        ("scale-list", {"scale": [0.5]}, TE),
        ("scale-nan", {"scale": float("nan")}, IE),
        ("scale-inf", {"scale": float("inf")}, IE),
        ("scale--inf", {"scale": -math.inf}, IE),
        ("scale-np-nan", {"scale": np.float32("nan")}, IE),
        ("scale-f32-overflow", {"scale": 1e300}, IE),
        ("scale-huge-int", {"scale": 10**400}, IE),
        ("part-0", {"partition_size": 0}, IE),
        ("part-neg", {"partition_size": -4}, IE),
        ("part-huge-neg", {"partition_size": -(2**70)}, IE),
        ("part-bool", {"partition_size": True}, TE),
        ("part-float", {"partition_size": 4.0}, TE),
        ("part-nan", {"partition_size": float("nan")}, TE),
        ("part-str", {"partition_size": "4"}, TE),
        ("part-np-float", {"partition_size": np.float64(4)}, TE),
        ("maxlen-neg", {"max_seq_len": -1}, IE),
        ("maxlen-past-table", {"max_seq_len": 13}, IE),  # 3 entries x B=4
        ("maxlen-huge", {"max_seq_len": 2**70}, IE),
        ("maxlen-below-longest", {"max_seq_len": 5}, IE),  # checked: sequence 0 has 6
        ("maxlen-bool", {"max_seq_len": True}, TE),
        ("maxlen-float", {"max_seq_len": 6.0}, TE),
        ("maxlen-nan", {"max_seq_len": float("nan")}, TE),
        ("maxlen-str", {"max_seq_len": "6"}, TE),
        ("config-dict", {"config": {"lanes": 2}}, TE),
        ("config-str", {"config": "fast"}, TE),
        ("config-array", {"config": np.array([2, 2, 2, 1])}, TE),
        ("config-lanes-bool", {"config": KernelConfig(lanes=True)}, TE),
        ("config-lanes-float", {"config": KernelConfig(lanes=2.0)}, TE),
        ("config-lanes-0", {"config": KernelConfig(lanes=0)}, IE),
        ("config-slots-neg", {"config": KernelConfig(slots=-1)}, IE),
        ("config-lanes-3", {"config": KernelConfig(lanes=3)}, IE),  # 8 f32 = 4 words
        ("config-huge", {"config": KernelConfig(slots=2**40)}, IE),
        ("check-str", {"check": "yes"}, TE),
        ("check-none", {"check": None}, TE),
        ("check-int", {"check": 1}, TE),
        ("gens-alone", {"block_generations": np.zeros(NB, np.int32)}, IE),
        ("gens-str", {"block_generations": "gens",
                      "table_generations": np.zeros((2, 3), np.int32)}, TE),
        ("gens-float", {"block_generations": np.zeros(NB),
                        "table_generations": np.zeros((2, 3), np.int32)}, TE),
        ("gens-list", {"block_generations": [0] * NB,
                       "table_generations": np.zeros((2, 3), np.int32)}, TE),
        ("gens-short", {"block_generations": np.zeros(NB - 1, np.int32),
                        "table_generations": np.zeros((2, 3), np.int32)}, IE),
        ("tgens-1d", {"block_generations": np.zeros(NB, np.int32),
                      "table_generations": np.zeros(6, np.int32)}, IE),
        ("tgens-shape", {"block_generations": np.zeros(NB, np.int32),
                         "table_generations": np.zeros((2, 2), np.int32)}, IE),
    ]


def _cache_cases(c):
    k = c.k_cache
    return [
        *[(f"k_cache-{i}", {"k_cache": v}, e) for i, v, e in NOT_ARRAYS],
        ("k_cache-f64", {"k_cache": k.double(), "v_cache": c.v_cache.double()}, TE),
        ("k_cache-int16", {"k_cache": k.to(torch.int16), "v_cache": k.to(torch.int16)}, TE),
        ("kv-dtypes-differ", {"v_cache": c.v_cache.half()}, TE),
        ("k_cache-3d", {"k_cache": k[0], "v_cache": c.v_cache[0]}, IE),
        ("kv-shapes-differ", {"v_cache": c.v_cache[:, :2]}, IE),
        ("kv-non-contiguous", {"k_cache": k.transpose(0, 1), "v_cache": k.transpose(0, 1)},
         IE),
    ]


# ---- paged_attention_decode ------------------------------------------------------------------

def _decode_args(c, **over):
    args = dict(q=torch.randn(2, 2, D, generator=torch.Generator().manual_seed(1)),
                k_cache=c.k_cache, v_cache=c.v_cache, block_tables=c.block_tables,
                seq_lens=c.seq_lens, out=torch.full((2, 2, D), float("nan")), check=True)
    args.update(over)
    return args


def _table_with(c, value, dtype=np.int64):
    t = c.block_tables.astype(dtype)
    t[0, 1] = value  # sequence 0 (length 6) uses entries 0 and 1
    return t


def _decode_cases():
    c = _case()
    q = torch.randn(2, 2, D)
    lens = c.seq_lens
    return [
        *[(f"q-{i}", {"q": v}, e) for i, v, e in NOT_ARRAYS],
        ("q-int", {"q": torch.ones(2, 2, D, dtype=torch.int32)}, TE),
        ("q-bool", {"q": np.zeros((2, 2, D), dtype=bool)}, TE),
        ("q-2d", {"q": q[:, 0]}, IE),
        ("q-head-dim", {"q": torch.randn(2, 2, 2 * D)}, IE),
        ("q-count", {"q": torch.randn(3, 2, D)}, IE),
        *_cache_cases(c),
        *_index_array_cases("block_tables", (2, 3), c.block_tables),
        ("block_tables-1d", {"block_tables": c.block_tables.reshape(-1)}, IE),
        ("block_tables-rows", {"block_tables": c.block_tables[:1]}, IE),
        ("block-id-padding", {"block_tables": _table_with(c, -1)}, IE),
        ("block-id-num-blocks", {"block_tables": _table_with(c, NB)}, IE),
        ("block-id-huge", {"block_tables": _table_with(c, 2**40)}, IE),
        ("block-id-u64-max", {"block_tables": _table_with(c, 2**64 - 1, np.uint64)}, IE),
        ("block-id-neg-huge", {"block_tables": _table_with(c, -(2**62))}, IE),
        *_index_array_cases("seq_lens", (2,), lens),
        ("seq_lens-count", {"seq_lens": np.array([6, 3, 1], np.int32)}, IE),
        ("seq_len-0", {"seq_lens": np.array([6, 0], np.int32)}, IE),
        ("seq_len-neg", {"seq_lens": np.array([6, -1], np.int32)}, IE),
        ("seq_len-past-table", {"seq_lens": np.array([13, 3], np.int32)}, IE),
        ("seq_len-huge", {"seq_lens": np.array([2**40, 3], np.int64)}, IE),
        ("seq_len-u64-max", {"seq_lens": np.array([2**64 - 1, 3], np.uint64)}, IE),
        *[(f"out-{i}", {"out": v}, e) for i, v, e in NOT_ARRAYS if v is not None],
        ("out-int", {"out": torch.zeros(2, 2, D, dtype=torch.int32)}, TE),
        ("out-bool", {"out": np.zeros((2, 2, D), dtype=bool)}, TE),
        ("out-shape", {"out": torch.zeros(2, 2, D // 2)}, IE),
        ("out-readonly", {"out": _readonly(torch.full((2, 2, D), float("nan")))}, IE),
        *_scalar_cases(),
    ]


DECODE_CASES = _decode_cases()


@pytest.mark.parametrize("over, err", [c[1:] for c in DECODE_CASES],
                         ids=[c[0] for c in DECODE_CASES])
def test_decode_refuses_and_changes_nothing(over, err):
    c = _case()
    _refused(paged_attention_decode, _decode_args(c, **over), err)


def _run(fn, args):
    return _np(fn(**args))


@pytest.mark.parametrize("over, same_as", [
    ({"partition_size": np.int64(4)}, {"partition_size": 4}),
    ({"partition_size": 2**70}, {"partition_size": None}),
    ({"max_seq_len": np.int32(6), "check": np.bool_(True)}, {"max_seq_len": 6}),
    ({"scale": np.float32(0.25)}, {"scale": 0.25}),
    ({"scale": np.int64(1)}, {"scale": 1.0}),
    ({"config": KernelConfig(np.int64(2), np.int32(1), np.uint8(2), 1)},
     {"config": KernelConfig(2, 1, 2, 1)}),
    ({"block_tables": torch.from_numpy(np.ascontiguousarray(_case().block_tables)).long(),
      "seq_lens": np.array([np.int64(6), np.int64(3)], dtype=np.uint16)}, {}),
], ids=["np-part", "huge-part", "np-maxlen", "np-f32-scale", "np-int-scale", "np-config",
        "torch-tables-u16-lens"])
def test_decode_accepts_numpy_scalars_where_valid(over, same_as):
    c = _case()
    want = _run(paged_attention_decode, _decode_args(c, **same_as))
    assert not np.isnan(want).any()
    got = _run(paged_attention_decode, _decode_args(c, **over))
    assert np.array_equal(got, want)


# ---- paged_attention_prefill -----------------------------------------------------------------

def _prefill_args(c, **over):
    args = dict(q=torch.randn(4, 2, D, generator=torch.Generator().manual_seed(2)),
                k_cache=c.k_cache, v_cache=c.v_cache, block_tables=c.block_tables,
                seq_lens=c.seq_lens, query_lens=np.array([3, 1], np.int32),
                out=torch.full((4, 2, D), float("nan")), check=True)
    args.update(over)
    return args


def _prefill_cases():
    c = _case()
    return [
        ("query_lens-none", {"query_lens": None}, TE),
        *_index_array_cases("query_lens", (2,), np.array([3, 1], np.int32)),
        ("query_lens-count", {"query_lens": np.array([4], np.int32)}, IE),
        ("query_len-neg", {"query_lens": np.array([5, -1], np.int32)}, IE),
        ("query_lens-sum", {"query_lens": np.array([1, 1], np.int32)}, IE),
        ("query_len-past-seq", {"query_lens": np.array([0, 4], np.int32)}, IE),
        ("query_len-u64-max", {"query_lens": np.array([2**64 - 1, 5], np.uint64)}, IE),
        ("q-list", {"q": [[0.0] * D] * 4}, TE),
        ("q-count", {"q": torch.randn(5, 2, D)}, IE),
        ("seq_len-neg", {"seq_lens": np.array([6, -3], np.int32)}, IE),
        ("block-id-num-blocks", {"block_tables": _table_with(c, NB)}, IE),
        ("out-readonly", {"out": _readonly(torch.full((4, 2, D), float("nan")))}, IE),
        ("k_cache-list", {"k_cache": c.k_cache.tolist()}, TE),
        *_scalar_cases(),
    ]


PREFILL_CASES = _prefill_cases()


@pytest.mark.parametrize("over, err", [c[1:] for c in PREFILL_CASES],
                         ids=[c[0] for c in PREFILL_CASES])
def test_prefill_refuses_and_changes_nothing(over, err):
    c = _case()
    _refused(paged_attention_prefill, _prefill_args(c, **over), err)


@pytest.mark.parametrize("over, same_as", [
    ({"partition_size": np.uint32(4), "query_lens": torch.tensor([3, 1])},
     {"partition_size": 4}),
    ({"max_seq_len": np.int16(6), "scale": np.float64(0.5)}, {"scale": 0.5}),
], ids=["np-part-torch-qlens", "np-maxlen-np-scale"])
def test_prefill_accepts_numpy_scalars_where_valid(over, same_as):
    c = _case()
    want = _run(paged_attention_prefill, _prefill_args(c, **same_as))
    assert not np.isnan(want).any()
    assert np.array_equal(_run(paged_attention_prefill, _prefill_args(c, **over)), want)


# ---- write_kv --------------------------------------------------------------------------------

def _kv(n=2, dtype=torch.float32, heads=HKV, dim=D):
    return torch.randn(n, heads, dim, generator=torch.Generator().manual_seed(3)).to(dtype)


def _write_args(c, **over):
    args = dict(key=_kv(), value=-_kv(), k_cache=c.k_cache, v_cache=c.v_cache,
                slot_mapping=np.array([17, 2], np.int64))
    args.update(over)
    return args


def _write_cases():
    c = _case()
    ro_k, ro_v = _readonly(c.k_cache), _readonly(c.v_cache)
    return [
        *[(f"key-{i}", {"key": v}, e) for i, v, e in NOT_ARRAYS],
        *[(f"value-{i}", {"value": v}, e) for i, v, e in NOT_ARRAYS],
        ("key-int", {"key": torch.ones(2, HKV, D, dtype=torch.int32)}, TE),
        ("key-f16", {"key": _kv(dtype=torch.float16)}, TE),
        ("key-f64", {"key": _kv(dtype=torch.float64)}, TE),
        ("key-2d", {"key": _kv()[:, 0]}, IE),
        ("key-heads", {"key": _kv(heads=2)}, IE),
        ("key-dim", {"key": _kv(dim=4)}, IE),
        ("value-count", {"value": _kv(n=3)}, IE),
        *_index_array_cases("slot_mapping", (2,), np.array([17, 2])),
        ("slot_mapping-count", {"slot_mapping": np.array([1, 2, 3])}, IE),
        ("slot-num-slots", {"slot_mapping": np.array([NB * BS, 2])}, IE),
        ("slot-huge", {"slot_mapping": np.array([2**40, 2])}, IE),
        ("slot-u64-max", {"slot_mapping": np.array([2**64 - 1, 2], np.uint64)}, IE),
        ("slot-duplicate", {"slot_mapping": np.array([5, 5])}, IE),
        *_cache_cases(c),
        ("caches-readonly", {"k_cache": ro_k, "v_cache": ro_v, "key": _np(_kv()),
                             "value": _np(_kv())}, IE),
        ("v-cache-readonly", {"k_cache": _np(c.k_cache), "v_cache": ro_v, "key": _np(_kv()),
                              "value": _np(_kv())}, IE),
        ("check-str", {"check": "no"}, TE),
    ]


WRITE_CASES = _write_cases()


@pytest.mark.parametrize("over, err", [c[1:] for c in WRITE_CASES],
                         ids=[c[0] for c in WRITE_CASES])
def test_write_kv_refuses_and_changes_nothing(over, err):
    c = _case()
    _refused(write_kv, _write_args(c, **over), err)


@pytest.mark.parametrize("slots", [
    torch.tensor([17, 2], dtype=torch.int32), np.array([17, 2], dtype=np.uint8),
    np.array([17, -1], dtype=np.int16), np.array([-1, -1]),
], ids=["torch-i32", "np-u8", "padding", "all-padding"])
@pytest.mark.parametrize("check", [True, np.bool_(True), False])
def test_write_kv_accepts_any_integer_slots(slots, check):
    c, ref = _case(), _case()
    args = _write_args(c, slot_mapping=slots, check=check)
    write_kv(**args)
    write_kv_reference(args["key"], args["value"], ref.k_cache, ref.v_cache,
                       torch.as_tensor(np.asarray(slots, dtype=np.int64)))
    assert np.array_equal(_np(c.k_cache), _np(ref.k_cache), equal_nan=True)
    assert np.array_equal(_np(c.v_cache), _np(ref.v_cache), equal_nan=True)


# ---- copy_blocks -----------------------------------------------------------------------------

def _copy_args(c, **over):
    args = dict(k_cache=c.k_cache, v_cache=c.v_cache, pairs=np.array([[0, 3]], np.int32))
    args.update(over)
    return args


def _copy_cases():
    c = _case()
    return [
        *_index_array_cases("pairs", (1, 2), np.array([[0, 3]])),
        ("pairs-1d", {"pairs": np.array([0, 3])}, IE),
        ("pairs-3-cols", {"pairs": np.array([[0, 3, 1]])}, IE),
        ("pair-neg", {"pairs": np.array([[-1, 3]])}, IE),
        ("pair-num-blocks", {"pairs": np.array([[0, NB]])}, IE),
        ("pair-huge", {"pairs": np.array([[2**40, 3]])}, IE),
        ("pair-u64-max", {"pairs": np.array([[2**64 - 1, 3]], np.uint64)}, IE),
        ("pair-self", {"pairs": np.array([[2, 2]])}, IE),
        ("pair-dst-twice", {"pairs": np.array([[0, 3], [1, 3]])}, IE),
        ("pair-dst-is-src", {"pairs": np.array([[0, 3], [3, 1]])}, IE),
        *_cache_cases(c),
        ("caches-readonly", {"k_cache": _readonly(c.k_cache), "v_cache": _readonly(c.v_cache)},
         IE),
    ]


COPY_CASES = _copy_cases()


@pytest.mark.parametrize("over, err", [c[1:] for c in COPY_CASES],
                         ids=[c[0] for c in COPY_CASES])
def test_copy_blocks_refuses_and_changes_nothing(over, err):
    c = _case()
    _refused(copy_blocks, _copy_args(c, **over), err)


@pytest.mark.parametrize("pairs", [torch.tensor([[0, 3]]), np.array([[0, 3]], np.uint16),
                                   np.zeros((0, 2), np.int64)], ids=["torch", "u16", "empty"])
def test_copy_blocks_accepts_any_integer_pairs(pairs):
    c, ref = _case(), _case()
    copy_blocks(c.k_cache, c.v_cache, pairs)
    copy_blocks_reference(ref.k_cache, ref.v_cache, np.asarray(pairs, dtype=np.int64))
    assert np.array_equal(_np(c.k_cache), _np(ref.k_cache), equal_nan=True)
    assert np.array_equal(_np(c.v_cache), _np(ref.v_cache), equal_nan=True)


# ---- KVCachePool -----------------------------------------------------------------------------

POOL_ARGS = (1, 4, 2, 1, 4)  # num_layers, num_blocks, block_size, num_kv_heads, head_dim
POOL_NAMES = ("num_layers", "num_blocks", "block_size", "num_kv_heads", "head_dim")
BAD_SIZES = [(True, TE), (False, TE), (np.bool_(True), TE), (1.0, TE), (2.5, TE),
             (float("nan"), TE), (float("inf"), TE), ("2", TE), (None, TE),
             (np.float64(2.0), TE), ([2], TE), (0, IE), (-1, IE), (-(2**70), IE), (2**70, IE)]


@pytest.mark.parametrize("pos", range(5), ids=POOL_NAMES)
@pytest.mark.parametrize("bad, err", BAD_SIZES, ids=[repr(b) for b, _ in BAD_SIZES])
def test_pool_refuses_bad_sizes(pos, bad, err):
    args = list(POOL_ARGS)
    args[pos] = bad
    with pytest.raises(err):
        KVCachePool(*args, torch.float32)


def test_pool_refuses_a_pool_too_large_to_allocate():
    with pytest.raises(KernelInputError):
        KVCachePool(2**20, 2**20, 2**10, 2**10, 2**10, torch.float32)


@pytest.mark.parametrize("conv", [np.int64, np.int32, np.uint8, int], ids=stable_id)
def test_pool_accepts_numpy_int_sizes(conv):
    pool = KVCachePool(*map(conv, POOL_ARGS), torch.float32)
    got = (pool.num_layers, pool.num_blocks, pool.block_size, pool.num_kv_heads, pool.head_dim)
    assert got == POOL_ARGS and all(type(v) is int for v in got)
    assert pool.layer(0)[0].shape == (4, 2, 1, 4)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float64, torch.bool, "float64", "int8",
                                   "nonsense", "", None, np.float64, np.int32, float, int, 5,
                                   [1], np.array([1, 2])], ids=stable_id)
def test_pool_refuses_bad_dtype(dtype):
    with pytest.raises(KernelTypeError):
        KVCachePool(*POOL_ARGS, dtype)


@pytest.mark.parametrize("dtype, want", [(np.float16, torch.float16),
                                         (np.dtype("float32"), torch.float32),
                                         ("BF16", torch.bfloat16), ("half", torch.float16)],
                         ids=stable_id)
def test_pool_accepts_dtype_spellings(dtype, want):
    assert KVCachePool(*POOL_ARGS, dtype).dtype == want


@pytest.mark.parametrize("device, err", [("nonsense", DE), ("cuda:99", DE), (5, TE),
                                         (None, TE), (1.5, TE)], ids=stable_id)
def test_pool_refuses_bad_device(device, err):
    with pytest.raises(err):
        KVCachePool(*POOL_ARGS, torch.float32, device=device)


def _pool(dtype=torch.float32):
    pool = KVCachePool(2, 4, 2, 1, 4, dtype).fill_(float("nan"))
    pool.fill_blocks_([1], 1.0)
    return pool


def _pool_refused(pool, fn, err):
    before = _np(pool._storage)
    with pytest.raises(err) as info:
        fn(pool)
    assert isinstance(info.value, KernelError)
    assert np.array_equal(_np(pool._storage), before, equal_nan=True)


@pytest.mark.parametrize("i, err", [(True, TE), (1.0, TE), ("0", TE), (None, TE),
                                    (np.bool_(False), TE), (-1, IE), (2, IE), (2**70, IE)],
                         ids=stable_id)
def test_pool_layer_refuses(i, err):
    _pool_refused(_pool(), lambda p: p.layer(i), err)


def test_pool_layer_accepts_numpy_ints():
    pool = _pool()
    for i in (np.int64(1), np.uint8(1)):
        k, v = pool.layer(i)
        assert k.data_ptr() == pool.layer(1)[0].data_ptr()


@pytest.mark.parametrize("value, err", [("x", TE), (None, TE), (True, TE), (np.bool_(True), TE),
                                        (1j, TE), ([1.0], TE), (10**400, IE)], ids=stable_id)
def test_pool_fill_refuses(value, err):
    _pool_refused(_pool(), lambda p: p.fill_(value), err)
    _pool_refused(_pool(), lambda p: p.fill_blocks_([0], value), err)


def test_pool_fill_refuses_a_value_float16_cannot_hold():
    _pool_refused(_pool(torch.float16), lambda p: p.fill_(1e10), KernelInputError)
    _pool_refused(_pool(torch.float16), lambda p: p.fill_blocks_([0], 1e10), KernelInputError)


@pytest.mark.parametrize("ids, err", [
    ([1.5], TE), ([True], TE), (np.array([1.0]), TE), ("0", TE), (b"\x00", TE), (None, TE),
    ([0, "a"], TE), ([[0], [1, 2]], TE), (torch.tensor([0.5]), TE), ([[0, 1]], IE),
    ([4], IE), ([-1], IE), ([2**70], IE), ([-1, 2**63], TE), (np.array([2**64 - 1]), IE),
], ids=stable_id)
def test_pool_fill_blocks_refuses_bad_ids(ids, err):
    _pool_refused(_pool(), lambda p: p.fill_blocks_(ids, 0.0), err)


@pytest.mark.parametrize("ids", [np.int64(2), np.array([2], np.uint8), torch.tensor([2]), [2],
                                 range(2, 3), np.array([2], dtype=object)], ids=stable_id)
def test_pool_fill_blocks_accepts_integer_ids(ids):
    pool, ref = _pool(), _pool()
    pool.fill_blocks_(ids, np.float32(3.0))
    ref.fill_blocks_([2], 3.0)
    assert np.array_equal(_np(pool._storage), _np(ref._storage), equal_nan=True)
    assert (pool.layer(1)[1][2] == 3).all()
    empty = _np(pool._storage)
    pool.fill_blocks_([], 9.0)
    assert np.array_equal(_np(pool._storage), empty, equal_nan=True)


@pytest.mark.parametrize("pairs, err", [([[0, 3]], TE), (None, TE), ("pairs", TE),
                                        (np.array([[0.0, 3.0]]), TE), (np.array([[0, 4]]), IE),
                                        (np.array([[1, 1]]), IE), (np.array([0, 3]), IE)],
                         ids=stable_id)
def test_pool_copy_blocks_refuses_and_changes_no_layer(pairs, err):
    _pool_refused(_pool(), lambda p: p.copy_blocks(pairs), err)


# ---- helpers: choose_partition_size, default_config ------------------------------------------

@pytest.mark.parametrize("pos, bad, err", [
    (0, "8", TE), (0, None, TE), (0, -1, IE), (1, True, TE), (1, 1.5, TE), (1, -1, IE),
    (2, 0, IE), (2, float("nan"), TE), (3, 0, IE), (3, np.bool_(True), TE),
])
def test_choose_partition_size_refuses(pos, bad, err):
    args = [8, 32_768, 132, 16]
    args[pos] = bad
    with pytest.raises(err):
        choose_partition_size(*args)


def test_choose_partition_size_accepts_numpy_ints():
    want = choose_partition_size(8, 32_768, 132, 16)
    assert want is not None
    assert choose_partition_size(np.int64(8), np.int32(32_768), np.uint8(132), np.int16(16)) \
        == want


@pytest.mark.parametrize("args, kw, err", [
    ((8, 1, "f64"), {"prefill": False}, TE), ((8, 1, None), {"prefill": False}, TE),
    ((0, 1, "f32"), {"prefill": False}, IE), ((8, True, "f32"), {"prefill": False}, TE),
    ((8.0, 1, "f32"), {"prefill": False}, TE), ((8, 1, "f32"), {"prefill": "no"}, TE),
])
def test_default_config_refuses(args, kw, err):
    with pytest.raises(err):
        default_config(*args, **kw)


def test_default_config_accepts_numpy_ints():
    assert default_config(np.int64(8), np.int32(2), "f16", prefill=np.bool_(True)) == \
        default_config(8, 2, "f16", prefill=True)
