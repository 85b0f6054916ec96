"""The engine calls' programs (spec.calls) and call-level refinement, both directions.

The programs are run on concrete spec states; then allocators with planted defects are held
against them: one that refuses what the spec allows, one that allows what it refuses, one
that ends elsewhere. Each is caught by ``CallModel.check`` alone, and the refinement state
machine finds the first of them (which the pool-level replay let through)."""

from __future__ import annotations

import traceback

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from pagedkv.allocator import (
    AllocatorError,
    BlockAllocator,
    CommitError,
    InvalidArgument,
    InvariantViolation,
    OutOfBlocks,
)
from pagedkv.allocator.hashing import chain_hashes
from pagedkv.proofs.call_refinement import CallModel
from pagedkv.proofs.refinement import AllocatorMachine
from pagedkv.spec import PUBLISHED, REFERENCED
from pagedkv.spec.calls import CallRefused, call_allowed, run_call
from pagedkv.spec.requests import count, table_of

B = 2
PROMPT = [5, 6, 7, 8, 9, 10, 11]  # three full blocks and one token


def _served(a: BlockAllocator, m: CallModel, rid: str, tokens: list[int]) -> None:
    """Admit, allocate, launch, complete and commit a whole prompt, each call checked."""
    _check(m, "add_request", (rid, len(tokens), chain_hashes(tokens, B)),
           lambda: a.add_request(rid, tokens))
    _check(m, "allocate", (rid, len(tokens)), lambda: a.allocate(rid, len(tokens)))
    launch = _check(m, "publish", ([rid],), lambda: a.publish([rid]))
    _check(m, "complete", (launch.seq, list(launch.writes)), launch.complete)
    _check(m, "commit", (rid, len(tokens)), lambda: a.commit(rid, len(tokens)))


def _setup(num_blocks: int = 10) -> tuple[BlockAllocator, CallModel]:
    a = BlockAllocator(num_blocks, B)
    a.pool.trace = []
    return a, CallModel(a)


def _check(m: CallModel, call: str, args: tuple, do) -> object:
    out = m.check(call, args, do)
    m.alloc.pool.trace.clear()
    return out


# ---- the programs on spec states ----------------------------------------------------------------
def test_admission_takes_every_hit_whatever_the_first_chunk():
    a, m = _setup()
    _served(a, m, "a", PROMPT)
    _check(m, "add_request", ("b", len(PROMPT), chain_hashes(PROMPT, B)),
           lambda: a.add_request("b", PROMPT))
    run = run_call(m.state, "allocate", "b", 2)  # a first chunk of one block
    assert table_of(run.state, "b") == a.block_table("a")[:3]
    assert count(run.state, "computed", "b") == 6
    assert [name for name, _ in run.steps] == ["hit", "hit", "hit"]


def test_commit_program_caches_the_blocks_it_completes():
    a, m = _setup()
    _served(a, m, "a", PROMPT)
    table = a.block_table("a")
    assert [m.state.pool.state[b] for b in table] == [REFERENCED] * 3 + [PUBLISHED]
    assert [name for name, _ in m.last.steps].count("cache") == 3


def test_refusals_say_which_condition_failed():
    a, m = _setup()
    _check(m, "add_request", ("a", 3, chain_hashes([1, 2, 3], B)),
           lambda: a.add_request("a", [1, 2, 3]))
    _check(m, "allocate", ("a", 3), lambda: a.allocate("a", 3))
    refused = call_allowed(m.state, "commit", "a", 2)  # nothing issued yet
    assert isinstance(refused, CallRefused)
    assert refused.step[0] == "commit_pos"
    assert "position 2 must be at most the issued position of request 'a' (it is 0)" in (
        refused.reason)
    launch = _check(m, "publish", (["a"],), lambda: a.publish(["a"]))
    refused = call_allowed(m.state, "commit", "a", 2)  # issued, but the write is pending
    assert "the pending writing launches on block 0 (it is 1) must be 0" in refused.reason
    _check(m, "complete", (launch.seq, list(launch.writes)), launch.complete)
    assert not isinstance(call_allowed(m.state, "commit", "a", 2), CallRefused)
    full = BlockAllocator(1, B)
    full.add_request("x", [1, 2, 3])
    room = call_allowed(full.abstract().requests, "allocate", "x", 3)
    assert isinstance(room, CallRefused) and room.room
    assert "no FREE block" in room.reason


def test_commit_of_nothing_is_allowed_while_a_later_write_is_pending():
    """Regression: the allocator refused ``commit(r, num_computed(r))`` while a launch wrote
    the rest of the partial block; the spec's program commits nothing and allows it."""
    a, m = _setup()
    _served(a, m, "a", PROMPT)  # computed 7: block 3 holds one committed slot
    _check(m, "append_tokens", ("a", 8, chain_hashes(PROMPT + [12], B)),
           lambda: a.append_tokens("a", [12]))
    _check(m, "allocate", ("a", 8), lambda: a.allocate("a", 8))
    _check(m, "publish", (["a"],), lambda: a.publish(["a"]))  # writes slot 7, in flight
    assert _check(m, "commit", ("a", 7), lambda: a.commit("a", 7)) is None
    with pytest.raises(CommitError, match="pending"):
        a.commit("a", 8)


def test_truncate_keeps_a_position():
    a, m = _setup()
    _served(a, m, "a", [1, 2, 3])
    out = _check(m, "truncate", ("a", 0), lambda: a.truncate("a", 0))
    assert isinstance(out, InvalidArgument)
    assert "at least one position" in str(out)


# ---- planted defects, caught at call level ------------------------------------------------------
def _fork_while_parent_in_flight(a: BlockAllocator, m: CallModel) -> None:
    _check(m, "add_request", ("p", 3, chain_hashes([1, 2, 3], B)),
           lambda: a.add_request("p", [1, 2, 3]))
    _check(m, "allocate", ("p", 3), lambda: a.allocate("p", 3))
    _check(m, "publish", (["p"],), lambda: a.publish(["p"]))
    _check(m, "fork", ("p", "c"), lambda: a.fork("p", "c"))


def test_fork_in_flight_agrees_with_the_spec():
    a, m = _setup()
    _fork_while_parent_in_flight(a, m)
    assert a.block_table("c") == a.block_table("p")


class _RefusesForkInFlight(BlockAllocator):
    """Refuses a fork while any launch is in flight: a call the spec allows."""

    def fork(self, parent, child):
        if self.inflight:
            raise CommitError(f"fork of {parent!r} while a launch is in flight")
        return super().fork(parent, child)


class _HitsOnlyTheFirstChunk(BlockAllocator):
    """Takes prefix hits only up to the first chunk (the chunked-prefill defect): a call
    that succeeds but ends elsewhere than the spec's program."""

    def allocate(self, rid, num_tokens):
        req = self._req(rid)
        if not req.table:
            hits = self._hits(req)[: num_tokens // self.block_size]
            self._hits = lambda r, hits=hits: hits  # type: ignore[method-assign]
            try:
                return super().allocate(rid, num_tokens)
            finally:
                del self._hits
        return super().allocate(rid, num_tokens)


def test_refusing_what_the_spec_allows_is_caught():
    a = _RefusesForkInFlight(10, B)
    a.pool.trace = []
    with pytest.raises(AssertionError, match="the spec allows fork"):
        _fork_while_parent_in_flight(a, CallModel(a))


def test_allowing_what_the_spec_refuses_is_caught():
    """An allocator whose commit forgets that a launch still writes the positions (its spec's
    ``slots_written`` always holds), checked against the spec as written."""
    from pagedkv.spec import REQUEST_SPEC

    a = BlockAllocator(10, B, spec=REQUEST_SPEC.replace(slots_written=lambda *args: True))
    a.pool.trace = []
    m = CallModel(a)
    _check(m, "add_request", ("a", 3, chain_hashes([1, 2, 3], B)),
           lambda: a.add_request("a", [1, 2, 3]))
    _check(m, "allocate", ("a", 3), lambda: a.allocate("a", 3))
    _check(m, "publish", (["a"],), lambda: a.publish(["a"]))  # in flight
    with pytest.raises(AssertionError, match="succeeded where the spec refuses: commit_pos"):
        _check(m, "commit", ("a", 1), lambda: a.commit("a", 1))


def test_ending_elsewhere_than_the_program_is_caught():
    a = _HitsOnlyTheFirstChunk(10, B)
    a.pool.trace = []
    m = CallModel(a)
    _served(a, m, "a", PROMPT)
    _check(m, "add_request", ("b", len(PROMPT), chain_hashes(PROMPT, B)),
           lambda: a.add_request("b", PROMPT))
    with pytest.raises(AssertionError, match="differs from the spec's program"):
        _check(m, "allocate", ("b", 2), lambda: a.allocate("b", 2))


FAST = settings(max_examples=300, stateful_step_count=40, derandomize=True, database=None,
                deadline=None, phases=[Phase.generate])


def test_the_refinement_machine_finds_a_refused_fork_in_flight(monkeypatch):
    """The defect the pool-level replay let through: the machine now finds it."""
    import pagedkv.proofs.refinement as refinement

    monkeypatch.setattr(refinement, "BlockAllocator", _RefusesForkInFlight)
    try:
        run_state_machine_as_test(AllocatorMachine, settings=FAST)
    except AssertionError:
        text = traceback.format_exc()
    else:  # pragma: no cover - the test fails here
        text = ""
    assert "the spec allows fork" in text, text[-2000:]


def test_allocator_errors_are_the_refusals():
    """Every refusal the programs report is one the allocator raises as AllocatorError."""
    a, m = _setup(num_blocks=2)
    out = _check(m, "add_request", ("a", 5, chain_hashes([1, 2, 3, 4, 5], B)),
                 lambda: a.add_request("a", [1, 2, 3, 4, 5]))
    assert out == 0
    assert isinstance(_check(m, "allocate", ("a", 5), lambda: a.allocate("a", 5)),
                      AllocatorError)


# ---- refusals confirmed by the spec at run time -------------------------------------------------
def test_a_refusal_carries_the_spec_reason_in_words():
    a = BlockAllocator(4, B)
    a.add_request("a", [1, 2, 3])
    a.allocate("a", 3)
    a.publish(["a"])
    with pytest.raises(CommitError) as info:
        a.commit("a", 2)
    assert info.value.spec_reason == (
        "commit_pos: the pending writing launches on block 0 (it is 1) must be 0")
    assert "(spec: commit_pos:" in str(info.value)


class _RefusesRoom(BlockAllocator):
    """Claims to be out of blocks whenever a call needs one."""

    def _plan_room(self, need, hits=()):
        if need:
            raise OutOfBlocks(need, 0)
        return []


def test_a_refusal_the_spec_would_not_make_is_an_invariant_violation():
    a = _RefusesRoom(4, B)
    a.add_request("a", [1, 2, 3])
    with pytest.raises(InvariantViolation, match="refines") as info:
        a.allocate("a", 3)
    assert "the spec's program runs: ['grow', 'grow']" in str(info.value)
    assert a.block_table("a") == []  # nothing changed: the refusal stands, flagged


def test_every_request_refusal_is_said_in_words():
    """On a few serving states, every refused request transition (any parameters in a small
    range) names its failed conditions without falling back to source text."""
    import itertools

    from pagedkv.spec import CONCRETE, REQUEST_TRANSITIONS
    from pagedkv.spec.calls import why_refused
    from pagedkv.spec.requests import REQUEST_PARAM_KINDS

    a, m = _setup(num_blocks=6)
    _served(a, m, "a", PROMPT)
    _check(m, "fork", ("a", "c"), lambda: a.fork("a", "c"))
    _check(m, "publish", (["a"],), lambda: a.publish(["a"]))
    s = m.state
    ranges = {"block": range(-1, 7), "holder": ("a", "c", "zz"), "hash": (0, 5),
              "slots": range(0, 3), "launch": range(0, 3)}
    said = 0
    for name, t in REQUEST_TRANSITIONS.items():
        choices = [ranges[REQUEST_PARAM_KINDS[p]] for p in t.params]
        for values in itertools.product(*choices):
            params = dict(zip(t.params, values, strict=True))
            if t.guard(CONCRETE, s, **params):
                continue
            text = why_refused(s, name, **params)
            assert text.startswith(f"{name}: ") and "ops." not in text and "s." not in text, (
                text)
            assert text != f"{name}: refused"  # a failed condition is named, always
            said += 1
    assert said > 500


def test_a_holder_the_state_already_names_is_not_named_twice():
    """Explorer states name their holders up front (closed ones too): admitting or forking
    into one of them opens it, without a second entry in ``holder_ids``."""
    from pagedkv.spec import initial_request_state, initial_state

    s = initial_request_state(initial_state(4, B, holder_ids=("a", "c")))
    run = run_call(s, "add_request", "a", 3, chain_hashes([1, 2, 3], B))
    assert run.state.pool.holder_ids == ("a", "c")
    run = run_call(run.state, "fork", "a", "c")
    assert run.state.pool.holder_ids == ("a", "c")
    s2 = initial_request_state(initial_state(4, B))
    assert run_call(s2, "add_request", "z", 1, []).state.pool.holder_ids == ("z",)


def test_two_requests_computing_one_prefix_cache_it_once():
    """Both admitted before either committed: each computes the prefix in its own blocks; the
    first commit caches them, the second finds the content cached and leaves its own copies
    uncached (they are freed like any other block), on the allocator and in the program."""
    a, m = _setup()
    for rid in ("a", "b"):
        _check(m, "add_request", (rid, len(PROMPT), chain_hashes(PROMPT, B)),
               lambda rid=rid: a.add_request(rid, PROMPT))
        _check(m, "allocate", (rid, len(PROMPT)), lambda rid=rid: a.allocate(rid, len(PROMPT)))
    launch = _check(m, "publish", (["a", "b"],), lambda: a.publish(["a", "b"]))
    _check(m, "complete", (launch.seq, list(launch.writes)), launch.complete)
    for rid in ("a", "b"):
        _check(m, "commit", (rid, len(PROMPT)), lambda rid=rid: a.commit(rid, len(PROMPT)))
    first, second = a.block_table("a"), a.block_table("b")
    assert [m.state.pool.state[b] for b in first[:3]] == [REFERENCED] * 3
    assert [m.state.pool.state[b] for b in second[:3]] == [PUBLISHED] * 3
    assert "cache" not in [name for name, _ in m.last.steps]


def _refused(s, call: str, *args, words: str) -> None:
    refused = call_allowed(s, call, *args)
    assert isinstance(refused, CallRefused), (call, args)
    assert words in refused.reason, refused.reason


def test_truncate_program_at_its_bounds():
    a, m = _setup()
    tokens = [1, 2, 3, 4, 5]
    _check(m, "add_request", ("u", 5, chain_hashes(tokens, B)),
           lambda: a.add_request("u", tokens))
    _check(m, "allocate", ("u", 9), lambda: a.allocate("u", 9))  # five entries
    launch = _check(m, "publish", (["u"],), lambda: a.publish(["u"]))
    _check(m, "complete", (launch.seq, list(launch.writes)), launch.complete)
    _check(m, "commit", ("u", 3), lambda: a.commit("u", 3))
    _check(m, "truncate", ("u", 9), lambda: a.truncate("u", 9))  # all it covers: a no-op
    _check(m, "truncate", ("u", 6), lambda: a.truncate("u", 6))  # two entries let go
    assert [name for name, _ in m.last.steps][:2] == ["release_tail", "release_tail"]
    _check(m, "truncate", ("u", 3), lambda: a.truncate("u", 3))  # down to what it committed
    assert count(m.state, "reserved", "u") == 3 and len(table_of(m.state, "u")) == 2
    _refused(m.state, "truncate", "u", 2, words="committed 3 positions")
    _refused(m.state, "truncate", "u", 4, words="covers 3 positions")
    _check(m, "add_request", ("v", 3, chain_hashes([7, 8, 9], B)),
           lambda: a.add_request("v", [7, 8, 9]))
    _check(m, "allocate", ("v", 3), lambda: a.allocate("v", 3))
    _refused(m.state, "truncate", "v", 0, words="at least one position")
    _check(m, "truncate", ("v", 1), lambda: a.truncate("v", 1))


def test_publish_append_and_allocate_many_programs_at_their_bounds():
    a, m = _setup()
    for rid, tokens in (("a", [1, 2, 3]), ("b", [4, 5, 6])):
        _check(m, "add_request", (rid, 3, chain_hashes(tokens, B)),
               lambda rid=rid, tokens=tokens: a.add_request(rid, tokens))
    _refused(m.state, "publish", [], words="at least one request")
    _refused(m.state, "publish", ["a"], words="has no allocated positions")
    _refused(m.state, "allocate_many", [("a", 2)], words="has an empty table")
    _check(m, "allocate", ("a", 1), lambda: a.allocate("a", 1))  # one position, one entry
    assert not isinstance(call_allowed(m.state, "publish", ["a"]), CallRefused)
    _check(m, "allocate_many", ([("a", 3)],), lambda: a.allocate_many([("a", 3)]))
    more = [("a", 4, chain_hashes([1, 2, 3, 9], B)), ("b", 4, chain_hashes([4, 5, 6, 9], B))]
    assert not isinstance(call_allowed(m.state, "append_tokens_many", more), CallRefused)
    _refused(m.state, "append_tokens_many", [more[0], more[0]], words="appears twice")
    _check(m, "append_tokens_many", (more,),
           lambda: a.append_tokens_many([(r, [9]) for r in ("a", "b")]))
