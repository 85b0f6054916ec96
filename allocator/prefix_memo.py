"""The hash slots of the prefixes recent lookups found, read back by comparing digests.

A ``NativePool`` finds a digest's hash slot in a dict (``_known``): each 256-bit int is hashed
again on every lookup, and an admission looks up every full block of its prompt. A run of
admissions that share a system prompt looks up the same leading digests each time. A memo
keeps them, by their first digest, with their slots: a lookup whose list starts with a memo's
digests compares them with it as one list, at C speed, and reads their slots from it (a
quarter of the instructions of the dict's lookups and the conversion of their answers); the
digests past the memo are looked up as before.

A memo stays exact: its digests are interned (each was found registered by a lookup) and an
interned digest keeps its slot until it is forgotten, when the pool drops every memo naming
the slot (``forget``). It holds the prefix two lookups agree on: a lookup that matches less of
it truncates it to the part it matched; one that matches all of it and finds more registered
digests past it extends it by the part the previous such lookup found too (``pending``), so
each request's own blocks past a shared prompt never enter it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from .hashing import all_ints

MEMOS = 16  # memos kept (distinct first digests) before they are all dropped


@dataclasses.dataclass
class Memo:
    """Leading digests (plain ints) a lookup found registered, their hash slots (also as a
    set), and the digests past them that the last lookup matching them all found."""

    digests: list[int]
    slots: np.ndarray
    slot_set: set[int]
    pending: list[int]


def common_length(a: Sequence[object], b: Sequence[object]) -> int:
    """The length of the longest common prefix of lists a and b, by halving: each step
    compares one new slice as a list (about twice the shorter length in all)."""
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo], and they differ before hi + 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixMemos:
    """A pool's memos, by first digest. ``slots`` reads a lookup's leading slots from one,
    ``learn`` keeps what a lookup found, ``forget`` drops those naming freed slots."""

    def __init__(self) -> None:
        self.by_first: dict[int, Memo] = {}

    def slots(self, hashes: list[int], rest: Callable[[list[int]], Sequence[int]]
              ) -> tuple[np.ndarray, int] | None:
        """The hash slots of ``hashes`` (a non-empty list) and how many leading ones the memo
        of its first digest gave (``rest`` gives the others'), or None where no memo starts
        with it. A memo it matches only in part is truncated to that part. ``TypeError``
        where the first digest is unhashable, ``ValueError`` where an item's comparison has
        no truth value."""
        memo = self.by_first.get(hashes[0])
        if memo is None:
            return None
        n, m = len(hashes), len(memo.digests)
        if n >= m and hashes[:m] == memo.digests:
            k = m
        else:
            k = common_length(hashes, memo.digests)
            if not k:  # (equal to the first as a dict key, not as a list item)
                return None
            if k < m:
                _truncate(memo, k)
        out = np.empty(n, np.int64)
        out[:k] = memo.slots[:k]
        if k < n:
            out[k:] = rest(hashes[k:])
        return out, k

    def learn(self, hashes: Sequence[int], slots: np.ndarray, found: int, matched: int) -> None:
        """A lookup of ``hashes`` (their ``slots``) found the leading ``found`` registered,
        the first ``matched`` of them read from a memo. Without a memo of its first digest,
        the digests found become one (where they are plain ints of a list); past one it
        matched whole, the digests the last such lookup found too extend it, and the others
        wait for the next (``pending``)."""
        if not found or type(hashes) is not list:
            return
        memo = self.by_first.get(hashes[0])
        if memo is None:
            digests = hashes[:found]
            if all_ints(digests):
                if len(self.by_first) >= MEMOS:
                    self.by_first.clear()
                kept = slots[:found].copy()
                self.by_first[digests[0]] = Memo(digests, kept, set(kept.tolist()), [])
            return
        m = len(memo.digests)
        if matched != m or found <= m:
            return
        past = hashes[m:found]
        agreed = common_length(past, memo.pending)
        if agreed:
            more = slots[m:m + agreed]
            memo.digests = memo.digests + memo.pending[:agreed]
            memo.slots = np.concatenate((memo.slots, more))
            memo.slot_set.update(more.tolist())
            past = past[agreed:]
        memo.pending = past if all_ints(past) else []

    def forget(self, gone: list[int]) -> None:
        """Hash slots freed (their digests forgotten): every memo naming one goes."""
        stale = [first for first, memo in self.by_first.items()
                 if not memo.slot_set.isdisjoint(gone)]
        for first in stale:
            del self.by_first[first]

    def errors(self, slot_of: Callable[[int], int]) -> list[str]:
        """Each memo whose digests are not interned at its slots (``slot_of``: a digest's
        slot, 0 where none), or whose parts disagree."""
        return [f"the prefix memo of digest {first:#x} is stale"
                for first, memo in self.by_first.items()
                if not memo.digests or memo.digests[0] != first
                or not all_ints(memo.digests + memo.pending)
                or memo.slot_set != set(memo.slots.tolist())
                or [slot_of(h) for h in memo.digests] != memo.slots.tolist()]


def _truncate(memo: Memo, k: int) -> None:
    memo.digests = memo.digests[:k]
    memo.slots = memo.slots[:k].copy()
    memo.slot_set = set(memo.slots.tolist())
    memo.pending = []
