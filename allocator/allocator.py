"""BlockAllocator: per-request block tables over a BlockPool, with prefix caching.

Every public method names the spec transitions it performs (on ``self.pool``). Each call
validates everything first and then performs transitions whose guards are known to hold, so a
refused call raises a typed ``AllocatorError`` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pagedkv.spec import (
    CACHED,
    CONCRETE,
    FREE,
    NO_HASH,
    PUBLISHED,
    RECLAIMED,
    REFERENCED,
    TRANSITIONS,
    PoolState,
    TableView,
    slots_written,
    violations,
)
from pagedkv.spec.states import ALLOCATED

from .errors import (
    CommitError,
    DuplicateRequest,
    GuardViolation,
    InvalidArgument,
    InvariantViolation,
    OutOfBlocks,
    TokensUnknown,
    UnknownRequest,
)
from .hashing import block_hash, encode_extra_key, encode_tokens
from .launch import Launch
from .pool import BlockPool
from .table import blocks_needed, check_count, slot_mapping, writes_per_block

_HASH_MEMO_MAX = 1 << 16


@dataclass
class _Request:
    rid: Hashable
    tokens: list[int]
    salt: str | bytes | None
    extra_keys: tuple[Any, ...]
    hashes: list[int] = field(default_factory=list)  # chain hash of each full block so far
    table: list[int] = field(default_factory=list)
    reserved: int = 0  # positions the table covers for this request
    issued: int = 0  # positions a launch has been issued to write
    computed: int = 0  # positions committed (written by completed launches)
    committed_blocks: int = 0  # leading full blocks already offered to the prefix cache
    started: bool = False  # the first allocate() (which takes the prefix hits) has happened


@dataclass(frozen=True)
class Abstraction:
    """The allocator's state in the spec's vocabulary."""

    pool: PoolState
    tables: tuple[TableView, ...]


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _check_tokens(token_ids: Iterable[int]) -> list[int]:
    tokens = list(token_ids)
    if not set(map(type, tokens)) <= {int}:  # fast path: plain ints need no conversion
        for t in tokens:
            if isinstance(t, bool) or not isinstance(t, int | np.integer):
                raise InvalidArgument(f"token ids must be ints, got {type(t).__name__}")
        tokens = [int(t) for t in tokens]
    if tokens and (min(tokens) < _I64_MIN or max(tokens) > _I64_MAX):
        encode_tokens(tokens)  # raises the range error
    return tokens


class BlockAllocator:
    """A verified paged KV-cache block allocator.

    ``checked=True`` compares every transition's effect with the spec's and re-checks the
    invariants of the touched blocks (O(1) per block); guards are enforced in both modes.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        prefix_caching: bool = True,
        checked: bool = True,
    ) -> None:
        self.pool = BlockPool(num_blocks, block_size, checked=checked)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.prefix_caching = bool(prefix_caching)
        self.checked = bool(checked)
        self._requests: dict[Hashable, _Request] = {}
        self._inflight: dict[int, Launch] = {}
        self._prefix_hit_tokens = 0
        self._attached_pool: Any = None
        # block_hash is a pure function: memoize it on its full input (parent hash, the
        # block's tokens, extra keys, salt), so a shared prefix is sha256-hashed once. Bounded:
        # cleared when it reaches _HASH_MEMO_MAX entries. None disables it.
        self._hash_memo: dict[tuple[Any, ...], int] | None = {}

    # ---- requests ----------------------------------------------------------------------------
    def add_request(
        self,
        rid: Hashable,
        token_ids: Sequence[int],
        *,
        cache_salt: str | bytes | None = None,
        extra_keys: Sequence[Any] = (),
    ) -> int:
        """Register a request (spec: open_holder); return the prompt tokens the cache has now.

        Only full blocks count, and never the last prompt token (it must be computed to get
        logits). No reference is taken: ``allocate`` takes the hits found at that moment.
        """
        self._check_new_rid(rid)
        tokens = _check_tokens(token_ids)
        if cache_salt is not None and not isinstance(cache_salt, str | bytes):
            raise InvalidArgument("cache_salt must be str, bytes or None")
        extra = tuple(extra_keys)
        for key in extra:
            encode_extra_key(key)
        req = _Request(rid, tokens, cache_salt, extra)
        self._extend_hashes(req)
        self.pool.open_holder(rid)
        self._requests[rid] = req
        return len(self._hits(req)) * self.block_size

    def _extend_hashes(self, req: _Request) -> None:
        B = self.block_size
        memo = self._hash_memo
        tokens, hashes, extra = req.tokens, req.hashes, req.extra_keys
        while (len(hashes) + 1) * B <= len(tokens):
            i = len(hashes)
            parent = hashes[-1] if hashes else 0
            block = tokens[i * B : (i + 1) * B]
            salt = req.salt if i == 0 else None
            if memo is None:
                hashes.append(block_hash(parent, block, extra, salt))
                continue
            key = (parent, tuple(block), extra, salt)
            h = memo.get(key)
            if h is None:
                h = block_hash(parent, block, extra, salt)
                if len(memo) >= _HASH_MEMO_MAX:
                    memo.clear()
                memo[key] = h
            hashes.append(h)

    def _hits(self, req: _Request, limit_tokens: int | None = None) -> list[int]:
        """Cached blocks for the request's leading full prompt blocks (spec: share-able)."""
        if not self.prefix_caching:
            return []
        max_tokens = len(req.tokens) - 1  # the last known token must be computed for logits
        if limit_tokens is not None:
            max_tokens = min(max_tokens, limit_tokens)
        out: list[int] = []
        for i in range(max(0, max_tokens) // self.block_size):
            b = self.pool.lookup(req.hashes[i])
            if b is None:
                break
            out.append(b)
        return out

    def _check_new_rid(self, rid: Hashable) -> None:
        try:
            hash(rid)
        except TypeError:
            raise InvalidArgument("request ids must be hashable") from None
        if rid in self._requests:
            raise DuplicateRequest(f"request {rid!r} is already registered")

    def _ensure_room(self, need: int, held_back: int = 0) -> None:
        """Raise OutOfBlocks (nothing changed) unless ``need`` blocks can be taken now, beyond
        ``held_back`` usable blocks the caller will revive; completed launches are reclaimed
        first if that is what it takes."""
        if need > self.pool.usable() - held_back:
            self.reclaim()
            available = self.pool.usable() - held_back
            if need > available:
                raise OutOfBlocks(need, available)

    def _req(self, rid: Hashable) -> _Request:
        try:
            return self._requests[rid]
        except (KeyError, TypeError):
            raise UnknownRequest(f"unknown request {rid!r}") from None

    def allocate(self, rid: Hashable, num_tokens: int) -> list[int]:
        """Grow rid's table to cover ``num_tokens`` positions (spec: share for prefix hits on the
        first call, then allocate — evicting LRU cached blocks as needed). All or nothing."""
        req = self._req(rid)
        check_count(num_tokens, "num_tokens")
        if num_tokens < req.reserved:
            raise InvalidArgument(
                f"request {rid!r} already covers {req.reserved} positions; tables only grow"
            )
        hits = [] if req.started else self._hits(req, num_tokens)
        need = blocks_needed(num_tokens, self.block_size) - len(req.table) - len(hits)
        pool = self.pool
        revived = sum(1 for b in hits if pool.state[b] == CACHED and pool.pending[b] == 0)
        self._ensure_room(need, held_back=revived)
        for b in hits:
            pool.share(b, rid)
            req.table.append(b)
        if not req.started:
            req.started = True
            req.computed = req.issued = len(hits) * self.block_size
            req.committed_blocks = len(hits)
            self._prefix_hit_tokens += req.computed
        for _ in range(need):
            req.table.append(pool.take(rid))
        req.reserved = num_tokens
        return list(req.table)

    def append_tokens(self, rid: Hashable, token_ids: Sequence[int]) -> None:
        """Record generated tokens, so that the blocks they fill can be hashed at commit."""
        req = self._req(rid)
        req.tokens.extend(_check_tokens(token_ids))
        self._extend_hashes(req)

    def commit(self, rid: Hashable, num_tokens: int) -> None:
        """Positions below ``num_tokens`` are written (their launches completed): full blocks
        below it become REFERENCED and enter the prefix cache (spec: commit)."""
        req = self._req(rid)
        check_count(num_tokens, "num_tokens")
        B = self.block_size
        if num_tokens < req.computed:
            raise CommitError(f"{rid!r} already committed {req.computed} positions")
        if num_tokens > req.issued:
            raise CommitError(
                f"cannot commit {num_tokens} positions of {rid!r}: launches were issued for "
                f"{req.issued} (allocated {req.reserved})"
            )
        pool = self.pool
        for i in range(req.computed // B, blocks_needed(num_tokens, B)):
            b = req.table[i]
            upto = min(B, num_tokens - i * B)
            if pool.state[b] in (REFERENCED,):
                continue
            if not slots_written(CONCRETE, pool.view, b, upto):
                raise CommitError(
                    f"block {b} (entry {i} of {rid!r}) has a writing launch still pending"
                )
        full = num_tokens // B  # publish saw every written token, so their hashes exist
        req.computed = num_tokens
        if not self.prefix_caching:
            return
        for i in range(req.committed_blocks, full):
            b, h = req.table[i], req.hashes[i]
            if pool.state[b] == PUBLISHED and pool.lookup(h) is None:
                pool.commit(b, rid, h)
        req.committed_blocks = max(req.committed_blocks, full)

    def fork(self, parent: Hashable, child: Hashable) -> list[int]:
        """The child shares the parent's blocks (spec: open_holder, share each; blocks the
        parent has not published yet are unwritten, so the child takes fresh ones: allocate).

        A shared partial block is copied at the child's or parent's next write (copy-on-write,
        reported in ``Launch.copies``). All or nothing."""
        p = self._req(parent)
        self._check_new_rid(child)
        share = TRANSITIONS["share"]
        pool = self.pool
        # Blocks never handed to a kernel hold no KV yet: the child gets fresh ones instead.
        fresh = [pool.state[b] == ALLOCATED for b in p.table]
        pool.open_holder(child)
        bad = [
            b for b, f in zip(p.table, fresh, strict=True)
            if not f and not share.guard(CONCRETE, pool.view, b=b, r=child)
        ]
        if bad or sum(fresh) > pool.usable():
            pool.close_holder(child)
            if bad:
                raise GuardViolation(
                    "share", f"blocks {bad[:8]} of {parent!r} have a writing launch pending"
                )
            raise OutOfBlocks(sum(fresh), pool.usable())
        table = [
            pool.take(child) if f else b for b, f in zip(p.table, fresh, strict=True)
        ]
        for b, f in zip(p.table, fresh, strict=True):
            if not f:
                pool.share(b, child)
        c = _Request(
            child, list(p.tokens), p.salt, p.extra_keys, list(p.hashes),
            table, p.reserved, p.issued, p.computed, p.committed_blocks, p.started,
        )
        self._requests[child] = c
        return list(c.table)

    def free(self, rid: Hashable) -> None:
        """Release the request's blocks in reverse order, so its tail is evicted first
        (spec: release each, then close_holder). Preemption is free + add_request."""
        req = self._req(rid)
        for b in reversed(req.table):
            self.pool.release(b, rid)
        self.pool.close_holder(rid)
        del self._requests[rid]

    # ---- launches ----------------------------------------------------------------------------
    def publish(self, rids: Sequence[Hashable]) -> Launch:
        """Hand the requests' tables to kernels: ALLOCATED blocks are published, every used
        block is pinned (spec: publish, begin_access), shared partial blocks about to be
        written are copied first (spec: allocate, publish, begin_access, release).

        Every position written must have a known token id (``TokensUnknown`` otherwise), so
        that a fork or a prefix commit of that KV knows which tokens it holds."""
        rids = tuple(rids)
        if not rids:
            raise InvalidArgument("publish needs at least one request")
        if len(set(rids)) != len(rids):
            raise InvalidArgument("a request appears twice in one launch")
        reqs = [self._req(r) for r in rids]
        B, pool = self.block_size, self.pool
        cow: list[_Request] = []
        for req in reqs:
            if req.reserved == 0:
                raise InvalidArgument(f"request {req.rid!r} has no allocated positions")
            if req.reserved > len(req.tokens):
                # KV is written for a token; a fork or a prefix commit must know which one.
                raise TokensUnknown(
                    f"{req.rid!r} would write positions up to {req.reserved} but only "
                    f"{len(req.tokens)} token ids are known: append_tokens first"
                )
            if req.issued < req.reserved and req.issued % B:
                if pool.ref[req.table[req.issued // B]] > 1:
                    cow.append(req)
        self._ensure_room(len(cow))
        copies: list[tuple[int, int]] = []
        accesses: list[tuple[int, bool]] = []
        tables, gens, slots = [], [], []
        seq_lens, query_lens = [], []
        for req in cow:
            i = req.issued // B
            src = req.table[i]
            dst = pool.take(req.rid)
            pool.publish(dst, req.rid)
            req.table[i] = dst
            pool.release(src, req.rid)
            copies.append((src, dst))
        copied = {dst for _, dst in copies}
        for req in reqs:
            writes = writes_per_block(B, req.issued, req.reserved)
            for i, b in enumerate(req.table):
                if pool.state[b] == ALLOCATED:
                    pool.publish(b, req.rid)
                w = writes.get(i, 0)
                if b in copied and w:
                    w += req.issued % B  # the copy writes the shared slots too
                pool.begin_access(b, req.rid, w)
                accesses.append((b, w > 0))
            slots.extend(slot_mapping(req.table, B, req.issued, req.reserved))
            tables.append(list(req.table))
            gens.append([pool.gen[b] for b in req.table])
            seq_lens.append(req.reserved)
            query_lens.append(req.reserved - req.issued)
            req.issued = req.reserved
        width = max(len(t) for t in tables)
        bt = np.full((len(rids), width), -1, dtype=np.int32)
        tg = np.full((len(rids), width), -1, dtype=np.int32)
        for k, (t, g) in enumerate(zip(tables, gens, strict=True)):
            bt[k, : len(t)] = t
            tg[k, : len(g)] = g
        launch = Launch(
            rids=rids,
            block_tables=bt,
            seq_lens=np.asarray(seq_lens, dtype=np.int32),
            query_lens=np.asarray(query_lens, dtype=np.int32),
            slot_mapping=np.asarray(slots, dtype=np.int64),
            table_generations=tg,
            copies=np.asarray(copies, dtype=np.int32).reshape(-1, 2),
            accesses=tuple(accesses),
            _on_complete=self._complete,
            _generation_of=lambda: self.pool.gen,
        )
        self._inflight[id(launch)] = launch
        return launch

    def _complete(self, launch: Launch) -> None:
        for b, writes in launch.accesses:
            self.pool.end_access(b, writes)
        launch.completed = True
        self._inflight.pop(id(launch), None)

    def reclaim(self) -> int:
        """Complete the launches whose recorded events are done; reclaimed blocks they pinned
        become FREE (spec: end_access, recycle). Returns how many blocks became FREE."""
        before = self.pool.count[FREE]
        for launch in list(self._inflight.values()):
            launch.poll()
        return self.pool.count[FREE] - before

    def validate(self, launch: Launch) -> None:
        """Raise StaleTableError if the launch's tables name a block reclaimed since."""
        launch.check_current()

    @property
    def inflight(self) -> tuple[Launch, ...]:
        return tuple(self._inflight.values())

    # ---- queries -----------------------------------------------------------------------------
    def state(self, block_id: int) -> int:
        return self.pool.state[self.pool.check_block_id(block_id)]

    def ref_count(self, block_id: int) -> int:
        return self.pool.ref[self.pool.check_block_id(block_id)]

    def block_table(self, rid: Hashable) -> list[int]:
        return list(self._req(rid).table)

    def num_computed(self, rid: Hashable) -> int:
        return self._req(rid).computed

    def num_reserved(self, rid: Hashable) -> int:
        return self._req(rid).reserved

    def block_generations(self) -> np.ndarray:
        """Each block's current generation (int32), for kernels' checked launch mode."""
        return np.asarray(self.pool.gen, dtype=np.int32)

    @property
    def requests(self) -> tuple[Hashable, ...]:
        return tuple(self._requests)

    def attach_pool(self, kv_pool: Any) -> None:
        """Attach a device KV pool (e.g. ``pagedkv.kernels.KVCachePool``): its block count and
        block size must match; its memory figures then appear in ``stats()``."""
        for attr, mine in (("num_blocks", self.num_blocks), ("block_size", self.block_size)):
            theirs = getattr(kv_pool, attr, None)
            if theirs != mine:
                raise InvalidArgument(f"pool {attr} is {theirs!r}, the allocator's is {mine}")
        self._attached_pool = kv_pool

    def stats(self) -> dict[str, int]:
        c, pool = self.pool.count, self.pool
        out = {
            "free": c[FREE],
            "evictable_cached": c[CACHED],
            "in_use": c[ALLOCATED] + c[PUBLISHED] + c[REFERENCED],
            "reclaimed_pending": c[RECLAIMED],
            "admission_headroom": c[FREE] + c[CACHED],
            "allocatable_now": pool.usable(),
            "prefix_hit_tokens": self._prefix_hit_tokens,
            "tail_waste_slots": sum(
                len(r.table) * self.block_size - r.reserved for r in self._requests.values()
            ),
            "inflight_launches": len(self._inflight),
        }
        if self._attached_pool is not None:
            per = int(self._attached_pool.bytes_per_block)
            out["bytes_per_block"] = per
            out["reserved_bytes"] = int(self._attached_pool.reserved_bytes)
            out["in_use_bytes"] = out["in_use"] * per
        return out

    # ---- the spec view -----------------------------------------------------------------------
    def abstract(self) -> Abstraction:
        """The allocator's state mapped to the spec's state, plus its tables."""
        tables = tuple(
            TableView(
                holder=r.rid,
                entries=tuple(r.table),
                reserved=r.reserved,
                computed=r.computed,
                chain=tuple(
                    r.hashes[i] if i < len(r.hashes) else NO_HASH for i in range(len(r.table))
                ),
            )
            for r in self._requests.values()
        )
        return Abstraction(self.pool.abstract(), tables)

    def check_invariants(self) -> None:
        """Scan everything; raise InvariantViolation naming the first invariant that fails."""
        a = self.abstract()
        found = violations(a.pool, a.tables) + self.pool.structure_errors()
        if found:
            name, where = found[0]
            raise InvariantViolation(name, f"at {where!r}" + (
                f" (and {len(found) - 1} more)" if len(found) > 1 else ""))


__all__ = ["Abstraction", "BlockAllocator"]
