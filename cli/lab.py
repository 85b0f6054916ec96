"""``pagedkv lab``: the prefix cache's hit/miss behaviour on the real BlockPool.

A pool of ``C`` blocks (``BlockPool(C, block_size)``, checked mode, the allocator's own class
and eviction queue), ``N = min(4096, 16 + floor(2 t))`` requests; request ``i`` wants the
reusable identity ``i mod s``, committed under the hash ``identity + 1`` (hash 0 is
"no hash"). One holder makes the requests, one at a time:

- hit: a zero-ref CACHED block holds that identity (``pool.lookup``): ``share`` revives it,
  ``release`` caches it again at the tail of the queue (most recently used);
- miss: ``pool.take`` allocates the queue's head (FREE blocks first, then the least recently
  released CACHED block, which is evicted), then ``publish``, ``begin_write`` of all
  ``block_size`` slots, ``end_write``, ``commit`` under the identity's hash and ``release``.

The lab is a pure function of ``(C, s, t)`` (and the block size, which changes nothing but
the writes): every run starts from an empty pool, so changing ``C`` or ``s`` starts over and
``t`` only says how many requests are replayed from the start.

What it does not model: token positions, request tables, device addresses, launches (none
is ever in flight, so a released block is reusable at once) or completion events; every write
completes before the next request.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import CliError

MAX_REQUESTS = 4096
HOLDER = "lab"


def requests_for_time(t: float) -> int:
    """N = min(4096, 16 + floor(2 t))."""
    return min(MAX_REQUESTS, 16 + math.floor(2 * t))


@dataclass(frozen=True)
class LabStep:
    request: int
    identity: int
    hit: bool
    block: int
    evicted: int | None  # the identity evicted to make room, if any
    blocks: list[int | None]  # identity per block id (None: FREE, no identity)
    queue: list[int]  # the eviction queue, head (taken next) first
    lru: list[int]  # identities of the CACHED blocks, least recently used first


@dataclass
class LabResult:
    capacity: int
    stride: int
    time: float
    block_size: int
    requests: int
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    steps: list[LabStep] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    def to_dict(self, with_steps: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["hit_rate"] = self.hit_rate
        if not with_steps:
            d.pop("steps")
        return d


def _check(capacity: int, stride: int, t: float, block_size: int) -> None:
    if capacity < 1:
        raise CliError(f"--capacity must be >= 1 block, got {capacity}")
    if stride < 1:
        raise CliError(f"--stride must be >= 1, got {stride}")
    if not math.isfinite(t) or t < 0:
        raise CliError(f"--time must be a finite number >= 0, got {t}")
    if block_size < 1:
        raise CliError(f"--block-size must be >= 1, got {block_size}")


def run_lab(capacity: int, stride: int, t: float = 0.0, block_size: int = 16,
            record: bool = False, progress: Callable[[int], Any] | None = None) -> LabResult:
    """Replay the ``N(t)`` requests on a fresh ``BlockPool(capacity, block_size)``."""
    _check(capacity, stride, t, block_size)
    from pagedkv.allocator.pool import BlockPool
    from pagedkv.spec import CACHED, NO_HASH

    pool = BlockPool(capacity, block_size)
    pool.open_holder(HOLDER)
    result = LabResult(capacity, stride, float(t), block_size, requests_for_time(t))
    for i in range(result.requests):
        identity = i % stride
        h = identity + 1
        b = pool.lookup(h)
        evicted = None
        if b is not None and pool.state[b] == CACHED:
            pool.share(b, HOLDER)  # revive: CACHED -> REFERENCED
            pool.release(b, HOLDER)  # back to CACHED, at the tail of the queue
            result.hits += 1
            hit = True
        else:
            before = set(pool.hmap)
            b = pool.take(HOLDER)  # FREE head, or evict the least recently released
            gone = before - set(pool.hmap)
            if gone:
                result.evictions += len(gone)
                evicted = min(gone) - 1
            pool.publish(b, HOLDER)
            pool.begin_write(b, HOLDER, block_size)
            pool.end_write(b)
            pool.commit(b, HOLDER, h)
            pool.release(b, HOLDER)
            result.misses += 1
            hit = False
        if record:
            blocks = [None if pool.hash[x] == NO_HASH else pool.hash[x] - 1
                      for x in range(capacity)]
            queue = pool.queue.order()
            lru = [blocks[x] for x in queue if pool.state[x] == CACHED]
            result.steps.append(LabStep(i, identity, hit, b, evicted, blocks, queue, lru))
        if progress is not None:
            progress(1)
    return result


def render_step(s: LabStep) -> str:
    blocks = " ".join(f"{b}:{'-' if ident is None else ident}"
                      for b, ident in enumerate(s.blocks))
    what = "hit " if s.hit else "miss"
    ev = f", evicted id {s.evicted}" if s.evicted is not None else ""
    lru = " ".join(str(x) for x in s.lru)
    return (f"#{s.request:<5} id {s.identity:<4} {what} block {s.block}{ev}\n"
            f"        blocks (block:id) [{blocks}]  LRU ids, least recent first [{lru}]  "
            f"queue head first {s.queue}")


def render_summary(r: LabResult) -> str:
    return (f"lab: capacity {r.capacity} blocks, stride {r.stride}, time {r.time:g} -> "
            f"{r.requests} requests: {r.hits} hits, {r.misses} misses "
            f"(hit rate {r.hit_rate:.1%}), {r.evictions} evictions")
