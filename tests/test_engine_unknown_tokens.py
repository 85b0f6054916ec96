"""pagedkv.engine with positions whose token ids are not known when their launch is published:
async scheduling (the next step is published while the previous one, which samples its token,
is in flight) and speculative-decoding verification (``num_new_tokens`` covers draft tokens
that are not part of the request). Such positions are written, and committed (hashed, cached,
hit) only once their ids are known and the scheduler counts them computed."""

from __future__ import annotations

import pytest

from pagedkv.engine import EngineRequest, KVCacheManager, RequestStatus

B = 2


def admitted(m: KVCacheManager, rid: str, tokens: list[int]) -> EngineRequest:
    req = EngineRequest(rid, tokens)
    blocks, hits, _ = m.get_computed_blocks(req)
    assert m.allocate_slots(req, req.num_tokens - hits, hits, blocks) is not None
    req.status, req.num_computed_tokens = RequestStatus.RUNNING, hits
    return req


def hit_tokens(m: KVCacheManager, tokens: list[int]) -> int:
    return m.get_computed_blocks(EngineRequest("probe", tokens))[1]


def test_async_steps_commit_a_sampled_position_once_its_token_is_appended() -> None:
    m = KVCacheManager(32, B)
    r = admitted(m, "r", [1, 2, 3])
    first = m.publish([r])
    r.num_computed_tokens = 3  # as vLLM's scheduler does right after scheduling
    assert m.allocate_slots(r, 1) is not None  # position 3: its token is sampled by `first`
    second = m.publish([r])
    r.num_computed_tokens = 4
    m.complete(first)
    m.complete(second)  # wrote position 3, whose id nobody knew at publish
    assert m.allocator.num_computed("r") == 3
    assert hit_tokens(m, [1, 2, 3, 9, 9]) == 2  # block [3, ?] is not cached
    r.append_output_token_ids([9])
    m.allocate_slots(r, 1)  # the scheduler's next call: position 3 is now known
    assert m.allocator.num_computed("r") == 4
    assert hit_tokens(m, [1, 2, 3, 9, 9]) == 4


def test_growth_within_the_table_commits_first_what_completed_launches_wrote() -> None:
    """As above with a block of 8: the next call grows the table within its last block (the
    manager's fast path for a decode step), and still commits position 3 first, now that its
    token is known, as a growth that takes a block does."""
    m = KVCacheManager(32, 8)
    r = admitted(m, "r", [1, 2, 3])
    first = m.publish([r])
    r.num_computed_tokens = 3
    assert m.allocate_slots(r, 1) is not None
    second = m.publish([r])
    r.num_computed_tokens = 4
    m.complete(first)
    m.complete(second)
    assert m.allocator.num_computed("r") == 3
    r.append_output_token_ids([9])
    table = m.get_block_ids("r")
    assert m.allocate_slots(r, 1) is not None
    assert m.get_block_ids("r") == table  # within the table: no block taken
    assert m.allocator.num_computed("r") == 4
    assert m.allocator.num_reserved("r") == 5


def test_a_token_appended_after_a_rollback_reaches_the_allocator_in_order() -> None:
    """``append_token`` hands a sampled id to the allocator at once while it knows every
    earlier one. After a rollback made it forget some (the ids past the new end are resent
    at the next publish), a new id waits for them: the allocator's ids stay the request's."""
    m = KVCacheManager(32, 8)
    r = admitted(m, "r", [1, 2, 3])
    m.complete(m.publish([r]))
    r.num_computed_tokens = 3
    m.append_token(r, 4)  # handed over at once
    assert m.allocator._req("r").tokens == [1, 2, 3, 4]
    assert m.allocate_slots(r, 3) is not None  # position 3 (token 4), drafts at 4 and 5
    m.complete(m.publish([r]))
    r.num_computed_tokens = 4  # both drafts rejected
    m.append_token(r, 7)  # the id sampled at position 4
    assert m.allocate_slots(r, 1) is not None  # rolls back to 4 positions, then grows
    assert m.allocator._req("r").tokens == [1, 2, 3, 4]  # forgot 7 with the rollback
    m.append_token(r, 8)
    assert m.allocator._req("r").tokens == [1, 2, 3, 4]  # 8 waits for 7
    m.publish([r])
    assert m.allocator._req("r").tokens == r.all_token_ids == [1, 2, 3, 4, 7, 8]


def test_verified_drafts_are_committed_up_to_the_accepted_tokens() -> None:
    m = KVCacheManager(32, B)
    r = admitted(m, "r", [1, 2, 3])
    m.complete(m.publish([r]))
    r.num_computed_tokens = 3
    r.append_output_token_ids([4])  # sampled; drafts 5, 6 to verify next
    assert m.allocate_slots(r, 3) is not None  # positions 3 (token 4), 4 and 5 (drafts)
    launch = m.publish([r])
    r.num_computed_tokens = 6
    m.complete(launch)
    assert m.allocator.num_computed("r") == 4  # positions 4, 5: draft ids, not known
    r.append_output_token_ids([5, 6, 7])  # both drafts accepted, then the bonus token
    m.free(r)  # a finished request: what its completed launches wrote is cached first
    assert hit_tokens(m, [1, 2, 3, 4, 5, 6, 7, 8]) == 6


def _verified_drafts() -> tuple[KVCacheManager, EngineRequest]:
    """[1, 2, 3] computed, then one launch writes position 3 (token 4) and positions 4, 5
    (two drafts whose ids the allocator is never told) and completes; 6 counted computed."""
    m = KVCacheManager(32, B)
    r = admitted(m, "r", [1, 2, 3])
    m.complete(m.publish([r]))
    r.num_computed_tokens = 3
    r.append_output_token_ids([4])
    m.allocate_slots(r, 3)
    launch = m.publish([r])
    r.num_computed_tokens = 6
    m.complete(launch)
    return m, r


def test_a_rejected_draft_position_is_never_cached_under_the_bonus_token() -> None:
    """Drafts 5, 6 were written at positions 4, 5; 5 is accepted, 6 rejected, the model
    samples 8 at position 5: the KV there belongs to 6. It must not be cached as [.., 8]."""
    m, r = _verified_drafts()
    r.num_computed_tokens -= 1  # one draft rejected (vLLM: num_computed_tokens -= rejected)
    r.append_output_token_ids([5, 8])  # the accepted draft, then the bonus token
    m.free(r)
    assert hit_tokens(m, [1, 2, 3, 4, 5, 8, 9]) == 4  # [5, 8] was never written as such


def test_rolled_back_positions_are_written_again_and_then_cached() -> None:
    m, r = _verified_drafts()
    r.num_computed_tokens = 5  # draft 5 accepted, draft at position 5 rejected
    r.append_output_token_ids([5, 8])  # the bonus token 8 takes position 5
    table = m.get_block_ids("r")[0]
    assert m.allocate_slots(r, 1) is not None  # position 5 again (B = 2: the kept block)
    assert m.allocator.num_issued("r") == 5 and m.get_block_ids("r")[0] == table
    launch = m.publish([r])
    assert launch.query_lens.tolist() == [1]  # the launch writes position 5 again
    m.complete(launch)
    r.num_computed_tokens = 6
    r.append_output_token_ids([9])
    m.free(r)
    assert hit_tokens(m, [1, 2, 3, 4, 5, 8, 9]) == 6  # [5, 8]: written by that launch


def test_rollback_waits_for_the_launch_in_flight_and_changes_nothing() -> None:
    m = KVCacheManager(32, B)
    r = admitted(m, "r", [1, 2, 3])
    m.complete(m.publish([r]))
    r.num_computed_tokens = 3
    r.append_output_token_ids([4])
    m.allocate_slots(r, 3)
    launch = m.publish([r])  # drafts at positions 4, 5, still being written
    r.num_computed_tokens = 5
    before = (m.get_block_ids("r"), m.stats(), m.allocator.num_issued("r"))
    with pytest.raises(ValueError, match="still in flight"):
        m.allocate_slots(r, 1)
    assert (m.get_block_ids("r"), m.stats(), m.allocator.num_issued("r")) == before
    m.complete(launch)
    r.num_computed_tokens = 2  # below the 3 positions committed when the first launch completed
    with pytest.raises(ValueError, match="already committed"):
        m.allocate_slots(r, 1)
    r.num_computed_tokens = 5
    assert m.allocate_slots(r, 1) is not None


def test_after_a_rollback_nothing_is_committed_before_the_rewrite_completed() -> None:
    m, r = _verified_drafts()
    r.num_computed_tokens = 5  # the draft at position 5 rejected; bonus 8 takes it
    r.append_output_token_ids([5, 8])
    assert m.allocate_slots(r, 1) is not None
    rewrite = m.publish([r])  # writes position 5 again, in flight
    r.num_computed_tokens = 6
    r.append_output_token_ids([9])  # async scheduling: the next token is already known
    assert m.allocate_slots(r, 1) is not None  # must not commit position 5 yet
    assert m.allocator.num_computed("r") <= 5
    m.complete(rewrite)
    assert m.allocate_slots(r, 1) is not None
    assert m.allocator.num_computed("r") == 6
