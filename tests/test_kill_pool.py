"""Kills mutants of allocator/pool.py: checked mode notices, for every transition, a runtime
effect that differs from the spec's; the busy-cached accounting behind ``usable()``; the
read-only views the interpreted guards use."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv.allocator import BlockAllocator, DoubleFree, InvariantViolation, PublishError
from pagedkv.allocator.pool import BlockPool
from pagedkv.spec import CACHED, FREE, RECLAIMED, TRANSITIONS, WATERMARK

STEPS = [
    ("open_holder", lambda p: p.open_holder("r")),
    ("allocate", lambda p: p.allocate(0, "r")),
    ("publish", lambda p: p.publish(0, "r")),
    ("launch", lambda p: p.launch(0)),
    ("begin_write", lambda p: p.begin_write(0, "r", 1)),
    ("end_write", lambda p: p.end_write(0)),
    ("complete", lambda p: p.complete(0)),
    ("advance", lambda p: p.advance()),
    ("commit", lambda p: p.commit(0, "r", 7)),
    ("open_holder", lambda p: p.open_holder("s")),
    ("share", lambda p: p.share(0, "s")),
    ("launch", lambda p: p.launch(1)),  # in flight while block 0 is let go: it retires busy
    ("release", lambda p: p.release(0, "s")),
    ("release", lambda p: p.release(0, "r")),
    ("close_holder", lambda p: p.close_holder("s")),
    ("evict", lambda p: p.evict(0)),  # busy: it stays RECLAIMED
    ("complete", lambda p: p.complete(1)),
    # the watermark passes block 0's retire clock: the retire queue's drain recycles it (a
    # recyclable block is always recycled by the pool itself, never left for a caller)
    ("recycle", lambda p: p.advance()),
]


def _pool(compiled: bool, spec=None) -> BlockPool:
    p = BlockPool(3, 1, checked=True, spec=spec)
    if hasattr(p, "compile_spec"):
        p.compile_spec = compiled
    return p


@pytest.mark.parametrize("compiled", [True, False])
def test_the_steps_are_legal(compiled):
    p = _pool(compiled)
    for _, call in STEPS:
        call(p)
    assert p.state[0] == 0 and p.structure_errors() == []


def _skewed(name: str):
    """The spec's effect of ``name`` plus one extra write the runtime does not perform."""
    t = TRANSITIONS[name]

    def effect(ops, s, **kw):
        post = t.effect(ops, s, **kw)
        if "b" in kw:
            b = kw["b"]
            return post.replace(gen=ops.store(post.gen, b, post.gen[b] + 1))
        if "r" in kw:
            r = kw["r"]
            return post.replace(nheld=ops.store(post.nheld, r, post.nheld[r] + 5))
        return post.replace(gen=ops.store(post.gen, 0, post.gen[0] + 1))  # the clock's own

    return dataclasses.replace(t, effect=effect)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("name", sorted({n for n, _ in STEPS}))
def test_checked_mode_catches_a_runtime_that_differs_from_the_spec(name, compiled):
    spec = dict(TRANSITIONS)  # this pool's own spec: the module's stays as it is
    p = _pool(compiled, spec)
    first = next(i for i, (n, _) in enumerate(STEPS) if n == name)
    for _, call in STEPS[:first]:
        call(p)
    spec[name] = _skewed(name)
    with pytest.raises(InvariantViolation, match=f"refines:{name}"):
        STEPS[first][1](p)


def _reader_of_cached_prefix():
    """Request a's two full blocks are committed; a decode launch reading them is in flight
    when a is freed: the blocks are CACHED but busy."""
    a = BlockAllocator(6, 2)
    a.add_request("a", [1, 2, 3, 4, 5])
    a.allocate("a", 5)
    a.publish(["a"]).complete()
    a.commit("a", 5)
    a.append_tokens("a", [6])
    a.allocate("a", 6)
    launch = a.publish(["a"])
    a.free("a")
    return a, launch


def _usable_by_scan(a):
    p = a.pool
    return sum(1 for b in range(a.num_blocks)
               if p.state[b] == 0 or (p.state[b] == CACHED
                                      and p.retire[b] <= p.clock[WATERMARK]))


def test_busy_cached_blocks_are_not_usable_until_the_launch_completes():
    a, launch = _reader_of_cached_prefix()
    p = a.pool
    assert [p.state[b] for b in range(6)].count(CACHED) == 2
    assert p.usable() == _usable_by_scan(a) == 3
    assert a.stats()["allocatable_now"] == 3
    assert p.structure_errors() == []
    launch.complete()
    assert p.usable() == _usable_by_scan(a) == 6
    assert p.structure_errors() == []


def test_reviving_a_busy_cached_block():
    a, launch = _reader_of_cached_prefix()
    p = a.pool
    a.add_request("b", [1, 2, 3, 4, 9])
    a.allocate("b", 5)  # hits both cached blocks, still read by the launch
    assert p.usable() == _usable_by_scan(a)
    assert p.structure_errors() == []
    launch.complete()
    assert p.usable() == _usable_by_scan(a)
    assert p.structure_errors() == []
    a.free("b")
    assert p.usable() == _usable_by_scan(a) and p.structure_errors() == []


def test_evicting_a_busy_cached_block():
    a, launch = _reader_of_cached_prefix()
    p = a.pool
    cached = [b for b in range(6) if p.state[b] == CACHED]
    p.evict(cached[0])
    assert p.state[cached[0]] == RECLAIMED
    assert p.usable() == _usable_by_scan(a) and p.structure_errors() == []
    launch.complete()  # the reclaimed block becomes FREE now
    assert p.state[cached[0]] == 0
    assert p.usable() == _usable_by_scan(a) and p.structure_errors() == []


def test_a_cached_block_read_then_completed_is_idle():
    a = BlockAllocator(4, 2)
    a.add_request("a", [1, 2, 3])
    a.allocate("a", 3)
    a.publish(["a"]).complete()
    a.commit("a", 3)
    launch = a.publish(["a"])  # reads the committed block again (no new positions)
    a.free("a")
    p = a.pool
    assert p.usable() == _usable_by_scan(a) == 2
    launch.complete()
    assert p.usable() == _usable_by_scan(a) == 4
    assert p.structure_errors() == []


@pytest.mark.parametrize("compiled", [True, False])
def test_unknown_holders_are_refused_typed(compiled):
    p = _pool(compiled)
    p.open_holder("r")
    p.allocate(0, "r")
    with pytest.raises(DoubleFree):
        p.release(0, "ghost")
    with pytest.raises(PublishError):
        p.publish(0, "ghost")
    with pytest.raises(PublishError):
        p.begin_write(0, "ghost", 1)
    p.publish(0, "r")
    p.release(0, "r")
    p.close_holder("r")
    assert p.state[0] == 0 and p.structure_errors() == []


def _stray(name: str, write):
    """A pool whose ``name`` makes one write its spec's effect does not (just before the
    check): checked mode's frame check must name it, for transitions without a block too."""

    class Stray(BlockPool):
        def _verify(self, n, predicted, *args):
            if n == name:
                write(self)
            return super()._verify(n, predicted, *args)

    return Stray


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("name, write, words", [
    ("open_holder", lambda p: p.clock.__setitem__(0, p.clock[0] + 1), "clock changed"),
    ("complete", lambda p: p.clock.__setitem__(0, p.clock[0] + 1), "clock changed"),
    ("advance", lambda p: p.inflight.add(99), "launches in flight changed"),
    ("allocate", lambda p: p.clock.__setitem__(0, p.clock[0] + 1), "clock changed"),
])
def test_a_stray_write_is_caught_by_the_frame_check(compiled, name, write, words):
    p = _stray(name, write)(3, 1, checked=True)
    if hasattr(p, "compile_spec"):
        p.compile_spec = compiled
    first = next(i for i, (n, _) in enumerate(STEPS) if n == name)
    for _, call in STEPS[:first]:
        call(p)
    with pytest.raises(InvariantViolation, match=f"refines:{name}") as err:
        STEPS[first][1](p)
    assert words in str(err.value)


def _block_0_in_flight(p: BlockPool) -> None:
    """Holder r's block 0, published, and launch 0 (which may read it) in flight."""
    p.open_holder("r")
    p.allocate(0, "r")
    p.publish(0, "r")
    p.launch(0)


@pytest.mark.parametrize("checked", [True, False])
def test_a_write_that_ends_after_its_launch_completed_recycles_the_block(checked):
    """The pool's API lets a write end after the launch completed and the watermark passed
    the block's retire clock (the spec ties no write to a launch): the block, let go
    meanwhile, is recycled by that ``end_write``, not left RECLAIMED and reusable."""
    p = BlockPool(2, 4, checked=checked)
    _block_0_in_flight(p)
    p.begin_write(0, "r", 4)
    p.release(0, "r")  # retired while launch 0 is in flight
    p.complete(0)
    p.advance()
    assert p.state[0] == RECLAIMED and p.retire[0] <= p.clock[WATERMARK]  # waits for the write
    p.end_write(0)
    assert p.state[0] == FREE
    assert p.structure_errors() == []
    assert p.usable() == 2


def test_advance_watermark_says_how_far_it_advanced():
    p = BlockPool(2, 4)
    for L in range(3):
        p.launch(L)
    assert p.advance_watermark() == 0  # launch 0 is in flight: the watermark stays
    p.complete(1)
    assert p.advance_watermark() == 0  # out of order: 1 completed, 0 not yet
    p.complete(0)
    assert p.advance_watermark() == 2 and p.clock[WATERMARK] == 2
    assert p.advance_watermark() == 0
    p.complete(2)
    assert p.advance_watermark() == 1 and p.clock[WATERMARK] == 3


@pytest.mark.parametrize("compiled", [True, False])
def test_a_rewind_that_writes_what_the_spec_does_not_is_caught(compiled):
    p = _stray("rewind", lambda p: p.filled.__setitem__(0, p.filled[0] + 1))(3, 2, checked=True)
    if hasattr(p, "compile_spec"):
        p.compile_spec = compiled
    _block_0_in_flight(p)
    p.begin_write(0, "r", 2)
    p.end_write(0)
    p.complete(0)
    p.advance()
    with pytest.raises(InvariantViolation, match="refines:rewind"):
        p.rewind(0, "r", 1)
