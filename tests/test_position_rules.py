"""The rules of positions and room are written once, in the spec, and every runtime
evaluates them: the prefix-hit rule (``spec.requests.may_hit``, through ``leading_hits``) in
the allocator, the manager's lookup and the host tier's admission; the commit bounds
(``commit_bounds``) in the allocator's commit; which blocks an allocation may take
(``spec.takeable``) in the spec's own choice, the allocator's room planning and the pool's
scans. A rule changed in the spec changes the spec's guard and each runtime together: the
tests pass a changed ``RequestSpec`` in (``spec=``), nothing is patched, and with a private
copy of the rule anywhere they fail."""

from __future__ import annotations

import pytest
import torch

from pagedkv.allocator import BlockAllocator
from pagedkv.allocator.errors import InvariantViolation, TokensUnknown
from pagedkv.engine import KVCacheManager
from pagedkv.engine.offload import Swapper
from pagedkv.engine.request import EngineRequest
from pagedkv.kernels import KVCachePool
from pagedkv.spec import CACHED, REQUEST_SPEC, RequestSpec
from pagedkv.spec.calls import CallRefused, cached_prefix, call_allowed, first_fit, why_refused
from pagedkv.spec.requests import commit_bounds, may_hit, pos_le

B = 4


def _warm(a: BlockAllocator, tokens: list[int]) -> None:
    """Cache the full blocks of ``tokens`` (one request computes and frees them)."""
    a.add_request("warm", tokens)
    a.allocate("warm", len(tokens))
    a.publish(["warm"]).complete()
    a.commit("warm", len(tokens))
    a.free("warm")


def _allow_the_last_token(ops, i, known):
    """A weakened hit rule: a block may be a hit even when its last token is the last known
    one (nothing would be left to compute the logits from)."""
    return pos_le(ops, (i + 1, 0), known)


@pytest.mark.parametrize("known", range(1, 3 * B + 3))
def test_the_allocator_takes_the_hits_the_spec_s_program_takes(known: int) -> None:
    tokens = list(range(100, 100 + 3 * B + 2))
    a = BlockAllocator(12, B)
    _warm(a, tokens)
    a.add_request("r", tokens[:known])
    spec = cached_prefix(a.abstract().requests, "r")
    assert a.allocate("r", known) and a.num_computed("r") == spec
    assert spec == min(known - 1, 3 * B) // B * B  # never the last known token


def test_a_changed_hit_rule_changes_the_spec_and_every_runtime_together() -> None:
    tokens = list(range(100, 100 + 2 * B))  # two full blocks, the second one ends the prompt

    def hits(spec: RequestSpec) -> tuple[int, int, int, int]:
        a = BlockAllocator(12, B, spec=spec)
        _warm(a, tokens)
        found = a.add_request("r", tokens)
        programs = cached_prefix(a.abstract().requests, "r", spec=spec)
        m = KVCacheManager(12, B, spec=spec)
        warm = EngineRequest("warm", tokens)
        m.allocate_slots(warm, len(tokens))
        m.publish([warm]).complete()
        m.free(warm)
        _, manager_hit, _ = m.get_computed_blocks(EngineRequest("r", tokens))
        return found, programs, manager_hit, _host_admission(tokens, spec)

    assert hits(REQUEST_SPEC) == (B, B, B, B)  # the last block holds the last token: no hit
    weakened = REQUEST_SPEC.replace(may_hit=_allow_the_last_token)
    assert hits(weakened) == (2 * B, 2 * B, 2 * B, 2 * B)
    assert hits(REQUEST_SPEC) == (B, B, B, B)  # the spec as written is untouched
    assert REQUEST_SPEC.may_hit is may_hit


def test_the_spec_s_hit_guard_reads_the_rule_it_was_given() -> None:
    """The changed rule is the hit transition's guard, and a refusal says it as written."""
    tokens = list(range(100, 100 + 2 * B))
    a = BlockAllocator(12, B)
    _warm(a, tokens)
    a.add_request("r", tokens)  # its table is empty until allocate takes the hits
    s = a.abstract().requests
    first = REQUEST_SPEC.transitions["hit"].fire(s, r="r", b=s.pool.hmap[s.chain["r"][0]])
    assert first is not None
    s = first.flattened()
    b = s.pool.hmap[s.chain["r"][1]]  # the block of the last known token
    weakened = REQUEST_SPEC.replace(may_hit=_allow_the_last_token)
    assert weakened.transitions["hit"].fire(s, r="r", b=b) is not None
    assert REQUEST_SPEC.transitions["hit"].fire(s, r="r", b=b) is None
    assert "must be at most the known position of request 'r'" in why_refused(
        s, "hit", r="r", b=b)


def test_a_spec_passed_in_carries_its_pool_transitions_and_its_rules() -> None:
    from dataclasses import replace

    from pagedkv.allocator.errors import InvalidArgument
    from pagedkv.spec import TRANSITIONS

    changed_pool = dict(TRANSITIONS, share=replace(TRANSITIONS["share"]))
    spec = RequestSpec(pool=changed_pool)
    assert all(t.pool is changed_pool for t in spec.transitions.values())
    assert REQUEST_SPEC.transitions["hit"].pool is TRANSITIONS
    a = BlockAllocator(4, B, spec=changed_pool)  # a mapping: the pool's transitions only
    assert a.spec.pool is changed_pool and a.pool.spec is changed_pool
    assert a.spec.may_hit is may_hit
    with pytest.raises(InvalidArgument, match="RequestSpec or a mapping"):
        BlockAllocator(4, B, spec=[may_hit])  # type: ignore[arg-type]


def test_every_plan_that_reads_a_rule_reads_the_spec_s() -> None:
    from pagedkv.spec.request_spec import RULES

    changed = REQUEST_SPEC.replace(
        may_hit=_allow_the_last_token,
        commit_bounds=lambda ops, new, issued, known: [pos_le(ops, new, issued)],
        slots_written=lambda ops, s, b, k: True)
    readers = 0
    for t in changed.transitions.values():
        for rule in RULES:
            if rule in t.plan.__code__.co_names:
                readers += 1
                assert t.plan.__globals__[rule] is getattr(changed, rule), (t.name, rule)
    assert readers == 3  # hit reads may_hit; commit_pos reads commit_bounds and slots_written


def _host_admission(tokens: list[int], spec: RequestSpec = REQUEST_SPEC) -> int:
    """Positions a host-tier admission loads for ``tokens`` after their blocks were
    offloaded and recycled on the device."""
    m = KVCacheManager(6, B, spec=spec)
    pool = KVCachePool(1, 6, B, 1, 2, torch.float32).fill_(0.5)
    sw = Swapper(m, pool, pool.like(4).fill_(0.5))
    a = EngineRequest("a", tokens)
    m.allocate_slots(a, len(tokens))
    m.publish([a]).complete()
    a.num_computed_tokens = len(tokens)
    sw.complete(sw.offload(a))
    m.free(a)
    filler = EngineRequest("f", list(range(9000, 9000 + 5 * B)))
    m.allocate_slots(filler, 5 * B)  # every device block recycled: no device hit left
    m.free(filler)
    t = sw.admit(EngineRequest("c", list(tokens)))
    return t.num_tokens


def test_a_changed_commit_rule_changes_the_allocator_s_commit() -> None:
    def commit_past_known(spec: RequestSpec) -> bool:
        a = BlockAllocator(8, B, spec=spec)
        a.add_request("r", list(range(6)))
        a.allocate("r", 7)  # one position past the known tokens (a sampled one, say)
        a.publish(["r"]).complete()
        refused = call_allowed(a.abstract().requests, "commit", "r", 7, spec=spec)
        try:
            a.commit("r", 7)
        except TokensUnknown:
            assert isinstance(refused, CallRefused)
            return False
        assert not isinstance(refused, CallRefused)
        return True

    assert not commit_past_known(REQUEST_SPEC)
    assert commit_past_known(REQUEST_SPEC.replace(
        commit_bounds=lambda ops, new, issued, known: [pos_le(ops, new, issued), True]))


def test_the_pool_s_usable_count_is_checked_against_the_spec_s_takeable(monkeypatch) -> None:
    a = BlockAllocator(8, B)
    _warm(a, list(range(2 * B + 1)))  # two cached blocks, idle
    assert a.pool.structure_errors() == []
    assert a.pool.usable() == 8
    # a runtime bug planted in this one pool: its count leaves out the idle cached blocks
    monkeypatch.setattr(a.pool, "usable", lambda: 8 - a.pool.count[CACHED])
    errors = a.pool.structure_errors()
    assert [name for name, _ in errors] == ["conservation"]
    assert "takeable" in errors[0][1]
    with pytest.raises(InvariantViolation):
        a.check_invariants()


def test_the_spec_s_first_fit_takes_only_takeable_blocks() -> None:
    a = BlockAllocator(3, B)
    a.add_request("r", list(range(2 * B)))
    a.allocate("r", 2 * B)
    launch = a.publish(["r"])  # r's blocks are read while in flight
    a.free("r")
    s = a.abstract().requests
    choice = first_fit.take(s)
    assert choice == ([], 2)  # block 2 is FREE; blocks 0, 1 wait for the launch
    launch.complete()
    a.add_request("q", list(range(50, 50 + 3 * B)))
    assert a.allocate("q", 3 * B)  # all three, once the launch completed
    assert first_fit.take(a.abstract().requests) is None


def test_may_hit_holds_for_a_prefix_of_the_entries() -> None:
    """``leading_hits`` finds where the entries that may be hits end from the top: that needs
    ``may_hit`` to hold for a prefix of them, whatever the block size and known count."""
    from pagedkv.spec.ops import CONCRETE

    for block_size in (1, 2, 3, 16):
        for known in range(0, 5 * block_size + 2):
            held = [bool(may_hit(CONCRETE, i, divmod(known, block_size)))
                    for i in range(6)]
            assert held == sorted(held, reverse=True), (block_size, known, held)
            assert sum(held) == max(0, known - 1) // block_size


def test_the_compiled_commit_bounds_are_the_spec_s_on_every_count() -> None:
    from pagedkv.allocator.compiled import position_rule
    from pagedkv.spec.ops import CONCRETE

    rule = position_rule(commit_bounds, ("new", "issued", "known"))
    assert rule.__code__.co_filename == "<spec commit_bounds, compiled>"
    for block_size in (2, 16):
        for new in range(0, 3 * block_size):
            for issued in (0, new - 1, new, new + 1, 2 * block_size + 3):
                for known in (new - 1, new, new + 5):
                    want = tuple(bool(c) for c in commit_bounds(
                        CONCRETE, *(divmod(max(n, 0), block_size)
                                    for n in (new, max(issued, 0), max(known, 0)))))
                    got = rule(block_size, new, max(issued, 0), max(known, 0))
                    assert tuple(map(bool, got)) == want
                    assert want == (new <= max(issued, 0), new <= max(known, 0))


def test_a_position_rule_the_compiler_cannot_express_is_interpreted() -> None:
    from pagedkv.allocator.compiled import position_rule

    def odd_offset(ops, a):
        return [a[1] % 2 == 1]  # '%' on a term: not in the compiler's vocabulary

    rule = position_rule(odd_offset, ("a",))
    assert not rule.__code__.co_filename.startswith("<spec")
    assert [rule(4, n) for n in range(6)] == [(False,), (True,), (False,), (True,), (False,),
                                              (True,)]
