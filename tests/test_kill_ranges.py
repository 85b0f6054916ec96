"""Kills mutants of the block-id range checks: in the spec, every guard that takes a block
refuses ids outside [0, num_blocks); in the pool, every block-taking method raises
InvalidArgument for them (before any guard runs, so the refusal is typed and changes nothing).
"""

from __future__ import annotations

import pytest

from pagedkv.allocator import InvalidArgument
from pagedkv.allocator.pool import BlockPool
from pagedkv.spec import TRANSITIONS, initial_state, step

N = 3


def _spec_state():
    s = initial_state(N, 1, holder_ids=(0,))
    return step(s, "open_holder", r=0)


BLOCK_TRANSITIONS = sorted(n for n, t in TRANSITIONS.items() if "b" in t.params)
PARAMS = {"r": 0, "w": 0, "k": 0, "writes": False, "h": 5}


@pytest.mark.parametrize("name", BLOCK_TRANSITIONS)
@pytest.mark.parametrize("b", [-1, N, N + 1])
def test_spec_guards_refuse_out_of_range_blocks(name, b):
    """Out-of-range ids read the arrays' defaults (FREE, ref 0, ...): the guard must refuse."""
    from pagedkv.spec import CONCRETE

    s = _spec_state()
    params = {p: (b if p == "b" else PARAMS[p]) for p in TRANSITIONS[name].params}
    assert not TRANSITIONS[name].guard(CONCRETE, s, **params)


def test_spec_allocate_takes_every_in_range_block():
    for b in range(N):
        assert step(_spec_state(), "allocate", b=b, r=0) is not None


CALLS = {
    "allocate": lambda p, b: p.allocate(b, "r"),
    "publish": lambda p, b: p.publish(b, "r"),
    "begin_write": lambda p, b: p.begin_write(b, "r", 1),
    "end_write": lambda p, b: p.end_write(b),
    "commit": lambda p, b: p.commit(b, "r", 5),
    "share": lambda p, b: p.share(b, "r"),
    "release": lambda p, b: p.release(b, "r"),
    "evict": lambda p, b: p.evict(b),
    "recycle": lambda p, b: p.recycle(b),
}


@pytest.mark.parametrize("checked", [True, False])
@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("b", [-1, N, N + 1, True, 1.0])
def test_pool_methods_reject_out_of_range_blocks(name, b, checked):
    p = BlockPool(N, 1, checked=checked)
    p.open_holder("r")
    p.trace = []
    with pytest.raises(InvalidArgument):
        CALLS[name](p, b)
    assert p.trace == []
    assert p.state == [0] * N and p.ref == [0] * N


@pytest.mark.parametrize("b", range(N))
def test_pool_accepts_every_in_range_block(b):
    p = BlockPool(N, 1)
    p.open_holder("r")
    p.allocate(b, "r")
    p.publish(b, "r")
    p.begin_write(b, "r", 1)
    p.end_write(b)
    p.commit(b, "r", 9)
    assert p.lookup(9) == b
    p.launch(0)  # in flight when b is let go: b waits for it
    p.release(b, "r")
    p.evict(b)
    assert p.state[b] == 5 and p.lookup(9) is None  # RECLAIMED
    p.complete(0)
    p.advance()  # the watermark passes b's retire clock: recycled
    assert p.state[b] == 0 and p.queue.head() == b


def test_check_block_id():
    p = BlockPool(N, 1)
    assert [p.check_block_id(b) for b in range(N)] == list(range(N))
    for bad in (-1, N, True, 1.0, None):
        with pytest.raises(InvalidArgument):
            p.check_block_id(bad)

