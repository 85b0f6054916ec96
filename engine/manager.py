"""KVCacheManager: a vLLM-0.33.0-shaped front door over one pagedkv ``BlockAllocator``.

The calls and their meaning follow vLLM 0.33.0's ``vllm/v1/core/kv_cache_manager.py`` (one
full-attention KV-cache group), so a scheduler written against vLLM's manager can drive
pagedkv: ``get_computed_blocks`` (prefix lookup), ``allocate_slots`` (all or nothing: ``None``
and nothing changed when it does not fit), ``free``, ``usage``, ``make_prefix_cache_stats`` /
``record_prefix_cache_stats``, ``reset_prefix_cache``, ``take_events``, ``get_block_ids``,
``get_blocks``, ``get_num_common_prefix_blocks``, ``new_step_starts``, ``cache_blocks``. On top
of that it has what vLLM lacks, the launch: ``publish(requests) -> Launch`` hands the step's
block tables to the kernels and pins every block they use; ``complete(launch)`` (or
``launch.record(event)``, noticed at the next call) says the kernels are done, and only then
do the full blocks that launch wrote enter the prefix cache.

Deliberate differences from vLLM 0.33.0 (each one is a safety rule or a scope limit):

1. **Hits only on written KV.** vLLM hashes and caches a request's full blocks inside
   ``allocate_slots``, before the step that writes their KV has run, so a request admitted
   later in the same step can hit blocks whose KV does not exist yet. Here blocks enter the
   cache only when the launch that wrote them completed (``complete`` / a recorded event);
   such a request recomputes the prefix instead.
2. **Identical full blocks are deduplicated.** vLLM caches every full block under its hash,
   so one hash can map to several blocks. Here a full block whose hash is already cached is
   not cached again: the copy stays private to its request and is freed (reused first, like
   an unhashed block) when the request frees it, where vLLM keeps it as a second evictable
   entry at the LRU end. Evictable counts are therefore lower and, when the pool is under
   pressure, eviction order can differ.
3. **The lookup cannot go stale.** ``BlockAllocator.allocate`` takes every prefix hit the
   cache holds at a request's first allocation. ``allocate_slots`` re-runs the lookup and
   compares it with the ``new_computed_blocks`` it is given: a lookup that went stale (the
   cache changed in between) returns ``None`` and changes nothing (redo
   ``get_computed_blocks``, as vLLM's scheduler does on every admission attempt); a first
   allocation that passes no lookup while the cache holds hits is a ``ValueError``.
   ``max_cache_hit_length`` shorter than ``num_tokens - 1`` is refused for the same reason.
4. **The null block.** Like vLLM, ``num_blocks`` counts a null block: block 0 is never handed
   out (a private holder keeps it), so ids and ``usage`` match vLLM's (``num_blocks - 1``
   usable). ``null_block=False`` uses every block.
5. **Pins.** A launch pins, by its number, every block held when it is published: a block
   freed while such a launch is in flight is not reusable until every launch published
   before it was freed completed (epoch-based reclamation: it waits,
   ``stats()["reclaimed_waiting"]``), and capacity checks count only blocks allocatable now
   (FREE, idle cached, and what completed launches release). They count as not in use in
   ``usage`` and ``get_num_free_blocks`` (no request holds them).
6. **Scope.** One full-attention group. Positions whose token ids are not known when their
   launch is published are written and committed later: async scheduling (the token is
   sampled by the launch in flight) and speculative-decoding verification (``num_new_tokens``
   covering draft tokens); such a position is hashed and cached only once its id is known
   and ``num_computed_tokens`` counts it, so the KV of a rejected draft is never cached under
   the token sampled in its place. ``num_lookahead_tokens`` reserves that many more
   positions (the launch writes them: a drafter's proposals). Rolling back (the scheduler
   lowers ``num_computed_tokens`` below the issued positions after rejecting drafts) happens
   at the next ``allocate_slots``: ``BlockAllocator.truncate`` rewinds the kept partial
   block's rejected slots and releases the table entries wholly past the new end (epochs:
   reused once no launch can read them), and the table grows again, so the next launch writes
   those positions anew. vLLM keeps the blocks, so block ids past the rollback point can
   differ. A rollback is refused (``ValueError``, nothing changed) while a launch (or a
   transfer) of the request is in flight, or below what is already committed; its capacity
   check does not count the blocks it is about to release. ``num_external_computed_tokens`` (KV
   connectors) and ``num_encoder_tokens`` must be 0. ``delay_cache_blocks`` and
   ``skip_zeroing_group_ids`` are accepted and have no effect (caching always waits for the
   launch). ``cache_blocks`` caches nothing by itself: it only processes completed launches.
7. **Return shapes.** ``get_computed_blocks`` returns vLLM 0.33.0's triple
   ``(blocks, num_computed_tokens, shared_prefix_boundary)``, the last always 0 (full
   attention); ``get_num_common_prefix_blocks`` returns ``[0]`` as vLLM 0.33.0 does (cascade
   attention was removed). ``KVCacheBlocks`` holds block ids, not block objects.
8. **KV events.** Hashes are pagedkv's 256-bit ints; one ``BlockStored`` per contiguous run of
   newly cached blocks of a request, at completion (it also lists the block ids); one
   ``BlockRemoved`` per eviction; ``AllBlocksCleared`` on reset. Observed through the pool's
   transition trace (``BlockPool.trace``), enabled only with ``enable_kv_cache_events=True``.

9. **Transfers.** ``begin_transfer(request)`` / ``end_transfer(request)`` bracket a copy of
   the request's device blocks to or from another tier (``pagedkv.engine.offload``): while
   one is in flight ``publish`` refuses the request (``TransferInFlight``: a launch would
   write blocks a store reads, or be taken as having written KV a load has not delivered)
   and ``free`` / ``preempt`` wait for the last one to end (deferred free).

Prefix stats are recorded by the scheduler, as in vLLM (``record_prefix_cache_stats`` at
admission; preempted re-admissions are counted apart); ``make_prefix_cache_stats`` returns
them and starts new ones. ``preempt(request)`` and ``append_token(request, token)`` do the
KV-side part of vLLM's ``_preempt_request`` and ``append_output_token_ids``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from pagedkv.allocator import BlockAllocator, Launch, LaunchAlreadyCompleted, OutOfBlocks
from pagedkv.spec import PUBLISHED, REFERENCED, takeable
from pagedkv.spec.request_spec import RequestSpec
from pagedkv.spec.states import ALLOCATED

from .events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from .request import EngineRequest, RequestStatus, _as_token

_F = TypeVar("_F", bound=Callable[..., Any])


class TransferInFlight(ValueError):
    """A request whose device blocks are being copied to or from another tier was published:
    the launch would race the copy (see ``KVCacheManager.begin_transfer``)."""


def _locked(method: _F) -> _F:
    @wraps(method)
    def run(self: KVCacheManager, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _count(value: Any, name: str) -> int:
    if type(value) is int and value >= 0:  # the common case: a plain int, nothing to convert
        return value
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value.__index__())
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def does_not_fit(block_size: int, usable: int, num_tokens: int, target: int, have: int,
                 extra: int, full_sequence_must_fit: bool, reserved_blocks: int) -> bool:
    """Whether growing a request of ``num_tokens`` tokens to ``target`` positions (with
    ``full_sequence_must_fit``: to its whole sequence too) needs more blocks than are
    ``usable``: the blocks beyond the ``have`` it holds or takes as hits, plus ``extra`` (idle
    hits it revives, the watermark), against the usable ones (less ``reserved_blocks``).
    vLLM's ``allocate_slots`` capacity check, for every front door."""
    if (full_sequence_must_fit
            and max(_cdiv(num_tokens, block_size) - have, 0) + extra > usable):
        return True
    return max(_cdiv(target, block_size) - have, 0) + extra > usable - reserved_blocks


@dataclass(frozen=True, eq=True)
class KVCacheBlocks:
    """Block ids handed to or taken from the scheduler (vLLM's ``KVCacheBlocks``, one group).
    Like vLLM's, an empty one is still truthy: test ``is None`` for a failed allocation."""

    block_ids: tuple[int, ...] = ()

    def get_block_ids(self, allow_none: bool = False) -> tuple[list[int], ...] | None:
        if allow_none and not self.block_ids:
            return None
        return (list(self.block_ids),)

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(self.block_ids + other.block_ids)


@dataclass
class PrefixCacheStats:
    """vLLM's ``PrefixCacheStats``: lookups counted at admission, preempted ones apart."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


class _NullHolder:
    """The private holder of the null block (block 0)."""

    def __repr__(self) -> str:
        return "<null block holder>"


class _Live:
    """A request the allocator has a table for."""

    __slots__ = ("req", "record", "known", "computed", "written", "vouched", "inflight",
                 "cursor")

    def __init__(self, req: EngineRequest, computed: int, record: Any) -> None:
        self.req = req
        # The allocator's record of the request (its table and counts), read and grown under
        # the allocator's lock, which is the manager's.
        self.record = record
        self.known = req.num_tokens  # token ids the allocator knows
        self.computed = computed  # positions committed in the allocator (see _commit_target)
        # Positions written by completed launches (in publish order), and of those, the ones
        # whose token ids were known when their launch was published.
        self.written = self.vouched = computed
        # (launch, positions it covers, of those the ones whose token ids it was given)
        self.inflight: deque[tuple[Launch, int, int]] = deque()
        self.cursor = 0  # where to look for the next committed hash (events)


class KVCacheManager:
    """vLLM 0.33.0's KVCacheManager calls over one pagedkv ``BlockAllocator`` (see module doc).

    ``num_blocks`` includes the null block when ``null_block`` (the default, as in vLLM).
    ``checked`` is the allocator's checked mode. ``watermark`` is vLLM's: a fraction of
    ``num_blocks`` kept free when admitting waiting / preempted requests while others run.

    Thread safety: every public method runs under one lock per manager, its allocator's (so a
    thread calling the allocator directly waits for the manager's call, and the other way
    round); launches may be completed (``Launch.complete``) from any thread: the manager
    notices at its next call.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        checked: bool = True,
        *,
        log_stats: bool = True,
        enable_kv_cache_events: bool = False,
        watermark: float = 0.0,
        null_block: bool = True,
        spec: RequestSpec | None = None,
    ) -> None:
        """``spec``: the request layer the allocator enforces and this manager's lookups
        evaluate (default ``spec.REQUEST_SPEC``); tests pass a changed one here."""
        for name, flag in (("enable_caching", enable_caching), ("checked", checked),
                           ("log_stats", log_stats), ("null_block", null_block),
                           ("enable_kv_cache_events", enable_kv_cache_events)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        if isinstance(watermark, bool) or not isinstance(watermark, int | float) or not (
                0.0 <= watermark <= 1.0):
            raise ValueError(f"watermark must be a fraction in [0, 1], got {watermark!r}")
        if null_block and isinstance(num_blocks, int) and num_blocks < 2:
            raise ValueError("num_blocks must be >= 2 with a null block")
        self._alloc = BlockAllocator(num_blocks, block_size, prefix_caching=enable_caching,
                                     checked=checked, spec=spec)
        self.spec: RequestSpec = self._alloc.spec
        self._pool = self._alloc.pool
        self.num_blocks: int = self._alloc.num_blocks
        self.block_size: int = self._alloc.block_size
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.log_stats = log_stats
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.empty_kv_cache_blocks = KVCacheBlocks()
        # One lock for the manager and its allocator: a manager call holds it throughout, so it
        # may read the allocator's request records (``_Live.record``) as they stand.
        self._lock = self._alloc._lock
        self._live: dict[Hashable, _Live] = {}
        self._inflight: dict[int, tuple[Launch, list[_Live]]] = {}  # by Launch.seq
        self._transfers: dict[Hashable, int] = {}  # request id -> copies in flight
        self._free_after_transfer: set[Hashable] = set()
        self._prefix_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None
        self._events: list[KVCacheEvent] = []
        self._cached_hash: dict[int, int] = {}  # block -> hash it is cached under (events)
        self._trace: list[tuple[str, dict[str, Any]]] | None = None
        self._null: _NullHolder | None = None
        if null_block:
            self._null = _NullHolder()
            self._alloc.add_request(self._null, [0])
            if self._alloc.allocate(self._null, 1) != [0]:  # pragma: no cover - queue order
                raise AssertionError("the null block is not block 0")
        if enable_kv_cache_events:
            self._trace = []
            self._pool.trace = self._trace

    # ---- properties --------------------------------------------------------------------
    @property
    def allocator(self) -> BlockAllocator:
        """The underlying allocator (for kernels: ``block_generations``, ``attach_pool``)."""
        return self._alloc

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - (self._null is not None)

    def _held(self) -> int:
        c = self._pool.count
        return c[ALLOCATED] + c[PUBLISHED] + c[REFERENCED] - (self._null is not None)

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks that some request holds (vLLM: 1 - free / usable)."""
        with self._lock:
            total = self.num_usable_blocks
            return self._held() / total if total else 0.0

    @_locked
    def get_num_free_blocks(self) -> int:
        """Usable blocks no request holds: FREE, zero-ref cached, and freed blocks still read by
        an in-flight launch (vLLM's free-queue length; see ``stats()`` for the split)."""
        return self.num_usable_blocks - self._held()

    @_locked
    def stats(self) -> dict[str, int]:
        """The allocator's ``stats()`` (the null block counts in ``held``)."""
        return self._alloc.stats()

    # ---- hashing and lookup ------------------------------------------------------------
    def _hashes(self, req: EngineRequest) -> list[int]:
        B = self.block_size
        key = (B, req.cache_salt, req.hash_keys)
        if req._hash_key != key:
            req._hash_key = key
            req.block_hashes = []
        hs, toks = req.block_hashes, req._all
        if (len(hs) + 1) * B <= len(toks):  # memoized: the allocator does not hash them again
            hs += self._alloc.chain_hashes(toks, start=len(hs), parent=hs[-1] if hs else 0,
                                           extra_keys=key[2], salt=req.cache_salt)
        return hs

    def _lookup(self, req: EngineRequest) -> list[int]:
        """The blocks the allocator's first ``allocate`` would take as prefix hits now."""
        if not self.enable_caching:
            return []
        return self.spec.leading_hits(self._hashes(req), req.num_tokens, self.block_size,
                                      self._pool.hmap.get)

    # ---- launches and completion --------------------------------------------------------
    def _sweep(self) -> None:
        """Complete launches whose events are done; commit what completed launches wrote."""
        if not self._inflight:
            return
        done = [pair for pair in self._inflight.values()
                if pair[0].completed or pair[0].event_done()]
        if not done:
            return
        for launch, _ in done:
            if not launch.completed:
                launch.poll()
            del self._inflight[launch.seq]
        if len(done) == 1:
            touched: Iterable[_Live] = done[0][1]  # a request appears once in a launch
        else:
            touched = {id(e): e for _, entries in done for e in entries}.values()
        self._drain()
        self._commit_ready(touched, advance=True)

    def _commit_ready(self, entries: Iterable[_Live], advance: bool = False) -> None:
        """Commit, in one step-level call, what each live entry may commit now (the tokens of
        those positions synced first where the allocator does not know them yet). With
        ``advance``, each entry first takes in its completed launches (``_advance``)."""
        live, target, take_in = self._live, self._commit_target, self._advance
        ready: list[_Live] = []
        commits: list[tuple[Hashable, int]] = []
        unsynced: list[_Live] = []
        for e in entries:
            if advance:
                take_in(e)
            rid = e.req.request_id
            if live.get(rid) is e and (n := target(e)) is not None:
                ready.append(e)
                commits.append((rid, n))
                if e.known < n:
                    unsynced.append(e)
        if commits:
            if unsynced:
                self._sync_many(unsynced)
            self._alloc.commit_many(commits)
            for e, (_, n) in zip(ready, commits, strict=True):
                e.computed = n
            self._drain()

    def _check_rollback(self, entry: _Live, issued: int) -> None:
        """``ValueError`` (nothing changed) unless the entry's positions from
        ``num_computed_tokens`` on may be rolled back now."""
        req = entry.req
        n = req.num_computed_tokens
        self._advance(entry)
        if entry.inflight or req.request_id in self._transfers:
            raise ValueError(
                f"{req!r}: num_computed_tokens {n} is below the {issued} positions launches "
                "were issued to write, and one of its launches (or a copy of its blocks) is "
                "still in flight: roll back once it completed")
        if n < entry.computed or n < 1:
            raise ValueError(
                f"{req!r}: num_computed_tokens {n} is below the {max(entry.computed, 1)} "
                "positions already committed (cached): they cannot be rolled back")

    def _rollback(self, entry: _Live) -> None:
        """Forget the entry's positions from ``num_computed_tokens`` on (``_check_rollback``
        passed): ``BlockAllocator.truncate`` releases the table entries past the new end and
        rewinds the kept partial block's dropped slots, so the next launch writes them again
        and nothing of the rejected tokens is committed."""
        n = entry.req.num_computed_tokens
        self._alloc.truncate(entry.req.request_id, n)
        entry.known = min(entry.known, n)  # truncate forgot the ids from n on: resent
        entry.written = min(entry.written, n)
        entry.vouched = min(entry.vouched, n)

    @staticmethod
    def _advance(entry: _Live) -> None:
        """Take in the entry's launches that completed, in publish order (a launch that
        completed before an older one waits for it)."""
        inflight = entry.inflight
        while inflight and inflight[0][0].completed:
            _, written, vouched = inflight.popleft()
            if written > entry.written:
                entry.written = written
            if vouched > entry.vouched:
                entry.vouched = vouched

    def _commit_target(self, entry: _Live) -> int | None:
        """The positions the entry may commit now, or None for nothing new.

        Completed launches wrote up to ``written``. A position whose token id the launch was
        given (up to ``vouched``) holds KV of that token. One whose id was not known yet
        (async scheduling: sampled on the device; speculative decoding: a draft token) holds
        KV of whatever token the device used, so it is committed only once its id is known
        and the scheduler counts it computed (``num_computed_tokens``: below a rejected
        draft). While a later launch is in flight, only whole blocks (it may still write the
        last partial one)."""
        req = entry.req
        n = min(entry.written, req.num_computed_tokens, len(req._all))
        if entry.vouched > n:
            n = entry.vouched
        if entry.inflight:
            n -= n % self.block_size
        return n if n > entry.computed else None

    def _drain(self) -> None:
        """Turn the pool's recorded commits and evictions into KV events."""
        tr = self._trace
        if not tr:
            return
        run: list[tuple[Hashable, int, int]] = []
        for name, p in tr:
            if name == "commit":
                self._cached_hash[p["b"]] = p["h"]
                run.append((p["r"], p["b"], p["h"]))
            elif name == "evict":
                if run:
                    self._emit_stored(run)
                    run = []
                h = self._cached_hash.pop(p["b"])
                self._events.append(BlockRemoved(block_hashes=[h]))
        if run:
            self._emit_stored(run)
        tr.clear()

    def _emit_stored(self, commits: list[tuple[Hashable, int, int]]) -> None:
        B = self.block_size
        groups: list[tuple[_Live, list[int], list[int]]] = []  # (entry, indices, blocks)
        for rid, b, h in commits:
            entry = self._live[rid]
            hs = self._hashes(entry.req)
            i = entry.cursor
            while i < len(hs) and hs[i] != h:
                i += 1
            if i == len(hs):  # pragma: no cover - commits come in index order
                i = hs.index(h)
            entry.cursor = i + 1
            if groups and groups[-1][0] is entry and groups[-1][1][-1] == i - 1:
                groups[-1][1].append(i)
                groups[-1][2].append(b)
            else:
                groups.append((entry, [i], [b]))
        for entry, idx, blocks in groups:
            req = entry.req
            hs = self._hashes(req)
            keys = req.hash_keys
            self._events.append(BlockStored(
                block_hashes=[hs[i] for i in idx],
                parent_block_hash=hs[idx[0] - 1] if idx[0] else None,
                token_ids=req._all[idx[0] * B:(idx[-1] + 1) * B],
                block_size=B,
                lora_id=req.lora_id,
                lora_name=req.lora_name,
                extra_keys=[(req.cache_salt, *keys) if i == 0 and req.cache_salt is not None
                            else keys for i in idx],
                block_ids=blocks,
            ))

    def _sync_many(self, entries: Sequence[_Live]) -> None:
        """Tell the allocator, in one step-level call, the tokens appended to these requests
        since it last knew (``append_token`` only records them on the request)."""
        updates = []
        B, caching = self.block_size, self.enable_caching
        for entry in entries:
            req = entry.req
            n = len(req._all)
            if entry.known < n:
                updates.append((req.request_id, req._all[entry.known:]))
                entry.known = n
                if caching and (len(req.block_hashes) + 1) * B <= n:  # as append_token
                    self._hashes(req)
        if updates:
            self._alloc.append_tokens_many(updates)

    @_locked
    def publish(self, requests: Sequence[EngineRequest]) -> Launch:
        """Hand the requests' block tables to the kernels (``BlockAllocator.publish``): the
        launch writes each request's positions allocated since its last launch and pins every
        block it reads. Complete it with ``complete(launch)`` or ``launch.record(event)``."""
        if self._inflight:
            self._sweep()
        live, transfers = self._live, self._transfers
        entries: list[_Live] = []
        rids: list[Hashable] = []
        for r in requests:
            rid = getattr(r, "request_id", None)
            entry = live.get(rid)
            if entry is None or entry.req is not r:
                raise ValueError(f"{r!r} holds no blocks of this manager (allocate_slots first)")
            if transfers and rid in transfers:
                raise TransferInFlight(f"{r!r} has a copy of its blocks in flight: "
                                       "end_transfer before publishing it")
            entries.append(entry)
            rids.append(rid)
        self._sync_many(entries)
        launch = self._alloc.publish(rids)
        if self._trace:
            self._drain()
        for entry, reserved in zip(entries, launch.seq_lens.tolist(), strict=True):
            known = entry.known  # synced above: the token ids this launch was given
            entry.inflight.append((launch, reserved, reserved if reserved <= known else known))
        self._inflight[launch.seq] = (launch, entries)
        return launch

    @_locked
    def complete(self, launch: Launch) -> None:
        """The launch's kernels are done: unpin its blocks and cache the full blocks it wrote.
        ``LaunchAlreadyCompleted`` if it already completed."""
        pair = self._inflight.get(getattr(launch, "seq", None))  # type: ignore[arg-type]
        if pair is None or pair[0] is not launch:
            if isinstance(launch, Launch) and launch.completed:
                raise LaunchAlreadyCompleted(f"{launch!r} already completed")
            raise ValueError(f"{launch!r} is not an in-flight launch of this manager")
        launch.complete()
        self._sweep()

    @_locked
    def poll(self) -> int:
        """Process launches that completed or whose recorded events are done; returns how many
        launches are still in flight."""
        self._sweep()
        return len(self._inflight)

    @_locked
    def new_step_starts(self) -> None:
        """Start of a scheduler step: process completed launches."""
        self._sweep()

    @_locked
    def cache_blocks(self, request: EngineRequest, num_computed_tokens: int) -> None:
        """vLLM caches blocks here; pagedkv caches them when their launch completes, so this
        only processes completed launches."""
        _count(num_computed_tokens, "num_computed_tokens")
        self._sweep()

    # ---- the vLLM calls ----------------------------------------------------------------
    @_locked
    def get_computed_blocks(
        self, request: EngineRequest, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """The prefix-cache hit for a waiting request: (blocks, hit tokens, 0). Whole blocks
        only, never the last token (it must be computed to get logits). Nothing is taken: pass
        the blocks to ``allocate_slots`` right away (it re-validates them)."""
        self._sweep()
        if request.request_id in self._live:
            raise ValueError(f"{request!r} already holds blocks: lookups are for admission")
        if max_cache_hit_length is not None:
            if _count(max_cache_hit_length, "max_cache_hit_length") < request.num_tokens - 1:
                raise ValueError("max_cache_hit_length < num_tokens - 1 is not supported: "
                                 "BlockAllocator takes every hit at the first allocation")
        hits = self._lookup(request)
        if not hits:
            return self.empty_kv_cache_blocks, 0, 0
        return KVCacheBlocks(tuple(hits)), len(hits) * self.block_size, 0

    def allocate_slots(
        self,
        request: EngineRequest,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        """Grow the request's table to cover ``num_computed_tokens + num_new_computed_tokens +
        num_new_tokens`` positions; the first call also takes the prefix hit
        ``new_computed_blocks`` (from ``get_computed_blocks``). Returns the newly allocated
        blocks, or ``None`` when they do not fit (or the lookup went stale): nothing changed.

        ``full_sequence_must_fit``: admit only if the whole current sequence
        (``request.num_tokens``) would fit. ``reserved_blocks``: leave that many allocatable
        blocks. The watermark applies to WAITING / PREEMPTED requests when
        ``has_scheduled_reqs``."""
        with self._lock:  # (inline: the wrapper's call costs as much as the fast path)
            if self._inflight:
                self._sweep()
            entry = self._live.get(request.request_id)
            if (entry is not None and new_computed_blocks is None
                    and type(num_new_tokens) is int and num_new_tokens > 0
                    and type(num_new_computed_tokens) is int and not num_new_computed_tokens
                    and type(num_lookahead_tokens) is int and not num_lookahead_tokens
                    and type(reserved_blocks) is int and not reserved_blocks
                    and full_sequence_must_fit is False
                    and type(num_external_computed_tokens) is int
                    and not num_external_computed_tokens
                    and type(num_encoder_tokens) is int and not num_encoder_tokens
                    and self._grew_within_table(entry, request, num_new_tokens)):
                return self.empty_kv_cache_blocks
            return self._allocate_slots(
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                num_lookahead_tokens, num_external_computed_tokens, num_encoder_tokens,
                full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)

    def _grew_within_table(self, entry: _Live, request: EngineRequest,
                           num_new_tokens: int) -> bool:
        """Grow a running request by ``num_new_tokens`` (a plain int > 0) if that stays within
        its table (most decode steps) and return True; else change nothing and return False.
        Within the table there is no rollback, nothing to commit first, no watermark and no
        block needed, so nothing can refuse it: the allocator's growth, which finds nothing to
        take (what ``_allocate_slots`` does for it)."""
        if (entry.req is not request or entry.written > entry.computed
                or (self.watermark_blocks and request.status != RequestStatus.RUNNING)):
            return False
        record = entry.record
        target = request.num_computed_tokens
        if target < record.issued:  # a rollback
            return False
        target += num_new_tokens
        if target < record.reserved:
            target = record.reserved
        if target > len(record.table) * self.block_size:
            return False
        self._alloc._extend(record, target)
        return True

    def allocate_slots_many(self, requests: Sequence[EngineRequest],
                            num_new_tokens: Sequence[int], *,
                            num_lookahead_tokens: int = 0) -> list[KVCacheBlocks]:
        """The running pass of a scheduler step in one call: ``allocate_slots(request, n,
        num_lookahead_tokens=num_lookahead_tokens)`` for each running request and its ``n``
        new tokens, in order, stopping at the first one that does not fit (vLLM's scheduler
        passes one lookahead to every running request). Returns the new blocks of each
        request allocated, in order: a list shorter than ``requests`` means
        ``requests[len(result)]`` did not fit and it and those after it are unchanged (a
        scheduler then preempts, as vLLM's does, and calls again from it). Every argument is
        checked before anything changes: each request must hold blocks of this manager
        (admissions go through ``allocate_slots``) and appear once, each count be an int > 0
        and the lookahead an int >= 0 (``ValueError`` / ``TypeError``)."""
        reqs = list(requests)
        counts = list(num_new_tokens)
        if len(reqs) != len(counts):
            raise ValueError(f"allocate_slots_many: {len(reqs)} requests but "
                             f"{len(counts)} token counts")
        lookahead = _count(num_lookahead_tokens, "num_lookahead_tokens")
        with self._lock:
            if self._inflight:
                self._sweep()
            live = self._live
            entries: list[_Live] = []
            for i, (request, n) in enumerate(zip(reqs, counts, strict=True)):
                if type(n) is not int or n <= 0:
                    counts[i] = n = _count(n, "num_new_tokens")
                    if n == 0:
                        raise ValueError("allocate_slots_many: num_new_tokens must be > 0")
                entry = live.get(getattr(request, "request_id", None))
                if entry is None or entry.req is not request:
                    raise ValueError(f"{request!r} holds no blocks of this manager: admit it "
                                     "with allocate_slots")
                entries.append(entry)
            if len({id(e) for e in entries}) != len(entries):
                raise ValueError("allocate_slots_many: a request appears twice")
            out: list[KVCacheBlocks] = []
            empty, grew = self.empty_kv_cache_blocks, self._grew_within_table
            for entry, request, n in zip(entries, reqs, counts, strict=True):
                if not lookahead and grew(entry, request, n):
                    out.append(empty)
                    continue
                new = self._allocate_slots(request, n, 0, None, lookahead, 0, 0, False, 0, True)
                if new is None:
                    break
                out.append(new)
            return out

    def _refused_before_lookup(self, request: EngineRequest, target: int, given: int,
                               full_sequence_must_fit: bool, reserved_blocks: int) -> bool:
        """A waiting request that does not fit even if the ``given`` blocks are the cache's
        hits now, without the idle hits and the watermark (which only add to the need): the
        lookup that follows could only refuse it too (stale), so it is skipped."""
        return self._does_not_fit(request, target, given, 0, full_sequence_must_fit,
                                  reserved_blocks)

    def _does_not_fit(self, request: EngineRequest, target: int, have: int, extra: int,
                      full_sequence_must_fit: bool, reserved_blocks: int) -> bool:
        return does_not_fit(self.block_size, self._pool.usable(), request.num_tokens, target,
                            have, extra, full_sequence_must_fit, reserved_blocks)

    def _allocate_slots(
        self,
        request: EngineRequest,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: KVCacheBlocks | None,
        num_lookahead_tokens: int,
        num_external_computed_tokens: int,
        num_encoder_tokens: int,
        full_sequence_must_fit: bool,
        reserved_blocks: int,
        has_scheduled_reqs: bool,
    ) -> KVCacheBlocks | None:
        """``allocate_slots`` past its fast path, under the lock."""
        if type(num_new_tokens) is not int or num_new_tokens < 0:
            num_new_tokens = _count(num_new_tokens, "num_new_tokens")
        if type(num_new_computed_tokens) is not int or num_new_computed_tokens:
            num_new_computed_tokens = _count(num_new_computed_tokens, "num_new_computed_tokens")
        if type(reserved_blocks) is not int or reserved_blocks:
            reserved_blocks = _count(reserved_blocks, "reserved_blocks")
        if type(num_lookahead_tokens) is not int or num_lookahead_tokens:
            num_lookahead_tokens = _count(num_lookahead_tokens, "num_lookahead_tokens")
        if (type(num_external_computed_tokens) is not int or num_external_computed_tokens
                or type(num_encoder_tokens) is not int or num_encoder_tokens):
            for name, v in (("num_external_computed_tokens", num_external_computed_tokens),
                            ("num_encoder_tokens", num_encoder_tokens)):
                if _count(v, name):
                    raise ValueError(f"{name} > 0 is not supported by pagedkv.engine")
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no "
                             "computed tokens to adopt")
        if new_computed_blocks is not None and not isinstance(new_computed_blocks,
                                                              KVCacheBlocks):
            raise TypeError("new_computed_blocks must be KVCacheBlocks or None")
        B, alloc, pool = self.block_size, self._alloc, self._pool
        rid = request.request_id
        entry = self._live.get(rid)
        given = new_computed_blocks.block_ids if new_computed_blocks is not None else ()
        if num_new_computed_tokens != len(given) * B:
            raise ValueError(f"num_new_computed_tokens {num_new_computed_tokens} != "
                             f"{len(given)} blocks x {B}")
        if entry is None:
            if request.num_computed_tokens:
                raise ValueError(f"{request!r} holds no blocks but num_computed_tokens is "
                                 f"{request.num_computed_tokens} (preempt resets it to 0)")
            if new_computed_blocks is not None and self._refused_before_lookup(
                    request, num_new_computed_tokens + num_new_tokens + num_lookahead_tokens,
                    len(given), full_sequence_must_fit, reserved_blocks):
                return None
            hits = self._lookup(request)
            if list(given) != hits:
                if new_computed_blocks is None:
                    raise ValueError(f"{request!r}: the cache holds {len(hits)} hit blocks; "
                                     "pass get_computed_blocks()'s result (the first "
                                     "allocation takes every hit)")
                return None  # stale lookup: redo get_computed_blocks
            table_len = 0
            target = num_new_computed_tokens + num_new_tokens + num_lookahead_tokens
            rollback = False
        else:
            if entry.req is not request:
                raise ValueError(f"another request with id {rid!r} holds blocks")
            if given:
                raise ValueError(f"{request!r} is running: it takes no new prefix hits")
            hits = []
            issued, reserved = entry.record.issued, entry.record.reserved
            n = request.num_computed_tokens
            rollback = n < issued  # rejected speculative tokens: write those positions again
            if rollback:
                self._check_rollback(entry, issued)
                reserved = n
            elif entry.written > entry.computed:  # written positions whose ids came later
                self._commit_ready((entry,))  # (commits reserve nothing)
            table_len = _cdiv(reserved, B)
            target = max(n + num_new_tokens + num_lookahead_tokens, reserved)
        if hits:  # cached hits an allocation could take: revived instead
            is_takeable = pool.predicate(takeable, ("b",))
            idle_hits = sum(map(is_takeable, hits))
        else:
            idle_hits = 0
        watermark = 0
        if has_scheduled_reqs and self.watermark_blocks and request.status in (
                RequestStatus.WAITING, RequestStatus.PREEMPTED):
            watermark = self.watermark_blocks
        if entry is not None and not (rollback or full_sequence_must_fit or watermark
                                      or reserved_blocks) and target <= table_len * B:
            # Growth within the table (most decode steps): no block is needed, so nothing can
            # refuse it; the allocator's growth, which finds nothing to take.
            alloc._extend(entry.record, target)
            return self.empty_kv_cache_blocks
        if self._does_not_fit(request, target, table_len + len(hits), idle_hits + watermark,
                              full_sequence_must_fit, reserved_blocks):
            return None
        if entry is None:
            alloc.add_request(rid, request._all, cache_salt=request.cache_salt,
                              extra_keys=request.hash_keys)
            try:
                added = alloc.extend(rid, target)
            except OutOfBlocks:  # pragma: no cover - checked above
                alloc.free(rid)
                return None
            except Exception:
                alloc.free(rid)
                raise
            self._live[rid] = _Live(request, len(hits) * B, alloc._req(rid))
        else:
            if rollback:
                self._rollback(entry)
            try:
                added = alloc.extend(rid, target)
            except OutOfBlocks:  # pragma: no cover - checked above
                return None
        if self._trace:
            self._drain()
        if not added and not hits:  # growth within the table (most decode steps)
            return self.empty_kv_cache_blocks
        if added[:len(hits)] != hits:  # pragma: no cover - internal
            raise AssertionError(f"{rid!r} took other prefix hits than looked up")
        return KVCacheBlocks(tuple(added[len(hits):])) if len(added) > len(hits) else (
            self.empty_kv_cache_blocks)

    @_locked
    def free(self, request: EngineRequest) -> None:
        """Free the request's blocks, tail first (its tail is evicted first). Blocks an
        in-flight launch reads wait for it; what that launch wrote is not cached. A request
        that holds no blocks is ignored (as in vLLM)."""
        rid = request.request_id
        entry = self._live.get(rid)
        if entry is None:
            return
        if entry.req is not request:
            raise ValueError(f"another request with id {rid!r} holds blocks")
        if self._transfers and rid in self._transfers:  # freed by the last end_transfer
            self._free_after_transfer.add(rid)
            return
        self._advance(entry)
        if entry.written > entry.computed:  # what completed launches wrote is cached first
            self._commit_ready((entry,))
        del self._live[rid]
        self._alloc.free(rid)
        self._drain()

    @_locked
    def begin_transfer(self, request: EngineRequest) -> None:
        """A copy of the request's device blocks to or from another tier starts. Until the
        matching ``end_transfer``, ``publish`` refuses the request (``TransferInFlight``) and
        ``free`` (``preempt``) of it waits: its blocks stay with it and are freed at the last
        ``end_transfer``. Transfers nest (a count)."""
        rid = request.request_id
        entry = self._live.get(rid)
        if entry is None or entry.req is not request:
            raise ValueError(f"{request!r} holds no blocks of this manager")
        self._transfers[rid] = self._transfers.get(rid, 0) + 1

    @_locked
    def end_transfer(self, request: EngineRequest) -> None:
        """The copy ``begin_transfer`` announced is done; a free asked for meanwhile happens
        now (after the last one)."""
        rid = request.request_id
        n = self._transfers.get(rid, 0)
        if n == 0 or self._live[rid].req is not request:
            raise ValueError(f"{request!r} has no transfer in flight")
        if n > 1:
            self._transfers[rid] = n - 1
            return
        del self._transfers[rid]
        if rid in self._free_after_transfer:
            self._free_after_transfer.discard(rid)
            self.free(request)

    def transfers_in_flight(self, request: EngineRequest) -> int:
        """How many copies of the request's blocks are in flight (``begin_transfer``)."""
        return self._transfers.get(request.request_id, 0)

    @_locked
    def preempt(self, request: EngineRequest) -> None:
        """vLLM's ``_preempt_request`` on the KV side: free, PREEMPTED, no computed tokens."""
        self.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1

    def append_token(self, request: EngineRequest, token_id: int) -> None:
        """The model sampled ``token_id`` for ``request`` (``append_output_token_ids``)."""
        if type(token_id) is not int:
            token_id = _as_token(token_id)
        with self._lock:  # (inline, as in allocate_slots)
            entry = self._synced(request)
            if entry is not None:  # checked there first: a refused id changes nothing
                self._alloc._append_token(entry.record, token_id)
            self._record_token(request, token_id, entry)

    def append_token_many(self, requests: Sequence[EngineRequest],
                          token_ids: Sequence[int]) -> None:
        """``append_token(request, token_id)`` of each pair, in order, each request once (a
        step's sampled tokens in one call). All or nothing: every token id is checked first
        (``TypeError``; one the allocator refuses: ``InvalidArgument``), and nothing is
        appended if one is bad."""
        reqs = list(requests)
        tokens = [t if type(t) is int else _as_token(t) for t in token_ids]
        if len(reqs) != len(tokens):
            raise ValueError(f"append_token_many: {len(reqs)} requests but {len(tokens)} "
                             "token ids")
        if len({id(r) for r in reqs}) != len(reqs):
            raise ValueError("append_token_many: a request appears twice")
        with self._lock:
            entries = [self._synced(request) for request in reqs]
            synced = [(request.request_id, [token_id])
                      for request, token_id, entry in zip(reqs, tokens, entries, strict=True)
                      if entry is not None]
            if synced:  # every id checked there first: a refused one changes nothing
                self._alloc.append_tokens_many(synced)
            record = self._record_token
            for request, token_id, entry in zip(reqs, tokens, entries, strict=True):
                record(request, token_id, entry)

    def _synced(self, request: EngineRequest) -> _Live | None:
        """The request's entry if the allocator knows every token it has so far (then it is
        told a new one at once); None if it holds no blocks or a rollback made the allocator
        forget some (it learns them all at the next publish or commit: ``_sync_many``)."""
        entry = self._live.get(request.request_id)
        if entry is not None and entry.req is request and entry.known == len(request._all):
            return entry
        return None

    def _record_token(self, request: EngineRequest, token_id: int,
                      entry: _Live | None) -> None:
        """The request takes the token (the allocator was told if ``entry``: ``_synced``)."""
        if entry is not None:
            entry.known += 1
        tokens = request._all
        tokens.append(token_id)
        if self.enable_caching and (len(request.block_hashes) + 1) * self.block_size <= len(
                tokens):  # a block filled: hash it, as vLLM's Request does
            self._hashes(request)

    @_locked
    def record_prefix_cache_stats(self, request: EngineRequest, num_hits: int) -> None:
        """Count one admission lookup (vLLM's scheduler calls it when a request is admitted)."""
        if self._prefix_stats is None or not self.enable_caching:
            return
        self._prefix_stats.record(num_tokens=request.num_tokens,
                                  num_hits=_count(num_hits, "num_hits"),
                                  preempted=request.num_preemptions > 0)

    @_locked
    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The prefix-cache stats since the last call (and start new ones); None without
        ``log_stats``."""
        if self._prefix_stats is None:
            return None
        stats, self._prefix_stats = self._prefix_stats, PrefixCacheStats()
        return stats

    @_locked
    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash, so nothing hits. Refused (False) while a request holds
        blocks, as in vLLM. Cached blocks an in-flight launch still reads become FREE when it
        completes."""
        self._sweep()
        if self._held() > 0:
            return False
        self._drain()
        pool = self._pool
        for b in list(pool.hmap.values()):
            pool.evict(b)  # FREE at once unless busy (then when the watermark passes it)
        if self._trace is not None:
            self._trace.clear()
            self._cached_hash.clear()
            self._events.append(AllBlocksCleared())
        if self._prefix_stats is not None:
            self._prefix_stats.reset = True
        return True

    @_locked
    def take_events(self) -> list[KVCacheEvent]:
        """The KV events since the last call ([] unless ``enable_kv_cache_events``)."""
        events, self._events = self._events, []
        return events

    @_locked
    def get_blocks(self, request_id: Hashable) -> KVCacheBlocks:
        if request_id not in self._live:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(tuple(self._alloc.block_table(request_id)))

    @_locked
    def get_block_ids(self, request_id: Hashable) -> tuple[list[int], ...]:
        """The request's block table, one list per KV-cache group (one group here)."""
        if request_id not in self._live:
            return ([],)
        return (self._alloc.block_table(request_id),)

    def get_num_common_prefix_blocks(self, running_request_id: Hashable) -> list[int]:
        """Deprecated in vLLM 0.33.0 (cascade attention was removed): ``[0]`` per group."""
        return [0]


__all__ = ["KVCacheBlocks", "KVCacheManager", "PrefixCacheStats"]
