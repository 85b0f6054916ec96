"""The rules of positions and room are written once, in the spec, and every runtime
evaluates them: the prefix-hit rule (``spec.requests.may_hit``, through ``leading_hits``) in
the allocator, the manager's lookup and the host tier's admission; the commit bounds
(``commit_bounds``) in the allocator's commit; which blocks an allocation may take
(``spec.takeable``) in the spec's own choice, the allocator's room planning and the pool's
scans. A rule changed in the spec changes the spec's guard and each runtime together (the
tests that patch one show it: with a private copy of the rule anywhere, they fail)."""

from __future__ import annotations

import pytest
import torch

from pagedkv.allocator import BlockAllocator
from pagedkv.allocator.errors import InvariantViolation, TokensUnknown
from pagedkv.engine import KVCacheManager
from pagedkv.engine.offload import Swapper
from pagedkv.engine.request import EngineRequest
from pagedkv.kernels import KVCachePool
from pagedkv.spec import CACHED
from pagedkv.spec import requests as spec_requests
from pagedkv.spec.calls import CallRefused, cached_prefix, call_allowed, first_fit
from pagedkv.spec.requests import pos_le

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


def test_a_changed_hit_rule_changes_the_spec_and_every_runtime_together(monkeypatch) -> None:
    tokens = list(range(100, 100 + 2 * B))  # two full blocks, the second one ends the prompt

    def hits() -> tuple[int, int, int, int]:
        a = BlockAllocator(12, B)
        _warm(a, tokens)
        found = a.add_request("r", tokens)
        spec = cached_prefix(a.abstract().requests, "r")
        m = KVCacheManager(12, B)
        warm = EngineRequest("warm", tokens)
        m.allocate_slots(warm, len(tokens))
        m.publish([warm]).complete()
        m.free(warm)
        _, manager_hit, _ = m.get_computed_blocks(EngineRequest("r", tokens))
        return found, spec, manager_hit, _host_admission(tokens)

    assert hits() == (B, B, B, B)  # the last block holds the last token: not a hit
    monkeypatch.setattr(spec_requests, "may_hit", _allow_the_last_token)
    assert hits() == (2 * B, 2 * B, 2 * B, 2 * B)


def _host_admission(tokens: list[int]) -> int:
    """Positions a host-tier admission loads for ``tokens`` after their blocks were
    offloaded and recycled on the device."""
    m = KVCacheManager(6, B)
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


def test_a_changed_commit_rule_changes_the_allocator_s_commit(monkeypatch) -> None:
    def commit_past_known() -> bool:
        a = BlockAllocator(8, B)
        a.add_request("r", list(range(6)))
        a.allocate("r", 7)  # one position past the known tokens (a sampled one, say)
        a.publish(["r"]).complete()
        refused = call_allowed(a.abstract().requests, "commit", "r", 7)
        try:
            a.commit("r", 7)
        except TokensUnknown:
            assert isinstance(refused, CallRefused)
            return False
        assert not isinstance(refused, CallRefused)
        return True

    assert not commit_past_known()
    monkeypatch.setattr(spec_requests, "commit_bounds",
                        lambda ops, new, issued, known: [pos_le(ops, new, issued), True])
    assert commit_past_known()


def test_the_pool_s_usable_count_is_checked_against_the_spec_s_takeable(monkeypatch) -> None:
    a = BlockAllocator(8, B)
    _warm(a, list(range(2 * B + 1)))  # two cached blocks, idle
    assert a.pool.structure_errors() == []
    assert a.pool.usable() == 8
    monkeypatch.setattr(type(a.pool), "usable", lambda self: 8 - self.count[CACHED])
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
            held = [bool(spec_requests.may_hit(CONCRETE, i, divmod(known, block_size)))
                    for i in range(6)]
            assert held == sorted(held, reverse=True), (block_size, known, held)
            assert sum(held) == max(0, known - 1) // block_size


def test_the_compiled_commit_bounds_are_the_spec_s_on_every_count() -> None:
    from pagedkv.allocator.compiled import position_rule
    from pagedkv.spec.ops import CONCRETE

    rule = position_rule(spec_requests.commit_bounds, ("new", "issued", "known"))
    assert rule.__code__.co_filename == "<spec commit_bounds, compiled>"
    for block_size in (2, 16):
        for new in range(0, 3 * block_size):
            for issued in (0, new - 1, new, new + 1, 2 * block_size + 3):
                for known in (new - 1, new, new + 5):
                    want = tuple(bool(c) for c in spec_requests.commit_bounds(
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
