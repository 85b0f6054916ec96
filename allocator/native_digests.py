"""The prefix cache's digests interned natively: a table from 256-bit block digests to slots.

The native pool names a digest by a hash slot (``B``'s hash row and the map ``X``, slot to
block, hold slots); this table interns digests into slots and forgets them. A digest is kept
as four int64 words (its 32 big-endian bytes, read in the machine's order: only compared);
the words of slot ``s`` are ``W[s]`` (all zero for a free slot: no digest is zero, a zero
sha256 stands for 1). The index ``IX`` is open addressing with linear probing over a power
of two of cells, at most half of them used, each holding a slot or 0 (empty); a digest's home
cell is its first word modulo the cell count (sha256 output: uniform), and a removal shifts
the cells after it back (no tombstones). Free slots are a stack (``FREE``, its height in
``DM[FREE_TOP]``); each interning takes the next stamp (``DM[STAMP]``) into ``G[slot]``.

What runs natively here is what a step's calls need without a Python int per digest:
interning the digests of a commit's filled blocks straight from a per-request digest matrix
(``intern_rows``), forgetting the digests of evicted blocks (``forget``), a waiting request's
leading hits from its row (``leading_in_row``). ``DigestTable`` wraps the arrays and serves
the digest API of ``NativePool`` (ints) through the same loops.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numba
import numpy as np

from pagedkv.spec import NO_BLOCK

from .hashing import digest_bytes
from .native_entry import I64, MAT, VEC, entry

FREE_TOP, STAMP, LIVE = 0, 1, 2  # DM's fields
WORDS = 4
_WORDS_DTYPE = np.dtype(np.int64)


@numba.njit(cache=True)
def _find(W, IX, a, b, c, d):
    """The slot of the digest with words ``a b c d``, or 0."""
    mask = len(IX) - 1
    p = a & mask
    while True:
        s = IX[p]
        if s == 0:
            return 0
        if W[s, 0] == a and W[s, 1] == b and W[s, 2] == c and W[s, 3] == d:
            return s
        p = (p + 1) & mask


@numba.njit(cache=True)
def _place(W, IX, s):
    """Index slot ``s`` (its words set, not indexed yet)."""
    mask = len(IX) - 1
    p = W[s, 0] & mask
    while IX[p] != 0:
        p = (p + 1) & mask
    IX[p] = s


@numba.njit(cache=True)
def _intern(W, IX, FREE, DM, G, a, b, c, d):
    """The slot of the digest ``a b c d``, interned (a new stamp) if it was not; 0 if it
    was not and no slot is free (nothing changed)."""
    s = _find(W, IX, a, b, c, d)
    if s:
        return s
    top = DM[FREE_TOP]
    if top == 0:
        return 0
    top -= 1
    s = FREE[top]
    DM[FREE_TOP] = top
    W[s, 0], W[s, 1], W[s, 2], W[s, 3] = a, b, c, d
    _place(W, IX, s)
    DM[STAMP] += 1
    G[s] = DM[STAMP]
    DM[LIVE] += 1
    return s


@numba.njit(cache=True)
def _remove(W, IX, FREE, DM, s):
    """Forget slot ``s``'s digest: its cell emptied (the cells after it in its run shifted
    back where their home allows), its words zeroed, the slot free again."""
    mask = len(IX) - 1
    p = W[s, 0] & mask
    while IX[p] != s:
        p = (p + 1) & mask
    q = p
    while True:
        q = (q + 1) & mask
        t = IX[q]
        if t == 0:
            break
        home = W[t, 0] & mask
        stays = (p < home <= q) if p <= q else (home > p or home <= q)
        if not stays:
            IX[p] = t
            p = q
    IX[p] = 0
    W[s, 0] = W[s, 1] = W[s, 2] = W[s, 3] = 0
    FREE[DM[FREE_TOP]] = s
    DM[FREE_TOP] += 1
    DM[LIVE] -= 1


@numba.njit(cache=True)
def intern_words(W, IX, FREE, DM, G, words, n, out):
    """Intern ``words[:n]`` (a digest a row) into ``out``: n, or -1 where the free slots ran
    out first (those interned stay: the caller grows the table and calls again)."""
    for i in range(n):
        s = _intern(W, IX, FREE, DM, G, words[i, 0], words[i, 1], words[i, 2], words[i, 3])
        if s == 0:
            return -1
        out[i] = s
    return n


@numba.njit(cache=True)
def intern_rows(W, IX, FREE, DM, G, D, rows, filled, nf, out):
    """Intern the digests of a commit's filled blocks: for ``j < nf``, entries
    ``filled[1, j] .. filled[2, j] - 1`` of row ``rows[filled[0, j]]`` of the digest matrix
    ``D`` (rows, entries, words), in order, their slots into ``out``. Returns how many, or
    -1 where the free slots ran out (as ``intern_words``), -2 where ``out`` is too short
    (those interned stay: the caller calls again with a longer one)."""
    k = 0
    for j in range(nf):
        r = rows[filled[0, j]]
        for e in range(filled[1, j], filled[2, j]):
            if k == len(out):
                return -2
            s = _intern(W, IX, FREE, DM, G, D[r, e, 0], D[r, e, 1], D[r, e, 2], D[r, e, 3])
            if s == 0:
                return -1
            out[k] = s
            k += 1
    return k


@numba.njit(cache=True)
def find_words(W, IX, words, n, out):
    """The slot of each of ``words[:n]`` (0 where not interned) into ``out``."""
    for i in range(n):
        out[i] = _find(W, IX, words[i, 0], words[i, 1], words[i, 2], words[i, 3])


@numba.njit(cache=True)
def forget(W, IX, FREE, DM, X, slots, n, gone):
    """Forget the digest of each of ``slots[:n]`` that is interned and names no block in the
    map ``X`` (slot 0, a free slot and a repeated one are passed over): an eviction's, or a
    commit's not made. The slots forgotten go into ``gone`` (as long as ``slots``); returns
    how many."""
    k = 0
    for i in range(n):
        s = slots[i]
        if s <= 0 or X[s] != NO_BLOCK or (W[s, 0] == 0 and W[s, 1] == 0 and W[s, 2] == 0
                                          and W[s, 3] == 0):
            continue
        _remove(W, IX, FREE, DM, s)
        gone[k] = s
        k += 1
    return k


@numba.njit(cache=True)
def leading_in_row(W, IX, X, D, row, start, stop, slots, blocks):
    """A request's leading hits from its digests ``D[row, start:stop]``: the slot and block
    of each, in order, up to the first digest no block is registered under. Returns how
    many."""
    k = 0
    for e in range(start, stop):
        s = _find(W, IX, D[row, e, 0], D[row, e, 1], D[row, e, 2], D[row, e, 3])
        if s == 0 or X[s] == NO_BLOCK:
            break
        slots[k] = s
        blocks[k] = X[s]
        k += 1
    return k


@numba.njit(cache=True)
def reindex(W, IX):
    """Every interned slot of ``W`` indexed into the empty ``IX``."""
    for s in range(1, W.shape[0]):
        if W[s, 0] != 0 or W[s, 1] != 0 or W[s, 2] != 0 or W[s, 3] != 0:
            _place(W, IX, s)


_D3 = numba.types.Array(numba.types.int64, 3, "C")
_ANY = numba.types.Array(numba.types.int64, 1, "A")


class DigestLoops:
    """The table's loops as compiled entry points (made once per process)."""

    def __init__(self) -> None:
        self.intern_words = entry(intern_words, MAT, VEC, VEC, VEC, VEC, MAT, I64, VEC)
        self.intern_rows = entry(intern_rows, MAT, VEC, VEC, VEC, VEC, _D3, _ANY, MAT, I64,
                                 VEC)
        self.find_words = entry(find_words, MAT, VEC, MAT, I64, VEC)
        self.forget = entry(forget, MAT, VEC, VEC, VEC, VEC, _ANY, I64, VEC)
        self.leading_in_row = entry(leading_in_row, MAT, VEC, VEC, _D3, I64, I64, I64, VEC,
                                    VEC)
        self.reindex = entry(reindex, MAT, VEC)


_LOOPS: list[DigestLoops] = []


def loops() -> DigestLoops:
    if not _LOOPS:
        _LOOPS.append(DigestLoops())
    return _LOOPS[0]


def words_of(digests: Sequence[int]) -> np.ndarray:
    """Digests (ints in ``(0, 2**256)``) as a (n, 4) int64 matrix of their words."""
    return np.frombuffer(digest_bytes(digests), _WORDS_DTYPE).reshape(len(digests), WORDS)


def digest_of(words: np.ndarray) -> int:
    """The digest whose words these are."""
    return int.from_bytes(words.tobytes(), "big")


class DigestTable:
    """The arrays of the table (see the module docstring) for ``slots`` hash slots (slot 0
    names no digest), and the digest API over them. ``G`` (each slot's stamp) is the
    caller's, grown with the table (``grow``)."""

    def __init__(self, slots: int, stamp: int = 0) -> None:
        self.loops = loops()
        self.W = np.zeros((slots, WORDS), np.int64)
        self.IX = np.zeros(2 * slots, np.int64)
        self.FREE = np.zeros(slots, np.int64)
        self.FREE[:slots - 1] = np.arange(slots - 1, 0, -1)  # slot 1 on top
        self.DM = np.array([slots - 1, stamp, 0], np.int64)
        self._one = np.empty(1, np.int64)

    @property
    def slots(self) -> int:
        return len(self.W)

    @property
    def stamp(self) -> int:
        return int(self.DM[STAMP])

    def __len__(self) -> int:
        return int(self.DM[LIVE])

    def free_count(self) -> int:
        return int(self.DM[FREE_TOP])

    def grow(self) -> int:
        """Twice the slots (the new ones free, under the free ones already there); returns
        the new slot count."""
        old = len(self.W)
        self.W = np.concatenate([self.W, np.zeros_like(self.W)])
        top = int(self.DM[FREE_TOP])
        free = np.zeros(2 * old, np.int64)
        free[:old] = np.arange(2 * old - 1, old - 1, -1)
        free[old:old + top] = self.FREE[:top]
        self.FREE = free
        self.DM[FREE_TOP] = old + top
        self.IX = np.zeros(4 * old, np.int64)
        self.loops.reindex(self.W, self.IX)
        return 2 * old

    def find(self, words: np.ndarray) -> np.ndarray:
        """The slot of each row of ``words`` (0 where not interned)."""
        out = np.empty(len(words), np.int64)
        self.loops.find_words(self.W, self.IX, words, len(words), out)
        return out

    def slot_of(self, h: int) -> int:
        """The slot of digest ``h`` (an int in ``(0, 2**256)``), or 0."""
        self.loops.find_words(self.W, self.IX, words_of((h,)), 1, self._one)
        return self._one.item(0)

    def digest(self, slot: int) -> int:
        """The digest interned in ``slot`` (0 for none)."""
        return digest_of(self.W[slot])

    def items(self) -> Iterator[tuple[int, int]]:
        """(digest, slot) of each interned slot, by slot."""
        live = np.flatnonzero(self.W.any(axis=1))
        for s in live.tolist():
            yield digest_of(self.W[s]), s

    def structure_errors(self) -> list[tuple[str, str]]:
        """Where the arrays disagree: a live slot the index does not find, a free slot with
        words, the counts."""
        errors = []
        live = self.W.any(axis=1)
        if live[0]:
            errors.append(("digest_table", "slot 0 holds a digest"))
        top = int(self.DM[FREE_TOP])
        free = self.FREE[:top]
        if live[free].any() or len(set(free.tolist())) != top or 0 in free:
            errors.append(("digest_table", "a free slot holds a digest, or twice, or slot 0"))
        if int(live.sum()) != len(self) or top + len(self) != len(self.W) - 1:
            errors.append(("digest_table", "the live and free counts differ from the slots"))
        found = self.find(self.W)
        bad = np.flatnonzero(live & (found != np.arange(len(self.W))))
        if bad.size:
            errors.append(("digest_table", f"slot {int(bad[0])}'s digest is not found there"))
        if int(np.count_nonzero(self.IX)) != len(self):
            errors.append(("digest_table", "the index holds other than the live slots"))
        return errors


__all__ = ["DigestTable", "digest_of", "loops", "words_of"]
