"""NativePool: the block pool with its spec transitions compiled to native loops (numba).

The same lifecycle as ``BlockPool`` (same blocks chosen, same states, same errors; the tests
run both side by side), kept in NumPy arrays (``native_source``'s layout) so that a batch of
transitions runs as one native loop: ``take_many`` (allocations, with LRU eviction of cached
blocks on the way), ``release_many``, ``share_many``, ``publish_many``,
``begin_write_many``, ``end_write_many``, ``commit_many``, and an admission and a request's end
(``admit``, ``finish``) as one loop each. Each loop calls the spec's guard and
effect of every block, generated from the spec (``spec=`` as for ``BlockPool``), and the
generated module is checked against the interpreted spec on the probe states before any pool
uses it (``self_check``). The launch clock (``launch``, ``complete``, ``advance``) runs the
same way: the launches in flight are an open-addressing set in ``M`` (``native_clock.py``).
Checked mode re-evaluates the local invariants on every touched block, and the clock's after
each clock transition, in their native form.

Request ids and sha256 digests are mapped to small slots (holders from 1; hash slot 0 is
``NO_HASH``), digests by a native table (``native_digests``). Needs numba (``pip install
pagedkv[native]``); ``NativeUnavailable`` otherwise.
The generated module is written once per spec to a cache folder (``PAGEDKV_NATIVE_CACHE``,
default ``~/.cache/pagedkv``) so that numba's own cache keeps later imports fast.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import operator
import os
import sys
import tempfile
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pagedkv.spec import (
    CACHED,
    CONCRETE,
    FREE,
    ISSUED,
    NO_BLOCK,
    NO_HASH,
    RECLAIMED,
    TRANSITIONS,
    WATERMARK,
    PoolState,
    Transition,
    cache_due,
    takeable,
)
from pagedkv.spec.explain import refusal_detail
from pagedkv.spec.model import ARRAY_FIELDS
from pagedkv.spec.request_spec import REQUEST_SPEC

from . import native_source as ns
from .allocator import _ordered
from .compiled import _PROBE_BY_KIND, _effect_probe_pools, _probe_pools, _Unsupported
from .errors import (
    AllocatorError,
    GuardViolation,
    InvalidArgument,
    InvariantViolation,
    OutOfBlocks,
)
from .hashing import all_ints
from .pool import (
    _GUARD_ERRORS,
    MAX_BLOCKS,
    MAX_HASH,
    BlockPool,
    check_admission,
    clock_invariants,
    local_invariants,
)
from .prefix_memo import PrefixMemos
from .storage import PoolStorage
from .table import MAX_COUNT, check_block_size, check_count, check_int

ROW, CLOCK0, COUNT0 = ns.ROW, ns.CLOCK0, ns.COUNT0
UNKNOWN_HOLDER = 0  # the slot of every id that is not an open holder: never alive
_KEYS_USED = ns.KEYS_USED
_INT64 = np.dtype(np.int64)
_NONE = np.empty(0, _INT64)
_NONE.flags.writeable = False


class NativeUnavailable(AllocatorError, ImportError):
    """The native pool cannot run here: numba is missing, or a spec function cannot be
    written over the native arrays, or the generated code disagrees with the spec."""


# ---- the generated module, once per spec -------------------------------------------------------
_MODULES: dict[str, ModuleType] = {}
_BY_SPEC: dict[tuple[Any, ...], ModuleType] = {}


def _cache_dir() -> Path:
    base = os.environ.get("PAGEDKV_NATIVE_CACHE") or str(Path.home() / ".cache" / "pagedkv")
    path = Path(base)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".writable"
        probe.touch()
        return path
    except OSError:
        path = Path(tempfile.gettempdir()) / "pagedkv-native"
        path.mkdir(parents=True, exist_ok=True)
        return path


def native_module(spec: Mapping[str, Transition] | None = None,
                  rules: tuple[Any, Any] | None = None) -> ModuleType:
    """The compiled module of ``spec``'s transitions (default ``spec.TRANSITIONS``) and the
    request rules ``rules`` (``commit_bounds``, ``slots_written``; default those of
    ``spec.REQUEST_SPEC``), generated, written to the cache folder, imported and checked
    against the interpreted spec (``self_check``) once per process."""
    spec = TRANSITIONS if spec is None else spec
    key = (tuple((name, spec[name]) for name in ns.NATIVE), rules)
    mod = _BY_SPEC.get(key)
    if mod is not None:
        return mod
    try:
        import numba  # noqa: F401
    except ImportError as exc:
        raise NativeUnavailable("the native pool needs numba: pip install pagedkv[native]") \
            from exc
    try:
        source = (ns.module_source(spec, local_invariants()) if rules is None
                  else ns.module_source(spec, local_invariants(), rules))
    except _Unsupported as exc:
        raise NativeUnavailable(f"a spec function has no native form: {exc}") from None
    digest = ns.source_digest(source)
    mod = _MODULES.get(digest)
    if mod is None:
        name = f"pagedkv_native_{digest}"
        path = _cache_dir() / f"{name}.py"
        if not path.exists() or path.read_text() != source:
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(source)
            os.replace(tmp, path)
        loader = importlib.util.spec_from_file_location(name, path)
        assert loader is not None and loader.loader is not None
        mod = importlib.util.module_from_spec(loader)
        sys.modules[name] = mod
        loader.loader.exec_module(mod)
        wrong = self_check(mod, spec, rules)
        if wrong:
            raise NativeUnavailable(f"the generated code disagrees with the spec: {wrong}")
        _MODULES[digest] = mod
    _BY_SPEC[key] = mod
    return mod


def _block_ids(blocks: object, what: str = "block ids") -> np.ndarray:
    """Block ids (or counts) as an int64 vector: an int64 vector as it is, other integer
    arrays converted, a sequence of ints packed (``InvalidArgument`` for anything else)."""
    if type(blocks) is np.ndarray and blocks.dtype is _INT64 and blocks.ndim == 1:
        return blocks
    if isinstance(blocks, np.ndarray):
        if blocks.ndim != 1 or blocks.dtype.kind not in "iu":
            raise InvalidArgument(f"{what} must be a 1-d integer array, got {blocks.dtype}"
                                  f" of shape {blocks.shape}")
        return blocks.astype(np.int64, copy=False)
    items = _ordered(blocks, what)  # the allocator's own argument checks
    if any(type(b) is not int for b in items):
        items = [check_int(b, what) for b in items]
    try:
        return np.array(items, np.int64) if items else np.empty(0, np.int64)
    except OverflowError:
        raise InvalidArgument(f"{what} must fit in int64") from None


# ---- the view: the native arrays as the spec's state, keyed by request ids and digests ---------
class _HashRow:
    __slots__ = ("_pool",)

    def __init__(self, pool: NativePool) -> None:
        self._pool = pool

    def __getitem__(self, b: Any) -> Any:
        return self._pool._table.digest(self._pool.B[ROW["hash"], b])


class _HashMap:
    __slots__ = ("_pool",)

    def __init__(self, pool: NativePool) -> None:
        self._pool = pool

    def __getitem__(self, h: Any) -> int:
        return int(self._pool.X[self._pool._slot_of(h)])


class _Holder:
    __slots__ = ("_pool", "_row")

    def __init__(self, pool: NativePool, row: int) -> None:
        self._pool, self._row = pool, row

    def __getitem__(self, r: Any) -> Any:
        slot = self._pool._slot.get(r, UNKNOWN_HOLDER)
        value = int(self._pool.H[self._row, slot])
        return bool(value) if self._row == 0 else value


class _HoldsOf:
    __slots__ = ("_pool", "_slot")

    def __init__(self, pool: NativePool, slot: int) -> None:
        self._pool, self._slot = pool, slot

    def __getitem__(self, b: Any) -> bool:
        if not 0 <= b < self._pool.num_blocks:
            return False
        return bool(self._pool.mod.has_key(self._pool.K, self._slot, b))


class _Holds:
    __slots__ = ("_pool",)

    def __init__(self, pool: NativePool) -> None:
        self._pool = pool

    def __getitem__(self, r: Any) -> _HoldsOf:
        return _HoldsOf(self._pool, self._pool._slot.get(r, UNKNOWN_HOLDER))


class _Launches:
    """The spec's ``inflight``: ``m[L]``, whether launch L is in flight (the native set in
    ``M``); ``items()`` yields ``(L, True)`` for each, in order."""

    __slots__ = ("_pool",)

    def __init__(self, pool: NativePool) -> None:
        self._pool = pool

    def __getitem__(self, L: Any) -> bool:
        if type(L) is not int and not isinstance(L, np.integer):
            return False  # no launch number (the spec reads only ints)
        return bool(self._pool.mod.has_launch(self._pool.M, L))

    def items(self) -> Any:
        return ((L, True) for L in sorted(self._pool.launches()))


class NativePool:
    """Physical blocks, their lifecycle states, the eviction queue and the prefix-hash map, in
    NumPy arrays; batches of spec transitions run as native loops. Not thread-safe, as
    ``BlockPool`` (``BlockAllocator`` holds a lock around its pool): one thread, or a lock
    around every call."""

    def __init__(self, num_blocks: int, block_size: int, *, checked: bool = True,
                 spec: Mapping[str, Transition] | None = None) -> None:
        num_blocks = check_count(num_blocks, "num_blocks", MAX_BLOCKS)
        if num_blocks == 0:
            raise InvalidArgument("num_blocks must be >= 1")
        block_size = check_block_size(block_size)
        if num_blocks * block_size > MAX_COUNT:
            raise InvalidArgument(f"num_blocks * block_size must be <= {MAX_COUNT}")
        if not isinstance(checked, bool | np.bool_):
            raise InvalidArgument(f"checked must be a bool, got {type(checked).__name__}")
        self.spec: Mapping[str, Transition] = TRANSITIONS if spec is None else spec
        self.mod = native_module(self.spec)
        self.checked = bool(checked)
        self._setup(num_blocks, block_size)

    def _setup(self, n: int, block_size: int) -> None:
        self.num_blocks, self.block_size = n, block_size
        B = self.B = np.zeros((len(ns.ROWS), n + 1), np.int64)
        B[ROW["queued"], :n] = 1  # every block FREE and queued in id order, 0 at the head
        B[ROW["next"]] = np.arange(1, n + 2) % (n + 1)
        B[ROW["prev"]] = (np.arange(n + 1) - 1) % (n + 1)
        self.M = np.zeros(ns.LAUNCHES0 + 16, np.int64)
        self.M[ns.LAUNCHES0:] = ns.LAUNCH_EMPTY
        self.M[COUNT0 + FREE] = n
        self.M[ns.QLEN] = n
        self.M[ns.BLOCK_SIZE] = block_size
        self.H = np.zeros((2, 64), np.int64)
        self.K = np.full(1024, ns.EMPTY_KEY, np.int64)
        self.X = np.full(64, NO_BLOCK, np.int64)
        self._slot: dict[Hashable, int] = {}
        self._free_slots = list(range(self.H.shape[1] - 1, UNKNOWN_HOLDER, -1))
        # The digests interned into hash slots (``native_digests``), and per slot the stamp
        # of the interning it holds (a count that never repeats, not even across ``load``): a
        # slot and its stamp name one digest's interning, so a request's hits found earlier
        # can be checked still current (``current_prefix``).
        from .native_digests import DigestTable, words_of  # (numba's, as native_entry)

        self._words_of = words_of
        table = getattr(self, "_table", None)
        self._table = DigestTable(len(self.X), 0 if table is None else table.stamp)
        # The digests the int API (lookups, interning by value) met, by value and by slot: a
        # dict read where the table would need the int's bytes; kept exact (a digest
        # forgotten leaves it). Complete (every interned digest) until digests are interned
        # as words, past the int API (``NativeAllocator``'s rows): a miss then is looked up.
        self._known: dict[int, int] = {}
        self._known_digest: dict[int, int] = {}
        self._known_complete = getattr(self, "_known_complete", True)  # (kept by ``load``)
        self._memos = PrefixMemos()  # the slots of recent lookups' prefixes (prefix_memo)
        self.G = np.zeros(len(self.X), np.int64)
        self.retire_queue: deque[tuple[int, int]] = deque()
        # Scratch outputs of the native loops, grown to what a call may write (``_scratch_for``).
        self._scratch = np.empty((3, 64), np.int64)
        self._one_block = np.empty(1, np.int64)  # take's output, release's input
        self._gone = np.empty(64, np.int64)  # the hash slots a forget freed
        self._param = np.empty((1, 1), np.int64)  # a clock transition's one parameter
        self._keys_half = len(self.K) // 2
        from .native_entry import pool_loops  # (numba's: imported once the module is)

        loops = self._loops = pool_loops(self.mod)
        self._take_many, self._release_many = loops.take_many, loops.release_many
        self._runs, self._one = loops.run, loops.one
        self.view = PoolState(
            **{f: self.B[ROW[f], :n] for f in ROW if f in ARRAY_FIELDS and f != "hash"},
            hash=_HashRow(self), hmap=_HashMap(self), alive=_Holder(self, 0),
            nheld=_Holder(self, 1), holds=_Holds(self),
            count=self.M[COUNT0:COUNT0 + CLOCK0], clock=self.M[CLOCK0:CLOCK0 + 2],
            inflight=_Launches(self), block_size=block_size, num_blocks=n,
            block_ids=range(n),  # type: ignore[arg-type]
            holder_ids=self._slot.keys(),  # type: ignore[arg-type]
        )

    # ---- slots ---------------------------------------------------------------------------------
    def _holder(self, r: Hashable) -> int:
        try:
            return self._slot.get(r, UNKNOWN_HOLDER)
        except TypeError:
            raise InvalidArgument(f"holder ids must be hashable, got {type(r).__name__}") \
                from None

    def _new_holder_slot(self, r: Hashable) -> int:
        if not self._free_slots:
            old = self.H.shape[1]
            self.H = np.concatenate([self.H, np.zeros_like(self.H)], axis=1)
            self._free_slots = list(range(2 * old - 1, old - 1, -1))
        slot = self._free_slots.pop()
        self._slot[r] = slot
        return slot

    def _hash_slot(self, h: object) -> int:
        """The slot of digest h, interned if new (released again by ``_release_hash``)."""
        if type(h) is not int or not 0 <= h <= MAX_HASH:
            h = check_count(h, "hash", MAX_HASH)
        if h == NO_HASH:
            return 0
        return self._chain_slots([h])[0]

    def _hash_slots(self, digests: Sequence[int]) -> np.ndarray:
        """``_hash_slot`` of each digest, as an int64 vector, all or none interned: where all
        are plain ints in range, ``_chain_slot_vector`` (else one ``_hash_slot`` call each,
        which names the first bad one)."""
        if all_ints(digests) and (  # (a float equal to a digest is refused)
                not digests or min(digests) > NO_HASH and max(digests) <= MAX_HASH):
            return self._chain_slot_vector(digests)
        out: list[int] = []
        try:
            for h in digests:
                out.append(self._hash_slot(h))
        except BaseException:
            for slot in out:
                self._release_hash(slot)  # a refused digest interns none
            raise
        return np.array(out, _INT64)

    def _chain_slots(self, digests: Sequence[int]) -> list[int]:
        """The slots of digests known to be ints in ``(NO_HASH, MAX_HASH]`` (checked, or
        ``hashing.chain_digests``' own), the new ones interned (the digests met before read
        from ``_known``)."""
        known = self._known
        slots = list(map(known.get, digests))
        if None not in slots:
            return slots  # type: ignore[return-value]
        more = [h for h, s in zip(digests, slots, strict=True) if s is None]
        self._remember(more, self._intern_words(self._words_of(more)).tolist())
        return list(map(known.__getitem__, digests))

    def _chain_slot_vector(self, digests: Sequence[int]) -> np.ndarray:
        """``_chain_slots`` as an int64 vector (where none of the digests was met: interned
        straight into it)."""
        slots = list(map(self._known.get, digests))
        if None not in slots:
            return np.array(slots, _INT64)
        if slots.count(None) == len(slots):
            out = self._intern_words(self._words_of(digests))
            self._remember(digests, out.tolist())
            return out
        return np.array(self._chain_slots(digests), _INT64)

    def _remember(self, digests: Sequence[int], slots: Sequence[int]) -> None:
        """``_known`` learns these digests' slots (0: not interned, passed over)."""
        if 0 in slots:
            digests = [h for h, s in zip(digests, slots, strict=True) if s]
            slots = [s for s in slots if s]
        self._known.update(zip(digests, slots, strict=True))
        self._known_digest.update(zip(slots, digests, strict=True))

    def _intern_words(self, words: np.ndarray) -> np.ndarray:
        """The slots of these digests (rows of words), the new ones interned in order (the
        table grown first where its free slots run out)."""
        out = np.empty(len(words), _INT64)
        t = self._table
        while t.loops.intern_words(t.W, t.IX, t.FREE, t.DM, self.G, words, len(words),
                                   out) < 0:
            self._grow_hash_slots()
        return out

    def _grow_hash_slots(self) -> None:
        """Twice the hash slots (the new ones free)."""
        old = len(self.X)
        self._table.grow()
        self.X = np.concatenate([self.X, np.full(old, NO_BLOCK, np.int64)])
        self.G = np.concatenate([self.G, np.zeros(old, np.int64)])

    def _slot_of(self, h: Any) -> int:
        """The slot digest ``h`` is interned in, or 0 (as for anything but an int in
        ``(NO_HASH, MAX_HASH]``, or equal to one as a dict key; an unhashable ``h``:
        ``InvalidArgument``)."""
        if self._known_complete:
            try:
                return self._known.get(h, 0)
            except TypeError:
                raise InvalidArgument("hashes must be hashable digests") from None
        if type(h) is not int:
            try:
                hash(h)
            except TypeError:
                raise InvalidArgument("hashes must be hashable digests") from None
            try:
                h = operator.index(h)  # (as a dict key: equal to an int, found as it)
            except TypeError:
                if not (isinstance(h, float) and h.is_integer()):
                    return 0
                h = int(h)
        if not NO_HASH < h <= MAX_HASH:
            return 0
        slot = self._known.get(h)
        if slot is None:
            slot = self._table.slot_of(h)
            self._remember((h,), (slot,))
        return slot

    def _release_hashes(self, slots: np.ndarray) -> None:
        """``_release_hash`` of each slot (the digests left with no block go): an eviction's
        (each evicted block's own hash), or what a commit not made leaves behind."""
        t, n = self._table, len(slots)
        if len(self._gone) < n:
            self._gone = np.empty(2 * n, np.int64)
        k = t.loops.forget(t.W, t.IX, t.FREE, t.DM, self.X, slots, n, self._gone)
        if k and (self._known_digest or self._memos.by_first):
            gone = self._gone[:k].tolist()
            for s in gone:
                h = self._known_digest.pop(s, None)
                if h is not None:
                    del self._known[h]
            if self._memos.by_first:
                self._memos.forget(gone)

    def _release_hash(self, slot: int) -> None:
        one = self._one_block
        one[0] = slot
        self._release_hashes(one)

    @property
    def _hslot(self) -> dict[int, int]:
        """Each interned digest's slot (a copy: for tests and cold reads)."""
        return dict(self._table.items())

    @property
    def _digest(self) -> list[int]:
        """Each slot's digest (NO_HASH where free; a copy)."""
        out = [NO_HASH] * len(self.X)
        for h, slot in self._table.items():
            out[slot] = h
        return out

    @property
    def _free_hslots(self) -> list[int]:
        """The free hash slots, the next one taken last (a copy)."""
        t = self._table
        return t.FREE[:t.free_count()].tolist()

    def _scratch_for(self, k: int) -> np.ndarray:
        """Scratch rows of at least k entries (grown by doubling: amortized O(1))."""
        self._scratch = np.empty((3, max(k, 2 * self._scratch.shape[1])), np.int64)
        return self._scratch

    def _room_for_keys(self, n: int) -> None:
        """The holds set can take n more keys at a load of at most one half (its keys are
        counted natively, ``KEYS_USED``: a deleted key leaves no marker), else it is rehashed
        into cells doubled until they would be a quarter full: O(1) per key added."""
        live = self.M.item(_KEYS_USED)
        if live + n <= self._keys_half:
            return
        cap = len(self.K)
        while cap < 4 * (live + n):
            cap *= 2
        new = np.full(cap, ns.EMPTY_KEY, np.int64)
        self.mod.rehash(self.K, new)
        self.K = new
        self._keys_half = cap // 2

    _ids = staticmethod(_block_ids)

    # ---- refusals and checks -------------------------------------------------------------------
    def _refuse(self, name: str, **params: Any) -> None:
        b = params.get("b")
        if b is not None and not 0 <= b < self.num_blocks:
            raise InvalidArgument(f"block id {b!r} out of range [0, {self.num_blocks})")
        t = self.spec[name]
        detail = refusal_detail(t.guard, self.view, name, params)
        raise _GUARD_ERRORS.get(name, GuardViolation)(name, detail)

    def _check_touched(self, name: str, blocks: np.ndarray, n: int) -> None:
        if not self.checked or n == 0:
            return
        i = self._loops.first_failing(self.B, self.M, self.H, self.K, self.X, blocks, n)
        if i >= 0:
            b = int(blocks[i])
            values = self.mod.each(self.B, self.M, self.H, self.K, self.X, b)
            invs = local_invariants()
            failed = next(inv for inv, ok in zip(invs, values, strict=True) if not ok)
            raise InvariantViolation(failed.name, f"after {name}, at block {b}")

    def _clock_step(self, name: str, L: int) -> None:
        """A launch-clock transition (launch, complete) of launch L, natively: the spec's
        guard and effect; in checked mode the clock invariants are evaluated after it."""
        P = self._param
        P[0, 0] = L
        if self._runs[name](self.B, self.M, self.H, self.K, self.X, P, 1) != 1:
            self._refuse(name, L=L)
        self._check_clock(name, L)

    def _check_clock(self, name: str, L: int | None) -> None:
        """Checked mode: the clock's invariants after a clock transition, at launch L (the
        watermark for an advance), in their native form (``clock_each``)."""
        if self.checked:
            at = int(self.M[CLOCK0 + WATERMARK]) if L is None else L
            values = self.mod.clock_each(self.B, self.M, self.H, self.K, self.X, at)
            if not all(values):
                failed = next(inv for inv, ok in zip(clock_invariants(), values, strict=True)
                              if not ok)
                raise InvariantViolation(failed.name, f"after {name}")

    def _room_for_launch(self) -> None:
        """The launch set can take one more launch at a load of at most one half: rehashed,
        in place unless the live launches fill a quarter (then into cells doubled until they
        do not)."""
        M = self.M
        cap = len(M) - ns.LAUNCHES0
        if 2 * (M[ns.LAUNCH_USED] + 1) <= cap:
            return
        live = self.mod.launch_members(M, np.empty(cap, np.int64))
        if 4 * (live + 1) <= cap:  # room enough: the deleted cells cleared in place
            old = M.copy()
            M[ns.LAUNCHES0:] = ns.LAUNCH_EMPTY
            self.mod.rehash_launches(old, M)
            return
        while 4 * (live + 1) > cap:
            cap *= 2
        new = np.full(ns.LAUNCHES0 + cap, ns.LAUNCH_EMPTY, np.int64)
        new[:ns.LAUNCHES0] = M[:ns.LAUNCHES0]
        self.mod.rehash_launches(M, new)
        self.M = new
        self.view = dataclasses.replace(
            self.view, count=new[COUNT0:COUNT0 + CLOCK0], clock=new[CLOCK0:CLOCK0 + 2])

    def launches(self) -> set[int]:
        """The launches in flight."""
        out = np.empty(len(self.M) - ns.LAUNCHES0, np.int64)
        return set(out[:self.mod.launch_members(self.M, out)].tolist())

    # ---- holders ---------------------------------------------------------------------------------
    def open_holder(self, r: Hashable) -> None:
        try:
            slot = self._slot.get(r, UNKNOWN_HOLDER)
        except TypeError:
            slot = self._holder(r)  # raises InvalidArgument
        new = slot == UNKNOWN_HOLDER
        if new:
            slot = self._new_holder_slot(r)
        if not self._one["open_holder"](self.B, self.M, self.H, self.K, self.X, slot):
            if new:
                self._forget_holder(r)
            self._refuse("open_holder", r=r)

    def close_holder(self, r: Hashable) -> None:
        try:
            slot = self._slot.get(r, UNKNOWN_HOLDER)
        except TypeError:
            slot = self._holder(r)  # raises InvalidArgument
        if not self._one["close_holder"](self.B, self.M, self.H, self.K, self.X, slot):
            self._refuse("close_holder", r=r)
        if slot != UNKNOWN_HOLDER:
            self._forget_holder(r)

    def _forget_holder(self, r: Hashable) -> None:
        slot = self._slot.pop(r)
        H = self.H
        H[0, slot] = H[1, slot] = 0
        self._free_slots.append(slot)

    # ---- batches ---------------------------------------------------------------------------------
    def take_many(self, r: Hashable, n: int) -> np.ndarray:
        """``BlockPool.take_many``: n blocks from the queue's head for holder r, evicting
        cached heads on the way (LRU order), as an int64 array; the blocks taken before a
        refused one stay taken. The caller checks ``usable()`` first (an exhausted queue is an
        ``AssertionError``, as there)."""
        if type(n) is not int or n < 0:
            n = check_count(n, "n (blocks taken)")
        try:
            slot = self._slot.get(r, UNKNOWN_HOLDER)
        except TypeError:
            slot = self._holder(r)  # raises InvalidArgument
        if self.M.item(_KEYS_USED) + n > self._keys_half:
            self._room_for_keys(n)
        out = np.empty(n, _INT64)
        found = self._take_many(self.B, self.M, self.H, self.K, self.X, slot, n, out,
                                self._scratch)
        if found[1] or found[4] or self.checked:  # evictions, a stop, or checks to run
            return self._taken(r, slot, n, out, found)
        return out

    def _taken(self, r: Hashable, slot: int, n: int, out: np.ndarray,
               found: tuple[int, int, int, int, int]) -> np.ndarray:
        """``take_many`` past its first native call's answer ``found``: the evicted digests
        forgotten, the touched blocks checked, the rest taken after the scratch rows grew,
        or the refusal raised."""
        S, done = self._scratch, 0
        while True:  # once, unless the scratch rows fill (evictions): grown, then the rest
            taken, nev, nt, refused, status = found
            done += taken
            if nev:
                self._release_hashes(S[1, :nev])
            if self.checked:
                self._check_touched("take_many", S[2], nt)
            if not status:
                return out
            if status != self.mod.TAKE_SCRATCH_FULL:
                break
            S = self._scratch_for(2 * S.shape[1])
            found = self._take_many(self.B, self.M, self.H, self.K, self.X, slot, n - done,
                                    out[done:], S)
        if status == self.mod.TAKE_EXHAUSTED:
            raise AssertionError("take_many() on an exhausted pool")
        evict = status == self.mod.TAKE_EVICT_REFUSED
        self._refuse("evict" if evict else "allocate", b=refused, **({} if evict else {"r": r}))
        return out[:done]  # pragma: no cover - _refuse raises

    def take(self, r: Hashable) -> int:
        """``BlockPool.take``: the queue's head for holder r (evicting cached heads on the
        way), as ``take_many(r, 1)`` does, returned as an int (no array is made)."""
        try:
            slot = self._slot.get(r, UNKNOWN_HOLDER)
        except TypeError:
            slot = self._holder(r)
        if self.M.item(_KEYS_USED) >= self._keys_half:
            self._room_for_keys(1)
        out = self._one_block
        found = self._take_many(self.B, self.M, self.H, self.K, self.X, slot, 1, out,
                                self._scratch)
        if found[1] or found[4] or self.checked:
            self._taken(r, slot, 1, out, found)
        return out.item(0)

    def release(self, b: int, r: Hashable) -> None:
        """``BlockPool.release(b, r)``: ``release_many(r, [b])`` without a list."""
        if type(b) is not int or not 0 <= b < self.num_blocks:
            self.release_many(r, [b])  # InvalidArgument, saying why
            return
        one = self._one_block
        one[0] = b
        try:
            slot = self._slot.get(r, UNKNOWN_HOLDER)
        except TypeError:
            slot = self._holder(r)
        done, nret = self._release_many(self.B, self.M, self.H, self.K, self.X, slot, one, 1,
                                        self._scratch)
        if nret or not done or self.checked:
            self._released(r, one, done, nret)

    def release_many(self, r: Hashable, blocks: object) -> None:
        """``BlockPool.release(b, r)`` for each block in order: at ref 0 a REFERENCED block is
        cached (the queue's tail), any other is reclaimed and recycled once no launch that
        may read it is in flight. A refused block raises its guard's error (``DoubleFree``);
        the blocks before it stay released."""
        bs, slot, S = self._releasing(r, blocks)
        n = len(bs)
        done, nret = self._release_many(self.B, self.M, self.H, self.K, self.X, slot, bs,
                                        n, S)
        if nret or done < n or self.checked:
            self._released(r, bs, done, nret)

    def _releasing(self, r: Hashable, blocks: object) -> tuple[np.ndarray, int, np.ndarray]:
        """A release loop's arguments: the block ids as an int64 vector, holder r's slot
        (``InvalidArgument`` for an unhashable r), scratch rows for as many blocks."""
        if type(blocks) is np.ndarray and blocks.dtype is _INT64 and blocks.ndim == 1:
            bs = blocks
        else:
            bs = self._ids(blocks)
        try:
            slot = self._slot.get(r, UNKNOWN_HOLDER)
        except TypeError:
            slot = self._holder(r)  # raises InvalidArgument
        S = self._scratch
        if S.shape[1] < len(bs):
            S = self._scratch_for(len(bs))
        return bs, slot, S

    def _released(self, r: Hashable, bs: np.ndarray, done: int, nret: int) -> None:
        """``release_many`` past its native call: the retired blocks queued at the current
        clock, the released ones checked, the refusal raised."""
        if nret:
            stamp = int(self.M[CLOCK0 + ISSUED])
            self.retire_queue.extend(zip(itertools.repeat(stamp), self._scratch[0, :nret].tolist()))
        if self.checked:
            self._check_touched("release", bs, done)
        if done < len(bs):
            self._refuse("release", b=int(bs[done]), r=r)

    def share_many(self, r: Hashable, blocks: object) -> None:
        """``BlockPool.share(b, r)`` for each block in order (a prefix hit or a fork: a CACHED
        block is revived and leaves the queue); stops at the first refusal, as
        ``release_many``."""
        bs = self._ids(blocks)
        slot = self._holder(r)
        self._room_for_keys(len(bs))
        done = self._loops.share_many(self.B, self.M, self.H, self.K, self.X, slot, bs, len(bs))
        self._check_touched("share", bs, done)
        if done < len(bs):
            self._refuse("share", b=int(bs[done]), r=r)

    def share_prefix(self, r: Hashable, hashes: Sequence[int]) -> np.ndarray:
        """``share_many(r, prefix_hits(hashes))`` in one native loop: the blocks registered
        under the leading hashes, up to the first that is not, each shared for holder r (an
        admission's prefix hits: revived if cached), as an int64 array. Stops at the first
        refused share (raised; the blocks before it stay shared)."""
        slot = self._holder(r)
        slots, matched = self._prefix_slots(hashes)
        if slots is None:
            return _NONE
        n = len(slots)
        self._room_for_keys(n)
        out = np.empty(n, _INT64)
        k, done = self._loops.share_prefix(self.B, self.M, self.H, self.K, self.X, slot, slots,
                                           n, out)
        self._memos.learn(hashes, slots, k, matched)
        if self.checked:
            self._check_touched("share", out, done)
        if done < k:
            self._refuse("share", b=int(out[done]), r=r)
        return out[:k]

    def admit(self, r: Hashable, hashes: Sequence[int], n: int) -> tuple[np.ndarray, int]:
        """``BlockPool.admit`` in one native loop: holder r opened, the blocks registered under
        the leading ``hashes`` shared for it, then blocks taken (evicting cached heads on the
        way) to make ``n`` in all. Returns the n blocks as an int64 array, the hits first,
        and how many are hits. Refused with nothing changed: ``n`` not a count, or fewer than
        the hashes (``InvalidArgument``); too few blocks usable (``OutOfBlocks``); r open
        already (the guard's error). A refused share raises, the shares before it staying."""
        if type(n) is not int or n < 0:
            n = check_count(n, "n (blocks)")
        try:
            slot = self._slot.get(r, UNKNOWN_HOLDER)
        except TypeError:
            slot = self._holder(r)  # raises InvalidArgument
        check_admission(hashes, n)
        slots, matched = self._prefix_slots(hashes)
        if slots is None:
            slots = _NONE
        new = slot == UNKNOWN_HOLDER
        if new:
            slot = self._new_holder_slot(r)
        if self.M.item(_KEYS_USED) + n > self._keys_half:
            self._room_for_keys(n)
        out = np.empty(n, _INT64)
        status, k, shared, *found = self._loops.admit(
            self.B, self.M, self.H, self.K, self.X, slot, slots, len(slots), n, out,
            self._scratch)
        if k:
            self._memos.learn(hashes, slots, k, matched)
        mod = self.mod
        if status == mod.ADMIT_TAKEN:
            if self.checked:
                self._check_touched("share", out, shared)
            if found[1] or found[4] or self.checked:  # evictions, a stop, or checks to run
                self._taken(r, slot, n - k, out[k:], tuple(found))
            return out, k
        if new and status != mod.ADMIT_SHARE_REFUSED:
            self._forget_holder(r)
        if status == mod.ADMIT_NO_ROOM:
            raise OutOfBlocks(n - k, shared, self.waiting())
        if status == mod.ADMIT_OPEN_REFUSED:
            self._refuse("open_holder", r=r)
        self._check_touched("share", out, shared)
        self._refuse("share", b=int(out[shared]), r=r)
        return out, k  # pragma: no cover - _refuse raises

    def finish(self, r: Hashable, blocks: object) -> None:
        """``BlockPool.finish`` in one native loop: each block released for holder r, in
        order, then r closed. A refused release raises (``DoubleFree``), the releases before
        it staying and r open; so does a refused close (r holds blocks still)."""
        bs, slot, S = self._releasing(r, blocks)
        n = len(bs)
        done, nret, closed = self._loops.finish(self.B, self.M, self.H, self.K, self.X, slot,
                                                bs, n, S)
        if nret or done < n or self.checked:
            self._released(r, bs, done, nret)
        if not closed:
            self._refuse("close_holder", r=r)
        self._forget_holder(r)

    def _run(self, name: str, bs: np.ndarray, r: Hashable | None = None,
             extra: np.ndarray | None = None) -> None:
        """Spec transition ``name`` on each block of ``bs`` in order (its parameters: the
        block, then holder r, then ``extra``'s values), stopping at the first refusal (raised;
        the blocks before it stay applied)."""
        params = self.spec[name].params
        n = len(bs)
        P = np.empty((len(params), n), np.int64)
        P[0] = bs
        if r is not None:
            try:
                P[1] = self._slot.get(r, UNKNOWN_HOLDER)
            except TypeError:
                P[1] = self._holder(r)
        if extra is not None:
            P[2] = extra
        done = self._runs[name](self.B, self.M, self.H, self.K, self.X, P, n)
        if self.checked:
            self._check_touched(name, bs, done)
        if done < n:
            args = {p: int(P[i, done]) for i, p in enumerate(params)}
            if r is not None:
                args["r"] = r
            if "h" in args:
                args["h"] = self._table.digest(args["h"])
            self._refuse(name, **args)

    def _each(self, name: str, loop: Any, bs: np.ndarray, r: Hashable, *rest: int) -> None:
        """Spec transition ``name`` on each block of ``bs`` in order for holder r, its other
        parameters ``rest`` the same for every block (``loop``: its ``each_<name>``),
        stopping at the first refusal (raised; the blocks before it stay applied)."""
        try:
            slot = self._slot.get(r, UNKNOWN_HOLDER)
        except TypeError:
            slot = self._holder(r)
        n = len(bs)
        done = loop(self.B, self.M, self.H, self.K, self.X, bs, n, slot, *rest)
        if self.checked:
            self._check_touched(name, bs, done)
        if done < n:
            self._refuse(name, **dict(zip(self.spec[name].params, (int(bs[done]), r, *rest),
                                          strict=True)))

    def publish_many(self, r: Hashable, blocks: object) -> None:
        self._each("publish", self._loops.each_publish, _block_ids(blocks), r)

    def begin_write_many(self, r: Hashable, blocks: object, slots: int | object) -> None:
        """A launch through r's table writes ``slots`` slots (one count, or one per block) of
        each block."""
        bs = _block_ids(blocks)
        if type(slots) is int or (isinstance(slots, int | np.integer)
                                  and not isinstance(slots, bool | np.bool_)):
            ws = check_count(slots, "slots", self.block_size)
            self._each("begin_write", self._loops.each_begin_write, bs, r, ws)
            return
        counts = self._ids(slots, "slots")
        if len(counts) != len(bs):
            raise InvalidArgument(f"{len(counts)} slot counts for {len(bs)} blocks")
        self._run("begin_write", bs, r, counts)

    def end_write_many(self, blocks: object) -> None:
        """The launch that wrote each block completed; a reclaimed block is recycled if it
        can be now."""
        bs = _block_ids(blocks)
        done = self._loops.end_write_many(self.B, self.M, self.H, self.K, self.X, bs, len(bs))
        if self.checked:
            self._check_touched("end_write", bs, done)
        if done < len(bs):
            self._refuse("end_write", b=int(bs[done]))

    def commit_many(self, r: Hashable, blocks: object, hashes: Sequence[int]) -> None:
        """Each full, written block becomes REFERENCED under its hash (a prefix hit from
        now on)."""
        bs = _block_ids(blocks)
        hashes = _ordered(hashes, "hashes")
        if len(hashes) != len(bs):
            raise InvalidArgument(f"commit_many needs one hash per block: {len(hashes)} "
                                  f"hashes for {len(bs)} blocks")
        slots = self._hash_slots(hashes)
        try:
            self._run("commit", bs, r, slots)
        except BaseException:
            self._release_hashes(slots)  # the digest of a refused (or unrun) commit goes
            raise

    def cache_many(self, r: Hashable, blocks: object, hashes: Sequence[int]) -> None:
        """Commit each block under its hash, for holder r, where caching it is due (the
        spec's ``cache_due``: the block is PUBLISHED and no block is registered under the
        hash yet; vLLM's ``cache_full_blocks``), in order: a request's full blocks once the
        launch that wrote them completed, whether or not an earlier request cached the same
        content. Stops at the first due block whose ``commit`` is refused (raised; the
        commits before it stay)."""
        bs = _block_ids(blocks)
        hashes = _ordered(hashes, "hashes")
        n = len(bs)
        if len(hashes) != n:
            raise InvalidArgument(f"cache_many needs one hash per block: {len(hashes)} "
                                  f"hashes for {n} blocks")
        slot = self._holder(r)
        if not n:  # (a request whose full blocks were all hits: nothing is due)
            return
        slots = self._hash_slots(hashes)
        failed, unregistered = self._loops.cache_many(self.B, self.M, self.H, self.K, self.X,
                                                      slot, bs, slots, n)
        try:
            if self.checked:
                self._check_touched("commit", bs, n if failed < 0 else failed)
            if failed >= 0:
                self._refuse("commit", b=int(bs[failed]), r=r, h=hashes[failed])
        finally:
            if unregistered:
                self._release_hashes(slots)  # the digests of the blocks not committed go

    def rewind(self, b: int, r: Hashable, k: int) -> None:
        self._run("rewind", self._ids([b]), r, check_count(k, "k (slots kept)", self.block_size))

    # ---- the launch clock ------------------------------------------------------------------------
    def launch(self) -> int:
        """Number the next launch (it may read every block held now); returns its number."""
        self._room_for_launch()
        L = int(self.M[CLOCK0 + ISSUED])
        self._clock_step("launch", L)
        return L

    def complete(self, L: int) -> None:
        self._clock_step("complete", check_count(L, "launch number"))

    def advance_watermark(self) -> int:
        """Advance the watermark past every completed launch below the oldest one in flight
        (one native loop of the spec's ``advance``), then drain the retire queue up to it
        (``BlockPool.advance_watermark`` drains at each step: the same blocks, in the same
        order, as the queue's stamps increase)."""
        n = self.mod.advance_while(self.B, self.M, self.H, self.K, self.X)
        if n:
            self._check_clock("advance", None)
            self._drain()
        return n

    def _drain(self) -> None:
        if not self.retire_queue:  # (a step's launch that freed nothing while in flight)
            return
        q, retire, state = self.retire_queue, self.B[ROW["retire"]], self.B[ROW["state"]]
        watermark = self.M[CLOCK0 + WATERMARK]
        reclaimed: list[int] = []
        while q and q[0][0] <= watermark:
            stamp, b = q.popleft()
            if retire[b] != stamp:
                continue
            if state[b] == CACHED:
                self.M[ns.CACHED_BUSY] -= 1
            elif state[b] == RECLAIMED:
                reclaimed.append(b)
        if reclaimed:
            bs = np.array(reclaimed, np.int64)
            self.mod.recycle_where(self.B, self.M, self.H, self.K, self.X, bs, len(bs))
            self._check_touched("recycle", bs, len(bs))

    # ---- reads -----------------------------------------------------------------------------------
    def lookup(self, h: int) -> int | None:
        """The block registered under digest h, or None."""
        b = self.X.item(self._slot_of(h))  # (a Python int, without a NumPy scalar)
        return None if b == NO_BLOCK else b

    def lookup_many(self, hashes: Sequence[int]) -> np.ndarray:
        """The block registered under each hash (``NO_BLOCK``, -1, where none), as an int64
        array: the digests found in the native table, then one vectorized read of the hash
        map."""
        return self.X[self._slots_of(hashes)]

    def _tail_slots(self, hashes: list[int]) -> Sequence[int]:
        """``_slots_of`` for the few digests past a prefix memo: a list where the dict
        is complete (no array made for them)."""
        if self._known_complete:
            return list(map(self._known.get, hashes, itertools.repeat(0)))
        return self._slots_of(hashes)

    def _slots_of(self, hashes: Sequence[int]) -> np.ndarray:
        """The hash slot of each digest (slot 0, naming no block, where it is not interned)."""
        try:
            slots = np.fromiter(map(self._known.get, hashes, itertools.repeat(0)), _INT64,
                                len(hashes))
            if self._known_complete or slots.all():
                return slots
            if not (all_ints(hashes) and min(hashes) > NO_HASH and max(hashes) <= MAX_HASH):
                return np.fromiter(map(self._slot_of, hashes), _INT64, len(hashes))
            new = np.flatnonzero(slots == 0)
            more = [hashes[i] for i in new.tolist()]
            slots[new] = found = self._table.find(self._words_of(more))
            self._remember(more, found.tolist())
            return slots
        except (TypeError, InvalidArgument):
            raise InvalidArgument("hashes must be a sequence of hashable digests") from None

    def prefix_hits(self, hashes: Sequence[int]) -> np.ndarray:
        """The blocks of the leading hashes that are registered, up to the first that is not
        (what an admission shares: a prefix hit stops at the first miss)."""
        return self._leading(hashes)[0]

    def misses(self, h: int) -> bool:
        """Whether no block is registered under the digest h (an int: no check)."""
        return self.X.item(self._slot_of(h)) == NO_BLOCK

    def _prefix_slots(self, hashes: Sequence[int]) -> tuple[np.ndarray | None, int]:
        """The hash slots of ``hashes`` (None where the first names no block), and how many
        leading ones a prefix memo gave (``prefix_memo``: a list that starts with a memo's
        digests). The first digest is read alone: where it misses (a request sharing no
        prefix), none of the rest is."""
        try:
            if not len(hashes):
                return None, 0
            if type(hashes) is list and self._memos.by_first:
                found = self._memos.slots(hashes, self._tail_slots)
                if found is not None:
                    slots, matched = found
                    return (None if self.X.item(slots.item(0)) == NO_BLOCK else slots), matched
            if self._known_complete:
                first = self._known.get(hashes[0], 0)
            else:
                first = self._slot_of(hashes[0])
        except (TypeError, ValueError, InvalidArgument):
            raise InvalidArgument("hashes must be a sequence of hashable digests") from None
        if self.X[first] == NO_BLOCK:
            return None, 0
        return self._slots_of(hashes), 0

    def _leading(self, hashes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``prefix_hits``, and the hash slots of the blocks found (``_prefix_slots``)."""
        slots, matched = self._prefix_slots(hashes)
        if slots is None:
            return _NONE, _NONE
        n = len(slots)
        out = np.empty(n, _INT64)
        k = self._loops.registered_prefix(self.X, slots, n, out)
        self._memos.learn(hashes, slots, k, matched)
        return out[:k], slots[:k]

    def usable(self) -> int:
        item = self.M.item  # (Python ints: no NumPy scalar arithmetic)
        return item(COUNT0 + FREE) + item(COUNT0 + CACHED) - item(ns.CACHED_BUSY)

    def waiting(self) -> int:
        return int(self.M[COUNT0 + RECLAIMED] + self.M[ns.CACHED_BUSY])

    @property
    def cached_busy(self) -> int:
        return int(self.M[ns.CACHED_BUSY])

    def queue_order(self) -> list[int]:
        out = np.empty(self.num_blocks, np.int64)
        return out[:self.mod.q_order(self.B, out)].tolist()

    def held_by(self, r: Hashable) -> set[int]:
        slot = self._holder(r)
        if slot == UNKNOWN_HOLDER:
            return set()
        out = np.empty(self.num_blocks, np.int64)  # its keys are distinct blocks of the pool
        return set(out[:self.mod.holder_blocks(self.K, slot, out)].tolist())

    # ---- the spec's state, and loading one -------------------------------------------------------
    def storage(self) -> PoolStorage:
        """This pool's contents as a list-based ``PoolStorage`` (what ``BlockPool`` keeps;
        O(pool)): for comparisons, ``abstract()`` and the interpreted spec."""
        p = PoolStorage(self.num_blocks, self.block_size)
        n = self.num_blocks
        for f in ROW:
            if f in ("prev", "next"):
                continue
            values = self.B[ROW[f], :n].tolist()
            if f == "hash":
                digest = self._table.digest
                values = [digest(s) if s else NO_HASH for s in values]
            elif f in ("init", "queued"):
                values = [bool(v) for v in values]
            getattr(p, f)[:] = values
        p.queue._next[:] = self.B[ROW["next"]].tolist()
        p.queue._prev[:] = self.B[ROW["prev"]].tolist()
        p.queue.length = int(self.M[ns.QLEN])
        p.count[:] = self.M[COUNT0:COUNT0 + CLOCK0].tolist()
        p.clock[:] = self.M[CLOCK0:CLOCK0 + 2].tolist()
        p.hmap.update({d: int(self.X[s]) for d, s in self._table.items()
                       if self.X[s] != NO_BLOCK})
        p.inflight.update(self.launches())
        for r, slot in self._slot.items():
            if self.H[0, slot]:
                p.held[r] = self.held_by(r)
        return p

    def abstract(self) -> PoolState:
        return self.storage().abstract()

    def load(self, p: PoolStorage) -> None:
        """Replace this pool's contents with p's (same geometry; p's holders, hashes, queue
        links and launches in flight). For the self-check and tests."""
        if (p.num_blocks, p.block_size) != (self.num_blocks, self.block_size):
            raise InvalidArgument("load needs a storage of the same geometry")
        self._setup(self.num_blocks, self.block_size)
        for r in p.held:
            self._new_holder_slot(r)
        B, n = self.B, self.num_blocks
        for f in ROW:
            if f in ("prev", "next", "hash", "queued"):
                continue
            B[ROW[f], :n] = getattr(p, f)
        B[ROW["queued"], :n] = p.queued
        B[ROW["next"]] = p.queue._next
        B[ROW["prev"]] = p.queue._prev
        digests = sorted({h for h in (*p.hash, *p.hmap) if h != NO_HASH})
        for h in digests:
            self._hash_slot(h)
        B[ROW["hash"], :n] = [self._slot_of(h) for h in p.hash]
        for h, b in p.hmap.items():
            if h != NO_HASH:
                self.X[self._slot_of(h)] = b
        self.M[COUNT0:COUNT0 + CLOCK0] = p.count
        self.M[CLOCK0:CLOCK0 + 2] = p.clock
        self.M[ns.QLEN] = p.queue.length
        for L in sorted(p.inflight):
            self._room_for_launch()
            self.mod.add_launch(self.M, L)
        self._room_for_keys(sum(len(bs) for bs in p.held.values()))
        for r, bs in p.held.items():
            slot = self._slot[r]
            self.H[0, slot] = 1
            self.H[1, slot] = len(bs)
            for b in bs:
                self.mod.add_key(self.K, self.M, slot, b)

    def structure_errors(self) -> list[tuple[str, str]]:
        """What the spec abstracts away, scanned: the holders' counts against the holds set,
        the holds set's key count and load, then ``BlockPool.structure_errors`` on a mirror
        of this pool (its contents, queue links, busy count and retire queue copied): the
        queue's links and flags, the busy count, ``usable()`` against the spec's
        ``takeable``, the retire queue."""
        p = self.storage()
        errors = [("holders_consistent", f"nheld of {r!r} is {self.H[1, slot]}, holds "
                                         f"{len(p.held[r])}")
                  for r, slot in self._slot.items()
                  if self.H[0, slot] and self.H[1, slot] != len(p.held[r])]
        keys = int((self.K >= 0).sum())
        if keys != self.M[_KEYS_USED] or 2 * keys > len(self.K):
            errors.append(("holds_set", f"{keys} keys in {len(self.K)} cells, counted "
                                        f"{self.M[_KEYS_USED]} (at most half full)"))
        mirror = BlockPool(self.num_blocks, self.block_size, checked=False, spec=self.spec)
        mirror.copy_from(p)
        mirror.queue._next[:], mirror.queue._prev[:] = p.queue._next, p.queue._prev
        mirror.queue.length = p.queue.length
        mirror.cached_busy = self.cached_busy
        mirror.retire_queue.extend(self.retire_queue)
        if self._known_complete and self._known != dict(self._table.items()):
            errors.append(("digest_table", "the digests met by value differ from the table's"))
        errors += [("digest_table", e) for e in self._memos.errors(self._table.slot_of)]
        return errors + self._table.structure_errors() + mirror.structure_errors()


# ---- the self-check: generated code against the interpreted spec -------------------------------
_PROBE_VALUES = {"b": (-1, *_PROBE_BY_KIND["block"], 6), "r": _PROBE_BY_KIND["holder"],
                 "w": _PROBE_BY_KIND["slots"], "k": _PROBE_BY_KIND["slots"],
                 "h": _PROBE_BY_KIND["hash"], "L": (-1, *_PROBE_BY_KIND["launch"], 5)}


def _bare(mod: ModuleType, p: PoolStorage) -> NativePool:
    pool = NativePool.__new__(NativePool)
    pool.spec, pool.mod, pool.checked = TRANSITIONS, mod, False
    pool._setup(p.num_blocks, p.block_size)
    pool.load(p)
    return pool


def _same(pool: NativePool, want: PoolStorage, nheld: dict[Any, int]) -> bool:
    """pool's contents are want's, its holders' counts ``nheld`` (the spec's, which a set's
    size cannot always show: a weakened guard may release a block the holder does not
    hold)."""
    got = pool.storage()
    fields = ("state", "ref", "retire", "wpend", "filled", "gen", "init", "hash", "queued",
              "count", "clock", "held", "inflight")
    nheld_ok = all(pool.H[1, s] == nheld[r] for r, s in pool._slot.items())
    hmap_ok = got.hmap == {h: b for h, b in want.hmap.items() if b != NO_BLOCK}
    return nheld_ok and hmap_ok and all(getattr(got, f) == getattr(want, f) for f in fields)


def self_check(mod: ModuleType, spec: Mapping[str, Transition],
               rules: tuple[Any, Any] | None = None) -> str | None:
    """None if every generated transition agrees with the interpreted spec on the probe
    states (each parameter tuple: refused exactly where the guard fails, changing nothing,
    else the spec's post-state; ``one_<name>`` making ``run_<name>``'s move), and the fused
    invariants with the interpreted ones; else what disagreed."""
    for name in ns.NATIVE:
        t = spec[name]
        run = getattr(mod, f"run_{name}")
        one = getattr(mod, f"one_{name}") if name in ns.ONE else None
        combos = list(itertools.product(*(_PROBE_VALUES[x] for x in t.params)))
        for pre in _effect_probe_pools(t):
            pool = _bare(mod, pre)
            for r in _PROBE_VALUES["r"]:  # every probe holder and hash has its slot first
                pool._slot.get(r) or pool._new_holder_slot(r)
            for h in _PROBE_VALUES["h"]:
                pool._hash_slot(h)
            arrays = [a.copy() for a in (pool.B, pool.M, pool.H, pool.K, pool.X)]
            for combo in combos:
                kw = dict(zip(t.params, combo, strict=True))
                want = PoolStorage(pre.num_blocks, pre.block_size)
                want.copy_from(pre)
                for mine, saved in zip((pool.B, pool.M, pool.H, pool.K, pool.X), arrays,
                                       strict=True):
                    mine[...] = saved  # back to pre (the slots and sizes are unchanged)
                col = [pool._slot[v] if p == "r" else pool._slot_of(v) if p == "h"
                       else v for p, v in kw.items()]
                P = np.array(col, np.int64).reshape(len(col), 1)
                ran = run(pool.B, pool.M, pool.H, pool.K, pool.X, P, 1) == 1
                if one is not None:  # the same transition once, on scalars: the same move
                    mine = (pool.B, pool.M, pool.H, pool.K, pool.X)
                    after = [a.copy() for a in mine]
                    for a, saved in zip(mine, arrays, strict=True):
                        a[...] = saved
                    if one(*mine, *col) != ran or not all(
                            np.array_equal(a, b) for a, b in zip(mine, after, strict=True)):
                        return f"one_{name}{combo}: not run_{name}'s move"
                in_pool = all(0 <= v < pre.num_blocks for p, v in kw.items() if p == "b")
                allowed = in_pool and bool(t.guard(CONCRETE, want.view, **kw))
                if ran != allowed:
                    return f"{name}{combo}: native {'ran' if ran else 'refused'}"
                post = t.effect(CONCRETE, want.view, **kw) if allowed else want.view
                nheld = {r: int(post.nheld[r]) for r in pool._slot}
                if allowed:
                    want.write(post, kw.get("r"), kw.get("b"))
                if not _same(pool, want, nheld):
                    return f"{name}{combo}: the post-states differ"
    invs = local_invariants()
    for pre in _probe_pools():
        pool = _bare(mod, pre)
        for b in range(pre.num_blocks):
            want = tuple(bool(inv.pred(CONCRETE, pre.view,
                                       b if inv.scope == "block" else pre.hash[b]))
                         for inv in invs)
            if tuple(mod.each(pool.B, pool.M, pool.H, pool.K, pool.X, b)) != want:
                return f"local invariants at block {b}"
        for L in _PROBE_VALUES["L"]:
            want = tuple(bool(inv.pred(CONCRETE, pre.view, *(() if inv.scope == "pool"
                                                               else (L,))))
                         for inv in clock_invariants())
            if tuple(mod.clock_each(pool.B, pool.M, pool.H, pool.K, pool.X, L)) != want:
                return f"clock invariants at launch {L}"
    return _rules_disagree(mod, rules)


def _rules_disagree(mod: ModuleType, rules: tuple[Any, Any] | None) -> str | None:
    """What of the generated request rules disagrees with the interpreted ones, or None:
    ``commit_bounds`` on every count up to two blocks and one position at block sizes 1 and 3
    (as ``compiled.position_rule`` is checked), ``slots_written`` at every block of the probe
    pools for every k up to a block and one, the spec's ``takeable`` at every block, and its
    ``cache_due`` at every block with every registered hash and two unregistered ones."""
    commit_bounds, slots_written = rules or (REQUEST_SPEC.commit_bounds,
                                             REQUEST_SPEC.slots_written)
    for Bsz in (1, 3):
        for counts in itertools.product(range(2 * Bsz + 2), repeat=3):
            want = tuple(bool(c) for c in commit_bounds(
                CONCRETE, *(divmod(c, Bsz) for c in counts)))
            if tuple(mod.rule_commit_bounds(Bsz, *counts)) != want:
                return f"commit_bounds{counts} at block size {Bsz}"
    for pre in _probe_pools():
        pool = _bare(mod, pre)
        arrays = (pool.B, pool.M, pool.H, pool.K, pool.X)
        for b in range(pre.num_blocks):
            for k in range(pre.block_size + 2):
                want = bool(slots_written(CONCRETE, pre.view, b, k))
                if mod.g_slots_written(*arrays, b, k) != want:
                    return f"slots_written({b}, {k})"
            if mod.g_takeable(*arrays, b) != bool(takeable(CONCRETE, pre.view, b)):
                return f"takeable({b})"
            for h in (*pre.hmap, NO_HASH, MAX_HASH):  # registered, none, one never seen
                slot = pool._slot_of(h)
                if mod.g_cache_due(*arrays, b, slot) != bool(cache_due(CONCRETE, pre.view, b, h)):
                    return f"cache_due({b}, {h})"
    return None
