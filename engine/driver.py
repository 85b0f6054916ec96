"""A scheduler-call driver over ``pagedkv.engine.KVCacheManager``.

It has the calls of the vLLM anchor's driver (``shared/anchors/vllm_kvcache/vllm_kv.py``:
``step``, ``add``, ``allocate``, ``commit``, ``append``, ``preempt``, ``free`` and the
observation calls), so the anchor's ``traces.simulate`` / ``bench_step.py --driver
pagedkv.engine.driver:make`` run the same continuous-batching loop on pagedkv. Each call does
what vLLM 0.33.0's Scheduler does with its KVCacheManager, on pagedkv's manager:

- ``add``: an ``EngineRequest`` (new id) and ``get_computed_blocks`` (every admission
  attempt; a failed admission needs a new ``add(rid)``);
- ``allocate``: ``allocate_slots`` (admission: with the lookup's blocks,
  ``full_sequence_must_fit=True``, ``has_scheduled_reqs``; then RUNNING, computed = hits,
  ``record_prefix_cache_stats``);
- ``commit(rid, n)``: the step ran. The driver models a step as one launch, as an engine's
  model runner does: the step's first ``commit`` publishes every request allocated since
  ``step()`` (and not preempted or freed since) in one ``publish(requests)`` and completes it
  (``complete(launch)``: that is when the full blocks written become prefix hits); each
  commit then sets ``num_computed_tokens = n``. A commit of a request that no launch of this
  step covers publishes it alone;
- ``append`` / ``preempt`` / ``free``: ``append_token`` / ``preempt`` / ``free``.

A scheduler that batches its step (``benchmarks/batched_loop.py``) uses the step-level calls
instead: ``allocate_running(rids, counts)`` (``allocate_slots_many``: in order, stopping at the
first that does not fit), ``commit_many(pairs)`` and ``append_many(pairs)``
(``append_token_many``), each its single call repeated, checked before anything changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .manager import KVCacheBlocks, KVCacheManager, PrefixCacheStats
from .request import EngineRequest, RequestStatus


def make(num_blocks: int, block_size: int, enable_caching: bool = True, *,
         max_num_batched_tokens: int = 8192, checked: bool = False,
         **manager_kwargs: Any) -> PagedKVDriver:
    """A driver over a fresh ``KVCacheManager`` (``num_blocks`` includes the null block, as
    in the vLLM driver). ``max_num_batched_tokens`` is accepted for the anchor's factory
    signature and unused."""
    return PagedKVDriver(num_blocks, block_size, enable_caching, checked=checked,
                         **manager_kwargs)


def make_checked(num_blocks: int, block_size: int, enable_caching: bool = True, *,
                 max_num_batched_tokens: int = 8192, **manager_kwargs: Any) -> PagedKVDriver:
    """``make`` with the allocator in checked mode (the library's default)."""
    return PagedKVDriver(num_blocks, block_size, enable_caching, checked=True, **manager_kwargs)


class AdmissionStats:
    """A driver's prefix-cache counts: its lookups, and its admissions as vLLM's
    ``PrefixCacheStats`` counts them (preempted re-admissions apart)."""

    def __init__(self) -> None:
        self.lookups = 0
        self.admissions = PrefixCacheStats()

    def snapshot(self) -> dict[str, Any]:
        """The counts by name, and the hit rate of the (first) admissions."""
        s: dict[str, Any] = {"lookups": self.lookups, **{
            k: v for k, v in dataclasses.asdict(self.admissions).items() if k != "reset"}}
        s["hit_rate"] = s["hits"] / s["queries"] if s["queries"] else 0.0
        return s


def columns(pairs: Sequence[Any], values: Sequence[Any] | None, call: str
             ) -> tuple[list[Any], Sequence[Any]]:
    """A step-level call's requests and their values: ``pairs`` of ``(rid, value)``, or
    (``values`` given) the requests ``pairs`` and ``values`` as they are, of one length
    (``ValueError``); the requests as a list of their own."""
    if values is None:
        return [rid for rid, _ in pairs], [v for _, v in pairs]
    if len(values) != len(pairs):
        raise ValueError(f"{call}: {len(pairs)} requests but {len(values)} values")
    return list(pairs), values


def launch_batch(rid: Any, scheduled: dict[Any, Any], launched: set[Any] | dict[Any, Any]
                 ) -> list[Any]:
    """The requests the launch that a commit of ``rid`` runs covers (a driver models a step
    as one launch): every request allocated since ``step()`` and not launched yet
    (``scheduled``, in order), if ``rid`` is one of them (they move to ``launched``), else
    ``rid`` alone. Called only when ``rid`` commits new positions no launch of this step
    covers."""
    if rid not in scheduled:
        return [rid]
    batch = list(scheduled)
    launched.update(scheduled)
    scheduled.clear()
    return batch


class PagedKVDriver:
    """One request table per id over pagedkv's KVCacheManager (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True, *,
                 checked: bool = False, **manager_kwargs: Any) -> None:
        self.manager = KVCacheManager(num_blocks, block_size, enable_caching, checked,
                                      **manager_kwargs)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.requests: dict[Any, EngineRequest] = {}
        self._pending: dict[Any, tuple[KVCacheBlocks, int]] = {}
        self._num_running = 0
        self._scheduled: dict[Any, EngineRequest] = {}  # allocated this step, not launched yet
        self._launched: set[Any] = set()  # covered by this step's launch
        self._stats = AdmissionStats()

    # -- lifecycle -------------------------------------------------------------------------
    def add(self, rid: Any, token_ids: Any = None, cache_salt: str | None = None,
            max_tokens: int = 1 << 30) -> int:
        req = self.requests.get(rid)
        if req is None:
            if token_ids is None:
                raise KeyError(f"unknown request {rid!r}: add() needs its token_ids")
            req = EngineRequest(rid, list(token_ids), cache_salt=cache_salt)
            self.requests[rid] = req
        else:
            if token_ids is not None or cache_salt is not None:
                raise ValueError(f"request {rid!r} exists; re-add it with add(rid) only")
            if req.status == RequestStatus.RUNNING:
                raise ValueError(f"request {rid!r} is running; preempt() it before re-adding")
        blocks, hits, _ = self.manager.get_computed_blocks(req)
        self._pending[rid] = (blocks, hits)
        self._stats.lookups += 1
        return hits

    def allocate(self, rid: Any, num_new_tokens: int, num_lookahead_tokens: int = 0, *,
                 full_sequence_must_fit: bool = True,
                 has_scheduled_reqs: bool | None = None) -> list[int] | None:
        req = self.requests[rid]
        m = self.manager
        if req.status == RequestStatus.RUNNING:
            new = m.allocate_slots(req, num_new_tokens, num_lookahead_tokens=num_lookahead_tokens)
            if new is None:
                return None
            self._schedule(rid, req)
            return list(new.block_ids)
        pending = self._pending.pop(rid, None)
        if pending is None:
            raise RuntimeError(f"request {rid!r} is waiting: call add({rid!r}) right before "
                               "allocate()")
        blocks, hits = pending
        if has_scheduled_reqs is None:
            has_scheduled_reqs = self._num_running > 0
        new = m.allocate_slots(req, num_new_tokens, num_new_computed_tokens=hits,
                               new_computed_blocks=blocks,
                               num_lookahead_tokens=num_lookahead_tokens,
                               full_sequence_must_fit=full_sequence_must_fit,
                               has_scheduled_reqs=has_scheduled_reqs)
        if new is None:
            return None
        self._schedule(rid, req)
        m.record_prefix_cache_stats(req, hits)
        self._stats.admissions.record(req.num_tokens, hits, req.num_preemptions > 0)
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = hits
        self._num_running += 1
        return list(new.block_ids)

    def _schedule(self, rid: Any, req: EngineRequest) -> None:
        self._scheduled[rid] = req
        self._launched.discard(rid)  # positions allocated after the launch need another

    def commit(self, rid: Any, num_computed_tokens: int, *, cache: bool = False) -> None:
        req = self._committable(rid, num_computed_tokens)
        self._commit(rid, req, num_computed_tokens, cache)

    def _committable(self, rid: Any, num_computed_tokens: int) -> EngineRequest:
        """The running request ``rid`` if it may commit ``num_computed_tokens`` positions
        (from its computed ones up to its tokens and allocated positions); ``ValueError``."""
        req = self.requests[rid]
        if req.status != RequestStatus.RUNNING:
            raise ValueError(f"request {rid!r} is not running")
        # The manager's record of the request (its allocator record): read without a call, as
        # the scheduler's thread is the one that grows it.
        entry = self.manager._live.get(rid)
        reserved = entry.record.reserved if entry is not None else 0
        if not (req.num_computed_tokens <= num_computed_tokens <= min(req.num_tokens, reserved)):
            raise ValueError(f"request {rid!r}: cannot commit {num_computed_tokens} tokens "
                             f"(computed {req.num_computed_tokens}, tokens {req.num_tokens}, "
                             f"allocated {reserved})")
        return req

    def _commit(self, rid: Any, req: EngineRequest, num_computed_tokens: int,
                cache: bool) -> None:
        m = self.manager
        if num_computed_tokens > req.num_computed_tokens and rid not in self._launched:
            requests = self.requests
            m.complete(m.publish([requests[r] for r in launch_batch(rid, self._scheduled,
                                                                    self._launched)]))
        req.num_computed_tokens = num_computed_tokens
        if cache:
            m.cache_blocks(req, num_computed_tokens)

    def append(self, rid: Any, token: int) -> None:
        self.manager.append_token(self.requests[rid], token)

    # -- step-level calls: a scheduler that batches its step ------------------------------
    def allocate_running(self, rids: Sequence[Any], num_new_tokens: Sequence[int],
                         num_lookahead_tokens: int = 0) -> list[list[int]]:
        """``allocate(rid, n, num_lookahead_tokens)`` of each running request and its ``n``
        new tokens, in order, stopping at the first one that does not fit
        (``KVCacheManager.allocate_slots_many``):
        the new block ids of each one allocated. A shorter list than ``rids`` means
        ``rids[len(result)]`` did not fit; it and those after it are unchanged."""
        requests = self.requests
        reqs = [requests[rid] for rid in rids]
        for req in reqs:
            if req.status != RequestStatus.RUNNING:
                raise ValueError(f"request {req.request_id!r} is not running (admit it with "
                                 "add() and allocate())")
        got = self.manager.allocate_slots_many(reqs, num_new_tokens,
                                               num_lookahead_tokens=num_lookahead_tokens)
        scheduled, launched = self._scheduled, self._launched
        for req in reqs[:len(got)]:
            rid = req.request_id
            scheduled[rid] = req
            launched.discard(rid)  # positions allocated after the launch need another
        return [list(blocks.block_ids) for blocks in got]

    def commit_many(self, pairs: Sequence[Any], num_computed_tokens: Sequence[int] | None = None
                    ) -> None:
        """``commit(rid, n)`` of each ``(rid, n)`` of ``pairs`` (or ``commit_many(rids,
        num_computed_tokens)``), in order; every pair is checked first, so a bad one
        (``ValueError``) commits none."""
        rids, news = columns(pairs, num_computed_tokens, "commit_many")
        checked = [(rid, self._committable(rid, n), n) for rid, n in zip(rids, news, strict=True)]
        commit = self._commit
        for rid, req, n in checked:
            commit(rid, req, n, False)

    def append_many(self, pairs: Sequence[Any], tokens: Sequence[int] | None = None) -> None:
        """``append(rid, token)`` of each pair (or ``append_many(rids, tokens)``), in order,
        each request once; all or nothing (``KVCacheManager.append_token_many``)."""
        rids, tokens = columns(pairs, tokens, "append_many")
        requests = self.requests
        self.manager.append_token_many([requests[rid] for rid in rids], list(tokens))

    def preempt(self, rid: Any) -> None:
        req = self.requests[rid]
        if req.status != RequestStatus.RUNNING:
            raise ValueError(f"request {rid!r} is not running")
        self.manager.preempt(req)
        self._scheduled.pop(rid, None)
        self._launched.discard(rid)
        self._num_running -= 1

    def free(self, rid: Any) -> None:
        req = self.requests.pop(rid)
        self._pending.pop(rid, None)
        self._scheduled.pop(rid, None)
        self._launched.discard(rid)
        if req.status == RequestStatus.RUNNING:
            self._num_running -= 1
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        self.manager.free(req)

    def step(self) -> None:
        self._scheduled.clear()
        self._launched.clear()
        self.manager.new_step_starts()

    # -- observation -----------------------------------------------------------------------
    def block_ids(self, rid: Any) -> list[int]:
        return self.manager.get_block_ids(rid)[0]

    def table_len(self, rid: Any) -> int:
        return len(self.manager.get_block_ids(rid)[0])

    def num_tokens(self, rid: Any) -> int:
        return self.requests[rid].num_tokens

    def num_computed(self, rid: Any) -> int:
        return self.requests[rid].num_computed_tokens

    def status(self, rid: Any) -> str:
        return self.requests[rid].status.name

    def usage(self) -> float:
        return self.manager.usage

    def num_free(self) -> int:
        """Usable blocks no request holds (vLLM's free-queue length)."""
        return self.manager.get_num_free_blocks()

    def num_evictable(self) -> int:
        """Zero-ref cached blocks (vLLM: free-queue blocks that still hold a hash)."""
        return self.manager.stats()["cached"]

    def prefix_stats(self) -> dict:
        s = self._stats.snapshot()
        st = self.manager.stats()
        s["cached_blocks"] = len(self.manager.allocator.pool.hmap)
        s["evictable_cached_blocks"] = st["cached"]
        s["hash_entries"] = len(self.manager.allocator.pool.hmap)
        return s


__all__ = ["PagedKVDriver", "make", "make_checked"]
