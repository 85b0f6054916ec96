"""BlockAllocator: per-request block tables over a BlockPool, with prefix caching.

Every public method names the spec transitions it performs (on ``self.pool``). Each call
validates everything first and then performs transitions whose guards are known to hold, so a
refused call raises a typed ``AllocatorError`` and changes nothing.
"""

from __future__ import annotations

import inspect
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, TypeVar

import numpy as np

from pagedkv.spec import (
    CACHED,
    FREE,
    ISSUED,
    PUBLISHED,
    RECLAIMED,
    REFERENCED,
    WATERMARK,
    PoolState,
    RequestState,
    Transition,
    cache_due,
    takeable,
    violations,
)
from pagedkv.spec.calls import CALLS, CallRefused, CallRun
from pagedkv.spec.explain import failed_conditions
from pagedkv.spec.request_spec import RequestSpec, as_request_spec
from pagedkv.spec.requests import initial_request_state
from pagedkv.spec.states import ALLOCATED

from .compiled import position_rule, position_rule_many
from .errors import (
    AllocatorError,
    CommitError,
    DuplicateRequest,
    InvalidArgument,
    InvariantViolation,
    OutOfBlocks,
    TokensUnknown,
    UnknownRequest,
)
from .hashing import (
    all_ints,
    chain_digests,
    check_parent,
    digest,
    encode_tokens,
    normalize_extra_keys,
    pack_native,
    pack_tokens,
    salt_bytes,
)
from .launch import Launch, LaunchAlreadyCompleted
from .pool import BlockPool
from .request_view import materialize, request_view
from .table import MAX_COUNT, blocks_needed, check_count, writes_per_block
from .table_rows import TableRows

_F = TypeVar("_F", bound=Callable[..., Any])


def _locked(method: _F) -> _F:
    """Run the method under the allocator's re-entrant lock (see BlockAllocator: concurrency)."""

    @wraps(method)
    def run(self: BlockAllocator, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


def _confirmed(call: str) -> Callable[[_F], _F]:
    """The method's refusals (``OutOfBlocks``, ``CommitError``) are confirmed by the spec at
    run time: the call's program (``spec.calls``) is run on ``spec_view`` and must not run
    either; its reason, in the spec's words, is attached (``spec_reason``) and appended to the
    message. Where the program runs, the allocator refused what the spec allows:
    ``InvariantViolation('refines')``. Only refusals pay for this. The method runs under the
    allocator's lock, as with ``_locked``."""

    def wrap(method: _F) -> _F:
        sig = inspect.signature(method)

        @wraps(method)
        def run(self: BlockAllocator, *args: Any, **kwargs: Any) -> Any:
            with self._lock:  # one wrapper takes the lock too (see _locked)
                try:
                    return method(self, *args, **kwargs)
                except (OutOfBlocks, CommitError) as exc:
                    bound = sig.bind(self, *args, **kwargs)
                    self._confirm_refusal(exc, call, tuple(bound.arguments.values())[1:])
                    raise

        return run  # type: ignore[return-value]

    return wrap


_HASH_MEMO_MAX = 1 << 13


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
    published: int = 0  # leading table entries already published (later ones: ALLOCATED/hits)
    computed: int = 0  # positions committed (written by completed launches)
    row: int = -1  # its row in the allocator's TableRows


@dataclass(frozen=True)
class Abstraction:
    """The allocator's state in the spec's vocabulary."""

    pool: PoolState
    requests: RequestState


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


# Iterables that are not sequences of ids or tokens: a bare string, or no order at all.
_NOT_SEQUENCES = (str, bytes, bytearray, memoryview, set, frozenset, dict, Mapping)


def _ordered(values: Any, what: str) -> list[Any]:
    """The items of an ordered sequence, or InvalidArgument (a bare string or an unordered
    collection is not one)."""
    if type(values) is list or type(values) is tuple:  # the common case, before the ABCs
        return list(values)
    if isinstance(values, _NOT_SEQUENCES):
        raise InvalidArgument(f"{what} must be an ordered sequence, not a {type(values).__name__}")
    try:
        return list(values)
    except TypeError:
        raise InvalidArgument(f"{what} must be a sequence, got {type(values).__name__}") from None


def _within_table(req: _Request, num_tokens: Any, B: int) -> bool:
    """Growing req to ``num_tokens`` positions stays within its non-empty table (B positions
    per entry): a plain int from its reserved positions up to its table's end."""
    return bool(req.table) and type(num_tokens) is int and (
        req.reserved <= num_tokens <= len(req.table) * B)


def _check_tokens(token_ids: Iterable[int]) -> list[int]:
    if type(token_ids) is list and len(token_ids) == 1:  # a decode step's one sampled token
        t = token_ids[0]
        if type(t) is int and _I64_MIN <= t <= _I64_MAX:
            return [t]
    return _check_and_pack_tokens(token_ids)[0]


def _check_and_pack_tokens(token_ids: Iterable[int]) -> tuple[list[int], bytes]:
    """``_check_tokens``, and the tokens packed as its range check packs them
    (``pack_native``: what ``native_hash.chain_packed`` hashes)."""
    tokens = _ordered(token_ids, "token ids")
    if not all_ints(tokens):  # plain ints need no conversion
        for t in tokens:
            if isinstance(t, bool) or not isinstance(t, int | np.integer):
                raise InvalidArgument(f"token ids must be ints, got {type(t).__name__}")
        tokens = [int(t) for t in tokens]
    try:  # (one pass at C speed: the int64 range, as min() and max() would check it in two)
        packed = pack_native(tokens)
    except (struct.error, OverflowError):
        encode_tokens(tokens)  # raises the range error
        raise  # pragma: no cover - encode_tokens refuses what struct cannot pack
    return tokens, packed


def _launch_slots(first_slots: Sequence[int], counts: Sequence[int]) -> np.ndarray:
    """A launch's int64 slot mapping from its writes, in launch order: write ``k`` fills
    ``counts[k]`` consecutive positions of one block, whose slots are ``first_slots[k] ..
    first_slots[k] + counts[k] - 1`` (``block * B + offset``)."""
    first = np.array(first_slots, dtype=np.int64)
    total = sum(counts)
    if total == len(first):  # one position per write: a decode step
        return first
    n = np.array(counts, dtype=np.int64)
    return np.repeat(first - (np.cumsum(n) - n), n) + np.arange(total, dtype=np.int64)


class RequestBook:
    """What an allocator keeps of its requests apart from their tables: the registry of
    request records (``_requests``: id -> a record with ``rid``, ``tokens``, ``hashes``,
    ``salt``, ``extra_keys``), the checks of request ids and step-level argument lists, and
    the memoized chain hashing of their full blocks and the prefix hits an empty table
    takes. Shared by ``BlockAllocator`` and ``NativeAllocator``, which need ``_requests``,
    ``_lock``, ``_hash_memo``, ``block_size``, ``prefix_caching``, ``spec`` and a ``pool``
    with ``lookup``."""

    _requests: dict[Hashable, Any]
    _lock: Any
    _hash_memo: OrderedDict[tuple[Any, ...], int] | None
    block_size: int
    prefix_caching: bool
    spec: RequestSpec
    pool: Any

    def _extend_hashes(self, req: _Request) -> None:
        """Hash the request's blocks its known tokens filled since (memoized)."""
        B, tokens, hashes = self.block_size, req.tokens, req.hashes
        first, full = len(hashes), len(tokens) // B
        if full > first:
            hashes += self._chain(hashes[-1] if hashes else 0, tokens[first * B:full * B],
                                  first, req.extra_keys, req.salt)

    def _record_tokens(self, updates: Sequence[tuple[Hashable, Sequence[int]]]) -> list[Any]:
        """``append_tokens_many``'s bookkeeping: the ``(rid, token_ids)`` pairs checked (each
        request once, every token) before any is recorded, then each request's tokens
        extended and the blocks they filled hashed. Returns the records, in order."""
        checked = [(req, _check_tokens(tokens))
                   for req, tokens in self._batch(updates, "append_tokens_many")]
        B = self.block_size
        for req, tokens in checked:
            req.tokens.extend(tokens)
            if (len(req.hashes) + 1) * B <= len(req.tokens):  # a block filled: hash it
                self._extend_hashes(req)
        return [req for req, _ in checked]

    @_locked
    def block_hash(self, parent: int, tokens: Sequence[int], extra_keys: Sequence[Any] = (),
                   salt: str | bytes | None = None) -> int:
        """``hashing.block_hash`` through this allocator's memo: a front door that hashes a
        request's blocks itself (for its prefix lookups) calls this, so that each block is
        sha256-hashed once. Every argument is checked as ``add_request`` checks it (so no
        value that merely compares equal to another, such as ``True`` for ``1``, can share
        its memo entry)."""
        if type(parent) is not int or parent < 0:
            raise InvalidArgument(f"parent must be a block hash (an int >= 0), got {parent!r}")
        parent = check_parent(parent)
        tokens = _check_tokens(tokens)
        keys = normalize_extra_keys(extra_keys)
        return self._memo_digest(parent, pack_tokens(tokens), keys, self._salt(salt))

    @_locked
    def chain_hashes(self, token_ids: Sequence[int], *, start: int = 0, parent: int = 0,
                     extra_keys: Sequence[Any] = (),
                     salt: str | bytes | None = None) -> list[int]:
        """``hashing.chain_hashes(token_ids, block_size, start=start, parent=parent, ...)``
        through this allocator's memo: the chain hashes of the full blocks of ``token_ids``
        from block ``start`` on, ``parent`` the hash of block ``start - 1`` (0 for none), the
        salt in block 0's hash only. The step-level ``block_hash``: a front door hashes the
        blocks a request's new tokens filled in one call. Only the tokens of those blocks
        are read and checked, each argument as ``block_hash`` checks it; nothing is
        memoized if one is refused (``InvalidArgument``)."""
        B = self.block_size
        start = check_count(start, "start (a block index)")
        if type(parent) is not int or parent < 0:
            raise InvalidArgument(f"parent must be a block hash (an int >= 0), got {parent!r}")
        parent = check_parent(parent)
        if type(token_ids) is not list and type(token_ids) is not tuple:
            token_ids = _ordered(token_ids, "token ids")
        tokens = _check_tokens(token_ids[start * B:])  # O(blocks hashed), not O(tokens)
        keys = normalize_extra_keys(extra_keys)
        self._salt(salt)
        return self._chain(parent, tokens[:len(tokens) // B * B], start, keys, salt)

    @staticmethod
    def _salt(salt: Any) -> bytes | None:
        if salt is not None and not isinstance(salt, str | bytes):
            raise InvalidArgument("cache_salt must be str, bytes or None")
        return None if salt is None else salt_bytes(salt)

    def _chain(self, parent: int, tokens: list[int], first: int, keys: tuple[Any, ...],
               salt: str | bytes | None) -> list[int]:
        """The memoized chain hashes of checked ``tokens``, whole blocks of them, the first
        being block ``first`` (the salt goes into block 0's hash only)."""
        data, w = pack_tokens(tokens), 8 * self.block_size  # encoded once, cut per block
        salt_b = None if first or salt is None else salt_bytes(salt)
        if self._hash_memo is None:
            return chain_digests(parent, data, w, len(data) // w, keys, salt_b)
        out: list[int] = []
        for i in range(len(data) // w):
            parent = self._memo_digest(parent, data[i * w:(i + 1) * w], keys,
                                       salt_b if i == 0 else None)
            out.append(parent)
        return out

    def _memo_digest(self, parent: int, data: bytes, keys: tuple[Any, ...],
                     salt: bytes | None) -> int:
        """The memoized ``hashing.digest`` of checked fields (tokens encoded, salt as bytes)."""
        memo = self._hash_memo
        if memo is None:
            return digest(parent, data, keys, salt)
        key = (parent, data, keys, salt)
        h = memo.get(key)
        if h is None:
            h = digest(parent, data, keys, salt)
            if len(memo) >= _HASH_MEMO_MAX:
                memo.popitem(last=False)
            memo[key] = h
        else:
            memo.move_to_end(key)
        return h

    def _hits(self, req: _Request) -> list[int]:
        """The cached blocks an empty table takes (spec: ``leading_hits``, by ``may_hit``)."""
        if not self.prefix_caching:
            return []
        return self.spec.leading_hits(req.hashes, len(req.tokens), self.block_size,
                                      self.pool.lookup)

    def _check_new_rid(self, rid: Hashable) -> None:
        try:
            hash(rid)
        except TypeError:
            raise InvalidArgument(
                f"request ids must be hashable, got {type(rid).__name__}"
            ) from None
        if not rid == rid:  # a NaN-like id could never be found again
            raise InvalidArgument(f"request id {rid!r} is not equal to itself")
        if rid in self._requests:
            raise DuplicateRequest(f"request {rid!r} is already registered")

    def _req(self, rid: Hashable) -> _Request:
        try:
            return self._requests[rid]
        except KeyError:
            raise UnknownRequest(f"unknown request {rid!r}") from None
        except TypeError:
            raise InvalidArgument(
                f"request ids must be hashable, got {type(rid).__name__}"
            ) from None

    def _batch(self, items: Any, call: str) -> list[tuple[_Request, Any]]:
        """``(rid, value)`` pairs of a step-level call: known requests, each once."""
        pairs = _ordered(items, f"{call}'s (request id, value) pairs")
        reqs = self._requests
        try:  # the common case in one pass; any doubt: the checks below, which say why
            fast = [(reqs[p[0]], p[1]) for p in pairs if type(p) is tuple and len(p) == 2]
            if len(fast) == len(pairs) and len({id(r) for r, _ in fast}) == len(fast):
                return fast
        except (KeyError, TypeError):
            pass
        out: list[tuple[_Request, Any]] = []
        seen: set[Hashable] = set()
        for pair in pairs:
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise InvalidArgument(f"{call} takes (request id, value) pairs, got {pair!r}")
            req = self._req(pair[0])
            if req.rid in seen:
                raise InvalidArgument(f"request {req.rid!r} appears twice in one {call}")
            seen.add(req.rid)
            out.append((req, pair[1]))
        return out

    def _check_rids(self, rids: Any) -> tuple[Hashable, ...]:
        rids = tuple(_ordered(rids, "publish's request ids"))
        if not rids:
            raise InvalidArgument("publish needs at least one request")
        try:
            distinct = len(set(rids))
        except TypeError:
            raise InvalidArgument("request ids must be hashable") from None
        if distinct != len(rids):
            raise InvalidArgument("a request appears twice in one launch")
        return rids


class BlockAllocator(RequestBook):
    """A verified paged KV-cache block allocator.

    ``checked=True`` compares every transition's effect with the spec's and re-checks the
    invariants of the touched blocks (O(1) per block); guards are enforced in both modes.

    Concurrency contract: every public method, ``Launch.complete()`` and the polling of
    recorded completion events run under one re-entrant lock per allocator, so completion
    callbacks may come from any thread while the scheduler thread allocates and frees. Event
    ``query()`` calls are made with the lock held and must not call back into the allocator
    from another thread and wait for it.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        prefix_caching: bool = True,
        checked: bool = True,
        spec: RequestSpec | Mapping[str, Transition] | None = None,
    ) -> None:
        """``spec``: the request layer to enforce (a ``spec.RequestSpec``; default
        ``spec.REQUEST_SPEC``, the spec as written), or only the pool's lifecycle transitions
        (a mapping like ``spec.TRANSITIONS``, the request rules as written). Its pool
        transitions go to the ``BlockPool``; its rules (``may_hit``, ``commit_bounds``,
        ``slots_written``) are the ones the allocator evaluates, and its call programs the ones
        a refusal is confirmed by. Tests and canaries pass a changed spec here."""
        if not isinstance(prefix_caching, bool | np.bool_):
            raise InvalidArgument(
                f"prefix_caching must be a bool, got {type(prefix_caching).__name__}"
            )
        try:
            self.spec = as_request_spec(spec)
        except TypeError as exc:
            raise InvalidArgument(str(exc)) from None
        self.pool = BlockPool(num_blocks, block_size, checked=checked,
                              spec=None if spec is None else self.spec.pool)
        self.block_size = self.pool.block_size
        self.num_blocks = self.pool.num_blocks
        self.prefix_caching = bool(prefix_caching)
        self.checked = bool(checked)
        self._lock = threading.RLock()
        self._requests: dict[Hashable, _Request] = {}
        self._rows = TableRows()  # the tables again, as int32 rows for launches
        self._inflight: dict[int, Launch] = {}  # by Launch.seq, the spec's launch number
        self._prefix_hit_tokens = 0
        # Kept exact on every change, so stats() costs O(1) whatever the number of requests.
        self._reserved_total = 0  # positions reserved, summed over live requests' tables
        self._entries_total = 0  # table entries, summed over live requests' tables
        self._attached_pool: Any = None
        # block_hash is a pure function: memoize it on its full input (parent hash, the
        # block's tokens, extra keys, salt), so a block a front door hashed (for its lookup)
        # and then hands over, or a hot shared prefix, is sha256-hashed once. Bounded at
        # _HASH_MEMO_MAX entries (about 350 bytes each at block size 16: a few MB, whatever
        # the number of live blocks), least recently used dropped first, one at a time
        # (clearing it all at once would pause one call for milliseconds). None disables it.
        self._hash_memo: OrderedDict[tuple[Any, ...], int] | None = OrderedDict()
        # The request records and pool seen as the spec's request-layer state (no copy).
        self.spec_view = request_view(self._requests, self.pool)

    # ---- requests ----------------------------------------------------------------------------
    @_locked
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
        extra = normalize_extra_keys(extra_keys)
        req = _Request(rid, tokens, cache_salt, extra)
        self._extend_hashes(req)
        self.pool.open_holder(rid)
        req.row = self._rows.open()
        self._requests[rid] = req
        return len(self._hits(req)) * self.block_size

    def _plan_room(self, need: int, hits: Sequence[int] = ()) -> list[Launch]:
        """Decide, changing nothing, whether ``need`` new blocks can be taken beyond the
        ``hits`` the call revives. Returns the completed launches (their events say done) to
        reclaim first when the blocks they would release are needed; raises OutOfBlocks
        otherwise, or EventError if an event fails.

        Completing them would move the watermark to the oldest launch still in flight (or
        the clock): the retire-queue entries up to there that are still live (a RECLAIMED
        block, recycled then, or a busy CACHED one, idle then) are what they release."""
        pool = self.pool
        if not hits and need <= pool.usable():  # the common case: it fits now
            return []
        state, retire = pool.state, pool.retire
        watermark = pool.clock[WATERMARK]
        is_takeable = pool.predicate(takeable, ("b",))
        available = pool.usable() - sum(1 for b in hits if is_takeable(b))  # revived, not taken
        if need <= available:
            return []
        done = [launch for launch in self._inflight.values() if launch.event_done()]
        gained = 0
        if done:
            finished = {launch.seq for launch in done}
            left = [L for L in pool.inflight if L not in finished]
            mark = min(left) if left else pool.clock[ISSUED]
            for stamp, b in pool.retire_queue:  # stamps increase: stop past the new watermark
                if stamp > mark:
                    break
                if retire[b] == stamp and (state[b] == RECLAIMED or state[b] == CACHED):
                    gained += 1
            # A hit that the completions would make idle is counted in ``gained`` and revived.
            gained -= sum(1 for b in hits
                          if state[b] == CACHED and watermark < retire[b] <= mark)
        if need > available + gained:
            raise OutOfBlocks(need, available + gained, pool.waiting() - gained)
        return done

    def _confirm_refusal(self, exc: AllocatorError, call: str, args: tuple[Any, ...]) -> None:
        """See ``_confirmed``."""
        if isinstance(exc, InvalidArgument) and not isinstance(exc, TokensUnknown):
            return  # a malformed argument, refused before the spec is consulted
        if call == "publish":
            args = (self._check_rids(args[0]),)
        run = CallRun(self.spec_view, prefix_caching=self.prefix_caching, flatten=False,
                      spec=self.spec)
        try:
            CALLS[call](run, *args)
        except CallRefused as refused:
            exc.spec_reason = refused.reason  # type: ignore[attr-defined]
            exc.args = (f"{exc.args[0]} (spec: {refused.reason})", *exc.args[1:])
            return
        raise InvariantViolation("refines", (
            f"the allocator refused {call}{args!r} ({exc}), but the spec's program runs: "
            f"{[name for name, _ in run.steps]}")) from exc

    def _reclaim_launches(self, done: Iterable[Launch]) -> None:
        for launch in done:
            self._complete(launch, False)

    @_confirmed("allocate")
    def allocate(self, rid: Hashable, num_tokens: int) -> list[int]:
        """Grow rid's table to cover ``num_tokens`` positions (spec: share for prefix hits on the
        first call, then allocate — evicting LRU cached blocks as needed). All or nothing;
        returns the whole table (``extend`` returns only what this call appended).

        A call on an empty table (the first) takes every prefix hit the cache has at that
        moment, whatever the first chunk: the table then covers at least the hit positions
        (``num_computed(rid)``), so a chunked prefill never recomputes cached KV. Completed
        launches are reclaimed only when the call needs the blocks they release and goes
        ahead. The spec's program of this call is ``spec.calls.allocate``."""
        req = self._req(rid)
        self._extend(req, num_tokens)
        return list(req.table)

    @_confirmed("allocate")
    def extend(self, rid: Hashable, num_tokens: int) -> list[int]:
        """``allocate``, returning only the entries this call appended (prefix hits, then new
        blocks): O(blocks added), not O(table), for a scheduler's per-step growth."""
        return self._extend(self._req(rid), num_tokens)

    def _extend(self, req: _Request, num_tokens: Any) -> list[int]:
        """Plan the growth, reclaim what it needs, grow: the entries added."""
        if _within_table(req, num_tokens, self.block_size):
            # A running request's growth within its table (most decode steps): no hit, no new
            # block, nothing to reclaim; what _growth, _plan_room and _grow find then.
            self._reserved_total += num_tokens - req.reserved
            req.reserved = num_tokens
            return []
        hits, reserved, need = self._growth(req, num_tokens)
        self._reclaim_launches(self._plan_room(need, hits))
        return self._grow(req, hits, reserved, need)

    @_confirmed("allocate_many")
    def allocate_many(self, grow: Sequence[tuple[Hashable, int]]) -> list[list[int]]:
        """The step-level ``extend``: grow each running request ``rid`` of ``(rid, num_tokens)``
        pairs to cover ``num_tokens`` positions, in order; returns the entries each one
        appended. All or nothing: the room for every request is planned before any block is
        taken, so a refusal (``OutOfBlocks``, ``InvalidArgument``) changes nothing. Each
        table must be non-empty (an admission takes prefix hits: ``allocate``); a request
        appears once. The spec's program is ``spec.calls.allocate_many``: ``allocate`` of
        each pair in order."""
        pairs = self._batch(grow, "allocate_many")
        if self._grows_within_tables(pairs):
            return [[] for _ in pairs]
        plans = []
        for req, n in pairs:
            if not req.table:
                raise InvalidArgument(
                    f"allocate_many grows running requests; {req.rid!r} has an empty table "
                    "(its first allocation takes prefix hits: allocate)")
            plans.append((req, *self._growth(req, n)))
        self._reclaim_launches(self._plan_room(sum(plan[3] for plan in plans)))
        return [self._grow(*plan) for plan in plans]

    def _grows_within_tables(self, pairs: Sequence[tuple[_Request, Any]]) -> bool:
        """If every pair grows its request within its non-empty table (most decode steps),
        reserve the positions and return True: no hit, no new block, nothing to reclaim,
        what ``_growth``, ``_plan_room`` and ``_grow`` find then (``_extend``'s fast path, for
        a batch). Otherwise change nothing and return False."""
        B = self.block_size
        for req, n in pairs:
            if not _within_table(req, n, B):
                return False
        for req, n in pairs:
            self._reserved_total += n - req.reserved
            req.reserved = n
        return True

    def _growth(self, req: _Request, num_tokens: Any) -> tuple[list[int], int, int]:
        """What growing req to ``num_tokens`` positions takes, changing nothing: (the prefix
        hits an empty table takes, the positions then reserved, the new blocks needed)."""
        num_tokens = check_count(num_tokens, "num_tokens")
        if num_tokens < req.reserved:
            raise InvalidArgument(
                f"request {req.rid!r} already covers {req.reserved} positions; tables only grow"
            )
        hits = [] if req.table else self._hits(req)
        B = self.block_size
        reserved = max(num_tokens, len(hits) * B)
        return hits, reserved, -(-reserved // B) - len(req.table) - len(hits)

    def _grow(self, req: _Request, hits: list[int], reserved: int, need: int) -> list[int]:
        """Take the hits and ``need`` new blocks (the room was planned); the entries added."""
        pool, rid = self.pool, req.rid
        table = req.table
        start = len(table)
        if hits:  # one compiled batch of the spec's share (as these shares one by one)
            pool.run_many("share", [(b, rid) for b in hits])
            table += hits
            req.computed = req.issued = len(hits) * self.block_size
            self._prefix_hit_tokens += req.computed
        if need > 0:  # the queue's FREE head run in one batch (as ``need`` takes would)
            table += pool.take_many(rid, need)
        if len(table) > start:
            self._put_rows(req, start)
            self._entries_total += len(table) - start
        self._reserved_total += reserved - req.reserved
        req.reserved = reserved
        return table[start:]

    @_locked
    def append_tokens(self, rid: Hashable, token_ids: Sequence[int]) -> None:
        """Record generated tokens, so that the blocks they fill can be hashed at commit."""
        req = self._req(rid)
        req.tokens.extend(_check_tokens(token_ids))
        self._extend_hashes(req)

    def _append_token(self, req: _Request, token_id: Any) -> None:
        """``append_tokens(rid, [token_id])`` on a record the caller already holds (the engine
        front door's per-token path, under the allocator's lock): the same check, the same
        hashing of a block it fills."""
        req.tokens += _check_tokens([token_id])
        if (len(req.hashes) + 1) * self.block_size <= len(req.tokens):  # a block filled
            self._extend_hashes(req)

    @_locked
    def append_tokens_many(self, updates: Sequence[tuple[Hashable, Sequence[int]]]) -> None:
        """The step-level ``append_tokens``: ``(rid, token_ids)`` pairs, each request once. All
        or nothing: every pair is checked before any token is recorded. The spec's program is
        ``spec.calls.append_tokens_many``."""
        self._record_tokens(updates)

    @_confirmed("commit")
    def commit(self, rid: Hashable, num_tokens: int) -> None:
        """Positions below ``num_tokens`` are written (their launches completed): full blocks
        below it become REFERENCED and enter the prefix cache (spec: commit)."""
        req = self._req(rid)
        self._commit([(req, self._commit_check(req, num_tokens))])

    @_confirmed("commit_many")
    def commit_many(self, updates: Sequence[tuple[Hashable, int]]) -> None:
        """The step-level ``commit``: ``(rid, num_tokens)`` pairs, each request once, committed
        in order. All or nothing: every pair is checked before anything is committed (a
        commit only makes another's condition easier: it never un-writes a block). The
        spec's program is ``spec.calls.commit_many``: ``commit`` of each pair in order."""
        pairs = self._batch(updates, "commit_many")
        if not self._commits_allowed(pairs):  # then each check, which says why
            written = self.pool.predicate(self.spec.slots_written, ("b", "k"))
            bounds = position_rule(self.spec.commit_bounds, ("new", "issued", "known"))
            check = self._commit_check
            pairs = [(req, check(req, n, written, bounds)) for req, n in pairs]
        self._commit(pairs)

    def _commits_allowed(self, pairs: Sequence[tuple[_Request, Any]]) -> bool:
        """Whether ``_commit_check`` passes every pair, each a plain int past what its
        request committed, answered by the spec's ``commit_bounds`` and ``slots_written`` each
        compiled into one loop over the batch (``position_rule_many``, ``predicate_many``).
        False: some pair is not such an int, or some check fails (``_commit_check`` then
        finds which, and why). Changes nothing."""
        B = self.block_size
        rows = []
        for req, n in pairs:
            if type(n) is not int or not req.computed < n <= MAX_COUNT:
                return False
            rows.append((n, req.issued, len(req.tokens)))
        if position_rule_many(self.spec.commit_bounds, ("new", "issued", "known"))(B, rows) >= 0:
            return False
        # Within the table: n <= issued <= reserved <= len(table) * B (the bounds held).
        cells = []
        for req, n in pairs:
            table = req.table
            for i in range(req.computed // B, -(-n // B)):
                k = n - i * B
                cells.append((table[i], B if k > B else k))
        return self.pool.predicate_many(self.spec.slots_written, ("b", "k"))(cells) < 0

    def _commit_check(self, req: _Request, num_tokens: Any, written: Any = None,
                      bounds: Any = None) -> int:
        """``num_tokens`` as an int if req may commit that far now; CommitError (or
        TokensUnknown) naming the condition otherwise. Changes nothing. ``written``, ``bounds``:
        the pool's compiled ``slots_written`` and the compiled ``commit_bounds`` (looked up
        here if not given)."""
        num_tokens = check_count(num_tokens, "num_tokens")
        rid, B = req.rid, self.block_size
        if num_tokens < req.computed:
            raise CommitError(f"{rid!r} already committed {req.computed} positions")
        if num_tokens == req.computed:
            return num_tokens
        if bounds is None:
            bounds = position_rule(self.spec.commit_bounds, ("new", "issued", "known"))
        issued_ok, known_ok = bounds(B, num_tokens, req.issued, len(req.tokens))
        if not issued_ok:
            raise CommitError(
                f"cannot commit {num_tokens} positions of {rid!r}: launches were issued for "
                f"{req.issued} (allocated {req.reserved})"
            )
        if not known_ok:
            raise TokensUnknown(
                f"cannot commit {num_tokens} positions of {rid!r}: only {len(req.tokens)} "
                f"token ids are known (append_tokens first)"
            )
        if written is None:
            written = self.pool.predicate(self.spec.slots_written, ("b", "k"))
        # The blocks holding positions computed..num_tokens-1, each written up to its part.
        for i in range(req.computed // B, -(-num_tokens // B)):
            b = req.table[i]
            if not written(b, min(B, num_tokens - i * B)):
                raise CommitError(
                    f"block {b} (entry {i} of {rid!r}) has a writing launch still pending"
                )
        return num_tokens

    def _commit(self, pairs: Sequence[tuple[_Request, int]]) -> None:
        """Commits checked by ``_commit_check``, in order: the full blocks each completes enter
        the cache."""
        B, caching = self.block_size, self.prefix_caching
        pool = self.pool
        due = pool.predicate(cache_due, ("b", "h"))
        for req, num_tokens in pairs:
            first, full = req.computed // B, num_tokens // B
            req.computed = num_tokens  # every committed token is known: its block hash exists
            if not caching or first == full:  # no block filled (most decode steps)
                continue
            table, hashes, rid = req.table, req.hashes, req.rid
            # No hash repeats in one chain (block 0's parent is 0, which no hash is, and a
            # later block's parent is a hash), so none of these commits makes another's hash
            # cached.
            commits = [(table[i], rid, hashes[i]) for i in range(first, full)
                       if due(table[i], hashes[i])]
            if commits:  # one compiled batch of the spec's commit (as these one by one)
                pool.run_many("commit", commits)

    @_confirmed("truncate")
    def truncate(self, rid: Hashable, num_tokens: int) -> list[int]:
        """Drop rid's positions from ``num_tokens`` on: rejected speculative (lookahead)
        tokens. Their token ids are forgotten, table entries past the new end are released
        (spec: release, tail first; a block a launch may still read waits for it), and a kept
        partial block forgets the dropped slots (spec: rewind) so they can be written again.

        Committed positions stay (``CommitError`` below ``num_computed``). A kept partial
        block must be this request's alone and its writes complete, so that its dropped
        slots can be rewound (``CommitError`` saying which condition failed otherwise);
        released blocks may still be in flight. At least one position is kept (``free`` drops
        a request). All or nothing; returns the table (spec: ``spec.calls.truncate``)."""
        req = self._req(rid)
        num_tokens = check_count(num_tokens, "num_tokens")
        B, pool = self.block_size, self.pool
        if num_tokens < 1:
            raise InvalidArgument(
                f"truncate keeps at least one position of {rid!r}; free drops a request")
        if num_tokens > req.reserved:
            raise InvalidArgument(
                f"{rid!r} covers {req.reserved} positions; cannot truncate to {num_tokens}"
            )
        if num_tokens < req.computed:
            raise CommitError(
                f"{rid!r} committed {req.computed} positions; cannot truncate to {num_tokens}"
            )
        keep = blocks_needed(num_tokens, B)
        tail = req.table[keep - 1] if keep else None  # rewound only if it holds dropped slots
        if tail is not None:
            k = num_tokens - (keep - 1) * B
            if pool.filled[tail] > k:
                why = failed_conditions(pool.spec["rewind"].guard, pool.view, b=tail, r=rid,
                                        k=k)
                if why:
                    raise CommitError(
                        f"cannot truncate {rid!r} to {num_tokens}: block {tail} "
                        + "; ".join(why)
                    )
            else:
                tail = None
        for b in reversed(req.table[keep:]):
            pool.release(b, rid)
        if tail is not None:
            pool.rewind(tail, rid, num_tokens - (keep - 1) * B)
        self._entries_total -= len(req.table) - keep
        self._reserved_total -= req.reserved - num_tokens
        self._rows.cut(req.row, keep, len(req.table))
        del req.table[keep:]
        del req.tokens[num_tokens:]
        del req.hashes[num_tokens // B:]
        req.published = min(req.published, keep)
        req.reserved = num_tokens
        req.issued = min(req.issued, num_tokens)
        return list(req.table)

    @_confirmed("fork")
    def fork(self, parent: Hashable, child: Hashable) -> list[int]:
        """The child shares the parent's blocks (spec: open_holder, share each; blocks the
        parent has not published yet are unwritten, so the child takes fresh ones: allocate).

        The parent may have a launch in flight, even one writing the blocks shared (parallel
        sampling right after a step is published): the child's launches are published later
        and run after it on the stream. A shared partial block is copied at the child's or
        parent's next write (copy-on-write, reported in ``Launch.copies``). The child can
        commit positions only once the launches writing them completed. All or nothing."""
        p = self._req(parent)
        self._check_new_rid(child)
        if p.issued > len(p.tokens):
            raise TokensUnknown(
                f"fork of {parent!r}: its KV covers {p.issued} positions but only "
                f"{len(p.tokens)} token ids are known (append_tokens first)"
            )
        pool = self.pool
        # Blocks never handed to a kernel hold no KV yet: the child gets fresh ones instead.
        # Every other entry is PUBLISHED or REFERENCED, which share takes even while the
        # parent's launch still writes it (spec: share).
        fresh = [pool.state[b] == ALLOCATED for b in p.table]
        self._reclaim_launches(self._plan_room(sum(fresh)))
        pool.open_holder(child)
        table = [
            pool.take(child) if f else b for b, f in zip(p.table, fresh, strict=True)
        ]
        for b, f in zip(p.table, fresh, strict=True):
            if not f:
                pool.share(b, child)
        c = _Request(
            child, list(p.tokens), p.salt, p.extra_keys, list(p.hashes),
            table, p.reserved, p.issued, p.published, p.computed, self._rows.open(),
        )
        self._put_rows(c, 0)
        self._requests[child] = c
        self._reserved_total += c.reserved
        self._entries_total += len(c.table)
        return list(c.table)

    @_locked
    def free(self, rid: Hashable) -> None:
        """Release the request's blocks in reverse order, so its tail is evicted first
        (spec: release each, then close_holder). Preemption is free + add_request. A block
        let go is retired at the launch clock: while a launch published before may still read
        it, it waits (RECLAIMED, or CACHED but busy) for the watermark to pass."""
        self._free(self._req(rid))

    @_locked
    def free_many(self, rids: Sequence[Hashable]) -> None:
        """The step-level ``free``: each request of ``rids`` (each once, all known, else
        ``InvalidArgument`` / ``UnknownRequest`` and nothing freed), in order. The spec's
        program is ``spec.calls.free_many``."""
        for req, _ in self._batch([(r, None) for r in _ordered(rids, "free_many's ids")],
                                  "free_many"):
            self._free(req)

    def _free(self, req: _Request) -> None:
        pool, rid = self.pool, req.rid
        if req.table:
            pool.run_many("release", [(b, rid) for b in reversed(req.table)])
        pool.close_holder(rid)
        self._rows.close(req.row, len(req.table))
        del self._requests[rid]
        self._reserved_total -= req.reserved
        self._entries_total -= len(req.table)

    # ---- launches ----------------------------------------------------------------------------
    @_confirmed("publish")
    def publish(self, rids: Sequence[Hashable]) -> Launch:
        """Hand the requests' tables to kernels as launch number ``L = pool.clock[ISSUED]``
        (spec: launch). New blocks are published (spec: publish), shared partial blocks about
        to be written are copied first (spec: allocate, publish, then release of the source),
        and each block the launch writes is marked (spec: begin_write).

        Reads are not tracked per block: launch L pins, by its number, every block any table
        holds now; a block let go later is retired at a clock > L and reused only once the
        watermark passes it (every launch up to L completed). A copy-on-write source is
        released only after the launch is numbered, so it is covered like every other block
        the launch reads, and no block is both a copy source and a copy destination. Of
        several writers of one shared partial block in one launch, each copies while another
        holder remains; the last one writes in place. Cost: O(requests + blocks written or
        new) transitions, whatever the tables' length (plus building the int32 arrays).

        Positions whose token ids are not known yet may be written (async scheduling: the
        previous step samples them on the device); ``commit`` and ``fork`` then wait for
        ``append_tokens`` (``TokensUnknown``), so that no KV is hashed, cached or shared
        under tokens nobody has seen."""
        rids = self._check_rids(rids)  # hashable: a lookup fails only for an unknown id
        try:
            reqs = [self._requests[r] for r in rids]
        except KeyError:
            reqs = [self._req(r) for r in rids]  # UnknownRequest, naming it
        B, pool = self.block_size, self.pool
        holders: dict[int, int] = {}  # shared partial block written -> holders left
        writers: dict[int, int] = {}  # ... -> its writers in this launch
        for req in reqs:
            if req.reserved == 0:
                raise InvalidArgument(f"request {req.rid!r} has no allocated positions")
            if req.issued < req.reserved and req.issued % B:
                b = req.table[req.issued // B]
                if pool.ref[b] > 1:
                    holders[b] = pool.ref[b]
                    writers[b] = writers.get(b, 0) + 1
        if writers:  # k writers of a block with n holders copy min(k, n - 1) times
            copies_needed = sum(min(k, holders[b] - 1) for b, k in writers.items())
            self._reclaim_launches(self._plan_room(copies_needed))
        copies: list[tuple[int, int]] = []
        sources: list[tuple[Hashable, int]] = []
        copied: set[int] = set()
        for req in reqs if writers else ():  # no shared partial block written: no copy
            i = req.issued // B
            if req.issued < req.reserved and req.issued % B and holders.get(req.table[i], 0) > 1:
                src = req.table[i]
                holders[src] -= 1
                dst = pool.take(req.rid)
                pool.publish(dst, req.rid)
                req.table[i] = dst
                self._put_rows(req, i, i + 1)
                sources.append((req.rid, src))
                copies.append((src, dst))
                copied.add(dst)
        state = pool.state
        fresh = [(b, req.rid) for req in reqs if req.published < len(req.table)
                 for b in req.table[req.published:] if state[b] == ALLOCATED]
        if fresh:
            pool.run_many("publish", fresh)
        L = pool.clock[ISSUED]
        pool.launch(L)
        # The sources are let go after the launch is numbered: another holder remains (the
        # last writer of a shared block writes in place, so its ref must be 1 before
        # begin_write), and whoever lets one go last retires it at a clock > L.
        for rid, src in sources:
            pool.release(src, rid)
        writes: list[tuple[int, Hashable, int]] = []
        written: list[int] = []  # the blocks of ``writes``
        first_slots: list[int] = []  # per write: the slot of its first position ...
        counts: list[int] = []  # ... and how many positions it writes
        starts: list[int] = []
        seq_lens: list[int] = []
        rows: list[int] = []
        width = 0  # the longest table: the launch's tables are at least as wide (take)
        for req in reqs:
            table = req.table
            req.published = n = len(table)
            if n > width:
                width = n
            rows.append(req.row)
            issued, reserved = req.issued, req.reserved
            starts.append(issued)
            seq_lens.append(reserved)
            if issued == reserved:
                continue
            req.issued = reserved
            i, offset = divmod(issued, B)  # the first block is written from offset on
            if reserved <= (i + 1) * B:  # one block written (a decode step): no split needed
                b = table[i]
                first_slots.append(b * B + offset)
                counts.append(reserved - issued)
                # a copy writes the shared slots too
                writes.append((b, req.rid, reserved - i * B if b in copied else reserved - issued))
                written.append(b)
                continue
            for i, w in writes_per_block(B, issued, reserved).items():
                b = table[i]
                first_slots.append(b * B + offset)
                counts.append(w)
                if b in copied:
                    w += offset  # the copy writes the shared slots too
                offset = 0  # the blocks after the first are written from their slot 0
                writes.append((b, req.rid, w))
                written.append(b)
        if writes:
            pool.run_many("begin_write", writes)
        bt, tg = self._rows.take(rows, width)
        lens = np.asarray(seq_lens, dtype=np.int32)
        query_lens = lens - np.asarray(starts, dtype=np.int32)
        launch = Launch(
            rids=rids,
            block_tables=bt,
            seq_lens=lens,
            query_lens=query_lens,
            slot_mapping=_launch_slots(first_slots, counts),
            table_generations=tg,
            copies=np.asarray(copies, dtype=np.int32).reshape(-1, 2),
            writes=tuple(written),
            _on_complete=self._complete,
            _generation_of=lambda: self.pool.gen,
            seq=L,
            block_size=B,
        )
        self._inflight[L] = launch
        return launch

    def _put_rows(self, req: _Request, start: int, stop: int | None = None) -> None:
        """Copy table entries ``start .. stop - 1`` (default: to the end) into the rows."""
        blocks = req.table[start:stop]
        gen = self.pool.gen
        self._rows.put(req.row, start, blocks, [gen[b] for b in blocks])

    def _complete(self, launch: Launch, strict: bool) -> None:
        """End the launch's writes and the launch (spec: end_write each, complete), then move
        the watermark as far as it goes (spec: advance: up to the oldest launch in flight),
        recycling the blocks retired below it."""
        with self._lock:
            if launch.completed:
                if strict:
                    raise LaunchAlreadyCompleted(f"{launch!r} already completed")
                return
            pool = self.pool
            if launch.writes:
                pool.run_many("end_write", [(b,) for b in launch.writes])
            pool.complete(launch.seq)
            launch.completed = True
            self._inflight.pop(launch.seq, None)
            pool.advance_watermark()

    @_locked
    def reclaim(self) -> int:
        """Complete the launches whose recorded events are done; reclaimed blocks the
        watermark then passes become FREE (spec: end_write, complete, advance, recycle).
        Returns how many blocks became FREE.

        Every event is queried before anything changes: if one fails (``EventError``),
        nothing is completed."""
        done = [launch for launch in self._inflight.values() if launch.event_done()]
        before = self.pool.count[FREE]
        self._reclaim_launches(done)
        return self.pool.count[FREE] - before

    @_locked
    def validate(self, launch: Launch) -> None:
        """Raise StaleTableError if the launch's tables name a block reclaimed since."""
        if not isinstance(launch, Launch):
            raise InvalidArgument(f"validate takes a Launch, got {type(launch).__name__}")
        if getattr(launch._on_complete, "__self__", None) is not self:
            raise InvalidArgument(f"{launch!r} was published by another allocator")
        launch.check_current()

    @property
    def inflight(self) -> tuple[Launch, ...]:
        with self._lock:
            return tuple(self._inflight.values())

    # ---- queries -----------------------------------------------------------------------------
    @_locked
    def state(self, block_id: int) -> int:
        return self.pool.state[self.pool.check_block_id(block_id)]

    @_locked
    def ref_count(self, block_id: int) -> int:
        return self.pool.ref[self.pool.check_block_id(block_id)]

    @_locked
    def block_table(self, rid: Hashable) -> list[int]:
        return list(self._req(rid).table)

    @_locked
    def num_computed(self, rid: Hashable) -> int:
        return self._req(rid).computed

    @_locked
    def num_reserved(self, rid: Hashable) -> int:
        return self._req(rid).reserved

    @_locked
    def num_issued(self, rid: Hashable) -> int:
        """Positions of rid that launches were issued to write (published)."""
        return self._req(rid).issued

    @_locked
    def positions(self, rid: Hashable) -> tuple[int, int]:
        """``(num_issued(rid), num_reserved(rid))`` in one call."""
        r = self._req(rid)
        return r.issued, r.reserved

    @_locked
    def block_generations(self) -> np.ndarray:
        """Each block's current generation (int32), for kernels' checked launch mode."""
        return np.asarray(self.pool.gen, dtype=np.int32)

    @property
    def requests(self) -> tuple[Hashable, ...]:
        with self._lock:
            return tuple(self._requests)

    @_locked
    def attach_pool(self, kv_pool: Any) -> None:
        """Attach a device KV pool (e.g. ``pagedkv.kernels.KVCachePool``): its block count and
        block size must match; its memory figures then appear in ``stats()``."""
        for attr, mine in (("num_blocks", self.num_blocks), ("block_size", self.block_size)):
            theirs = getattr(kv_pool, attr, None)
            if not isinstance(theirs, int | np.integer) or isinstance(theirs, bool) or (
                    theirs != mine):
                raise InvalidArgument(f"pool {attr} is {theirs!r}, the allocator's is {mine}")
        for attr in ("bytes_per_block", "reserved_bytes"):
            check_count(getattr(kv_pool, attr, None), f"pool {attr}")
        self._attached_pool = kv_pool

    @_locked
    def stats(self) -> dict[str, int]:
        """Exact counts, O(1) per call (kept up to date by every transition). In blocks:

        - ``free``: FREE blocks, reusable at once.
        - ``evictable_now``: zero-ref CACHED blocks retired below the watermark (no launch that
          may read them is in flight): a prefix hit revives them, an allocation may evict and
          reuse them at once.
        - ``evictable_after_launches``: CACHED blocks retired at a clock the watermark has not
          reached: a hit may revive them, but they are reused only after every launch
          published before they were let go completed.
        - ``cached``: all zero-ref CACHED blocks (the two above).
        - ``reclaimed_waiting``: RECLAIMED blocks (no holder, no hash, content invalid) waiting
          for the watermark to pass their retire clock; then FREE.
        - ``waiting_on_launches``: ``evictable_after_launches + reclaimed_waiting``, the blocks
          that become allocatable only when in-flight launches complete.
        - ``held``: blocks some live request's table holds (ref > 0), each counted once.
        - ``allocatable_now``: ``free + evictable_now``, what an allocation can take right now.
        - ``admission_headroom``: ``num_blocks - held``, what becomes allocatable without
          freeing any request once in-flight launches complete.
        - ``occupancy_blocks``: table entries over all live requests (a block shared by k
          tables counts k times; ``occupancy_blocks - held`` blocks are saved by sharing).
        - ``occupancy_tokens``: positions reserved over all live requests' tables.
        - ``tail_waste_slots``: ``occupancy_blocks * block_size - occupancy_tokens``, reserved
          slots past each table's last position.
        - ``prefix_hit_tokens``: positions taken from the prefix cache since creation.
        - ``inflight_launches``: published launches not completed yet.

        With a ``KVCachePool`` attached: ``bytes_per_block`` (all layers, K and V),
        ``reserved_bytes`` (the pool's whole device allocation), ``in_use_bytes``
        (``held * bytes_per_block``) and ``cached_bytes`` (``cached * bytes_per_block``).
        """
        pool = self.pool
        c = pool.count
        held = c[ALLOCATED] + c[PUBLISHED] + c[REFERENCED]
        busy = pool.cached_busy
        out = {
            "free": c[FREE],
            "evictable_now": c[CACHED] - busy,
            "evictable_after_launches": busy,
            "cached": c[CACHED],
            "reclaimed_waiting": c[RECLAIMED],
            "waiting_on_launches": c[RECLAIMED] + busy,
            "held": held,
            "allocatable_now": c[FREE] + c[CACHED] - busy,
            "admission_headroom": self.num_blocks - held,
            "occupancy_blocks": self._entries_total,
            "occupancy_tokens": self._reserved_total,
            "tail_waste_slots": self._entries_total * self.block_size - self._reserved_total,
            "prefix_hit_tokens": self._prefix_hit_tokens,
            "inflight_launches": len(self._inflight),
        }
        if self._attached_pool is not None:
            per = int(self._attached_pool.bytes_per_block)
            out["bytes_per_block"] = per
            out["reserved_bytes"] = int(self._attached_pool.reserved_bytes)
            out["in_use_bytes"] = held * per
            out["cached_bytes"] = c[CACHED] * per
        return out

    # ---- the spec view -----------------------------------------------------------------------
    @_locked
    def abstract(self) -> Abstraction:
        """The allocator's state mapped to the spec's: the pool, and the request layer's state
        (``spec.requests``), materialized from ``spec_view`` (the one mapping, written in
        ``allocator/request_view.py``)."""
        pool = self.pool.abstract()
        return Abstraction(pool, materialize(self.spec_view, pool, initial_request_state(pool)))

    @_locked
    def check_invariants(self) -> None:
        """Scan everything; raise InvariantViolation naming the first invariant that fails."""
        a = self.abstract()
        found = violations(a.pool, a.requests) + self.pool.structure_errors()
        gen = self.pool.gen
        found += [("table_covers_reserved", f"the launch rows of {r.rid!r} differ from its table")
                  for r in self._requests.values()
                  if self._rows.mismatches(r.row, r.table, [gen[b] for b in r.table])]
        reserved = sum(r.reserved for r in self._requests.values())
        entries = sum(len(r.table) for r in self._requests.values())
        if (reserved, entries) != (self._reserved_total, self._entries_total):
            found.append(("table_covers_reserved", "stats totals differ from the tables"))
        if found:
            name, where = found[0]
            raise InvariantViolation(name, f"at {where!r}" + (
                f" (and {len(found) - 1} more)" if len(found) > 1 else ""))


__all__ = ["Abstraction", "BlockAllocator"]
