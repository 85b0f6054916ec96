"""Swap a request's KV to the host tier and back, over a ``KVCacheManager`` (composition).

``Swapper(manager, device_pool, host_pool)``: two ``pagedkv.kernels.KVCachePool``s of the same
layers and block shape, the device one with the manager's blocks (one block id names the same
slots in every layer), the host one in host memory (``device_pool.like(n)``: page-locked where
CUDA is present). Copies are ``KVCachePool.transfer_blocks`` (every layer, K and V, in one
indexed copy). The host tier's bookkeeping is a ``HostPool`` (``allocator.host``), so every
host-side step runs the host spec's guards and effects.

- ``swap_out(request)`` stores the request's computed blocks under private swap keys
  (negative ints: disjoint from prefix hashes) and starts the device -> host copies. The
  device blocks stay with the request, pinned as read by the stores, until
  ``complete(transfer)``: only then does the manager free them (deferred free). A failed
  copy (``complete(transfer, success=False)``) frees the host blocks and leaves the request
  running on its device blocks.
- ``swap_in(request)`` re-admits it: device blocks from the manager (prefix hits included),
  host -> device copies into the ones that are not hits; ``complete`` unpins and drops the
  host copies and gives the request back its computed tokens. ``forget(request)`` gives a
  swap-out up (its host copies were evicted): the request is recomputed instead.

Both are atomic: not enough host blocks, not enough device blocks, or host KV missing raise a
typed error and change nothing. The copies are issued on the current stream (synchronous on
the CPU); completion is the explicit ``complete`` call, made once they are done.

- ``offload(request)`` copies its full computed blocks to the host under their prefix hashes
  (the request keeps running); ``admit(request)`` admits a waiting request with its cached
  prefix, loading the blocks after its device prefix hits that the host holds instead of
  recomputing them.

Limits (the manager is used through its public API only): a swapped-out request's host
blocks are STORED, so host LRU eviction under offload pressure may reclaim them; ``swap_in``
then refuses (``SwapError``, nothing changed) and the request must be recomputed.

A store (swap-out, offload) is bracketed by the manager's ``begin_transfer`` /
``end_transfer``: while it is in flight the manager refuses to publish the request
(``TransferInFlight``) and defers its free, so neither ``Swapper.free`` nor ``manager.free``
hands the blocks out under a copy. A load (swap-in, admit) is a launch of the manager
(``publish``) that writes the loaded positions: its blocks are pinned like any write's, a free
meanwhile waits for it, later launches write only the positions after them, and ``complete``
completes it, so the full loaded blocks enter the device prefix cache then, like computed
ones, and ``num_computed_tokens`` counts them.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from dataclasses import dataclass, field

from pagedkv.allocator.errors import AllocatorError, InvalidArgument, OutOfBlocks
from pagedkv.allocator.host import HostPool
from pagedkv.allocator.launch import Launch
from pagedkv.kernels.pool import KVCachePool

from .manager import KVCacheManager
from .request import EngineRequest, RequestStatus


class SwapError(AllocatorError):
    """A swap call that does not fit the request's state (not running, not swapped out,
    a transfer already in flight)."""


@dataclass
class Transfer:
    """One transfer in flight; ``complete`` it once its copies are done."""

    kind: str  # "out" / "in" (swap), "store" (offload), "load" (admit)
    request: EngineRequest
    host_blocks: list[int]
    device_blocks: list[int]
    num_tokens: int
    launch: Launch | None = None  # a load's launch: it writes the loaded positions
    done: bool = field(default=False)


@dataclass
class _Swapped:
    keys: list[int]
    host_blocks: list[int]
    num_tokens: int


class Swapper:
    """The host tier behind a ``KVCacheManager``: swap, offload and host prefix hits (see the
    module doc). One transfer per request at a time."""

    def __init__(self, manager: KVCacheManager, device_pool: KVCachePool,
                 host_pool: KVCachePool, checked: bool = True) -> None:
        if not isinstance(device_pool, KVCachePool) or not isinstance(host_pool, KVCachePool):
            raise InvalidArgument("device_pool and host_pool must be KVCachePools")
        if (device_pool.num_layers, device_pool.block_shape, device_pool.dtype) != (
                host_pool.num_layers, host_pool.block_shape, host_pool.dtype):
            raise InvalidArgument("device and host pools must share layers, block shape and "
                                  "dtype")
        if (device_pool.num_blocks, device_pool.block_size) != (manager.num_blocks,
                                                                manager.block_size):
            raise InvalidArgument("the device pool must have the manager's num_blocks and "
                                  "block_size")
        self.manager = manager
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.host = HostPool(host_pool.num_blocks, checked=checked)
        self._keys = itertools.count(1)
        self._swapped: dict[Hashable, _Swapped] = {}
        self._inflight: dict[Hashable, Transfer] = {}
        self._free_after: set[Hashable] = set()  # finished while a transfer was in flight

    def _store(self, device_blocks: list[int], host_blocks: list[int]) -> None:
        self.device_pool.transfer_blocks(self.host_pool, device_blocks, host_blocks)

    def _load(self, host_blocks: list[int], device_blocks: list[int]) -> None:
        self.host_pool.transfer_blocks(self.device_pool, host_blocks, device_blocks)

    def _idle(self, request: EngineRequest) -> Hashable:
        rid = request.request_id
        if rid in self._inflight:
            raise SwapError(f"{request!r} has a swap in flight: complete it first")
        return rid

    def swap_out(self, request: EngineRequest) -> Transfer:
        """Start copying the request's computed blocks to the host (see module doc)."""
        rid = self._idle(request)
        table = self.manager.get_block_ids(rid)[0]
        if not table:
            raise SwapError(f"{request!r} holds no device blocks")
        n = request.num_computed_tokens
        B = self.manager.block_size
        dev = table[: -(-n // B)]
        if not dev:
            raise SwapError(f"{request!r} has no computed tokens to swap out")
        keys = [-next(self._keys) for _ in dev]
        host_blocks = self.host.prepare_store(keys, dev)  # atomic: OutOfBlocks, DevicePinned
        hb = [b for b in host_blocks if b is not None]
        self._store(dev, hb)
        self.manager.begin_transfer(request)
        self._swapped[rid] = _Swapped(keys, hb, n)
        t = self._inflight[rid] = Transfer("out", request, hb, dev, n)
        return t

    def swap_in(self, request: EngineRequest) -> Transfer:
        """Re-admit a swapped-out request and start its host -> device copies."""
        rid = self._idle(request)
        rec = self._swapped.get(rid)
        if rec is None:
            raise SwapError(f"{request!r} is not swapped out")
        missing = [k for k in rec.keys if self.host.lookup(k) is None]
        if missing:  # e.g. the swap-out was not completed; nothing changed
            raise SwapError(f"{request!r}: {len(missing)} swapped blocks are not on the host")
        m = self.manager
        hits, hit_tokens, _ = m.get_computed_blocks(request)  # device prefix hits: no copy
        nh = len(hits.block_ids)
        new = m.allocate_slots(request, max(rec.num_tokens - hit_tokens, 0), hit_tokens,
                               hits if nh else None)
        if new is None:
            raise OutOfBlocks(max(len(rec.keys) - nh, 0), m.get_num_free_blocks())
        dev = m.get_block_ids(rid)[0][nh: len(rec.keys)]
        hb, launch = self._load_as_launch(request, rec.keys[nh:], dev)
        t = self._inflight[rid] = Transfer("in", request, hb, dev,
                                           max(rec.num_tokens, hit_tokens), launch)
        return t

    def _load_as_launch(self, request: EngineRequest, keys: list[int], dev: list[int]
                        ) -> tuple[list[int], Launch | None]:
        """Pin the host blocks of ``keys`` and copy them into ``dev``, the blocks of the
        request's positions allocated since its hits: one launch of the manager writes those
        positions, so the blocks are pinned by it like by any write, later launches write only
        what follows, and the full ones are cached once it completes (``complete``)."""
        if not dev:
            return [], None
        hb = self.host.prepare_load(keys)  # every key was looked up: a hit
        launch = self.manager.publish([request])
        self._load(hb, dev)
        return hb, launch

    def complete(self, transfer: Transfer, success: bool = True) -> None:
        """The transfer's copies are done (or, for a store, failed). The manager's
        ``end_transfer`` runs first: a free asked for meanwhile happens then."""
        rid, req = transfer.request.request_id, transfer.request
        if transfer.done or self._inflight.get(rid) is not transfer:
            raise SwapError("this transfer is not in flight")
        if transfer.kind in ("load", "in") and not success:
            raise InvalidArgument("a load cannot fail here; complete it")
        if transfer.kind in ("store", "out"):
            self.host.complete_store(transfer.host_blocks, success)
        else:
            self.host.complete_load(transfer.host_blocks)
        transfer.done = True
        del self._inflight[rid]
        finished = rid in self._free_after
        self._free_after.discard(rid)
        if transfer.launch is not None:
            self.manager.complete(transfer.launch)
        if transfer.kind in ("store", "out"):
            self.manager.end_transfer(req)
        if transfer.kind == "out":
            if not success:
                del self._swapped[rid]  # the request keeps running on its device blocks
            elif not finished:  # the stores no longer read the device blocks: free them
                self.manager.preempt(req)
        elif transfer.kind == "in":
            self.host.discard(self._swapped.pop(rid).host_blocks)
        if transfer.kind in ("load", "in") and not finished:
            req.num_computed_tokens = transfer.num_tokens
            if transfer.kind == "in":
                req.status = RequestStatus.RUNNING
        if finished:
            self.free(req)

    def free(self, request: EngineRequest) -> None:
        """The request finished: free its device blocks (``manager.free``) and drop its swap
        copies on the host. While one of its transfers is in flight the manager keeps the
        device blocks with it (a copy still reads or writes them) and frees them at
        ``complete`` (deferred free); the host copies go then too."""
        rid = request.request_id
        if rid in self._inflight:
            self._free_after.add(rid)
            self.manager.free(request)  # deferred by the manager until end_transfer
            return
        rec = self._swapped.pop(rid, None)
        if rec is not None:
            self._drop_copies(rec)
        self.manager.free(request)

    def forget(self, request: EngineRequest) -> None:
        """Give up a swap-out (``swap_in`` refused: the host tier evicted some of its blocks):
        the host copies left are dropped, and the request is admitted again like any preempted
        one, by recompute (``get_computed_blocks``, ``allocate_slots``)."""
        rid = self._idle(request)
        rec = self._swapped.pop(rid, None)
        if rec is None:
            raise SwapError(f"{request!r} is not swapped out")
        self._drop_copies(rec)

    def _drop_copies(self, rec: _Swapped) -> None:
        """Discard a swap-out's host copies (host LRU eviction may have dropped some)."""
        self.host.discard([b for k, b in zip(rec.keys, rec.host_blocks, strict=True)
                           if self.host.lookup(k) == b])

    # --- offload: full prefix blocks stay hits on the host ---------------------------------
    def offload(self, request: EngineRequest) -> Transfer:
        """Start copying the request's full computed blocks to the host under their prefix
        hashes (those already there are skipped). The request keeps running; its device
        blocks are pinned as read by the stores until ``complete``."""
        rid = self._idle(request)
        table = self.manager.get_block_ids(rid)[0]
        full = min(len(request.block_hashes), request.num_computed_tokens // self.manager.
                   block_size, len(table))
        hashes, dev = list(request.block_hashes[:full]), table[:full]
        out = self.host.prepare_store(hashes, dev)  # atomic: OutOfBlocks, DevicePinned
        pairs = [(d, h) for d, h in zip(dev, out, strict=True) if h is not None]
        self._store([d for d, _ in pairs], [h for _, h in pairs])
        self.manager.begin_transfer(request)
        t = self._inflight[rid] = Transfer("store", request, [h for _, h in pairs],
                                           [d for d, _ in pairs], request.num_computed_tokens)
        return t

    def admit(self, request: EngineRequest) -> Transfer:
        """Admit a waiting request with its cached prefix: its device prefix hits, then the
        following full blocks found on the host, loaded (by a launch of the manager) instead
        of recomputed. Only those positions are allocated; ``complete`` sets
        ``num_computed_tokens`` to them, and the engine then allocates the rest with
        ``allocate_slots``. Nothing cached on either tier: ``SwapError``, nothing changed."""
        rid = self._idle(request)
        m, B = self.manager, self.manager.block_size
        hits, hit_tokens, _ = m.get_computed_blocks(request)  # also hashes the request
        nh = len(hits.block_ids)
        on_host = m.spec.leading_hits(request.block_hashes, request.num_tokens, B,
                                      self.host.lookup, start=nh)
        found = list(request.block_hashes[nh:nh + len(on_host)])
        loaded = nh * B + len(found) * B
        if loaded == 0:
            raise SwapError(f"{request!r}: no prefix block on the device or the host (admit "
                            "it with allocate_slots)")
        new = m.allocate_slots(request, loaded - hit_tokens, hit_tokens, hits if nh else None)
        if new is None:
            raise OutOfBlocks(len(found), m.get_num_free_blocks())
        dev = m.get_block_ids(rid)[0][nh: nh + len(found)]
        hb, launch = self._load_as_launch(request, found, dev)
        t = self._inflight[rid] = Transfer("load", request, hb, dev, loaded, launch)
        return t

    def is_swapped_out(self, request: EngineRequest) -> bool:
        rid = request.request_id
        return rid in self._swapped and rid not in self._inflight
