"""A scheduler-call driver over ``NativeAllocator``: the native step path behind vLLM's calls.

It has ``PagedKVDriver``'s calls (the vLLM anchor driver's ``step``, ``add``, ``allocate``,
``commit``, ``append``, ``preempt``, ``free`` and the observation calls) and its step-level
ones (``allocate_running``, ``commit_many``, ``append_many``), with the same decisions: the
same prefix hits, admissions (``allocate_slots``' capacity check, ``does_not_fit``, with
``full_sequence_must_fit``), running passes that stop at the first request that does not fit,
preemptions, launches (the step's first commit publishes every request allocated since
``step()`` and completes it; what it wrote, with known token ids, is committed and cached
then) and the null block. ``tests/test_native_driver.py`` runs both on the anchor's traces and
compares every result. What differs is where the work runs: each step-level call is one native
loop over its requests (``NativeAllocator``), and the driver keeps per request only its
status, its computed count and its token ids (the allocator's own list while it holds the
request's table).

Not covered (``PagedKVDriver`` / ``KVCacheManager`` have them): lookahead tokens, rollbacks
(speculative decoding), KV events, watermarks, transfers. Needs numba (``pagedkv[native]``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from pagedkv.allocator.native_allocator import NativeAllocator, int64_vector
from pagedkv.allocator.native_entry import ANY_VEC, I64, MAT, VEC, entry
from pagedkv.allocator.native_steps import R_KNOWN, R_RESERVED
from pagedkv.allocator.table import MAX_COUNT
from pagedkv.spec import ALLOCATED, PUBLISHED, REFERENCED

from .driver import AdmissionStats, columns, launch_batch
from .manager import _count, does_not_fit
from .request import RequestStatus, _as_token

_NULL = ("pagedkv", "null block")  # the null block's holder (no request id of the trace)


@dataclass(slots=True)
class _Batch:
    """The running requests a step-level call named last (``NativeDriver._running_rows``):
    their rows, as an int64 array, and their allocator records once asked for."""

    rids: list[Any] | None = None
    rows: list[int] | None = None
    array: np.ndarray | None = None
    records: list[Any] | None = None
    distinct: bool = False


_NO_BATCH = _Batch()


class _Sequence:
    """A request as the driver keeps it."""

    __slots__ = ("rid", "tokens", "salt", "status", "computed", "preemptions", "pending",
                 "record")

    def __init__(self, rid: Hashable, tokens: list[int], salt: str | None) -> None:
        self.rid, self.tokens, self.salt = rid, tokens, salt
        self.record: Any = None  # its allocator record, kept when it was freed
        self.status = RequestStatus.WAITING
        self.computed = 0
        self.preemptions = 0
        self.pending: list[int] | None = None  # the lookup's hits, for the next admission


def make(num_blocks: int, block_size: int, enable_caching: bool = True, *,
         max_num_batched_tokens: int = 8192, checked: bool = False) -> NativeDriver:
    """A driver over a fresh ``NativeAllocator`` (``num_blocks`` includes the null block);
    ``max_num_batched_tokens`` is accepted for the anchor's factory signature and unused."""
    return NativeDriver(num_blocks, block_size, enable_caching, checked=checked)


def make_checked(num_blocks: int, block_size: int, enable_caching: bool = True, *,
                 max_num_batched_tokens: int = 8192) -> NativeDriver:
    """``make`` in checked mode (the library's default)."""
    return NativeDriver(num_blocks, block_size, enable_caching, checked=True)


class NativeDriver:
    """vLLM's scheduler calls over one ``NativeAllocator`` (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True, *,
                 checked: bool = False) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be >= 2 with a null block")
        self.alloc = NativeAllocator(num_blocks, block_size, prefix_caching=enable_caching,
                                     checked=checked)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_caching = enable_caching
        self.alloc.add_request(_NULL, [0])
        if self.alloc.allocate(_NULL, 1) != [0]:  # pragma: no cover - queue order
            raise AssertionError("the null block is not block 0")
        self.requests: dict[Hashable, _Sequence] = {}
        self._scheduled: dict[Hashable, None] = {}  # allocated this step, not launched yet
        # covered by this step's launch (a dict as an ordered set: see commit_many)
        self._launched: dict[Hashable, None] = {}
        self._num_running = 0
        # Running requests: their allocator rows, records by row, and their computed
        # positions by row (``_Sequence.computed`` is a stopped request's).
        self._row_of: dict[Hashable, int] = {}
        self._record_of_row: dict[int, Any] = {}
        self._last = _NO_BATCH
        self._computed = np.zeros(self.alloc.R.shape[1], np.int64)
        self._one = np.zeros((3, 1), np.int64)  # one request's row, position and count
        self._advancing = np.empty(64, np.int64)  # check_commits' output (commit_many's)
        self._check_commits = entry(check_commits, MAT, ANY_VEC, ANY_VEC, VEC, I64, VEC)
        self._stats = AdmissionStats()

    # ---- lifecycle -------------------------------------------------------------------------
    def add(self, rid: Any, token_ids: Any = None, cache_salt: str | None = None,
            max_tokens: int = 1 << 30) -> int:
        """A new request (with its ``token_ids``), or the lookup again of a waiting or
        preempted one (``add(rid)``): the prefix hit tokens its admission takes."""
        seq = self.requests.get(rid)
        alloc = self.alloc
        if seq is None:
            if token_ids is None:
                raise KeyError(f"unknown request {rid!r}: add() needs its token_ids")
            with alloc._lock:
                record = alloc._register(rid, token_ids, cache_salt, ())  # checks them
            seq = _Sequence(rid, record.tokens, cache_salt)  # one list: the allocator's
            seq.record = record
            self.requests[rid] = seq
        else:
            if token_ids is not None or cache_salt is not None:
                raise ValueError(f"request {rid!r} exists; re-add it with add(rid) only")
            if seq.status == RequestStatus.RUNNING:
                raise ValueError(f"request {rid!r} is running; preempt() it before re-adding")
        with alloc._lock:
            record = alloc._requests.get(rid)
            if record is None:  # preempted: its checked tokens and their hashes are kept
                record = alloc._register(rid, seq.tokens, seq.salt, (), seq.record)
                seq.tokens, seq.record = record.tokens, record
            seq.pending = alloc._hits(record)
        self._stats.lookups += 1
        return len(seq.pending) * self.block_size

    def allocate(self, rid: Any, num_new_tokens: int) -> list[int] | None:
        """Admit a waiting request (its lookup's hits and ``num_new_tokens`` more, if its whole
        sequence fits), or grow a running one: the new block ids, or None if they do not fit
        (nothing changed)."""
        row = self._row_of.get(rid)
        if row is not None and type(num_new_tokens) is int and 0 < num_new_tokens <= MAX_COUNT:
            one = self._one  # the running pass of one request, without building lists
            one[0, 0], one[2, 0] = row, num_new_tokens
            alloc = self.alloc
            with alloc._lock:
                got = alloc._grow_running(one[0], self._computed, one[2], (rid,))
            if not got:
                return None
            self._scheduled[rid] = None
            self._launched.pop(rid, None)
            return got[0]
        seq = self.requests[rid]
        if seq.status == RequestStatus.RUNNING:
            got = self.allocate_running([rid], [num_new_tokens])
            return got[0] if got else None
        if seq.pending is None:
            raise RuntimeError(f"request {rid!r} is waiting: call add({rid!r}) right before "
                               "allocate()")
        given, seq.pending = seq.pending, None
        n = _count(num_new_tokens, "num_new_tokens")
        alloc, B = self.alloc, self.block_size
        pool = alloc.pool
        hits_tokens = len(given) * B
        target = hits_tokens + n
        if n == 0 and hits_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no "
                             "computed tokens to adopt")
        usable = pool.usable()
        if does_not_fit(B, usable, len(seq.tokens), target, len(given), 0, True, 0):
            return None
        with alloc._lock:
            record = alloc._requests[rid]
            hits = alloc._hits(record)
            if hits != given:
                return None  # the lookup went stale: add(rid) again
            idle = alloc.count_takeable(hits) if hits else 0
            if does_not_fit(B, usable, len(seq.tokens), target, len(given), idle, True, 0):
                return None
            added = alloc._admit(record, target, hits)
        row = record.row
        if row >= len(self._computed):
            self._computed = np.concatenate([self._computed,
                                             np.zeros(alloc.R.shape[1], np.int64)])
        self._row_of[rid] = row  # (the rows remembered name running requests: unchanged)
        self._record_of_row[row] = record
        self._computed[row] = hits_tokens
        self._schedule(rid)
        self._stats.admissions.record(len(seq.tokens), hits_tokens, seq.preemptions > 0)
        seq.status = RequestStatus.RUNNING
        self._num_running += 1
        return added[len(given):]

    def _schedule(self, rid: Hashable) -> None:
        self._scheduled[rid] = None
        self._launched.pop(rid, None)  # positions allocated after the launch need another

    def commit(self, rid: Any, num_computed_tokens: int) -> None:
        row = self._row_of.get(rid)
        if (row is None or type(num_computed_tokens) is not int
                or not 0 <= num_computed_tokens <= MAX_COUNT):
            return self.commit_many([(rid, num_computed_tokens)])
        one, alloc = self._one, self.alloc
        with alloc._lock:
            one[0, 0], one[1, 0] = row, num_computed_tokens
            bad, advances = self._check_commits(alloc.R, one[0], one[1], self._computed, 1,
                                                one[2])
            if bad >= 0:
                self._refuse_commit(rid, num_computed_tokens, row)
            if advances:
                self._launch_for(rid)
            self._computed[row] = num_computed_tokens
        return None

    def append(self, rid: Any, token: int) -> None:
        row = self._row_of.get(rid)
        if row is None:
            return self.append_many([(rid, token)])
        one, alloc = self._one, self.alloc
        with alloc._lock:
            one[0, 0] = row
            alloc.append_token_many([self._record_of_row[row]], [token], one[0])
        return None

    # ---- step-level calls ------------------------------------------------------------------
    def allocate_running(self, rids: Sequence[Any], num_new_tokens: Sequence[int]
                         ) -> list[list[int]]:
        """Grow each running request by its new tokens, in order, stopping at the first that
        does not fit (one native loop): the new block ids of each one grown."""
        rids = list(rids)
        counts = list(num_new_tokens)
        rows = self._running_rows(rids)
        counts_a = int64_vector(counts)
        if (rows is None or counts_a is None or len(counts) != len(rows)
                or not self._distinct(rows)):
            counts_a = np.array(self._refuse_running(rids, counts), np.int64)
            rows = self._running_rows(rids)
        alloc = self.alloc
        with alloc._lock:  # (counts not > 0: refused natively, nothing changed)
            got = alloc._grow_running(self._rows_array(rows), self._computed, counts_a, rids)
        if got:
            grown = rids if len(got) == len(rids) else rids[:len(got)]
            if self._scheduled:
                self._scheduled.update(dict.fromkeys(grown))
            else:  # (the step's running pass, first: the order it grew them in)
                self._scheduled = dict.fromkeys(grown)
            if self._launched:  # (empty until the step's first commit)
                for rid in grown:
                    self._launched.pop(rid, None)
        return got

    def _running_rows(self, rids: list[Any]) -> list[int] | None:
        """The allocator rows of running requests (``rids``: a list of the driver's own), or
        None if one is not running; the last call's rows again for the same requests while
        none started or stopped (a step's calls name the same running batch)."""
        last = self._last
        if rids == last.rids:
            return last.rows
        row_of = self._row_of
        try:
            rows = [row_of[rid] for rid in rids]
        except (KeyError, TypeError):
            return None
        self._last = _Batch(rids, rows, np.array(rows, np.int64),
                            distinct=len(set(rows)) == len(rows))
        return rows

    def _distinct(self, rows: list[int]) -> bool:
        """Whether no row appears twice in ``rows`` (known for ``_running_rows``' own)."""
        last = self._last
        return last.distinct if rows is last.rows else len(set(rows)) == len(rows)

    def _rows_array(self, rows: list[int]) -> np.ndarray:
        """``rows`` as an int64 array (the one kept with them, for ``_running_rows``' own;
        the native loops only read it)."""
        last = self._last
        return last.array if rows is last.rows else np.array(rows, np.int64)

    def _records_of(self, rows: list[int]) -> list[Any]:
        """The allocator records at ``rows`` (kept with them, for ``_running_rows``' own)."""
        last = self._last
        if rows is not last.rows:
            return list(map(self._record_of_row.__getitem__, rows))
        if last.records is None:
            last.records = list(map(self._record_of_row.__getitem__, rows))
        return last.records

    def _refuse_running(self, rids: list[Any], counts: list[Any]) -> list[int]:
        """What the fast path does not take, said: an unknown request (``KeyError``), one not
        running, a count not an int > 0, a request twice, lengths that differ
        (``ValueError`` / ``TypeError``); or the counts as plain ints."""
        for rid in rids:
            if self.requests[rid].status != RequestStatus.RUNNING:
                raise ValueError(f"request {rid!r} is not running (admit it with add() and "
                                 "allocate())")
        if len(counts) != len(rids):
            raise ValueError(f"allocate_running: {len(rids)} requests but {len(counts)} "
                             "token counts")
        out = [_count(n, "num_new_tokens") for n in counts]
        if 0 in out:
            raise ValueError("allocate_running: num_new_tokens must be > 0")
        if max(out, default=0) > MAX_COUNT:
            raise ValueError(f"allocate_running: num_new_tokens must be <= {MAX_COUNT}")
        if len(set(rids)) != len(rids):
            raise ValueError("allocate_running: a request appears twice")
        return out

    def commit_many(self, pairs: Sequence[Any], num_computed_tokens: Sequence[int] | None = None
                    ) -> None:
        """The step ran: each ``(rid, n)`` of ``pairs`` counts ``n`` positions computed (or
        ``commit_many(rids, num_computed_tokens)``, the same as two sequences). The step's
        first commit publishes every request allocated since ``step()`` as one launch and
        completes it (its positions with known token ids are committed: cached if full);
        every pair is checked first (``ValueError``: none is committed)."""
        rids, news = columns(pairs, num_computed_tokens, "commit_many")
        rows = self._running_rows(rids)
        if rows is None:
            for rid in rids:
                if self.requests[rid].status != RequestStatus.RUNNING:
                    raise ValueError(f"request {rid!r} is not running")
        assert rows is not None
        alloc = self.alloc
        with alloc._lock:
            rows_a = self._rows_array(rows)
            news_a = int64_vector(news)
            if news_a is None:  # (a count not an int, or past int64)
                bad = next(i for i, n in enumerate(news) if int64_vector((n,)) is None)
                self._refuse_commit(rids[bad], news[bad], rows[bad])
            n = len(rows)
            if len(self._advancing) < n:
                self._advancing = np.empty(2 * n, np.int64)
            bad, k = self._check_commits(alloc.R, rows_a, news_a, self._computed, n,
                                         self._advancing)
            if bad >= 0:
                self._refuse_commit(rids[bad], news[bad], rows[bad])
            scheduled = self._scheduled
            if (k == n == len(scheduled) and not self._launched
                    and rids == list(scheduled)):  # (the step's launch: these, in order)
                # they are launched: the scheduled dict becomes the launched one, and the
                # launched one (empty: the step's first launch) the scheduled one
                self._scheduled, self._launched = self._launched, scheduled
                alloc._launch_and_commit(rids, rows_a)
            elif k:
                self._launch_covering(rids, k)
            self._computed[rows_a] = news_a

    def _launch_covering(self, rids: list[Any], k: int) -> None:
        """The launches that cover the ``k`` commits past their computed positions (their
        indices in ``_advancing``): the step's launch, run by the first of them if none
        covers it yet (all are in it, usually), then one for each still uncovered."""
        launched = self._launched
        first = rids[self._advancing.item(0)]
        if first not in launched:
            self._launch_for(first)
        ahead = rids if k == len(rids) else [rids[i] for i in self._advancing[:k].tolist()]
        if not launched.keys() >= set(ahead):
            for rid in ahead:
                if rid not in launched:
                    self._launch_for(rid)

    def _launch_for(self, rid: Hashable) -> None:
        """A commit of ``rid`` past its computed positions that no launch of this step
        covers yet runs one: of every request allocated since ``step()`` if it is one of
        them, else of it alone."""
        if rid not in self._launched:
            self._run_launch(launch_batch(rid, self._scheduled, self._launched))

    def _refuse_commit(self, rid: Hashable, n: Any, row: int) -> None:
        R = self.alloc.R
        raise ValueError(f"request {rid!r}: cannot commit {n!r} tokens (computed "
                         f"{int(self._computed[row])}, "
                         f"tokens {int(R[R_KNOWN, row])}, allocated "
                         f"{int(R[R_RESERVED, row])})")

    def _run_launch(self, rids: list[Hashable]) -> None:
        """One launch of ``rids``, completed at once; then each commits what it wrote whose
        token ids were known (the manager's commit at completion)."""
        rows = self._running_rows(rids)  # (a step's launch: the batch its commits name)
        if rows is None:  # pragma: no cover - a launch's requests were allocated, running
            raise AssertionError(f"a launch of requests not running: {rids!r}")
        self.alloc._launch_and_commit(rids, self._rows_array(rows))

    def append_many(self, pairs: Sequence[Any], tokens: Sequence[int] | None = None) -> None:
        """``append(rid, token)`` of each pair (or ``append_many(rids, tokens)``), each
        request once; all or nothing."""
        alloc, requests = self.alloc, self.requests
        rids, tokens = columns(pairs, tokens, "append_many")
        rows = self._running_rows(rids)
        with alloc._lock:
            if rows is not None and self._distinct(rows):
                alloc.append_token_many(self._records_of(rows), tokens,
                                        self._rows_array(rows))
                return
            if len(set(rids)) != len(rids):
                raise ValueError("append_many: a request appears twice")
            tokens = [_as_token(t) for t in tokens]
            held = alloc._requests
            alloc.append_token_many([held[rid] for rid in rids if rid in held],
                                    [t for rid, t in zip(rids, tokens, strict=True)
                                     if rid in held])
            for rid, t in zip(rids, tokens, strict=True):
                if rid not in held:  # (no table: the allocator learns them at add)
                    requests[rid].tokens.append(t)

    def preempt(self, rid: Any) -> None:
        seq = self.requests[rid]
        if seq.status != RequestStatus.RUNNING:
            raise ValueError(f"request {rid!r} is not running")
        self._stop(rid)
        self.alloc.free(rid)
        seq.status = RequestStatus.PREEMPTED
        seq.computed = 0
        seq.preemptions += 1
        self._scheduled.pop(rid, None)
        self._launched.pop(rid, None)
        self._num_running -= 1

    def free(self, rid: Any) -> None:
        seq = self.requests.pop(rid)
        self._scheduled.pop(rid, None)
        self._launched.pop(rid, None)
        if seq.status == RequestStatus.RUNNING:
            self._num_running -= 1
            seq.computed = self._stop(rid)
        seq.status = RequestStatus.FINISHED_LENGTH_CAPPED
        if rid in self.alloc._requests:
            self.alloc.free(rid)

    def _stop(self, rid: Hashable) -> int:
        """A running request stops running: its computed positions."""
        row = self._row_of.pop(rid)
        self._last = _NO_BATCH
        del self._record_of_row[row]
        return int(self._computed[row])

    def step(self) -> None:
        self._scheduled.clear()
        self._launched.clear()

    # ---- observation -----------------------------------------------------------------------
    def block_ids(self, rid: Any) -> list[int]:
        return self.alloc.block_table(rid) if rid in self.alloc._requests else []

    def table_len(self, rid: Any) -> int:
        return len(self.block_ids(rid))

    def num_tokens(self, rid: Any) -> int:
        return len(self.requests[rid].tokens)

    def num_computed(self, rid: Any) -> int:
        row = self._row_of.get(rid)
        return self.requests[rid].computed if row is None else int(self._computed[row])

    def status(self, rid: Any) -> str:
        return self.requests[rid].status.name

    def _held(self) -> int:
        count = self.alloc.pool.view.count
        return int(count[ALLOCATED] + count[PUBLISHED] + count[REFERENCED]) - 1

    def usage(self) -> float:
        return self._held() / (self.num_blocks - 1)

    def num_free(self) -> int:
        """Usable blocks no request holds (vLLM's free-queue length)."""
        return self.num_blocks - 1 - self._held()

    def num_evictable(self) -> int:
        """Zero-ref cached blocks."""
        from pagedkv.spec import CACHED

        return int(self.alloc.pool.view.count[CACHED])

    def prefix_stats(self) -> dict:
        s = self._stats.snapshot()
        cached = len(self.alloc.pool._hslot)
        s["cached_blocks"] = s["hash_entries"] = cached
        s["evictable_cached_blocks"] = self.num_evictable()
        return s


@numba.njit(cache=True)
def check_commits(R: np.ndarray, rows: np.ndarray, news: np.ndarray, computed: np.ndarray,
                  n: int, advancing: np.ndarray) -> tuple[int, int]:
    """The first pair that may not commit (computed <= new <= min(tokens, allocated)), or -1;
    and how many pairs commit past their computed positions (their indices into
    ``advancing``: each needs a launch of this step to cover it)."""
    k = 0
    for i in range(n):
        r = rows[i]
        if not computed[r] <= news[i] <= min(R[R_KNOWN, r], R[R_RESERVED, r]):
            return i, k
        if news[i] > computed[r]:
            advancing[k] = i
            k += 1
    return -1, k


__all__ = ["NativeDriver", "make", "make_checked"]
