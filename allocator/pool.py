"""BlockPool: the block-level runtime. Each public method is one spec transition.

Guards are the spec's own functions (``spec.TRANSITIONS[name].guard``), evaluated on a
read-only view of the pool's arrays, so a refused call raises a typed error and changes
nothing. In checked mode each transition's real effect is compared with the spec's predicted
effect on the touched blocks, and the block-scoped invariants are re-evaluated there: O(1) per
touched block, never a pool scan.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from pagedkv.spec import (
    ALL_STATES,
    ALLOCATED,
    CACHED,
    CONCRETE,
    FREE,
    INVARIANTS,
    NO_BLOCK,
    NO_HASH,
    PUBLISHED,
    RECLAIMED,
    REFERENCED,
    TRANSITIONS,
    Arr,
    Overlay,
    PoolState,
    state_name,
)

from .errors import (
    DoubleFree,
    GuardViolation,
    InvalidArgument,
    InvariantViolation,
    PendingAccess,
    PublishError,
)
from .lru import BlockQueue
from .table import check_block_size, check_count

_GUARD_ERRORS: dict[str, type[GuardViolation]] = {
    "release": DoubleFree,
    "recycle": PendingAccess,
    "allocate": PendingAccess,
    "publish": PublishError,
    "begin_access": PublishError,
}
_BLOCK_INVARIANTS = [inv for inv in INVARIANTS.values() if inv.scope == "block"]
_HASH_INVARIANTS = [inv for inv in INVARIANTS.values() if inv.scope == "hash"]


class _DefaultMap:
    """Read-only ``m[k]`` over a dict with a default (the spec's total arrays)."""

    __slots__ = ("_d", "_default")

    def __init__(self, d: dict[Any, Any], default: Any) -> None:
        self._d = d
        self._default = default

    def __getitem__(self, key: Any) -> Any:
        return self._d.get(key, self._default)


class _HeldBy:
    __slots__ = ("_blocks",)

    def __init__(self, blocks: set[int] | None) -> None:
        self._blocks = blocks

    def __getitem__(self, b: Any) -> bool:
        return self._blocks is not None and b in self._blocks


class _Holds:
    __slots__ = ("_held",)

    def __init__(self, held: dict[Hashable, set[int]]) -> None:
        self._held = held

    def __getitem__(self, r: Any) -> _HeldBy:
        return _HeldBy(self._held.get(r))


class _Alive:
    __slots__ = ("_held",)

    def __init__(self, held: dict[Hashable, set[int]]) -> None:
        self._held = held

    def __getitem__(self, r: Any) -> bool:
        return r in self._held


class _NHeld(_Alive):
    def __getitem__(self, r: Any) -> int:
        blocks = self._held.get(r)
        return 0 if blocks is None else len(blocks)


class BlockPool:
    """Physical blocks, their lifecycle states, the eviction queue and the prefix-hash map."""

    def __init__(self, num_blocks: int, block_size: int, *, checked: bool = True) -> None:
        if check_count(num_blocks, "num_blocks") == 0:
            raise InvalidArgument("num_blocks must be >= 1")
        check_block_size(block_size)
        n = num_blocks
        self.num_blocks = n
        self.block_size = block_size
        self.checked = checked
        self.state = [FREE] * n
        self.ref = [0] * n
        self.pending = [0] * n
        self.wpend = [0] * n
        self.filled = [0] * n
        self.gen = [0] * n
        self.init = [False] * n
        self.hash = [NO_HASH] * n
        self.hmap: dict[int, int] = {}
        self.held: dict[Hashable, set[int]] = {}
        self.count = [0] * len(ALL_STATES)
        self.count[FREE] = n
        self.queue = BlockQueue(n)
        # CACHED blocks that a pending launch still reads: evictable, but not reusable yet.
        self.cached_busy = 0
        # Set to a list to record every transition performed as (name, params).
        self.trace: list[tuple[str, dict[str, Any]]] | None = None
        self.view = PoolState(
            state=self.state,
            ref=self.ref,
            pending=self.pending,
            wpend=self.wpend,
            filled=self.filled,
            gen=self.gen,
            init=self.init,
            hash=self.hash,
            queued=self.queue.inq,
            hmap=_DefaultMap(self.hmap, NO_BLOCK),
            holds=_Holds(self.held),
            alive=_Alive(self.held),
            nheld=_NHeld(self.held),
            count=self.count,
            block_size=block_size,
            num_blocks=n,
            block_ids=range(n),  # type: ignore[arg-type]
            holder_ids=self.held.keys(),  # type: ignore[arg-type]
        )

    # ---- the guard/effect protocol ------------------------------------------------------------
    def _enter(self, name: str, **params: Any) -> PoolState | None:
        """Evaluate the spec guard (raise if it fails); in checked mode, predict the effect."""
        b = params.get("b")
        if b is not None:
            self.check_block_id(b)
        t = TRANSITIONS[name]
        if not t.guard(CONCRETE, self.view, **params):
            raise _GUARD_ERRORS.get(name, GuardViolation)(name, self._describe(params))
        if self.trace is not None:
            self.trace.append((name, params))
        return t.effect(CONCRETE, self.view, **params) if self.checked else None

    def _verify(self, name: str, predicted: PoolState | None, **params: Any) -> None:
        """Checked mode: where touched, the real post-state is the spec's and invariants hold."""
        if predicted is None:
            return
        touched_blocks: set[Any] = set()
        for field in ("state", "ref", "pending", "wpend", "filled", "gen", "init", "hash",
                      "queued", "count"):
            value = getattr(predicted, field)
            if isinstance(value, Overlay):
                real = getattr(self.view, field)
                for key, expected in value.changes().items():
                    if real[key] != expected:
                        raise InvariantViolation(
                            f"refines:{name}",
                            f"{field}[{key}] is {real[key]!r}, the spec says {expected!r}",
                        )
                    if field != "count":
                        touched_blocks.add(key)
        if isinstance(predicted.hmap, Overlay):
            for h, expected in predicted.hmap.changes().items():
                if self.view.hmap[h] != expected:
                    raise InvariantViolation(f"refines:{name}", f"hmap[{h}] differs")
        r = params.get("r")
        if r is not None and self.view.nheld[r] != predicted.nheld[r]:
            raise InvariantViolation(f"refines:{name}", f"holder {r!r} holds a different count")
        if r is not None and "b" in params:
            b = params["b"]
            if self.view.holds[r][b] != bool(predicted.holds[r][b]):
                raise InvariantViolation(f"refines:{name}", f"holds[{r!r}][{b}] differs")
        for b in touched_blocks:
            for inv in _BLOCK_INVARIANTS:
                if not inv.pred(CONCRETE, self.view, b):
                    raise InvariantViolation(inv.name, f"block {b} after {name}")
            for inv in _HASH_INVARIANTS:
                h = self.hash[b]
                if not inv.pred(CONCRETE, self.view, h):
                    raise InvariantViolation(inv.name, f"hash of block {b} after {name}")

    def _describe(self, params: dict[str, Any]) -> str:
        parts = [f"{k}={v!r}" for k, v in params.items()]
        b = params.get("b")
        if b is not None:
            parts.append(
                f"block {b} is {state_name(self.state[b])} ref={self.ref[b]} "
                f"pending={self.pending[b]}"
            )
        return ", ".join(parts)

    def check_block_id(self, b: object) -> int:
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < self.num_blocks:
            raise InvalidArgument(f"block id {b!r} out of range [0, {self.num_blocks})")
        return b

    def _move(self, b: int, new_state: int) -> None:
        self.count[self.state[b]] -= 1
        self.count[new_state] += 1
        self.state[b] = new_state

    # ---- transitions -------------------------------------------------------------------------
    def open_holder(self, r: Hashable) -> None:
        """spec: open_holder."""
        predicted = self._enter("open_holder", r=r)
        self.held[r] = set()
        self._verify("open_holder", predicted, r=r)

    def close_holder(self, r: Hashable) -> None:
        """spec: close_holder."""
        predicted = self._enter("close_holder", r=r)
        del self.held[r]
        self._verify("close_holder", predicted, r=r)

    def allocate(self, b: int, r: Hashable) -> None:
        """spec: allocate — FREE block b becomes ALLOCATED to holder r."""
        predicted = self._enter("allocate", b=b, r=r)
        self.queue.unlink(b)
        self._move(b, ALLOCATED)
        self.ref[b] = 1
        self.init[b] = True
        self.filled[b] = 0
        self.held[r].add(b)
        self._verify("allocate", predicted, b=b, r=r)

    def publish(self, b: int, r: Hashable) -> None:
        """spec: publish — ALLOCATED -> PUBLISHED."""
        predicted = self._enter("publish", b=b, r=r)
        self._move(b, PUBLISHED)
        self._verify("publish", predicted, b=b, r=r)

    def begin_access(self, b: int, r: Hashable, w: int) -> None:
        """spec: begin_access — a launch through r's table reads b, or writes w of its slots."""
        predicted = self._enter("begin_access", b=b, r=r, w=w)
        self.pending[b] += 1
        if w > 0:
            self.wpend[b] += 1
            self.filled[b] += w
        self._verify("begin_access", predicted, b=b, r=r, w=w)

    def end_access(self, b: int, writes: bool) -> None:
        """spec: end_access; then recycles b if it was reclaimed and nothing else reads it."""
        predicted = self._enter("end_access", b=b, writes=writes)
        self.pending[b] -= 1
        if writes:
            self.wpend[b] -= 1
        if self.state[b] == CACHED and self.pending[b] == 0:
            self.cached_busy -= 1
        self._verify("end_access", predicted, b=b, writes=writes)
        self._recycle_if_safe(b)

    def commit(self, b: int, r: Hashable, h: int) -> None:
        """spec: commit — PUBLISHED -> REFERENCED under prefix hash h."""
        predicted = self._enter("commit", b=b, r=r, h=h)
        self._move(b, REFERENCED)
        self.hash[b] = h
        self.hmap[h] = b
        self._verify("commit", predicted, b=b, r=r, h=h)

    def share(self, b: int, r: Hashable) -> None:
        """spec: share — a prefix hit or fork takes a reference (revives a CACHED block)."""
        predicted = self._enter("share", b=b, r=r)
        if self.state[b] == CACHED:
            self.queue.unlink(b)
            self._move(b, REFERENCED)
            if self.pending[b] > 0:
                self.cached_busy -= 1
        self.ref[b] += 1
        self.held[r].add(b)
        self._verify("share", predicted, b=b, r=r)

    def release(self, b: int, r: Hashable) -> None:
        """spec: release — ref - 1; at 0 a REFERENCED block is cached, others reclaimed."""
        predicted = self._enter("release", b=b, r=r)
        self.ref[b] -= 1
        self.held[r].discard(b)
        if self.ref[b] == 0:
            if self.state[b] == REFERENCED:
                self._move(b, CACHED)
                self.queue.push_tail(b)
                if self.pending[b] > 0:
                    self.cached_busy += 1
            else:
                self._invalidate(b)
        self._verify("release", predicted, b=b, r=r)
        self._recycle_if_safe(b)

    def evict(self, b: int) -> None:
        """spec: evict — CACHED -> RECLAIMED; the hash is dropped."""
        predicted = self._enter("evict", b=b)
        self.queue.unlink(b)
        if self.pending[b] > 0:
            self.cached_busy -= 1
        del self.hmap[self.hash[b]]
        self.hash[b] = NO_HASH
        self._invalidate(b)
        self._verify("evict", predicted, b=b)

    def recycle(self, b: int) -> None:
        """spec: recycle — RECLAIMED -> FREE, to the head of the queue (reused first)."""
        predicted = self._enter("recycle", b=b)
        self._move(b, FREE)
        self.queue.push_head(b)
        self._verify("recycle", predicted, b=b)

    def _invalidate(self, b: int) -> None:
        self._move(b, RECLAIMED)
        self.init[b] = False
        self.gen[b] += 1
        self.filled[b] = 0

    def _recycle_if_safe(self, b: int) -> None:
        if self.state[b] == RECLAIMED and TRANSITIONS["recycle"].guard(CONCRETE, self.view, b=b):
            self.recycle(b)

    # ---- composite helpers -------------------------------------------------------------------
    def usable(self) -> int:
        """Blocks an allocation can take now: FREE ones and CACHED ones no launch reads."""
        return self.count[FREE] + self.count[CACHED] - self.cached_busy

    def take(self, r: Hashable) -> int:
        """Allocate the queue's head for r, evicting cached blocks on the way (LRU order).

        The caller has checked ``usable()``; a CACHED head that a pending launch still reads is
        evicted (it becomes FREE when that launch completes) and the walk goes on.
        """
        while True:
            b = self.queue.head()
            if b is None:  # pragma: no cover - callers check usable() first
                raise AssertionError("take() on an exhausted pool")
            if self.state[b] == CACHED:
                self.evict(b)
                self._recycle_if_safe(b)
                continue
            self.allocate(b, r)
            return b

    def lookup(self, h: int) -> int | None:
        b = self.hmap.get(h)
        return b

    # ---- abstraction and scans ---------------------------------------------------------------
    def abstract(self) -> PoolState:
        """The pool's state mapped to the spec's state (fresh concrete arrays)."""
        n = self.num_blocks

        def arr(values: Iterable[Any], default: Any) -> Arr:
            return Arr(default, dict(enumerate(values)))

        return PoolState(
            state=arr(self.state, FREE),
            ref=arr(self.ref, 0),
            pending=arr(self.pending, 0),
            wpend=arr(self.wpend, 0),
            filled=arr(self.filled, 0),
            gen=arr(self.gen, 0),
            init=arr(self.init, False),
            hash=arr(self.hash, NO_HASH),
            queued=arr(self.queue.inq, False),
            hmap=Arr(NO_BLOCK, dict(self.hmap)),
            holds=Arr(Arr(False), {r: Arr(False, dict.fromkeys(bs, True))
                                   for r, bs in self.held.items()}),
            alive=Arr(False, dict.fromkeys(self.held, True)),
            nheld=Arr(0, {r: len(bs) for r, bs in self.held.items()}),
            count=arr(self.count, 0),
            block_size=self.block_size,
            num_blocks=n,
            block_ids=tuple(range(n)),
            holder_ids=tuple(self.held),
        )

    def structure_errors(self) -> list[tuple[str, str]]:
        """Implementation facts the spec abstracts away (queue links, busy counter)."""
        errors = [("queue_is_free_and_cached", e) for e in self.queue.structure_errors()]
        busy = sum(1 for b in range(self.num_blocks)
                   if self.state[b] == CACHED and self.pending[b] > 0)
        if busy != self.cached_busy:
            errors.append(("conservation", f"cached_busy {self.cached_busy} != {busy}"))
        return errors
