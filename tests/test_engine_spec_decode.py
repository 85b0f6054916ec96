"""Speculative decoding through pagedkv.engine: lookahead slots, drafts verified and rejected
positions rolled back, checked by a KV oracle.

The oracle records, for every slot, the token whose KV the last launch wrote there: the
request's token, a draft token, or a lookahead slot's unknown proposal (a negative id). Every
prefix hit must find, in every slot it covers, the KV of the hitting request's own token: a
rejected draft's KV cached under the token sampled in its place would be caught here."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pagedkv.engine import EngineRequest, KVCacheManager, RequestStatus

B = 4
VOCAB = 12  # small: drafts are often right, and prompts share prefixes


class Oracle:
    def __init__(self) -> None:
        self.kv: dict[int, int] = {}  # slot -> token whose KV is there
        self.hit_tokens = 0

    def write(self, launch, views: list[list[int]]) -> None:
        """The launch writes each request's positions ``seq_len - query_len ..``."""
        ends = np.cumsum(launch.query_lens)
        for i, view in enumerate(views):
            q, n = int(launch.query_lens[i]), int(launch.seq_lens[i])
            slots = launch.slot_mapping[ends[i] - q: ends[i]]
            for p, slot in zip(range(n - q, n), slots.tolist(), strict=True):
                self.kv[slot] = view[p] if p < len(view) else -1 - p  # lookahead: unknown

    def check_hit(self, req: EngineRequest, blocks, hits: int) -> None:
        table = list(blocks.block_ids)
        for p in range(hits):
            slot = table[p // B] * B + p % B
            assert self.kv.get(slot) == req.all_token_ids[p], (
                f"{req.request_id}: hit at position {p} holds KV of {self.kv.get(slot)}, "
                f"not of its token {req.all_token_ids[p]}")
        self.hit_tokens += hits


def run(seed: int, steps: int = 250, num_blocks: int = 64) -> dict[str, int]:
    rng = random.Random(seed)
    m = KVCacheManager(num_blocks, B)
    oracle = Oracle()
    live: dict[str, tuple[EngineRequest, list[int]]] = {}  # rid -> (request, drafts)
    finished: list[list[int]] = []
    counts = {"rollbacks": 0, "rejected": 0, "admitted": 0, "lookahead": 0}
    for step in range(steps):
        if len(live) < 4:
            base = rng.choice(finished) if finished and rng.random() < 0.7 else []
            prompt = base[: rng.randint(0, len(base))] + [
                rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
            req = EngineRequest(f"r{step}", prompt)
            blocks, hits, _ = m.get_computed_blocks(req)
            oracle.check_hit(req, blocks, hits)
            la = rng.choice([0, 2, 3])
            if m.allocate_slots(req, req.num_tokens - hits, hits, blocks,
                                num_lookahead_tokens=la) is not None:
                req.status, req.num_computed_tokens = RequestStatus.RUNNING, hits
                live[req.request_id] = (req, [])
                counts["admitted"] += 1
        batch: list[tuple[EngineRequest, list[int], int]] = []
        for rid, (req, drafts) in list(live.items()):
            new = req.num_tokens - req.num_computed_tokens + len(drafts)
            la = rng.choice([0, 2, 3])
            if req.num_computed_tokens < m.allocator.num_issued(rid):
                counts["rollbacks"] += 1
            if m.allocate_slots(req, new, num_lookahead_tokens=la) is None:
                m.preempt(req)  # re-admitted later through a prefix lookup, as a new one
                finished.append(req.all_token_ids)
                del live[rid]
                continue
            counts["lookahead"] += la
            batch.append((req, drafts, new))
        if not batch:
            continue
        launch = m.publish([req for req, _, _ in batch])
        oracle.write(launch, [req.all_token_ids + drafts for req, drafts, _ in batch])
        for req, _, new in batch:
            req.num_computed_tokens += new  # as the scheduler does when it schedules
        m.complete(launch)
        for req, drafts, _ in batch:  # verification: accept a prefix of the drafts
            a = rng.randint(0, len(drafts))
            accepted = drafts[:a]
            rejected = len(drafts) - a
            req.num_computed_tokens -= rejected
            counts["rejected"] += rejected
            req.append_output_token_ids([*accepted, rng.randrange(VOCAB)])
            if req.num_tokens > 28 or rng.random() < 0.08:
                finished.append(req.all_token_ids)
                m.free(req)
                del live[req.request_id]
            else:  # the drafts to verify next step; a correct one is a guess of the bonus
                live[req.request_id] = (req, [rng.randrange(VOCAB)
                                              for _ in range(rng.choice([0, 1, 2, 3]))])
    for req, _ in live.values():
        m.free(req)
    for tokens in finished:  # everything cached still holds the right KV
        probe = EngineRequest("probe", tokens + [0])
        blocks, hits, _ = m.get_computed_blocks(probe)
        oracle.check_hit(probe, blocks, hits)
    counts["hit_tokens"] = oracle.hit_tokens
    m.allocator.check_invariants()  # raises InvariantViolation
    return counts


@pytest.mark.parametrize("seed", range(12))
def test_spec_decode_loop_hits_only_written_kv(seed: int) -> None:
    counts = run(seed)
    # the workload did what it is for: rollbacks of rejected drafts, lookahead, hits
    assert counts["rollbacks"] > 10 and counts["rejected"] > 10
    assert counts["lookahead"] > 0 and counts["hit_tokens"] > 0


def test_lookahead_slots_are_reserved_and_issued() -> None:
    m = KVCacheManager(16, B)
    req = EngineRequest("a", [1, 2, 3])
    blocks, hits, _ = m.get_computed_blocks(req)
    new = m.allocate_slots(req, 3, hits, blocks, num_lookahead_tokens=3)
    assert new is not None and len(new.block_ids) == 2  # 6 positions
    assert m.allocator.num_reserved("a") == 6
    launch = m.publish([req])
    assert launch.query_lens.tolist() == [6]
    with pytest.raises(ValueError):
        m.allocate_slots(req, 1, num_lookahead_tokens=-1)
