"""An intrusive doubly linked list over block ids: O(1) push, pop and unlink, no list.remove."""

from __future__ import annotations

from collections.abc import Iterator


class BlockQueue:
    """The eviction queue. Slot ``n`` is the sentinel; ``inq[b]`` says whether b is linked."""

    __slots__ = ("_prev", "_next", "inq", "_sentinel", "length")

    def __init__(self, num_blocks: int) -> None:
        n = num_blocks
        assert n >= 1
        self._sentinel = n
        # Initially every block is queued in id order: 0 at the head.
        self._next = list(range(1, n + 1)) + [0]
        self._prev = [n] + list(range(0, n - 1)) + [n - 1]
        self.inq = [True] * n
        self.length = n

    def head(self) -> int | None:
        b = self._next[self._sentinel]
        return None if b == self._sentinel else b

    def push_tail(self, b: int) -> None:
        last = self._prev[self._sentinel]
        self._next[last] = b
        self._prev[b] = last
        self._next[b] = self._sentinel
        self._prev[self._sentinel] = b
        self.inq[b] = True
        self.length += 1

    def push_head(self, b: int) -> None:
        first = self._next[self._sentinel]
        self._prev[first] = b
        self._next[b] = first
        self._prev[b] = self._sentinel
        self._next[self._sentinel] = b
        self.inq[b] = True
        self.length += 1

    def push_tail_many(self, blocks: list[int]) -> None:
        """``push_tail(b)`` for each b of ``blocks`` in order (none of them queued, each
        once): linked as one chain, O(len(blocks)) in one call."""
        self._push_chain(blocks, self._next, self._prev)

    def push_head_many(self, blocks: list[int]) -> None:
        """``push_head(b)`` for each b of ``blocks`` in order (none of them queued, each
        once): the last one ends at the head, as by single pushes."""
        self._push_chain(blocks, self._prev, self._next)

    def _push_chain(self, blocks: list[int], out: list[int], back: list[int]) -> None:
        """Link ``blocks`` one after another at the end ``back[sentinel]`` of the queue, where
        ``out`` points away from the sentinel's side: the tail with (next, prev), the head
        with the links' roles swapped."""
        if not blocks:
            return
        inq, sentinel = self.inq, self._sentinel
        end = back[sentinel]
        for b in blocks:
            out[end] = b
            back[b] = end
            inq[b] = True
            end = b
        out[end] = sentinel
        back[sentinel] = end
        self.length += len(blocks)

    def unlink(self, b: int) -> None:
        p, q = self._prev[b], self._next[b]
        self._next[p] = q
        self._prev[q] = p
        self.inq[b] = False
        self.length -= 1

    def head_run(self, state: list[int], want: int, limit: int) -> list[int]:
        """The blocks from the head on, in queue order, while ``state[b] == want``: at most
        ``limit`` of them. Nothing is unlinked (``cut_head`` does, once they are taken)."""
        nxt, sentinel = self._next, self._sentinel
        out: list[int] = []
        b = nxt[sentinel]
        for _ in range(limit):
            if b == sentinel or state[b] != want:
                break
            out.append(b)
            b = nxt[b]
        return out

    def cut_head(self, taken: list[tuple[int, ...]]) -> None:
        """Unlink the first ``len(taken)`` blocks, which are the blocks ``taken[i][0]`` in
        queue order (a prefix of what ``head_run`` returned): O(1) links. Their ``inq``
        flags are the caller's: the spec's effect of the transition that took them (allocate)
        clears them (``queued``), and the structure check compares flags with links."""
        if not taken:
            return
        q = self._next[taken[-1][0]]
        self._next[self._sentinel] = q
        self._prev[q] = self._sentinel
        self.length -= len(taken)

    def __iter__(self) -> Iterator[int]:
        b = self._next[self._sentinel]
        while b != self._sentinel:
            yield b
            b = self._next[b]

    def order(self) -> list[int]:
        return list(self)

    def structure_errors(self) -> list[str]:
        """Scan: the links are mutually consistent and every queued block appears once."""
        errors: list[str] = []
        seen: set[int] = set()
        b, steps = self._sentinel, 0
        while True:
            nxt = self._next[b]
            if self._prev[nxt] != b:
                errors.append(f"broken link {b} -> {nxt}")
                break
            if nxt == self._sentinel:
                break
            if nxt in seen:
                errors.append(f"block {nxt} twice in the queue")
                break
            seen.add(nxt)
            b, steps = nxt, steps + 1
        flagged = {i for i, q in enumerate(self.inq) if q}
        if flagged != seen:
            errors.append(f"queued flags disagree with links: {sorted(flagged ^ seen)[:8]}")
        if len(seen) != self.length:
            errors.append(f"length {self.length} != {len(seen)} linked")
        return errors
