"""Hostile arguments to every public call of BlockAllocator, BlockPool and the hashing helpers.

The contract (allocator/errors.py): a refused call raises an ``AllocatorError`` subclass and
changes nothing observable. Each refused case here is run on a non-trivial allocator (shared
committed prefix, a fork, a freed request whose blocks are CACHED, a completed-but-unreclaimed
launch and a launch still in flight) and compared with a snapshot of everything the public API
can see. NumPy integers given as counts, token ids and block ids are accepted and behave
exactly like ints.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from pagedkv.allocator import (
    AllocatorError,
    BlockAllocator,
    CommitError,
    DoubleFree,
    DuplicateRequest,
    GuardViolation,
    InvalidArgument,
    OutOfBlocks,
    PendingAccess,
    PublishError,
    StaleTableError,
    UnknownRequest,
    block_hash,
    chain_hashes,
)
from pagedkv.allocator.errors import EventError
from pagedkv.spec import (
    ALLOCATED,
    CACHED,
    FREE,
    PUBLISHED,
    RECLAIMED,
    REFERENCED,
    states_equal,
)
from pagedkv.spec.requests import summary

NAN, INF = float("nan"), float("inf")
NB, BS = 16, 4  # the world's pool


# ---- helpers ---------------------------------------------------------------------------------
class FakeEvent:
    """A completion event: ``query()`` returns ``done``, or raises ``error`` when set."""

    def __init__(self, done: bool = False) -> None:
        self.done = done
        self.error: BaseException | None = None

    def query(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.done


class FakeKVPool:
    """Stands in for kernels.KVCachePool in attach_pool; ``missing`` names absent attributes."""

    def __init__(self, missing: tuple[str, ...] = (), **attrs) -> None:
        values = dict(num_blocks=NB, block_size=BS, bytes_per_block=1024,
                      reserved_bytes=NB * 1024)
        values.update(attrs)
        for name, value in values.items():
            if name not in missing:
                setattr(self, name, value)


def run_step(a: BlockAllocator, rid, n: int):
    """allocate n positions, launch, complete, commit them; the (completed) launch."""
    a.allocate(rid, n)
    launch = a.publish([rid])
    launch.complete()
    a.commit(rid, n)
    a.check_invariants()
    return launch


def snapshot(a: BlockAllocator, *, ids: bool = True) -> dict:
    """Everything the public API can observe (``ids=False``: comparable across allocators)."""
    ab = a.abstract()
    return {
        "stats": a.stats(),
        "requests": [
            (r, a.block_table(r), a.num_computed(r), a.num_reserved(r)) for r in a.requests
        ],
        "blocks": [(a.state(b), a.ref_count(b)) for b in range(a.num_blocks)],
        "generations": a.block_generations().tolist(),
        "inflight": [(id(x) if ids else None, x.completed) for x in a.inflight],
        "queue": a.pool.queue.order(),
        "pool": ab.pool,
        "tables": summary(ab.requests),
    }


def assert_same_snapshot(before: dict, after: dict) -> None:
    assert states_equal(before["pool"], after["pool"]) == []
    assert after["tables"] == before["tables"]
    for key in ("stats", "requests", "blocks", "generations", "inflight", "queue"):
        assert after[key] == before[key], key


def assert_unchanged(a: BlockAllocator, before: dict) -> None:
    assert_same_snapshot(before, snapshot(a))


def same(x, y) -> None:
    """Equal, and of the same types all the way down (np.int64 where an int was is a leak)."""
    assert type(x) is type(y), (x, y)
    if isinstance(x, dict):
        assert x.keys() == y.keys()
        for k in x:
            same(x[k], y[k])
    elif isinstance(x, list | tuple):
        assert len(x) == len(y), (x, y)
        for u, v in zip(x, y, strict=True):
            same(u, v)
    elif isinstance(x, np.ndarray):
        assert x.dtype == y.dtype and np.array_equal(x, y), (x, y)
    else:
        assert x == y, (x, y)


def build_world() -> SimpleNamespace:
    """A non-trivial allocator state, so that "unchanged" means something.

    a   : 9 tokens committed: a0, a1 REFERENCED (a shared prefix), a2 PUBLISHED partial
    d   : freed while its launch ran; the launch's event says done, not yet reclaimed:
          d0, d1 RECLAIMED, retired above the watermark (its launch is in flight)
    b   : hits a's prefix (a0, a1) + b2, its writing launch is in flight (event not done)
    a2  : a fork of a (shares a0, a1, a2)
    c   : committed then freed: c0, c1 CACHED (busy: launches published before it was freed
          are still in flight); its completed launch is now stale
    w   : w0 written by a completed launch, not committed (PUBLISHED, full)
    n   : registered, nothing allocated
    t   : 4 positions allocated, only 2 token ids known (t0 ALLOCATED)
    """
    a = BlockAllocator(NB, BS)
    a.add_request("a", list(range(9)))
    run_step(a, "a", 9)
    a0, a1, a2 = a.block_table("a")

    a.add_request("d", list(range(300, 306)))
    d0, d1 = a.allocate("d", 6)
    done = a.publish(["d"])
    done_ev = FakeEvent(done=True)
    done.record(done_ev)
    a.free("d")

    assert a.add_request("b", list(range(8)) + [50, 51]) == 8
    b_table = a.allocate("b", 10)
    assert b_table[:2] == [a0, a1]
    b2 = b_table[2]
    pending = a.publish(["b"])
    pending_ev = FakeEvent(done=False)
    pending.record(pending_ev)

    assert a.fork("a", "a2") == [a0, a1, a2]

    a.add_request("c", list(range(100, 109)))
    stale = run_step(a, "c", 9)
    c0, c1, _ = a.block_table("c")
    a.free("c")

    a.add_request("w", list(range(200, 205)))
    (w0,) = a.allocate("w", 4)
    a.publish(["w"]).complete()

    a.add_request("n", list(range(400, 420)))
    a.add_request("t", [1, 2])
    (t0,) = a.allocate("t", 4)

    free = next(b for b in range(NB) if a.state(b) == FREE)
    blocks = dict(a0=a0, a1=a1, a2=a2, b2=b2, c0=c0, c1=c1, d0=d0, d1=d1, w0=w0, t0=t0,
                  free=free)
    expected = dict(a0=REFERENCED, a1=REFERENCED, a2=PUBLISHED, b2=PUBLISHED, c0=CACHED,
                    c1=CACHED, d0=RECLAIMED, d1=RECLAIMED, w0=PUBLISHED, t0=ALLOCATED, free=FREE)
    assert {k: a.state(b) for k, b in blocks.items()} == expected
    assert a.ref_count(a0) == 3 and a.ref_count(a2) == 2
    assert a.inflight == (done, pending)
    a.check_invariants()
    return SimpleNamespace(alloc=a, pool=a.pool, b=blocks, done=done, done_ev=done_ev,
                           pending=pending, pending_ev=pending_ev, stale=stale)


@pytest.fixture
def world() -> SimpleNamespace:
    return build_world()


def case(id_: str, call, error, prep=None):
    return pytest.param(prep, call, error, id=id_)


def check_refused(w: SimpleNamespace, prep, call, error) -> AllocatorError:
    a = w.alloc
    if prep is not None:
        prep(w)
        a.check_invariants()
    before = snapshot(a)
    with pytest.raises(error) as info:
        call(w)
    err = info.value
    assert isinstance(err, AllocatorError)
    assert_unchanged(a, before)
    a.check_invariants()
    return err


def exhaust(w: SimpleNamespace) -> None:
    """Take every usable block (reclaiming d's first), so nothing is usable or waiting."""
    a = w.alloc
    a.reclaim()
    assert w.done.completed
    a.add_request("fill", list(range(500, 500 + 4 * NB)))
    a.allocate("fill", BS * a.stats()["allocatable_now"])
    assert a.stats()["allocatable_now"] == 0


# ---- argument classes ------------------------------------------------------------------------
BAD_COUNTS = [
    ("str", "8"), ("float", 8.0), ("bool", True), ("nan", NAN), ("inf", INF), ("neg", -1),
    ("none", None), ("list", [8]), ("2**63", 2**63), ("2**100", 2**100),
]
BAD_TOKEN_LISTS = [
    ("bare-str", "abc"), ("bare-bytes", b"abc"), ("bytearray", bytearray(b"ab")),
    ("none", None), ("int", 5), ("set", {1, 2}), ("dict", {1: 2}),
    ("float-item", [1, 1.5]), ("bool-item", [1, True]), ("nan-item", [NAN]),
    ("inf-item", [INF]), ("str-item", [1, "2"]), ("nested", [[1, 2]]),
    ("2**63-item", [2**63]), ("2**100-item", [2**100]), ("below-int64", [-(2**63) - 1]),
    ("float-array", np.array([1.0, 2.0])), ("bool-array", np.array([True, False])),
]
BAD_EXTRA_KEYS = [
    ("bare-str", "lora"), ("bare-bytes", b"lora"), ("none", None), ("int", 5),
    ("set", {"lora"}), ("bool-item", [True]), ("float-item", [1.5]), ("nan-item", [NAN]),
    ("list-item", [["x"]]), ("none-item", [None]),
]
BAD_SALTS = [("int", 5), ("bool", True), ("list", ["s"]), ("float", 1.5), ("nan", NAN)]
BAD_BLOCK_IDS = [
    ("neg", -1), ("num_blocks", NB), ("2**63", 2**63), ("2**100", 2**100), ("bool", True),
    ("float", 1.0), ("str", "0"), ("nan", NAN), ("inf", INF), ("none", None), ("list", [0]),
]
UNHASHABLE = [("list", ["a"]), ("dict", {"a": 1}), ("tuple-with-list", ("a", ["b"]))]
ABSENT = [("unknown", "ghost"), ("freed", "c"), ("none", None)]


def lookups(method: str) -> list:
    """Cases for a call that takes one request id."""
    return [
        *(case(f"{k}-rid", lambda w, r=r: getattr(w.alloc, method)(r), UnknownRequest)
          for k, r in ABSENT),
        *(case(f"unhashable-{k}-rid", lambda w, r=r: getattr(w.alloc, method)(r),
               InvalidArgument) for k, r in UNHASHABLE),
    ]


# ---- BlockAllocator --------------------------------------------------------------------------
CONSTRUCTOR_CASES = [
    *(pytest.param(dict(num_blocks=v), id=f"num_blocks-{k}")
      for k, v in BAD_COUNTS + [("zero", 0)]),
    *(pytest.param(dict(block_size=v), id=f"block_size-{k}")
      for k, v in BAD_COUNTS + [("zero", 0)]),
    pytest.param(dict(prefix_caching="no"), id="prefix_caching-str"),
    pytest.param(dict(checked="yes"), id="checked-str"),
]


@pytest.mark.parametrize("kwargs", CONSTRUCTOR_CASES)
def test_constructor_refuses(kwargs):
    args = dict(num_blocks=8, block_size=4) | kwargs
    num_blocks, block_size = args.pop("num_blocks"), args.pop("block_size")
    with pytest.raises(InvalidArgument) as info:
        BlockAllocator(num_blocks, block_size, **args)
    assert isinstance(info.value, AllocatorError)


ADD_REQUEST_CASES = [
    case("duplicate-rid", lambda w: w.alloc.add_request("a", [1, 2]), DuplicateRequest),
    case("duplicate-rid-not-started", lambda w: w.alloc.add_request("n", [1]),
         DuplicateRequest),
    *(case(f"unhashable-{k}-rid", lambda w, r=r: w.alloc.add_request(r, [1, 2]),
           InvalidArgument) for k, r in UNHASHABLE),
    case("nan-rid", lambda w: w.alloc.add_request(NAN, [1, 2]), InvalidArgument),
    *(case(f"tokens-{k}", lambda w, v=v: w.alloc.add_request("x", v), InvalidArgument)
      for k, v in BAD_TOKEN_LISTS),
    *(case(f"cache_salt-{k}", lambda w, v=v: w.alloc.add_request("x", [1], cache_salt=v),
           InvalidArgument) for k, v in BAD_SALTS),
    *(case(f"extra_keys-{k}", lambda w, v=v: w.alloc.add_request("x", [1], extra_keys=v),
           InvalidArgument) for k, v in BAD_EXTRA_KEYS),
]


@pytest.mark.parametrize("prep, call, error", ADD_REQUEST_CASES)
def test_add_request_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


ALLOCATE_CASES = [
    *(case(f"{k}-rid", lambda w, r=r: w.alloc.allocate(r, 4), UnknownRequest)
      for k, r in ABSENT),
    *(case(f"unhashable-{k}-rid", lambda w, r=r: w.alloc.allocate(r, 4), InvalidArgument)
      for k, r in UNHASHABLE),
    *(case(f"num_tokens-{k}", lambda w, v=v: w.alloc.allocate("n", v), InvalidArgument)
      for k, v in BAD_COUNTS),
    case("shrink", lambda w: w.alloc.allocate("a", 8), InvalidArgument),
    case("out-of-blocks-far", lambda w: w.alloc.allocate("n", 1000), OutOfBlocks),
    # 11 blocks: more than the 8 usable plus the 2 that d's completed launch would give back
    case("out-of-blocks-even-after-reclaim", lambda w: w.alloc.allocate("n", 4 * 11),
         OutOfBlocks),
    case("out-of-blocks-exhausted", lambda w: w.alloc.allocate("n", 4), OutOfBlocks, exhaust),
]


@pytest.mark.parametrize("prep, call, error", ALLOCATE_CASES)
def test_allocate_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


APPEND_TOKENS_CASES = [
    *(case(f"{k}-rid", lambda w, r=r: w.alloc.append_tokens(r, [1]), UnknownRequest)
      for k, r in ABSENT),
    *(case(f"unhashable-{k}-rid", lambda w, r=r: w.alloc.append_tokens(r, [1]),
           InvalidArgument) for k, r in UNHASHABLE),
    *(case(f"tokens-{k}", lambda w, v=v: w.alloc.append_tokens("n", v), InvalidArgument)
      for k, v in BAD_TOKEN_LISTS),
]


@pytest.mark.parametrize("prep, call, error", APPEND_TOKENS_CASES)
def test_append_tokens_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


COMMIT_CASES = [
    *(case(f"{k}-rid", lambda w, r=r: w.alloc.commit(r, 0), UnknownRequest)
      for k, r in ABSENT),
    *(case(f"unhashable-{k}-rid", lambda w, r=r: w.alloc.commit(r, 0), InvalidArgument)
      for k, r in UNHASHABLE),
    *(case(f"num_tokens-{k}", lambda w, v=v: w.alloc.commit("w", v), InvalidArgument)
      for k, v in BAD_COUNTS),
    case("past-issued", lambda w: w.alloc.commit("w", 5), CommitError),
    case("below-computed", lambda w: w.alloc.commit("a", 8), CommitError),
    case("write-pending", lambda w: w.alloc.commit("b", 10), CommitError),
    case("never-launched", lambda w: w.alloc.commit("t", 1), CommitError),
]


@pytest.mark.parametrize("prep, call, error", COMMIT_CASES)
def test_commit_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


FORK_CASES = [
    *(case(f"{k}-parent", lambda w, r=r: w.alloc.fork(r, "kid"), UnknownRequest)
      for k, r in ABSENT),
    *(case(f"unhashable-{k}-parent", lambda w, r=r: w.alloc.fork(r, "kid"), InvalidArgument)
      for k, r in UNHASHABLE),
    *(case(f"unhashable-{k}-child", lambda w, r=r: w.alloc.fork("a", r), InvalidArgument)
      for k, r in UNHASHABLE),
    case("nan-child", lambda w: w.alloc.fork("a", NAN), InvalidArgument),
    case("duplicate-child", lambda w: w.alloc.fork("a", "b"), DuplicateRequest),
    case("child-is-parent", lambda w: w.alloc.fork("a", "a"), DuplicateRequest),
    # t's block was never published: the child needs a fresh one, and none is left
    case("out-of-blocks", lambda w: w.alloc.fork("t", "kid"), OutOfBlocks, exhaust),
]


@pytest.mark.parametrize("prep, call, error", FORK_CASES)
def test_fork_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


FREE_CASES = [
    *lookups("free"),
    case("unhashable-set-rid", lambda w: w.alloc.free({"a"}), InvalidArgument),
]


@pytest.mark.parametrize("prep, call, error", FREE_CASES)
def test_free_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


def _cow_ready(w: SimpleNamespace) -> None:
    """a2's next publish must copy the partial block it shares with a; nothing is left."""
    w.alloc.append_tokens("a2", [9])
    w.alloc.allocate("a2", 10)
    exhaust(w)


PUBLISH_CASES = [
    case("bare-str", lambda w: w.alloc.publish("ab"), InvalidArgument),
    case("bare-str-one-rid", lambda w: w.alloc.publish("a"), InvalidArgument),
    case("bare-bytes", lambda w: w.alloc.publish(b"ab"), InvalidArgument),
    case("none", lambda w: w.alloc.publish(None), InvalidArgument),
    case("int", lambda w: w.alloc.publish(5), InvalidArgument),
    case("set", lambda w: w.alloc.publish({"a"}), InvalidArgument),
    case("empty", lambda w: w.alloc.publish([]), InvalidArgument),
    case("rid-twice", lambda w: w.alloc.publish(["a", "a"]), InvalidArgument),
    case("unhashable-list-rid", lambda w: w.alloc.publish([["a"]]), InvalidArgument),
    case("unhashable-dict-rid", lambda w: w.alloc.publish(["a", {"a": 1}]), InvalidArgument),
    case("unknown-rid", lambda w: w.alloc.publish(["a", "ghost"]), UnknownRequest),
    case("freed-rid", lambda w: w.alloc.publish(["c"]), UnknownRequest),
    case("nothing-allocated", lambda w: w.alloc.publish(["n"]), InvalidArgument),
    case("copy-on-write-out-of-blocks", lambda w: w.alloc.publish(["a2"]), OutOfBlocks,
         _cow_ready),
]


@pytest.mark.parametrize("prep, call, error", PUBLISH_CASES)
def test_publish_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


EVENT_FAILURES = [
    ("runtime", RuntimeError("device lost")), ("value", ValueError("bad handle")),
    ("key", KeyError("stream")), ("zero-division", ZeroDivisionError("x")),
    ("os", OSError("driver")),
]


def _break(which: str, exc: BaseException):
    def prep(w: SimpleNamespace) -> None:
        getattr(w, which).error = exc
    return prep


RECLAIM_CASES = [
    *(case(f"pending-event-{k}", lambda w: w.alloc.reclaim(), EventError,
           _break("pending_ev", exc)) for k, exc in EVENT_FAILURES),
    # the first launch polled fails: the second, done one must not be completed either
    *(case(f"done-event-{k}", lambda w: w.alloc.reclaim(), EventError,
           _break("done_ev", exc)) for k, exc in EVENT_FAILURES[:1]),
]


@pytest.mark.parametrize("prep, call, error", RECLAIM_CASES)
def test_reclaim_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)
    assert not world.done.completed and not world.pending.completed


def _foreign_launch():
    other = BlockAllocator(NB, BS)
    other.add_request("a", list(range(9)))
    other.allocate("a", 9)
    return other.publish(["a"])


VALIDATE_CASES = [
    case("none", lambda w: w.alloc.validate(None), InvalidArgument),
    case("str", lambda w: w.alloc.validate("launch"), InvalidArgument),
    case("int", lambda w: w.alloc.validate(5), InvalidArgument),
    case("stale", lambda w: w.alloc.validate(w.stale), StaleTableError),
    case("another-allocators-launch", lambda w: w.alloc.validate(_foreign_launch()),
         InvalidArgument),
]


@pytest.mark.parametrize("prep, call, error", VALIDATE_CASES)
def test_validate_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("block_id", [pytest.param(v, id=k) for k, v in BAD_BLOCK_IDS])
def test_state_refuses(world, block_id):
    check_refused(world, None, lambda w: w.alloc.state(block_id), InvalidArgument)


@pytest.mark.parametrize("block_id", [pytest.param(v, id=k) for k, v in BAD_BLOCK_IDS])
def test_ref_count_refuses(world, block_id):
    check_refused(world, None, lambda w: w.alloc.ref_count(block_id), InvalidArgument)


@pytest.mark.parametrize("prep, call, error", lookups("block_table"))
def test_block_table_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", lookups("num_computed"))
def test_num_computed_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", lookups("num_reserved"))
def test_num_reserved_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


def _attach(**kw):
    return lambda w: w.alloc.attach_pool(FakeKVPool(**kw))


ATTACH_POOL_CASES = [
    case("none", lambda w: w.alloc.attach_pool(None), InvalidArgument),
    case("object", lambda w: w.alloc.attach_pool(object()), InvalidArgument),
    case("num_blocks-mismatch", _attach(num_blocks=NB // 2), InvalidArgument),
    case("block_size-mismatch", _attach(block_size=BS * 2), InvalidArgument),
    case("num_blocks-float", _attach(num_blocks=float(NB)), InvalidArgument),
    case("block_size-str", _attach(block_size=str(BS)), InvalidArgument),
    case("bytes_per_block-missing", _attach(missing=("bytes_per_block",)), InvalidArgument),
    case("reserved_bytes-missing", _attach(missing=("reserved_bytes",)), InvalidArgument),
    *(case(f"bytes_per_block-{k}", _attach(bytes_per_block=v), InvalidArgument)
      for k, v in [("neg", -1), ("str", "1024"), ("nan", NAN), ("bool", True),
                   ("2**63", 2**63), ("none", None)]),
    *(case(f"reserved_bytes-{k}", _attach(reserved_bytes=v), InvalidArgument)
      for k, v in [("neg", -5), ("float", 1.5), ("2**100", 2**100)]),
    # a refused attach keeps the pool attached before it
    case("replace-attached", _attach(bytes_per_block="x"), InvalidArgument,
         lambda w: w.alloc.attach_pool(FakeKVPool())),
]


@pytest.mark.parametrize("prep, call, error", ATTACH_POOL_CASES)
def test_attach_pool_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


# ---- BlockPool transitions -------------------------------------------------------------------
def bad_ids(transition: str, call):
    """``call(w, b)`` with every malformed block id."""
    return [case(f"b-{k}", lambda w, b=b: call(w, b), InvalidArgument) for k, b in BAD_BLOCK_IDS]


def unhashable_holder(call):
    return [case(f"unhashable-{k}-holder", lambda w, r=r: call(w, r), InvalidArgument)
            for k, r in UNHASHABLE]


POOL_CASES = {
    "allocate": [
        *bad_ids("allocate", lambda w, b: w.pool.allocate(b, "n")),
        case("referenced", lambda w: w.pool.allocate(w.b["a0"], "n"), GuardViolation),
        case("reclaimed-pinned", lambda w: w.pool.allocate(w.b["d0"], "n"), GuardViolation),
        case("cached", lambda w: w.pool.allocate(w.b["c0"], "n"), GuardViolation),
        case("closed-holder", lambda w: w.pool.allocate(w.b["free"], "ghost"),
             GuardViolation),
        *unhashable_holder(lambda w, r: w.pool.allocate(w.b["free"], r)),
    ],
    "publish": [
        *bad_ids("publish", lambda w, b: w.pool.publish(b, "t")),
        case("published", lambda w: w.pool.publish(w.b["a2"], "a"), PublishError),
        case("free", lambda w: w.pool.publish(w.b["free"], "n"), PublishError),
        case("not-holder", lambda w: w.pool.publish(w.b["t0"], "n"), PublishError),
        *unhashable_holder(lambda w, r: w.pool.publish(w.b["t0"], r)),
    ],
    "begin_write": [
        *bad_ids("begin_write", lambda w, b: w.pool.begin_write(b, "b", 1)),
        # b2 could take one more written slot: only w is wrong
        *(case(f"w-{k}", lambda w, v=v: w.pool.begin_write(w.b["b2"], "b", v),
               InvalidArgument) for k, v in BAD_COUNTS),
        case("w-past-block", lambda w: w.pool.begin_write(w.b["b2"], "b", BS + 1),
             InvalidArgument),
        case("w-zero", lambda w: w.pool.begin_write(w.b["b2"], "b", 0), PublishError),
        case("overfill", lambda w: w.pool.begin_write(w.b["w0"], "w", 1), PublishError),
        case("free", lambda w: w.pool.begin_write(w.b["free"], "n", 1), PublishError),
        case("cached", lambda w: w.pool.begin_write(w.b["c0"], "a", 1), PublishError),
        case("referenced", lambda w: w.pool.begin_write(w.b["a0"], "a", 1), PublishError),
        case("unpublished", lambda w: w.pool.begin_write(w.b["t0"], "t", 1), PublishError),
        case("write-shared", lambda w: w.pool.begin_write(w.b["a2"], "a", 1), PublishError),
        case("not-holder", lambda w: w.pool.begin_write(w.b["b2"], "n", 1), PublishError),
        *unhashable_holder(lambda w, r: w.pool.begin_write(w.b["b2"], r, 1)),
    ],
    "end_write": [
        *bad_ids("end_write", lambda w, b: w.pool.end_write(b)),
        case("nothing-pending", lambda w: w.pool.end_write(w.b["free"]), GuardViolation),
        case("no-writer-pending", lambda w: w.pool.end_write(w.b["a0"]), GuardViolation),
    ],
    "launch": [
        *(case(f"L-{k}", lambda w, v=v: w.pool.launch(v), InvalidArgument)
          for k, v in BAD_COUNTS if not k.startswith("2**")),
        case("issued-already", lambda w: w.pool.launch(w.pending.seq), GuardViolation),
        case("first", lambda w: w.pool.launch(0), GuardViolation),
        case("skips-one", lambda w: w.pool.launch(w.pool.clock[0] + 1), GuardViolation),
    ],
    "complete": [
        *(case(f"L-{k}", lambda w, v=v: w.pool.complete(v), InvalidArgument)
          for k, v in BAD_COUNTS if not k.startswith("2**")),
        case("completed", lambda w: w.pool.complete(w.stale.seq), GuardViolation),
        case("not-issued", lambda w: w.pool.complete(w.pool.clock[0]), GuardViolation),
        case("far-future", lambda w: w.pool.complete(2**63), GuardViolation),
    ],
    "advance": [
        # the oldest launch not known complete (d's: its event is done, not yet reclaimed)
        case("oldest-in-flight", lambda w: w.pool.advance(), GuardViolation),
        case("at-the-clock", lambda w: w.pool.advance(), GuardViolation,
             lambda w: (w.done.complete(), w.pending.complete())),
    ],
    "commit": [
        *bad_ids("commit", lambda w, b: w.pool.commit(b, "w", 12345)),
        case("no-hash", lambda w: w.pool.commit(w.b["w0"], "w", 0), GuardViolation),
        case("hash-taken", lambda w: w.pool.commit(w.b["w0"], "w", w.pool.hash[w.b["a0"]]),
             GuardViolation),
        *(case(f"h-{k}", lambda w, h=h: w.pool.commit(w.b["w0"], "w", h), InvalidArgument)
          for k, h in [("str", "x"), ("float", 1.5), ("bool", True), ("neg", -1),
                       ("nan", NAN), ("none", None), ("2**256", 2**256), ("list", [1])]),
        case("partial", lambda w: w.pool.commit(w.b["a2"], "a", 12345), GuardViolation),
        case("write-pending", lambda w: w.pool.commit(w.b["b2"], "b", 12345),
             GuardViolation),
        case("allocated", lambda w: w.pool.commit(w.b["t0"], "t", 12345), GuardViolation),
        case("not-holder", lambda w: w.pool.commit(w.b["w0"], "n", 12345), GuardViolation),
        *unhashable_holder(lambda w, r: w.pool.commit(w.b["w0"], r, 12345)),
    ],
    "share": [
        *bad_ids("share", lambda w, b: w.pool.share(b, "n")),
        case("free", lambda w: w.pool.share(w.b["free"], "n"), GuardViolation),
        case("reclaimed", lambda w: w.pool.share(w.b["d0"], "n"), GuardViolation),
        case("already-held", lambda w: w.pool.share(w.b["a0"], "a"), GuardViolation),
        case("allocated", lambda w: w.pool.share(w.b["t0"], "n"), GuardViolation),
        case("closed-holder", lambda w: w.pool.share(w.b["a0"], "ghost"), GuardViolation),
        *unhashable_holder(lambda w, r: w.pool.share(w.b["a0"], r)),
    ],
    "release": [
        *bad_ids("release", lambda w, b: w.pool.release(b, "a")),
        case("not-held", lambda w: w.pool.release(w.b["a0"], "n"), DoubleFree),
        case("cached", lambda w: w.pool.release(w.b["c0"], "a"), DoubleFree),
        case("free", lambda w: w.pool.release(w.b["free"], "n"), DoubleFree),
        case("closed-holder", lambda w: w.pool.release(w.b["a0"], "ghost"), DoubleFree),
        *unhashable_holder(lambda w, r: w.pool.release(w.b["a0"], r)),
    ],
    "evict": [
        *bad_ids("evict", lambda w, b: w.pool.evict(b)),
        case("referenced", lambda w: w.pool.evict(w.b["a0"]), GuardViolation),
        case("free", lambda w: w.pool.evict(w.b["free"]), GuardViolation),
        case("reclaimed", lambda w: w.pool.evict(w.b["d0"]), GuardViolation),
    ],
    "recycle": [
        *bad_ids("recycle", lambda w, b: w.pool.recycle(b)),
        case("reclaimed-pinned", lambda w: w.pool.recycle(w.b["d0"]), PendingAccess),
        case("free", lambda w: w.pool.recycle(w.b["free"]), GuardViolation),
        case("cached", lambda w: w.pool.recycle(w.b["c0"]), GuardViolation),
    ],
    "open_holder": [
        case("open", lambda w: w.pool.open_holder("a"), GuardViolation),
        *unhashable_holder(lambda w, r: w.pool.open_holder(r)),
    ],
    "close_holder": [
        case("holds-blocks", lambda w: w.pool.close_holder("a"), GuardViolation),
        case("closed", lambda w: w.pool.close_holder("ghost"), GuardViolation),
        *unhashable_holder(lambda w, r: w.pool.close_holder(r)),
    ],
}


@pytest.mark.parametrize("prep, call, error", POOL_CASES["allocate"])
def test_pool_allocate_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["publish"])
def test_pool_publish_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["begin_write"])
def test_pool_begin_write_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["end_write"])
def test_pool_end_write_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["launch"])
def test_pool_launch_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["complete"])
def test_pool_complete_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["advance"])
def test_pool_advance_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["commit"])
def test_pool_commit_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["share"])
def test_pool_share_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["release"])
def test_pool_release_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["evict"])
def test_pool_evict_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["recycle"])
def test_pool_recycle_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["open_holder"])
def test_pool_open_holder_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


@pytest.mark.parametrize("prep, call, error", POOL_CASES["close_holder"])
def test_pool_close_holder_refuses(world, prep, call, error):
    check_refused(world, prep, call, error)


# ---- hashing ---------------------------------------------------------------------------------
BLOCK_HASH_CASES = [
    *(pytest.param(dict(parent=v), id=f"parent-{k}")
      for k, v in [("neg", -1), ("2**256", 2**256), ("str", "0"), ("float", 1.5),
                   ("bool", True), ("nan", NAN), ("none", None)]),
    *(pytest.param(dict(token_ids=v), id=f"tokens-{k}") for k, v in BAD_TOKEN_LISTS),
    *(pytest.param(dict(extra_keys=v), id=f"extra_keys-{k}") for k, v in BAD_EXTRA_KEYS),
    *(pytest.param(dict(salt=v), id=f"salt-{k}") for k, v in BAD_SALTS),
]


@pytest.mark.parametrize("kwargs", BLOCK_HASH_CASES)
def test_block_hash_refuses(kwargs):
    args = dict(parent=0, token_ids=[1, 2, 3, 4], extra_keys=(), salt=None) | kwargs
    with pytest.raises(InvalidArgument) as info:
        block_hash(args["parent"], args["token_ids"], args["extra_keys"], args["salt"])
    assert isinstance(info.value, AllocatorError)


CHAIN_HASHES_CASES = [
    *(pytest.param(dict(block_size=v), id=f"block_size-{k}")
      for k, v in BAD_COUNTS + [("zero", 0)]),
    *(pytest.param(dict(start=v), id=f"start-{k}")
      for k, v in [("neg", -1), ("bool", True), ("float", 1.5), ("str", "0"), ("nan", NAN),
                   ("none", None), ("2**100", 2**100)]),
    *(pytest.param(dict(parent=v), id=f"parent-{k}")
      for k, v in [("neg", -1), ("str", "x"), ("2**256", 2**256), ("bool", True)]),
    *(pytest.param(dict(token_ids=v), id=f"tokens-{k}") for k, v in BAD_TOKEN_LISTS),
    *(pytest.param(dict(extra_keys=v), id=f"extra_keys-{k}") for k, v in BAD_EXTRA_KEYS),
    *(pytest.param(dict(salt=v), id=f"salt-{k}") for k, v in BAD_SALTS),
]


@pytest.mark.parametrize("kwargs", CHAIN_HASHES_CASES)
def test_chain_hashes_refuses(kwargs):
    args = dict(token_ids=list(range(8)), block_size=2) | kwargs
    token_ids, block_size = args.pop("token_ids"), args.pop("block_size")
    with pytest.raises(InvalidArgument) as info:
        chain_hashes(token_ids, block_size, **args)
    assert isinstance(info.value, AllocatorError)


# ---- NumPy integers are accepted, and behave exactly like ints -------------------------------
def ints(values, conv):
    return [conv(v) for v in values]


def array(values, conv):
    return list(values) if conv is int else np.asarray(list(values), dtype=conv)


def _np_constructor(w, conv):
    a = BlockAllocator(conv(8), conv(4))
    a.add_request("x", list(range(9)))
    table = a.allocate("x", 9)
    launch = a.publish(["x"])
    launch.complete()
    a.commit("x", 9)
    out = (table, launch.block_tables, launch.seq_lens, launch.slot_mapping,
           a.num_blocks, a.block_size, a.add_request("y", list(range(10))))
    return out, a


def _np_add_request(w, conv):
    a = w.alloc
    hits = a.add_request("x", ints(range(9), conv)), a.add_request("y", array(range(10), conv))
    return (hits, a.allocate("x", 9), a.allocate("y", 10)), a


def _np_allocate(w, conv):
    a = w.alloc
    table = a.allocate("n", conv(8))
    launch = a.publish(["n"])
    launch.complete()
    a.commit("n", conv(8))
    grown = a.allocate("n", conv(13))
    return (table, grown, launch.seq_lens, launch.slot_mapping, a.num_reserved("n")), a


def _np_append_tokens(w, conv):
    a = w.alloc
    a.append_tokens("n", ints([7, 8], conv))
    a.append_tokens("n", array([9], conv))
    a.allocate("n", 23)
    launch = a.publish(["n"])
    launch.complete()
    a.commit("n", 23)
    return (launch.slot_mapping, a.add_request("same", list(range(400, 420)) + [7, 8, 9])), a


def _np_commit(w, conv):
    a = w.alloc
    a.commit("w", conv(4))
    return (a.num_computed("w"), a.add_request("hit", list(range(200, 205)))), a


def _np_queries(w, conv):
    a = w.alloc
    return ([a.state(conv(b)) for b in range(NB)], [a.ref_count(conv(b)) for b in range(NB)]), a


def _np_attach_pool(w, conv):
    a = w.alloc
    a.attach_pool(FakeKVPool(num_blocks=conv(NB), block_size=conv(BS),
                             bytes_per_block=conv(1024), reserved_bytes=conv(NB * 1024)))
    return a.stats(), a


def _np_pool(step):
    def run(w, conv):
        step(w, conv)
        return None, w.alloc
    return run


def _np_pool_recycle(w, conv):
    # A recyclable block is always recycled by the pool itself (release, evict, end_write,
    # the watermark's drain): the only recycle a caller can make is a refused one.
    with pytest.raises(PendingAccess):
        w.pool.recycle(conv(w.b["d0"]))
    w.pool.evict(conv(w.b["c0"]))


def _np_block_hash(w, conv):
    h = block_hash(0, ints([1, 2, 3, 4], conv))
    return (h, block_hash(h, array([5, 6, 7, 8], conv), [7], "s")), w.alloc


def _np_chain_hashes(w, conv):
    return chain_hashes(array(range(12), conv), conv(4), start=conv(1),
                        parent=block_hash(0, [0, 1, 2, 3])), w.alloc


NUMPY_CASES = [
    pytest.param(_np_constructor, id="constructor"),
    pytest.param(_np_add_request, id="add_request-tokens"),
    pytest.param(_np_allocate, id="allocate-num_tokens"),
    pytest.param(_np_append_tokens, id="append_tokens-tokens"),
    pytest.param(_np_commit, id="commit-num_tokens"),
    pytest.param(_np_queries, id="state-ref_count-block_id"),
    pytest.param(_np_attach_pool, id="attach_pool"),
    pytest.param(_np_pool(lambda w, c: w.pool.allocate(c(w.b["free"]), "n")),
                 id="pool-allocate"),
    pytest.param(_np_pool(lambda w, c: w.pool.publish(c(w.b["t0"]), "t")), id="pool-publish"),
    pytest.param(_np_pool(lambda w, c: w.pool.begin_write(c(w.b["b2"]), "b", c(1))),
                 id="pool-begin_write"),
    pytest.param(_np_pool(lambda w, c: w.pool.end_write(c(w.b["b2"]))), id="pool-end_write"),
    pytest.param(_np_pool(lambda w, c: w.pool.launch(c(w.pool.clock[0]))), id="pool-launch"),
    pytest.param(_np_pool(lambda w, c: (w.pool.complete(c(w.done.seq)), w.pool.advance())),
                 id="pool-complete"),
    pytest.param(_np_pool(lambda w, c: w.pool.commit(c(w.b["w0"]), "w", 12345)),
                 id="pool-commit"),
    pytest.param(_np_pool(lambda w, c: w.pool.share(c(w.b["c0"]), "n")), id="pool-share"),
    pytest.param(_np_pool(lambda w, c: w.pool.release(c(w.b["a0"]), "a2")),
                 id="pool-release"),
    pytest.param(_np_pool(lambda w, c: w.pool.evict(c(w.b["c0"]))), id="pool-evict"),
    pytest.param(_np_pool(_np_pool_recycle), id="pool-recycle"),
    pytest.param(_np_block_hash, id="block_hash"),
    pytest.param(_np_chain_hashes, id="chain_hashes"),
]


@pytest.mark.parametrize("conv", [np.int64, np.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("script", NUMPY_CASES)
def test_numpy_integers_accepted(script, conv):
    expected, a_int = script(build_world(), int)
    got, a_np = script(build_world(), conv)
    same(got, expected)
    want, have = snapshot(a_int, ids=False), snapshot(a_np, ids=False)
    assert states_equal(want["pool"], have["pool"]) == []
    assert have["tables"] == want["tables"]
    for key in ("stats", "requests", "blocks", "generations", "inflight", "queue"):
        same(have[key], want[key])


def test_numpy_out_of_blocks_like_int(world):
    a = world.alloc
    before = snapshot(a)
    with pytest.raises(OutOfBlocks) as as_np:
        a.allocate("n", np.int64(1000))
    assert_unchanged(a, before)
    with pytest.raises(OutOfBlocks) as as_int:
        a.allocate("n", 1000)
    assert str(as_np.value) == str(as_int.value)
    assert_unchanged(a, before)


# ---- scenario 1: a completion event that raises ----------------------------------------------
def lost_device_world():
    """6 blocks, none usable; the only 2 that could become usable wait on a launch whose
    event raises. A completed (event done) launch that frees nothing is polled first."""
    a = BlockAllocator(6, 4)
    a.add_request("p", list(range(6)))
    run_step(a, "p", 6)  # p0 REFERENCED, p1 PUBLISHED with 2 written slots
    a.append_tokens("p", [6])
    a.fork("p", "p2")
    a.append_tokens("p2", [6])
    a.allocate("p2", 7)  # p2's next publish copies the partial block it shares with p
    a.check_invariants()
    a.add_request("fill", list(range(70, 78)))
    a.allocate("fill", 8)
    done = a.publish(["fill"])
    done.record(FakeEvent(done=True))
    a.add_request("lost-launch", list(range(60, 68)))
    lost_blocks = a.allocate("lost-launch", 8)
    lost = a.publish(["lost-launch"])
    ev = FakeEvent(done=False)
    ev.error = RuntimeError("device lost")
    lost.record(ev)
    a.free("lost-launch")
    a.add_request("q", list(range(80, 88)))
    a.check_invariants()
    assert a.stats()["allocatable_now"] == 0
    assert a.inflight == (done, lost)
    return a, lost, lost_blocks, ev, done


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda a: a.allocate("q", 8), id="allocate"),
        pytest.param(lambda a: a.publish(["p2"]), id="publish"),
        pytest.param(lambda a: a.reclaim(), id="reclaim"),
    ],
)
def test_failing_event_is_an_event_error_and_loses_nothing(call):
    a, lost, lost_blocks, ev, done = lost_device_world()
    before = snapshot(a)
    with pytest.raises(EventError) as info:
        call(a)
    err = info.value
    assert isinstance(err, AllocatorError)
    assert "lost-launch" in str(err)  # names the launch
    assert_unchanged(a, before)
    a.check_invariants()
    # nothing lost: still in flight, its blocks still waiting for it
    assert lost in a.inflight and not lost.completed and not done.completed
    assert lost.seq in a.pool.inflight
    assert all(a.state(b) == RECLAIMED for b in lost_blocks)
    assert all(a.pool.busy(b) for b in lost_blocks)
    # the same call is refused the same way again
    with pytest.raises(EventError):
        call(a)
    assert_unchanged(a, before)
    # the device comes back: reclaim completes it
    ev.error, ev.done = None, True
    assert a.reclaim() == len(lost_blocks)
    assert lost.completed and done.completed and a.inflight == ()
    assert all(a.state(b) == FREE for b in lost_blocks)
    a.check_invariants()
    call(a)
    a.check_invariants()


# ---- scenario 2: a refused allocate does not reclaim -----------------------------------------
def test_refused_allocate_does_not_reclaim_and_goes_ahead_when_reclaim_suffices():
    a = BlockAllocator(6, 4)
    a.add_request("d", list(range(8)))
    a.allocate("d", 8)
    launch = a.publish(["d"])
    ev = FakeEvent(done=False)
    launch.record(ev)
    a.free("d")  # 2 blocks wait for the launch
    a.add_request("e", list(range(10, 18)))
    a.allocate("e", 8)
    a.add_request("f", list(range(100, 124)))
    a.check_invariants()
    assert a.stats()["allocatable_now"] == 2
    before = snapshot(a)
    # 4 blocks: 2 usable + 2 waiting, but the launch is not done
    with pytest.raises(OutOfBlocks):
        a.allocate("f", 16)
    assert_unchanged(a, before)
    ev.done = True
    # 5 blocks: even reclaiming would leave it 1 short, so nothing is reclaimed
    stats = a.stats()
    with pytest.raises(OutOfBlocks) as info:
        a.allocate("f", 20)
    assert info.value.needed == 5
    assert a.stats() == stats
    assert_unchanged(a, before)
    assert not launch.completed and a.inflight == (launch,)
    # 4 blocks: reclaiming is enough, so the call goes ahead
    table = a.allocate("f", 16)
    assert len(table) == len(set(table)) == 4
    assert launch.completed and a.inflight == ()
    assert a.block_table("f") == table and a.num_reserved("f") == 16
    a.check_invariants()


# ---- scenario 3: a prefix hit on a CACHED block a pending launch reads -----------------------
@pytest.mark.parametrize("reader_done", [False, True], ids=["reader-pending", "reader-done"])
@pytest.mark.parametrize("extra", [0, 1], ids=["exact", "one-too-many"])
def test_prefix_hit_on_busy_cached_block_after_reclaim(reader_done, extra):
    a = BlockAllocator(4, 4)
    a.add_request("A", list(range(5)))
    run_step(a, "A", 5)  # a0 REFERENCED (full, committed), a1 PUBLISHED (1 slot)
    a0, a1 = a.block_table("A")
    reader = a.publish(["A"])  # reads a0 and a1
    reader.record(FakeEvent(done=reader_done))
    a.check_invariants()
    a.free("A")  # a0 CACHED but read by the launch, a1 RECLAIMED
    a.check_invariants()
    assert (a.state(a0), a.state(a1)) == (CACHED, RECLAIMED)
    a.add_request("Z", list(range(40, 44)))
    (z0,) = a.allocate("Z", 4)
    a.check_invariants()
    writer = a.publish(["Z"])
    writer.record(FakeEvent(done=True))  # reclaim would free z0
    a.check_invariants()
    a.free("Z")
    a.check_invariants()
    assert a.stats()["allocatable_now"] == 1  # the one FREE block; a0 is busy
    # usable once reclamation has run, a0 (the hit) aside: the FREE block, and z0 and a1 when
    # the reader is done too. While the reader is in flight the watermark stays below it, so
    # z0 (let go after the reader was published) waits too, although its writer is done.
    fresh = 3 if reader_done else 1
    tokens = list(range(4)) + list(range(90, 90 + 4 * fresh + 4 * extra + 1))
    assert a.add_request("B", tokens) == 4  # a0 is hit
    a.check_invariants()
    before = snapshot(a)
    n = 4 * (1 + fresh + extra)
    if extra:
        with pytest.raises(OutOfBlocks):
            a.allocate("B", n)
        assert_unchanged(a, before)
        a.check_invariants()
        return
    table = a.allocate("B", n)
    a.check_invariants()
    assert table[0] == a0 and len(table) == len(set(table)) == 1 + fresh
    assert a.block_table("B") == table
    assert a.num_computed("B") == 4 and a.num_reserved("B") == n
    assert a.state(a0) == REFERENCED and a.ref_count(a0) == 1
    # completed launches are reclaimed only when the blocks they release are needed: with
    # the reader in flight the FREE block sufficed, completing the writer would free nothing
    assert writer.completed == reader_done and reader.completed == reader_done
    assert all(a.state(b) == ALLOCATED for b in table[1:])


# ---- scenario 4: OutOfBlocks says how many blocks wait for in-flight launches ----------------
@pytest.mark.parametrize("first_done", [False, True], ids=["none-done", "one-done"])
def test_out_of_blocks_counts_blocks_waiting_for_launches(first_done):
    a = BlockAllocator(8, 4)
    a.add_request("R1", list(range(10, 18)))
    a.allocate("R1", 8)
    first = a.publish(["R1"])
    first.record(FakeEvent(done=first_done))
    a.free("R1")  # 2 RECLAIMED blocks wait for it
    a.add_request("R2", list(range(100, 105)))
    run_step(a, "R2", 5)
    r2 = a.block_table("R2")
    reader = a.publish(["R2"])
    reader.record(FakeEvent(done=False))
    a.free("R2")  # r2[0] CACHED but read, r2[1] RECLAIMED: 2 more wait
    assert [a.state(b) for b in r2] == [CACHED, RECLAIMED]
    a.add_request("H", list(range(200, 212)))
    a.allocate("H", 12)
    a.add_request("Q", list(range(300, 330)))
    a.check_invariants()
    assert a.stats()["allocatable_now"] == 1
    before = snapshot(a)
    with pytest.raises(OutOfBlocks) as info:
        a.allocate("Q", 28)  # 7 blocks: 1 usable + 4 waiting is not enough
    err = info.value
    assert_unchanged(a, before)
    assert not first.completed
    assert type(err.waiting) is int
    assert err.needed == 7
    if first_done:  # R1's blocks may count as available (reclaimable) or as waiting
        assert err.available + err.waiting == 5 and err.waiting >= 2
    else:
        assert (err.available, err.waiting) == (1, 4)
    assert re.search(rf"\b{err.waiting}\b", str(err)), str(err)


def test_out_of_blocks_with_nothing_in_flight_waits_for_nothing():
    a = BlockAllocator(4, 4)
    a.add_request("x", list(range(40)))
    with pytest.raises(OutOfBlocks) as info:
        a.allocate("x", 40)
    assert info.value.waiting == 0 and info.value.needed == 10
