"""NativeAllocator: the request layer's step-level calls as native loops over a NativePool.

``BlockAllocator``'s calls for a serving loop that batches its step (``add_request``,
``allocate`` / ``extend``, ``allocate_many``, ``append_tokens`` / ``append_tokens_many``,
``publish`` and the launch's completion, ``commit`` / ``commit_many``, ``free``), with the same
meaning: the same blocks taken, tables, launches (block tables, slot mapping, sequence and
query lengths, writes), prefix hits, states and refusals (the tests run both side by side).
Each request's table and positions are a row of int64 arrays, and each step-level call runs one
native loop over all its requests (``native_steps.py``) that calls the spec's pool transitions
and the request rules (``commit_bounds``, ``slots_written``), all generated from the spec and
self-checked against it with the pool's (``native_pool.native_module``). What stays in Python
is per request and small: token ids and their sha256 chain (``RequestBook``, as
``BlockAllocator`` hashes), admissions (prefix hits, the first allocation) and frees.

Not here (``BlockAllocator`` has them): ``fork``, ``truncate``, copy-on-write (no partial
block is ever shared without a fork), launches completed by recorded events (complete each
launch: ``Launch.complete()``), ``attach_pool``. Needs numba (``pagedkv[native]``).
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

from pagedkv.spec import NO_HASH, Transition, initial_request_state, violations
from pagedkv.spec.request_spec import REQUEST_SPEC, RequestSpec, as_request_spec

from . import native_hash
from .allocator import (
    Abstraction,
    RequestBook,
    _check_and_pack_tokens,
    _check_tokens,
    _locked,
    _ordered,
)
from .errors import (
    CommitError,
    InvalidArgument,
    InvariantViolation,
    OutOfBlocks,
    TokensUnknown,
)
from .hashing import all_ints, digest_bytes, normalize_extra_keys, pack_tokens, salt_bytes
from .launch import Launch, LaunchAlreadyCompleted
from .native_pool import _NONE, ROW, NativePool, native_module
from .native_steps import (  # the row layout the generated module was pasted with
    FUSED_DONE,
    FUSED_LAUNCH_ROOM,
    FUSED_PLAN,
    FUSED_SCRATCH,
    R_COMPUTED,
    R_FIELDS,
    R_HOLDER,
    R_ISSUED,
    R_KNOWN,
    R_RESERVED,
    R_TLEN,
    STEP_COUNT,
    STEP_KEYS_ROOM,
    STEP_OK,
    STEP_TOO_WIDE,
)
from .request_view import materialize, request_view
from .table import MAX_COUNT, check_count
from .table_rows import TableRows, launch_width

_NO_COPIES = np.empty((0, 2), np.int32)
_NO_COPIES.flags.writeable = False
_INT64 = np.dtype(np.int64)


class _HitMemo(NamedTuple):
    """A request's last lookup (``NativeAllocator._hits``): its chain and token counts, per
    hit the hash slot, the slot's interning stamp and the block, and the spec's
    ``hit_limit`` from the entry after the hits (a pure function of the counts and hits)."""

    counts: tuple[int, int]
    slots: np.ndarray
    stamps: np.ndarray
    blocks: np.ndarray
    hits: list[int]
    limit: int


def int64_vector(values: Sequence[Any]) -> np.ndarray | None:
    """``values`` as an int64 vector if each is exactly an int in int64 range (``all_ints``:
    no bool, no NumPy integer), else None."""
    if not all_ints(values):
        return None
    try:
        return np.array(values, np.int64)
    except OverflowError:
        return None


def _split(entries: list[int], counts: list[int]) -> list[list[int]]:
    """``entries`` cut into consecutive lists of ``counts[i]`` each."""
    it = iter(entries)
    return [list(itertools.islice(it, g)) if g else [] for g in counts]


def _leading_part(memo: _HitMemo, k: int) -> _HitMemo | None:
    """The memo of the first ``k`` of ``memo``'s hits (those still current:
    ``current_prefix``), to resume a lookup from, or None for none. A lookup finds those
    hits again, then goes on from the first that is not current, as from a memo of them
    (with the same ``hit_limit``: the limit from any entry up to the chain's hit limit is
    that limit)."""
    if k == 0:
        return None
    return _HitMemo(memo.counts, memo.slots[:k], memo.stamps[:k], memo.blocks[:k],
                    memo.hits[:k], memo.limit)


class _NativeRequest:
    """A request's Python side: its token ids and their chain hashes (``RequestBook``), its
    row of the native arrays."""

    __slots__ = ("rid", "tokens", "salt", "extra_keys", "hashes", "row", "hit_memo")

    def __init__(self, rid: Hashable, tokens: list[int], salt: str | bytes | None,
                 extra_keys: tuple[Any, ...], row: int) -> None:
        self.rid, self.tokens, self.salt, self.extra_keys = rid, tokens, salt, extra_keys
        self.hashes: list[int] = []
        self.row = row
        self.hit_memo: _HitMemo | None = None


class NativeAllocator(RequestBook):
    """``BlockAllocator``'s step-level calls, natively (see the module docstring).

    ``checked``: the pool re-checks the spec's local invariants on every block a call touched,
    in their native form (as ``NativePool``). Thread safety as ``BlockAllocator``'s: every
    public call and ``Launch.complete()`` run under one re-entrant lock."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True,
                 checked: bool = True,
                 spec: RequestSpec | Mapping[str, Transition] | None = None) -> None:
        if not isinstance(prefix_caching, bool | np.bool_):
            raise InvalidArgument(
                f"prefix_caching must be a bool, got {type(prefix_caching).__name__}")
        try:
            self.spec = as_request_spec(spec)
        except TypeError as exc:
            raise InvalidArgument(str(exc)) from None
        self.pool = NativePool(num_blocks, block_size, checked=checked,
                               spec=None if spec is None else self.spec.pool)
        self.pool._known_complete = False  # (its commits intern digests from the rows, D)
        rules = (self.spec.commit_bounds, self.spec.slots_written)
        default = rules == (REQUEST_SPEC.commit_bounds, REQUEST_SPEC.slots_written)
        self.mod = self.pool.mod if default else native_module(self.pool.spec, rules)
        self.block_size = self.pool.block_size
        self.num_blocks = self.pool.num_blocks
        self.prefix_caching = bool(prefix_caching)
        self.checked = self.pool.checked
        self._lock = threading.RLock()
        self._requests: dict[Hashable, _NativeRequest] = {}
        # No memo: a block's native sha256 (``_chain``) costs less than a memo's lookup and
        # upkeep, and no front door hashes twice here.
        self._hash_memo: OrderedDict[tuple[Any, ...], int] | None = None
        self._inflight: dict[int, Launch] = {}
        self._written: dict[int, np.ndarray] = {}  # the blocks each launch in flight writes
        # The tables twice: T for the native loops, and as the int32 rows launches copy
        # incrementally (``TableRows``, as ``BlockAllocator``'s), a row index naming both.
        self._rows = TableRows()
        rows = self._rows.blocks.shape[0]
        self.R = np.zeros((R_FIELDS, rows), np.int64)
        self.T = np.full((rows, 16), -1, np.int64)
        self._S = np.empty((3, 2 * self.num_blocks + 2), np.int64)  # never fills: see grow
        # a running pass's growth per request, targets, and the entries it added (at most a
        # block each of the pool's)
        self._grown = self._targets = np.empty(0, np.int64)
        self._entries = np.empty(self.num_blocks + 1, np.int64)
        self._filled = np.empty((3, rows), np.int64)
        # a fused launch's slot mapping, starts, lengths, writes and commit counts (unchecked)
        self._fused = [np.empty(64, np.int64) for _ in range(5)]
        self._cached = np.empty(64, np.int64)  # _cache_filled's blocks and holders
        self._holders = np.empty(64, np.int64)
        # A mirror of each request's token and digest lists, set from them wherever Python
        # changes those: its row's block in progress (its tokens' big-endian bytes), chain
        # head (the last digest, where ``_chained``) and digests (``D``: each as the four
        # words the digest table keys on). Sampled tokens are appended and hashed natively
        # from it (``native_hash.appender``; None where hashing is not native), a commit's
        # filled blocks interned from ``D`` (``native_digests.intern_rows``), a lookup's
        # hits read from it (``leading_in_row``).
        self._appending = (native_hash.appender(self.block_size)
                           if sys.byteorder == "little" else None)
        self._open = np.zeros((rows, 8 * self.block_size), np.uint8)
        self._parent = np.zeros((rows, 32), np.uint8)
        self._chained = np.zeros(rows, np.uint8)
        from .native_digests import WORDS  # (numba's, as NativePool's own import of it)

        self.D = np.zeros((rows, 16, WORDS), np.int64)
        self._stored = np.zeros(rows, np.int64)  # how many of each row's digests D holds
        self._mirror_bytes()
        self._interned = np.empty(64, np.int64)  # a commit's hash slots
        self._lead = np.empty((2, 64), np.int64)  # a lookup's hit slots and blocks
        self._digest_out = bytearray(32 * 64)
        self._load_loops()
        from .native_entry import step_loops  # (numba's: imported once the module is)

        self._steps = step_loops(self.mod)

    def _load_loops(self) -> None:
        """Each step loop called through numba's dispatcher run once on no request, on copies
        of the arrays, so that numba loads its compiled code now (milliseconds per function,
        once per process) rather than in a step; the loops called through entry points
        (``native_entry``) are loaded by making them."""
        mod, none = self.mod, np.empty(0, np.int64)
        arrays = tuple(a.copy() for a in self._arrays)
        S, F = self._S.copy(), self._filled.copy()
        mod.grow_many(*arrays, none, none, 0, S, none)
        mod.commit_scan(*arrays, none, none, 0, F, True)
        tr = self._rows
        mod.copy_rows(tr.blocks, tr.gens, none, 0, *(np.empty((0, 1), np.int32),) * 2)
        mod.count_takeable(*arrays[:5], none, 0)
        mod.recycle_where(*arrays[:5], none, 0)

    # ---- rows ------------------------------------------------------------------------------------
    def _new_row(self) -> int:
        row = self._rows.open()
        old = self.R.shape[1]
        if row >= old:  # the rows doubled: so do R and T
            grow = self._rows.blocks.shape[0] - old
            self.R = np.concatenate([self.R, np.zeros((R_FIELDS, grow), np.int64)], axis=1)
            self.T = np.concatenate([self.T, np.full((grow, self.T.shape[1]), -1, np.int64)])
            self._filled = np.empty((3, self.R.shape[1]), np.int64)
            self._open = np.concatenate([self._open, np.zeros_like(self._open[:grow])])
            self._parent = np.concatenate([self._parent, np.zeros_like(self._parent[:grow])])
            self._chained = np.concatenate([self._chained, np.zeros(grow, np.uint8)])
            self.D = np.concatenate([self.D, np.zeros_like(self.D[:grow])])
            self._stored = np.concatenate([self._stored, np.zeros(grow, np.int64)])
            self._mirror_bytes()
        return row

    def _put_rows(self, row: int, start: int, blocks: list[int]) -> None:
        """Entries ``start ..`` of the row's launch-facing copy, with their generations."""
        gen = self.pool.B[ROW["gen"]]
        self._rows.put(row, start, blocks, gen[blocks].tolist())

    def _room_for_entries(self, entries: int) -> None:
        """Rows at least ``entries`` wide (a power of two: a launch's width never exceeds it),
        the launches' rows too."""
        width = self.T.shape[1]
        if entries > width:
            wider = np.full((self.T.shape[0], launch_width(entries)), -1, np.int64)
            wider[:, :width] = self.T
            self.T = wider
        self._rows.reserve(self.T.shape[1])

    def _rows_of(self, reqs: Sequence[_NativeRequest]) -> np.ndarray:
        return np.fromiter([req.row for req in reqs], np.int64, len(reqs))

    @property
    def _arrays(self) -> tuple[np.ndarray, ...]:
        p = self.pool
        return p.B, p.M, p.H, p.K, p.X, self.R, self.T

    # ---- requests --------------------------------------------------------------------------------
    @_locked
    def add_request(self, rid: Hashable, token_ids: Sequence[int], *,
                    cache_salt: str | bytes | None = None, extra_keys: Sequence[Any] = ()) -> int:
        """``BlockAllocator.add_request``: register a request (spec: open_holder); return the
        prompt tokens the cache has now."""
        return len(self._hits(self._register(rid, token_ids, cache_salt, extra_keys))) * (
            self.block_size)

    def _chain(self, parent: int, tokens: list[int], first: int, keys: tuple[Any, ...],
               salt: str | bytes | None) -> list[int]:
        """``RequestBook._chain`` without a memo, natively (``native_hash.chain_tokens``)."""
        return native_hash.chain_tokens(parent, tokens, self.block_size, keys,
                                        None if first or salt is None else salt_bytes(salt))

    def _register(self, rid: Hashable, token_ids: Sequence[int], cache_salt: Any,
                  extra_keys: Sequence[Any],
                  again: _NativeRequest | None = None) -> _NativeRequest:
        """``add_request`` without its lookup: the new record (under the caller's lock).
        ``again``: the record this request had before it was freed (its tokens since grown,
        nothing else changed): its tokens are taken as they are (checked then) and its chain
        hashes kept (a pure function of the tokens, salt and keys), the new blocks hashed."""
        self._check_new_rid(rid)
        if again is None:
            tokens, packed = _check_and_pack_tokens(token_ids)
            if cache_salt is not None and not isinstance(cache_salt, str | bytes):
                raise InvalidArgument("cache_salt must be str, bytes or None")
            req = _NativeRequest(rid, tokens, cache_salt, normalize_extra_keys(extra_keys), -1)
            count = len(tokens) // self.block_size
            raw = native_hash.chain_packed_bytes(  # (the tokens as the check packed them)
                0, packed, count, self.block_size, req.extra_keys,
                None if cache_salt is None else salt_bytes(cache_salt))
            req.hashes = native_hash.digests_of(raw, count)
        else:
            raw = None
            req = _NativeRequest(rid, again.tokens, again.salt, again.extra_keys, -1)
            req.hashes = again.hashes
            self._extend_hashes(req)
        self.pool.open_holder(rid)
        req.row = row = self._new_row()
        self.R[:, row] = 0
        self.R[R_HOLDER, row] = self.pool._slot[rid]
        self.R[R_KNOWN, row] = len(req.tokens)
        self._requests[rid] = req
        self._stored[row] = 0
        self._open_row(req, raw)
        return req

    def _open_row(self, req: _NativeRequest, raw: bytes | bytearray | None = None) -> None:
        """The row's mirror set from the request's lists (after Python changed them; ``raw``:
        all its digests' bytes where the caller has them): the digests ``D`` does not hold
        yet (O(blocks hashed), not O(context)), its block in progress and chain head."""
        B, row, tokens, hashes = self.block_size, req.row, req.tokens, req.hashes
        n, have = len(hashes), self._stored.item(row)
        if n > have:
            self._room_for_digests(n)
            at = (row * self.D.shape[1] + have) * 32
            self._digest_bytes[at:at + 32 * (n - have)] = (
                digest_bytes(hashes[have:]) if raw is None else raw[32 * have:])
            self._stored[row] = n
        start = len(tokens) - len(tokens) % B
        if start < len(tokens):
            at = row * 8 * B
            self._open_bytes[at:at + 8 * (len(tokens) - start)] = pack_tokens(tokens[start:])
        chained = self._chain_open(req, start)
        self._chained_bytes[row] = chained
        if chained:
            self._parent_bytes[32 * row:32 * row + 32] = hashes[-1].to_bytes(32, "big")

    def _chain_open(self, req: _NativeRequest, start: int) -> bool:
        """Whether ``_append`` may hash the block from token ``start`` on: the request's
        digests cover every block before it, it has one, and it takes no extra keys."""
        hashes = req.hashes
        return bool(hashes) and not req.extra_keys and len(hashes) * self.block_size == start

    def _room_for_digests(self, n: int) -> None:
        """Rows of ``D`` at least ``n`` digests wide (doubled: amortized O(1) a digest)."""
        width = self.D.shape[1]
        if n > width:
            while width < n:
                width *= 2
            wider = np.zeros((self.D.shape[0], width, self.D.shape[2]), np.int64)
            wider[:, :self.D.shape[1]] = self.D
            self.D = wider
            self._mirror_bytes()

    def _mirror_bytes(self) -> None:
        """Flat byte views of the mirror's arrays, for ``_open_row``'s writes (a slice of a
        memoryview takes bytes at memcpy's cost; a numpy slice converts them first)."""
        self._open_bytes = memoryview(self._open).cast("B")
        self._parent_bytes = memoryview(self._parent).cast("B")
        self._chained_bytes = memoryview(self._chained)
        self._digest_bytes = memoryview(self.D).cast("B")
        self._digest_rows = self.D.reshape(self.D.shape[0], -1).view(np.uint8)

    @_locked
    def allocate(self, rid: Hashable, num_tokens: int) -> list[int]:
        """``BlockAllocator.allocate``: grow rid's table to cover ``num_tokens`` positions (the
        first call takes every prefix hit the cache has); returns the whole table."""
        req = self._req(rid)
        self._extend(req, num_tokens)
        return self.block_table(rid)

    @_locked
    def extend(self, rid: Hashable, num_tokens: int) -> list[int]:
        """``allocate``, returning only the entries this call appended."""
        return self._extend(self._req(rid), num_tokens)

    def _extend(self, req: _NativeRequest, num_tokens: Any) -> list[int]:
        if self.R[R_TLEN, req.row]:
            return self._grow_rows([req], [num_tokens])[0]
        return self._admit(req, num_tokens)

    def _admit(self, req: _NativeRequest, num_tokens: Any,
               hits: list[int] | None = None) -> list[int]:
        """An empty table's first growth: the prefix hits (``hits``, when the caller just
        looked them up under the same lock), shared, then new blocks."""
        num_tokens = check_count(num_tokens, "num_tokens")
        row, B, R = req.row, self.block_size, self.R
        if num_tokens < R[R_RESERVED, row]:
            raise InvalidArgument(f"request {req.rid!r} already covers "
                                  f"{R[R_RESERVED, row]} positions; tables only grow")
        if hits is None:
            hits = self._hits(req)
        reserved = max(num_tokens, len(hits) * B)
        entries = -(-reserved // B)
        need = entries - len(hits)
        pool = self.pool
        available = pool.usable() - (self.count_takeable(hits) if hits else 0)
        if need > available:
            raise OutOfBlocks(need, available, pool.waiting())
        self._room_for_entries(entries)
        if hits:
            pool.share_many(req.rid, hits)
            self.T[row, :len(hits)] = hits
            R[R_COMPUTED, row] = R[R_ISSUED, row] = len(hits) * B
        R[R_TLEN, row] = len(hits)  # (the table holds the hits should a take be refused)
        if need > 0:
            self.T[row, len(hits):entries] = pool.take_many(req.rid, need)
        R[R_TLEN, row] = entries
        R[R_RESERVED, row] = reserved
        added = self.T[row, :entries].tolist()
        self._put_rows(row, 0, added)
        req.hit_memo = None  # admitted: not looked up again (its memory goes)
        return added

    @_locked
    def allocate_many(self, grow: Sequence[tuple[Hashable, int]]) -> list[list[int]]:
        """``BlockAllocator.allocate_many``: grow each running request of the ``(rid,
        num_tokens)`` pairs, in order, all or nothing (one native loop); the entries each
        appended."""
        pairs = self._batch(grow, "allocate_many")
        return self._grow_rows([req for req, _ in pairs], [n for _, n in pairs])

    def _grow_rows(self, reqs: list[_NativeRequest], counts: list[Any]) -> list[list[int]]:
        for i, n in enumerate(counts):
            if type(n) is not int or not 0 <= n <= MAX_COUNT:
                counts[i] = check_count(n, "num_tokens")
        n = len(reqs)
        if not n:
            return []
        targets = np.array(counts, np.int64)
        # (a table holds distinct blocks: one wider than the pool does not fit anyway)
        self._room_for_entries(min(-(-int(targets.max()) // self.block_size), self.num_blocks))
        rows = self._rows_of(reqs)
        grown = np.empty(n, np.int64)
        while True:
            found = self.mod.grow_many(*self._arrays, rows, targets, n, self._S, grown)
            if found[1] != self.mod.STEP_KEYS_ROOM:
                break
            self.pool._room_for_keys(found[2])
        self._after_growth(reqs, found)
        return self._entries_added(reqs, grown, n)

    def _after_growth(self, reqs: Sequence[_NativeRequest], found: tuple[int, ...]) -> None:
        """A growth loop's evictions told to the pool, its touched blocks checked, and its
        refusal raised (nothing changed then, but for a guard's refusal)."""
        i, status, detail, nev, nt = found
        pool, S, mod = self.pool, self._S, self.mod
        if nev:
            pool._release_hashes(S[0, :nev])
        if self.checked and nt:
            pool._check_touched("take_many", S[2], nt)
        if status == mod.STEP_OK:
            return
        if status == mod.STEP_NO_ROOM:
            raise OutOfBlocks(detail, pool.usable(), pool.waiting())
        rid = reqs[i].rid
        if status == mod.STEP_SHRINKS:
            raise InvalidArgument(
                f"request {rid!r} already covers {self.R[R_RESERVED, reqs[i].row]} "
                "positions; tables only grow")
        if status == mod.STEP_EMPTY_TABLE:
            raise InvalidArgument(
                f"allocate_many grows running requests; {rid!r} has an empty table "
                "(its first allocation takes prefix hits: allocate)")
        if status == STEP_COUNT:
            raise InvalidArgument(f"request {rid!r}: a running pass's token counts must be > 0")
        if status == mod.STEP_ROLLBACK:
            raise InvalidArgument(
                f"request {rid!r} has fewer positions computed than issued: rolling back "
                "is BlockAllocator.truncate's")
        if status != mod.STEP_REFUSED:  # pragma: no cover - the rows are widened first
            raise AssertionError(f"growth loop status {status} for {rid!r}")
        pool._refuse("allocate", b=detail, r=rid)  # a guard refused: its typed error

    def _entries_added(self, reqs: Sequence[_NativeRequest], grown: np.ndarray,
                       n: int) -> list[list[int]]:
        return self._entries_of_rows(self._rows_of(reqs[:n]), grown, n)

    def _entries_of_rows(self, rows: np.ndarray, grown: np.ndarray, n: int) -> list[list[int]]:
        """The entries each of ``rows[:n]`` just added (``grown[i]`` of them), as lists."""
        if n == 1 and not grown[0]:  # a decode step's growth within its table
            return [[]]
        tr, E = self._rows, self._S[0]  # (the growth loop's scratch, read by now)
        bad, total = self._steps.put_grown(self.pool.B, self.R, self.T, rows, grown, n,
                                           tr.blocks, tr.gens, tr.lengths, E)
        if bad >= 0:  # pragma: no cover - rows grow by appends
            raise AssertionError("a table grew other than at its end")
        return _split(E[:total].tolist(), grown[:n].tolist())

    def grow_running(self, rows: np.ndarray, computed: np.ndarray, counts: np.ndarray,
                     rids: Sequence[Hashable]) -> list[list[int]]:
        """A scheduler's running pass in one native loop (``native_steps.grow_running``):
        request ``rids[i]`` at row ``rows[i]`` (its table non-empty), ``computed[rows[i]]``
        positions computed (``computed``: by row), grows by ``counts[i]`` new ones (> 0;
        to at least what it reserved), in order, stopping at the first whose new blocks are
        not usable then; returns the entries each one grown added (shorter than ``rows`` if
        one did not fit). int64 vectors, ``computed`` contiguous and covering every row, the
        counts ints, the requests distinct (the caller's). Under the caller's lock."""
        n = len(rows)
        if not (rows.dtype is computed.dtype is counts.dtype is _INT64
                and rows.ndim == computed.ndim == counts.ndim == 1
                and computed.flags.c_contiguous and len(counts) == n
                and (not n or 0 <= rows.min() <= rows.max() < len(computed))):
            raise InvalidArgument("grow_running takes three int64 vectors: rows, computed "
                                  "positions by row (covering them), counts of the rows' length")
        return self._grow_running(rows, computed, counts, rids)

    def _grow_running(self, rows: np.ndarray, computed: np.ndarray, counts: np.ndarray,
                      rids: Sequence[Hashable]) -> list[list[int]]:
        """``grow_running`` on vectors the caller made (their types as it checks them)."""
        n = len(rows)
        if len(self._grown) < n:
            self._grown, self._targets = np.empty(2 * n, np.int64), np.empty(2 * n, np.int64)
        grown, tr = self._grown, self._rows
        while True:
            found = self._steps.grow_running(*self._arrays, rows, computed, counts, n, self._S,
                                             grown, self._targets, tr.blocks, tr.gens,
                                             tr.lengths, self._entries)
            if found[1] == STEP_TOO_WIDE:
                self._room_for_entries(min(found[2], self.num_blocks))
            elif found[1] == STEP_KEYS_ROOM:
                self.pool._room_for_keys(found[2])
            else:
                break
        ok = found[1] == STEP_OK
        if not ok or found[3] or self.checked:  # (else: no evictions, nothing to check)
            self._after_growth([self._requests[rid] for rid in rids] if not ok else (),
                               (-1 if ok else found[0], *found[1:5]))
        if not found[2]:  # no table grew (blocks touched: none): a decode step's pass
            return [[] for _ in range(found[0])]
        if found[5] < 0:  # pragma: no cover - rows grow by appends
            raise AssertionError("a table grew other than at its end")
        return _split(self._entries[:found[5]].tolist(), grown[:found[0]].tolist())

    @_locked
    def append_tokens(self, rid: Hashable, token_ids: Sequence[int]) -> None:
        """Record generated tokens, so that the blocks they fill can be hashed at commit."""
        req = self._req(rid)
        req.tokens.extend(_check_tokens(token_ids))
        self._extend_hashes(req)
        self.R[R_KNOWN, req.row] = len(req.tokens)
        self._open_row(req)

    @_locked
    def append_tokens_many(self, updates: Sequence[tuple[Hashable, Sequence[int]]]) -> None:
        """The step-level ``append_tokens``: all or nothing, each request once. One token
        each (a decode step's): ``append_token_many``, natively."""
        pairs = self._batch(updates, "append_tokens_many")
        if all(type(t) is list and len(t) == 1 for _, t in pairs):
            self.append_token_many([req for req, _ in pairs], [t[0] for _, t in pairs])
            return
        reqs = self._record_tokens(updates)
        if reqs:
            self.R[R_KNOWN, self._rows_of(reqs)] = [len(req.tokens) for req in reqs]
            for req in reqs:
                self._open_row(req)

    def append_token_many(self, reqs: Sequence[_NativeRequest], tokens: Sequence[Any],
                          rows: np.ndarray | None = None) -> None:
        """One sampled token for each request record (each once: the caller's; ``rows``
        their rows if the caller has them), as ``append_tokens_many`` of one token each:
        every token is checked before any is recorded (``InvalidArgument``). Natively, each
        row's block in progress takes its token and the blocks ended are hashed in the same
        loop (``native_hash.appender``). Under the caller's lock."""
        values = int64_vector(tokens)
        if values is None:
            tokens = _check_tokens(list(tokens))  # refused, saying why, or plain ints
            values = np.array(tokens, np.int64)
        if not reqs:
            return
        n = len(reqs)
        if len(tokens) != n:
            raise InvalidArgument(f"{n} requests but {len(tokens)} tokens")
        for req, token in zip(reqs, tokens, strict=True):
            req.tokens.append(token)
        if self._filled.shape[1] < n:
            self._filled = np.empty((3, 2 * n), np.int64)
        filled = self._filled[0]
        if rows is None:
            rows = self._rows_of(reqs)
        if self._appending is not None:
            if len(self._digest_out) < 32 * n:
                self._digest_out = bytearray(64 * n)
            nf = self._appending(self.R[R_KNOWN], rows, n, values,
                                 self._open, self._parent, self._chained, self._digest_out,
                                 filled, self._filled[1], self._digest_rows, self._stored)
            if nf:
                self._take_digests(reqs, nf)
            return
        nf = self._steps.count_known(self.pool.M, self.R, rows, n, filled)
        ended = [reqs[i] for i in filled[:nf].tolist()]
        if nf == 1:  # its last token ended a block: hash it
            self._extend_hashes(ended[0])
        elif nf:
            self._hash_next_blocks(ended)
        for req in ended:
            self._open_row(req)

    def _take_digests(self, reqs: Sequence[_NativeRequest], nf: int) -> None:
        """The digests ``_append`` made for the ``nf`` blocks the appended tokens ended, each
        appended to its request's, and the blocks it did not hash (a chain not open: the
        first block, extra keys) hashed here."""
        out, filled = self._digest_out, self._filled
        for j, (i, hashed) in enumerate(zip(filled[0, :nf].tolist(),
                                            filled[1, :nf].tolist(), strict=True)):
            req = reqs[i]
            if hashed:
                req.hashes.append(int.from_bytes(out[32 * j:32 * j + 32], "big"))
                if hashed == 2:  # (made, but its row of D had no room for it)
                    self._open_row(req)
            else:
                self._extend_hashes(req)
                self._open_row(req)

    def _hash_next_blocks(self, reqs: list[_NativeRequest]) -> None:
        """``_extend_hashes`` of each request: those whose one new full block is not their
        first and whose hashes take no extra keys in one native call
        (``native_hash.next_blocks``), the others one by one."""
        B, due, parents, tokens = self.block_size, [], [], []
        for req in reqs:
            hashes, end = req.hashes, len(req.tokens)
            if req.extra_keys or not hashes or (len(hashes) + 1) * B != end - end % B:
                self._extend_hashes(req)
            else:
                due.append(hashes)
                parents.append(hashes[-1])
                tokens += req.tokens[end - end % B - B:end - end % B]
        if due:
            for hashes, h in zip(due, native_hash.next_blocks(parents, tokens, B, ()),
                                 strict=True):
                hashes.append(h)

    def _hits(self, req: _NativeRequest) -> list[int]:
        """``RequestBook._hits``: the spec's ``leading_hits``, resumed past the hits the
        request's last lookup found while each is current (``current_prefix``: its digest
        still interned since and registered to the same block, so looking it up again finds
        the same), and past the leading ones still current where some are not. A waiting
        request is looked up every step, its prefix rarely changed. The entries the spec's
        ``hit_limit`` allows are looked up in one batch (``NativePool.prefix_hits``)."""
        if not self.prefix_caching:
            return []
        pool, counts = self.pool, (len(req.hashes), len(req.tokens))
        memo = req.hit_memo
        if memo is not None:
            if memo.counts != counts:
                memo = None
            elif memo.hits:
                k = self._steps.current_prefix(pool.X, pool.G, memo.slots, memo.stamps,
                                               memo.blocks, len(memo.hits))
                if k < len(memo.hits):
                    memo = _leading_part(memo, k)
        if memo is None:
            start, limit = 0, self.spec.hit_limit(counts[0], counts[1], self.block_size)
        else:
            start, limit = len(memo.hits), memo.limit
        found, slots = self._leading_in_row(req.row, start, limit)
        if not len(found):
            req.hit_memo = memo or _HitMemo(counts, slots, slots, slots, [], limit)
            return list(memo.hits) if memo else []
        more = found.tolist()
        if memo:
            slots, more = np.concatenate((memo.slots, slots)), memo.hits + more
        req.hit_memo = _HitMemo(counts, slots, pool.G[slots], np.array(more, np.int64), more,
                                self.spec.hit_limit(counts[0], counts[1], self.block_size,
                                                    len(more)))
        return list(more)

    def _leading_in_row(self, row: int, start: int, stop: int) -> tuple[np.ndarray, ...]:
        """The blocks registered under the row's digests ``start .. stop - 1`` up to the
        first that is not (its prefix hits from ``start``), and their hash slots, read
        natively from ``D``."""
        if start >= stop:
            return _NONE, _NONE
        if self._lead.shape[1] < stop - start:
            self._lead = np.empty((2, 2 * (stop - start)), np.int64)
        pool, lead = self.pool, self._lead
        t = pool._table
        k = t.loops.leading_in_row(t.W, t.IX, pool.X, self.D, row, start, stop, lead[0],
                                   lead[1])
        if not k:
            return _NONE, _NONE
        return lead[1, :k].copy(), lead[0, :k].copy()

    def count_takeable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` (ids of the pool) an allocation could take (the spec's
        ``takeable``): prefix hits that are, are revived rather than taken."""
        pool = self.pool
        bs = np.array(blocks, np.int64)
        return int(self.mod.count_takeable(pool.B, pool.M, pool.H, pool.K, pool.X, bs,
                                           len(bs)))

    # ---- launches -------------------------------------------------------------------------------
    @_locked
    def publish(self, rids: Sequence[Hashable]) -> Launch:
        """``BlockAllocator.publish``: the requests' tables handed to kernels as launch number
        ``L``; new blocks published, each written block marked (spec: begin_write)."""
        rids = self._check_rids(rids)
        requests = self._requests
        try:
            reqs = [requests[r] for r in rids]
        except KeyError:
            reqs = [self._req(r) for r in rids]  # UnknownRequest, naming it
        return self._launch(rids, self._rows_of(reqs))

    def _launch(self, rids: tuple[Hashable, ...], rows: np.ndarray) -> Launch:
        """``publish`` of the distinct known requests ``rids`` at ``rows`` (under the lock)."""
        return self._launch_of(rids, rows, *self._issue(rids, rows))

    def _launch_of(self, rids: tuple[Hashable, ...], rows: np.ndarray, L: int,
                   written: np.ndarray, slots: np.ndarray, starts: np.ndarray,
                   lens: np.ndarray, longest: int) -> Launch:
        """The ``Launch`` of the issued launch L (``_issue``'s results), in flight."""
        pool = self.pool
        tables, generations = self._tables(rows, longest)
        seq_lens = lens.astype(np.int32)
        launch = Launch(
            rids=rids, block_tables=tables, seq_lens=seq_lens,
            query_lens=seq_lens - starts.astype(np.int32), slot_mapping=slots,
            table_generations=generations, copies=_NO_COPIES,
            writes=tuple(written.tolist()), _on_complete=self._complete,
            _generation_of=lambda: pool.B[ROW["gen"], :pool.num_blocks], seq=L,
            block_size=self.block_size)
        self._inflight[L] = launch
        self._written[L] = written
        return launch

    def _issue(self, rids: Sequence[Hashable], rows: np.ndarray
               ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """The transitions of a launch of ``rids`` at ``rows``: their new blocks published,
        the launch numbered, its writes begun (checked, refusals raised). Returns (launch
        number, blocks written, slot mapping, per request the positions issued before and
        after, the longest table)."""
        n, pool = len(rids), self.pool
        i, status, npos, nblocks, longest = self._steps.launch_plan(*self._arrays, rows, n)
        if status != self.mod.STEP_OK:
            self._refuse_plan(rids[i], status)
        pool._room_for_launch()
        slots = np.empty(npos, np.int64)
        starts = np.empty(n, np.int64)
        lens = np.empty(n, np.int64)
        written = np.empty(nblocks, np.int64)
        issued = self._steps.launch_rows(*self._arrays, rows, n, slots, starts, lens, written)
        self._after_issue(rids, written, issued)
        return issued[4], written, slots, starts, lens, longest

    def _refuse_plan(self, rid: Hashable, status: int) -> None:
        """``launch_plan``'s refusal of request ``rid``, raised."""
        if status == self.mod.STEP_NOTHING_ALLOCATED:
            raise InvalidArgument(f"request {rid!r} has no allocated positions")
        raise InvalidArgument(f"request {rid!r} writes a shared partial block: only "
                              "BlockAllocator copies on write")

    def _after_issue(self, rids: Sequence[Hashable], written: np.ndarray,
                     issued: tuple[int, int, int, int, int, int]) -> None:
        """``launch_rows``' results (``issued``): checked mode's checks, a refusal raised."""
        stage, i, refused, w, L, nw = issued
        pool = self.pool
        if self.checked and nw:
            pool._check_touched("begin_write", written, nw)
        if stage == 1:
            pool._refuse("publish", b=refused, r=rids[i])
        if stage == 2:
            pool._refuse("launch", L=L)
        pool._check_clock("launch", L)
        if stage == 3:
            pool._refuse("begin_write", b=refused, r=rids[i], w=w)

    def _tables(self, rows: np.ndarray, longest: int) -> tuple[np.ndarray, np.ndarray]:
        """The launch's block tables and generations from the launch rows (``TableRows``):
        a copy kept incrementally for a large launch (``take``), a fresh one made natively
        for one below ``incremental_from`` entries (where ``take`` copies afresh too)."""
        tr, n = self._rows, len(rows)
        width = launch_width(longest)
        if n * width >= tr.incremental_from:
            return tr.take(rows.tolist(), longest)
        tables = np.empty((n, width), np.int32)
        generations = np.empty((n, width), np.int32)
        self.mod.copy_rows(tr.blocks, tr.gens, rows, n, tables, generations)
        tables.flags.writeable = generations.flags.writeable = False
        return tables, generations

    def _complete(self, launch: Launch, strict: bool) -> None:
        """End the launch's writes and the launch (spec: end_write each, complete), then move
        the watermark as far as it goes."""
        with self._lock:
            if launch.completed:
                if strict:
                    raise LaunchAlreadyCompleted(f"{launch!r} already completed")
                return
            pool, L = self.pool, launch.seq
            written = self._written[L]
            self._completed(launch, written, *self.mod.complete_launch(
                pool.B, pool.M, pool.H, pool.K, pool.X, written, len(written), L))

    def _completed(self, launch: Launch, written: np.ndarray, failed: int, refused: bool,
                   advanced: int) -> None:
        """After ``complete_launch`` ran (its results): the refusal raised (nothing was
        completed then), checked mode's checks, the launch marked completed and forgotten,
        the retire queue drained up to the new watermark."""
        L = launch.seq
        self._check_completion(L, written, failed, refused)
        launch.completed = True
        del self._inflight[L], self._written[L]
        self._after_advance(advanced)

    def _check_completion(self, L: int, written: np.ndarray, failed: int,
                          refused: bool) -> None:
        """Checked mode's checks of launch L's completion; its refusal raised."""
        pool = self.pool
        if pool.checked:
            pool._check_touched("end_write", written, len(written) if failed < 0 else failed)
        if failed >= 0:
            pool._refuse("end_write", b=int(written[failed]))
        if refused:
            pool._refuse("complete", L=L)
        pool._check_clock("complete", L)

    def _after_advance(self, advanced: int) -> None:
        """The retire queue drained up to the watermark, if it moved (checked first)."""
        if advanced:
            self.pool._check_clock("advance", None)
            self.pool._drain()

    def _launch_and_commit(self, rids: Sequence[Hashable], rows: np.ndarray) -> None:
        """A launch of the distinct known requests ``rids`` at ``rows`` that completes at
        once (a step already run), each then committing what it wrote whose token ids are
        known, in one native loop: ``publish``, ``launch.complete()``, then ``commit_many``
        of ``min(reserved, known)`` each (a front door's commit at completion). Nobody reads
        its tables, so no ``Launch`` is made unless its completion is refused (then it stays
        in flight, as after a refused ``complete()``). Under the caller's lock. Unchecked, in
        one native call (``launch_complete_commit``) on kept scratch vectors; checked, in
        two, its checks between them."""
        n = len(rows)
        if self._filled.shape[1] < n:
            self._filled = np.empty((3, 2 * n), np.int64)
        if self.checked:
            issue = self._issue(rids, rows)
            L, written, issued = issue[0], issue[1], lambda: issue
            news = np.empty(n, np.int64)
            failed, refused, advanced, i, status, _, nf = self._steps.complete_and_commit(
                *self._arrays, written, len(written), L, rows, n, news, self._filled)
        else:
            stop, plan, issue, done = self._launch_complete(rows, n)
            failed, refused, advanced, i, status, _, nf = done
            if stop == FUSED_DONE and failed < 0 and not refused and status == STEP_OK:
                # (a step's launch, all its commits made: unchecked, nothing refused)
                self._after_advance(advanced)
                if self.prefix_caching and nf:
                    self._cache_filled(rids, rows, self._filled, int(nf))
                return
            L, written, issued, news = self._after_fused(rids, rows, n, stop, plan, issue)
        if failed >= 0 or refused:
            self._launch_of(tuple(rids), rows, *issued())
        self._check_completion(L, written, failed, refused)
        self._after_advance(advanced)
        if status != self.mod.STEP_OK:  # the commits are refused (none made): say why
            self._commit_rows(rids, news.tolist(), rows)
        nf = int(nf)
        if self.prefix_caching and nf:
            self._cache_filled(rids, rows, self._filled, nf)

    def _launch_complete(self, rows: np.ndarray, n: int) -> tuple[Any, ...]:
        """``_issue`` then ``complete_and_commit`` in one native call (unchecked mode), on
        the kept scratch vectors (``_fused``), widened or the launch set given room first
        where the call stops for them: ``launch_complete_commit``'s results."""
        while True:
            slots, starts, lens, written, news = bufs = self._fused
            if len(starts) < n:
                self._fused = [slots, *(np.empty(2 * n, np.int64) for _ in range(4))]
                continue
            found = self._steps.launch_complete_commit(
                *self._arrays, rows, n, slots, starts, lens, written, news, self._filled)
            stop, plan = found[0], found[1]
            if stop == FUSED_SCRATCH:  # (nothing changed: again, on wider ones)
                bufs[0] = np.empty(2 * max(plan[2], len(slots)), np.int64)
                bufs[3] = np.empty(2 * max(plan[3], len(written)), np.int64)
                continue
            if stop == FUSED_LAUNCH_ROOM:
                self.pool._room_for_launch()
                continue
            return found

    def _after_fused(self, rids: Sequence[Hashable], rows: np.ndarray, n: int, stop: int,
                     plan: tuple[int, ...], issue: tuple[int, ...]) -> tuple[Any, ...]:
        """A fused launch that did not end in the common case: its refusal raised (its
        plan's, its issue's), else what a refused completion or commit needs: (the launch
        number, its writes, a function of no arguments returning ``_issue``'s results, the
        commits' counts)."""
        if stop == FUSED_PLAN:
            self._refuse_plan(rids[plan[0]], plan[1])
        slots, starts, lens, written, news = self._fused
        self._after_issue(rids, written, issue)  # (FUSED_ISSUE: its refusal)
        npos, longest, L, ws = plan[2], plan[4], issue[4], written[:issue[5]]
        return L, ws, lambda: (L, ws.copy(), slots[:npos].copy(), starts[:n].copy(),
                               lens[:n].copy(), longest), news[:n]

    @property
    def inflight(self) -> tuple[Launch, ...]:
        with self._lock:
            return tuple(self._inflight.values())

    # ---- commits --------------------------------------------------------------------------------
    @_locked
    def commit(self, rid: Hashable, num_tokens: int) -> None:
        """Positions below ``num_tokens`` are written: full blocks below it become REFERENCED
        and enter the prefix cache (spec: commit)."""
        req = self._req(rid)
        self._commit_rows([rid], [num_tokens], self._rows_of([req]))

    @_locked
    def commit_many(self, updates: Sequence[tuple[Hashable, int]]) -> None:
        """The step-level ``commit``: all or nothing, each request once, in order."""
        pairs = self._batch(updates, "commit_many")
        self._commit_rows([req.rid for req, _ in pairs], [n for _, n in pairs],
                          self._rows_of([req for req, _ in pairs]))

    def _commit_rows(self, rids: Sequence[Hashable], counts: list[Any],
                     rows: np.ndarray) -> None:
        """``commit_many`` of the distinct known requests ``rids`` at ``rows`` (under the
        lock)."""
        n = len(rids)
        for i, v in enumerate(counts):
            if type(v) is not int or not 0 <= v <= MAX_COUNT:
                try:
                    counts[i] = check_count(v, "num_tokens")
                except InvalidArgument:  # the pairs are checked in order (BlockAllocator's):
                    self._commit_refusal(rids[:i], counts[:i], rows[:i])  # an earlier one's
                    raise
        if not n:
            return
        if self._filled.shape[1] < n:
            self._filled = np.empty((3, 2 * n), np.int64)
        filled = self._filled
        i, status, block, nf = self.mod.commit_scan(*self._arrays, rows,
                                                    np.array(counts, np.int64), n, filled,
                                                    True)
        if status != self.mod.STEP_OK:
            self._raise_commit(rids[i], counts[i], int(rows[i]), status, block)
        if self.prefix_caching and nf:
            self._cache_filled(rids, rows, filled, nf)

    def _commit_refusal(self, rids: Sequence[Hashable], counts: list[int],
                        rows: np.ndarray) -> None:
        """Raise the refusal of the first of these commits (plain ints) that may not be made,
        changing nothing."""
        n = len(rids)
        if n:
            i, status, block, _ = self.mod.commit_scan(*self._arrays, rows,
                                                       np.array(counts, np.int64), n,
                                                       self._filled, False)
            if status != self.mod.STEP_OK:
                self._raise_commit(rids[i], counts[i], int(rows[i]), status, block)

    def _raise_commit(self, rid: Hashable, new: int, row: int, status: int,
                      block: int) -> None:
        """The typed refusal of ``commit_scan``'s ``status`` for request ``rid``."""
        mod, R = self.mod, self.R
        computed, issued = R[R_COMPUTED, row], R[R_ISSUED, row]
        if status == mod.STEP_BELOW_COMPUTED:
            raise CommitError(f"{rid!r} already committed {computed} positions")
        if status == mod.STEP_NOT_ISSUED:
            raise CommitError(f"cannot commit {new} positions of {rid!r}: launches were "
                              f"issued for {issued} (allocated {R[R_RESERVED, row]})")
        if status == mod.STEP_NOT_KNOWN:
            raise TokensUnknown(f"cannot commit {new} positions of {rid!r}: only "
                                f"{R[R_KNOWN, row]} token ids are known (append_tokens "
                                "first)")
        raise CommitError(f"block {block} of {rid!r} has a writing launch still pending")

    def _cache_filled(self, rids: Sequence[Hashable], rows: np.ndarray, filled: np.ndarray,
                      nf: int) -> None:
        """The full blocks the commits completed (``filled[:, :nf]``: per request, its index
        into ``rids`` / ``rows`` and entries first .. full - 1) enter the prefix cache (spec:
        commit), each PUBLISHED one whose hash is not cached yet, request by request in order
        (one native loop over all of them)."""
        pool = self.pool
        t = pool._table
        while True:  # (the digests of their rows of D interned natively)
            n = t.loops.intern_rows(t.W, t.IX, t.FREE, t.DM, pool.G, self.D, rows, filled,
                                    nf, self._interned)
            if n >= 0:
                break
            if n == -1:
                pool._grow_hash_slots()
            else:
                self._interned = np.empty(2 * len(self._interned), np.int64)
        slots = self._interned[:n]
        if len(self._cached) < n:
            self._cached = np.empty(2 * n, np.int64)
            self._holders = np.empty(2 * n, np.int64)
        bs, holders = self._cached, self._holders
        failed, orphaned = self._steps.cache_filled(*self._arrays, rows, filled, nf, slots,
                                                    bs, holders)
        h = t.digest(int(slots[failed])) if failed >= 0 else NO_HASH
        if orphaned:
            pool._release_hashes(slots)  # the digest of a block not committed goes
        if pool.checked:
            pool._check_touched("commit", bs, n if failed < 0 else failed)
        if failed >= 0:
            holder = next(r for r, slot in pool._slot.items() if slot == holders[failed])
            pool._refuse("commit", b=int(bs[failed]), r=holder, h=h)

    # ---- frees ----------------------------------------------------------------------------------
    @_locked
    def free(self, rid: Hashable) -> None:
        """Release rid's blocks, tail first (a block a launch may still read waits for it),
        and forget the request (spec: release each, close_holder: ``NativePool.finish``)."""
        req = self._req(rid)
        row, pool = req.row, self.pool
        tlen = int(self.R[R_TLEN, row])
        pool.finish(rid, self.T[row, tlen - 1::-1].copy() if tlen else _NONE)
        self.T[row, :tlen] = -1
        self.R[:, row] = 0
        self._rows.close(row, tlen)
        del self._requests[rid]

    @_locked
    def free_many(self, rids: Sequence[Hashable]) -> None:
        """``free`` of each request, in order; every id is checked first."""
        for req, _ in self._batch([(r, None) for r in _ordered(rids, "free_many's ids")],
                                  "free_many"):
            self.free(req.rid)

    # ---- queries --------------------------------------------------------------------------------
    @_locked
    def block_table(self, rid: Hashable) -> list[int]:
        req = self._req(rid)
        return self.T[req.row, :self.R[R_TLEN, req.row]].tolist()

    def _position(self, rid: Hashable, field: int) -> int:
        with self._lock:
            return int(self.R[field, self._req(rid).row])

    def num_computed(self, rid: Hashable) -> int:
        return self._position(rid, R_COMPUTED)

    def num_reserved(self, rid: Hashable) -> int:
        return self._position(rid, R_RESERVED)

    def num_issued(self, rid: Hashable) -> int:
        return self._position(rid, R_ISSUED)

    @property
    def requests(self) -> tuple[Hashable, ...]:
        with self._lock:
            return tuple(self._requests)

    def state(self, block_id: int) -> int:
        with self._lock:
            return int(self.pool.view.state[check_count(block_id, "block id",
                                                        self.num_blocks - 1)])

    def ref_count(self, block_id: int) -> int:
        with self._lock:
            return int(self.pool.view.ref[check_count(block_id, "block id",
                                                      self.num_blocks - 1)])

    # ---- the spec view ---------------------------------------------------------------------------
    def _records(self) -> dict[Hashable, SimpleNamespace]:
        """Each request as ``BlockAllocator`` keeps it (table, counts, tokens, hashes): what
        ``request_view`` reads."""
        R, T = self.R, self.T
        out = {}
        for rid, req in self._requests.items():
            row = req.row
            out[rid] = SimpleNamespace(
                table=T[row, :R[R_TLEN, row]].tolist(),
                reserved=int(R[R_RESERVED, row]), issued=int(R[R_ISSUED, row]),
                computed=int(R[R_COMPUTED, row]), tokens=req.tokens, hashes=req.hashes)
        return out

    @_locked
    def abstract(self) -> Abstraction:
        """The allocator's state mapped to the spec's (``BlockAllocator.abstract``): the
        pool's, and the request layer's, through the same mapping (``request_view``)."""
        storage = self.pool.storage()
        pool = storage.abstract()
        view = request_view(self._records(), storage)
        return Abstraction(pool, materialize(view, pool, initial_request_state(pool)))

    @_locked
    def check_invariants(self) -> None:
        """Scan everything: the spec's invariants on ``abstract()``, the pool's structure,
        and each request's known-token count; raise InvariantViolation naming the first
        that fails."""
        a = self.abstract()
        found = violations(a.pool, a.requests) + self.pool.structure_errors()
        found += [("table_covers_reserved", f"the known tokens of {rid!r} differ")
                  for rid, req in self._requests.items()
                  if self.R[R_KNOWN, req.row] != len(req.tokens)]
        gen = self.pool.B[ROW["gen"]]
        for rid, rec in self._records().items():
            if self._rows.mismatches(self._requests[rid].row, rec.table,
                                     gen[rec.table].tolist()):
                found.append(("table_covers_reserved",
                              f"the launch rows of {rid!r} differ from its table"))
        found += [("table_isolation", f"the digests, open block or chain head kept for {rid!r} "
                   "differ from its tokens and digests") for rid in self._mirror_mismatches()]
        if found:
            name, where = found[0]
            raise InvariantViolation(name, f"at {where!r}" + (
                f" (and {len(found) - 1} more)" if len(found) > 1 else ""))

    def _mirror_mismatches(self) -> list[Hashable]:
        """The requests whose row's mirror (``_open_row``'s: digests, block in progress,
        chain head) is not what their token and digest lists say (the digests ``_append``
        makes, or a commit interns, would not be their chain's)."""
        B, out = self.block_size, []
        for rid, req in self._requests.items():
            row, tokens, hashes = req.row, req.tokens, req.hashes
            start = len(tokens) - len(tokens) % B
            part = pack_tokens(tokens[start:])
            chained = self._chain_open(req, start)
            if (self._open[row, :len(part)].tobytes() != part
                    or bool(self._chained[row]) != chained
                    or chained and self._parent[row].tobytes() != hashes[-1].to_bytes(32, "big")
                    or self._stored[row] != len(hashes)
                    or self.D[row, :len(hashes)].tobytes() != digest_bytes(hashes)):
                out.append(rid)
        return out

    def block_generations(self) -> np.ndarray:
        """Each block's generation (a read-only copy): a launch's ``table_generations``."""
        with self._lock:
            out = self.pool.B[ROW["gen"], :self.num_blocks].astype(np.int32)
        out.flags.writeable = False
        return out


__all__ = ["NativeAllocator"]
