"""HostPool: the host (CPU) tier's runtime. Each call is a sequence of ``spec.host`` transitions.

A call first plans its transitions, then runs the spec's guards and effects
(``spec.host.HOST_TRANSITIONS``, evaluated with ``CONCRETE``) on a copy-on-write view of the
pool's containers: each effect returns ``Overlay`` chains, so nothing is written until every
guard of the call held. Then the chains' final values are written into the containers. A
refused call raises a typed error and changes nothing; the state changes are exactly the
spec's effects. The LRU order and the free list are derived indices, kept for the touched
blocks; in checked mode they and the block, hash and device invariants are re-evaluated at
every block, hash and device block the call touched (``check_all`` evaluates everything).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from pagedkv.spec.explain import refusal_detail
from pagedkv.spec.host import (
    HOST_ARRAY_FIELDS,
    HOST_BLOCK_FIELDS,
    HOST_FREE,
    HOST_STATE_NAMES,
    HOST_STATES,
    HOST_TRANSITIONS,
    HOST_WORDS,
    HostState,
    HostTransition,
    evictable,
    loadable,
)
from pagedkv.spec.host_invariants import HOST_INVARIANTS, host_violations
from pagedkv.spec.ops import CONCRETE, Arr, Overlay
from pagedkv.spec.states import NO_BLOCK, NO_HASH

from .errors import GuardViolation, InvalidArgument, InvariantViolation, OutOfBlocks


class HostGuardViolation(GuardViolation):
    """A host-tier transition was attempted whose guard does not hold."""


class HostMiss(HostGuardViolation):
    """A load of a hash whose KV is not (completely) on the host."""


class DevicePinned(HostGuardViolation):
    """A store would read a device block that another store in flight already reads."""


class NoTransfer(HostGuardViolation):
    """A completion for a host block with no such transfer in flight."""


_GUARD_ERRORS: dict[str, type[HostGuardViolation]] = {
    "store_begin": DevicePinned, "store_done": NoTransfer, "store_fail": NoTransfer,
    "load_begin": HostMiss, "load_done": NoTransfer, "evict": HostGuardViolation,
}


class _Map(dict):  # type: ignore[type-arg]
    """A dict that reads as a total map with a default (absent keys are the default)."""

    def __init__(self, default: Any) -> None:
        super().__init__()
        self.default = default

    def __missing__(self, key: Any) -> Any:
        return self.default


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__}")
    return value


class HostPool:
    """``num_blocks`` host blocks; ``lookup`` / ``prepare_store`` / ``complete_store`` /
    ``prepare_load`` / ``complete_load``, LRU eviction of unpinned STORED blocks."""

    def __init__(self, num_blocks: int, checked: bool = True) -> None:
        _check_int("num_blocks", num_blocks)
        if num_blocks < 1:
            raise InvalidArgument(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.checked = checked
        self.trace: list[tuple[str, dict[str, Any]]] | None = None
        self._arrays: dict[str, Any] = {
            "state": [HOST_FREE] * num_blocks, "hash": [NO_HASH] * num_blocks,
            "pins": [0] * num_blocks, "src": [NO_BLOCK] * num_blocks,
            "hmap": _Map(NO_BLOCK), "dreader": _Map(NO_BLOCK),
            "count": [num_blocks if st == HOST_FREE else 0 for st in HOST_STATES],
        }
        self.view = HostState(num_blocks=num_blocks, block_ids=tuple(range(num_blocks)),
                              **self._arrays)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._lru: OrderedDict[int, None] = OrderedDict()  # evictable, oldest first

    # --- queries -----------------------------------------------------------------------------
    def lookup(self, h: int) -> int | None:
        """The host block holding hash h's complete KV, or None (a miss; a store in flight
        is not a hit)."""
        _check_int("hash", h)
        b = self._arrays["hmap"][h]
        if b == NO_BLOCK or not CONCRETE.is_true(loadable(CONCRETE, self.view, b)):
            return None
        return b

    def num_free(self) -> int:
        return len(self._free)

    def num_evictable(self) -> int:
        return len(self._lru)

    def state_of(self, b: int) -> str:
        return HOST_STATE_NAMES[self._arrays["state"][b]]

    def device_pinned(self, d: int) -> bool:
        """A store in flight reads device block d (it must not be freed or overwritten)."""
        return self._arrays["dreader"][d] != NO_BLOCK

    def lru_order(self) -> list[int]:
        return list(self._lru)

    # --- calls -------------------------------------------------------------------------------
    def prepare_store(self, hashes: Sequence[int], device_blocks: Sequence[int]
                      ) -> list[int | None]:
        """Start copying ``device_blocks[i]`` to a host block under ``hashes[i]``. Returns the
        host block of each (None where the hash is already on the host: nothing to store).
        Takes FREE blocks first, then evicts the least recently used unpinned STORED ones;
        not enough of both: ``OutOfBlocks``, nothing changed."""
        hashes, device_blocks = list(hashes), list(device_blocks)
        if len(hashes) != len(device_blocks):
            raise InvalidArgument("prepare_store: one device block per hash")
        for h in hashes:
            if _check_int("hash", h) == NO_HASH:
                raise InvalidArgument("prepare_store: hash 0 means 'no hash'")
        for d in device_blocks:
            if _check_int("device block", d) < 0:
                raise InvalidArgument(f"prepare_store: device block {d} is negative")
        if len(set(hashes)) != len(hashes):
            raise InvalidArgument("prepare_store: duplicate hashes")
        hmap = self._arrays["hmap"]
        new = [i for i, h in enumerate(hashes) if hmap[h] == NO_BLOCK]
        keep = {hmap[h] for h in hashes} - {NO_BLOCK}  # already stored: not victims
        victims = [b for b in self._lru if b not in keep]
        available = len(self._free) + len(victims)
        if len(new) > available:
            raise OutOfBlocks(len(new), available)
        plan: list[tuple[str, dict[str, Any]]] = []
        out: list[int | None] = [None] * len(hashes)
        free = iter(self._free)
        victim = iter(victims)
        for i in new:
            b = next(free, None)
            if b is None:
                b = next(victim)
                plan.append(("evict", {"b": b}))
            plan.append(("store_begin", {"b": b, "h": hashes[i], "d": device_blocks[i]}))
            out[i] = b
        self._run(plan)
        return out

    def complete_store(self, blocks: Sequence[int], success: bool) -> None:
        """The copies into ``blocks`` completed (STORED) or failed (FREE); their device
        sources are let go either way."""
        if not isinstance(success, bool):
            raise InvalidArgument("complete_store: success must be a bool")
        name = "store_done" if success else "store_fail"
        self._run([(name, {"b": self._block(b)}) for b in blocks])

    def prepare_load(self, hashes: Sequence[int]) -> list[int]:
        """Pin the host blocks of ``hashes`` for host -> device copies (each must be a hit:
        else ``HostMiss``, nothing changed)."""
        hmap = self._arrays["hmap"]
        for h in hashes:
            if hmap[_check_int("hash", h)] == NO_BLOCK:  # nothing to plan a load of
                raise HostMiss("load_begin", f"hash {h} is not on the host (no host block "
                                             "holds it)")
        plan = [("load_begin", {"b": hmap[h]}) for h in hashes]
        self._run(plan)
        return [p["b"] for _, p in plan]

    def complete_load(self, blocks: Sequence[int]) -> None:
        """One host -> device copy of each of ``blocks`` completed; the last one unpins it
        (most recently used in the LRU order)."""
        self._run([("load_done", {"b": self._block(b)}) for b in blocks])

    def discard(self, blocks: Sequence[int]) -> None:
        """Drop the KV of unpinned STORED ``blocks`` now (e.g. a swap's blocks once swapped
        back in); a pinned or empty one: ``HostGuardViolation``, nothing changed."""
        self._run([("evict", {"b": self._block(b)}) for b in blocks])

    # --- machinery ---------------------------------------------------------------------------
    def _block(self, b: Any) -> int:
        _check_int("host block", b)
        if b < 0 or b >= self.num_blocks:
            raise InvalidArgument(f"host block {b} out of range [0, {self.num_blocks})")
        return b

    def _run(self, plan: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Every step's guard on the state the previous steps lead to; then write it all."""
        s = self.view
        for name, params in plan:
            t: HostTransition = HOST_TRANSITIONS[name]
            if not CONCRETE.is_true(t.guard(CONCRETE, s, **params)):
                raise _GUARD_ERRORS[name](name, refusal_detail(t.guard, s, name, params,
                                                               HOST_WORDS))
            s = t.effect(CONCRETE, s, **params)
        touched = self._commit(s)
        if self.trace is not None:
            self.trace.extend((n, dict(p)) for n, p in plan)
        self._reindex(touched["block"], plan)
        if self.checked:
            self._check(touched)

    def _commit(self, s: HostState) -> dict[str, set[Any]]:
        touched: dict[str, set[Any]] = {"block": set(), "hash": set(), "device": set()}
        for f in HOST_ARRAY_FIELDS:
            new, arr = getattr(s, f), self._arrays[f]
            if new is arr:
                continue
            if not isinstance(new, Overlay) or new.root() is not arr:  # pragma: no cover
                raise InvariantViolation(f"host:{f}", "an effect replaced a whole array")
            for k, v in new.changes().items():
                if f == "hash":
                    touched["hash"].update((arr[k], v))
                if isinstance(arr, _Map):
                    touched["hash" if f == "hmap" else "device"].add(k)
                    if v == arr.default:
                        arr.pop(k, None)
                    else:
                        arr[k] = v
                else:
                    if f in HOST_BLOCK_FIELDS:
                        touched["block"].add(k)
                    arr[k] = v
        return touched

    def _reindex(self, blocks: set[int], plan: Sequence[tuple[str, dict[str, Any]]]) -> None:
        order = [p["b"] for _, p in plan if p["b"] in blocks]
        for b in dict.fromkeys(order):
            self._free.pop(b, None)
            self._lru.pop(b, None)
            if self._arrays["state"][b] == HOST_FREE:
                self._free[b] = None
            elif CONCRETE.is_true(evictable(CONCRETE, self.view, b)):
                self._lru[b] = None  # (again) evictable after a use: most recently used

    def _check(self, touched: dict[str, set[Any]]) -> None:
        s, ops = self.view, CONCRETE
        for inv in HOST_INVARIANTS.values():
            for p in touched.get(inv.scope, ()):
                if not ops.is_true(inv.pred(ops, s, p)):
                    raise InvariantViolation(inv.name, f"at {inv.scope} {p}")
        for b in touched["block"]:
            if (b in self._free) != (s.state[b] == HOST_FREE):
                raise InvariantViolation("host:free_list", f"block {b}")
            if (b in self._lru) != ops.is_true(evictable(ops, s, b)):
                raise InvariantViolation("host:lru", f"block {b}")
        if sum(s.count[st] for st in HOST_STATES) != self.num_blocks:
            raise InvariantViolation("host_conservation", "counts do not sum to the tier size")

    def check_all(self) -> list[str]:
        """Every invariant instance (O(tier)); the violated ones, empty if none."""
        return host_violations(self.view, CONCRETE)

    def snapshot(self) -> HostState:
        """An immutable copy of the state, in the spec's concrete vocabulary."""
        a = self._arrays
        return HostState(
            **{f: Arr(d, dict(enumerate(a[f]))) for f, d in
               (("state", HOST_FREE), ("hash", NO_HASH), ("pins", 0), ("src", NO_BLOCK))},
            hmap=Arr(NO_BLOCK, dict(a["hmap"])), dreader=Arr(NO_BLOCK, dict(a["dreader"])),
            count=Arr(0, dict(enumerate(a["count"]))),
            num_blocks=self.num_blocks, block_ids=tuple(range(self.num_blocks)),
        )
