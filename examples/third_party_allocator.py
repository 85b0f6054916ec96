"""Plugging a third-party allocator into pagedkv's state machine.

``FreeListAllocator`` is a plain free-list block allocator, written without pagedkv: no prefix
caching, no fork, no spec. Blocks a running launch reads are pinned; a request freed while its
launch is in flight gives its blocks back only when the launch completes.
``EagerFreeAllocator`` is the same with a classic bug: ``release`` puts every block back on
the free list at once, so the next request can be handed a block the kernels are still
reading. ``FreeListAdapter`` maps either one to ``pagedkv.testing.AllocatorAdapter``.

Run ``python examples/third_party_allocator.py``: the machine passes on the first and prints
the shrunk failing program for the second.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from pagedkv.testing import BaseAdapter, Capabilities


class FreeListAllocator:
    """A stack of free block ids, one table per request, pin counts per block."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free_list = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0 first
        self.tables: dict[Hashable, list[int]] = {}
        self.pins: Counter[int] = Counter()  # block -> running launches that read it
        self.deferred: set[int] = set()  # freed while pinned: back on the list at completion
        self.running: dict[int, list[int]] = {}
        self._next_launch = 0

    def add(self, rid: Hashable) -> None:
        if rid in self.tables:
            raise KeyError(f"request {rid!r} exists")
        self.tables[rid] = []

    def grow(self, rid: Hashable, num_tokens: int) -> list[int] | None:
        table = self.tables[rid]
        need = -(-num_tokens // self.block_size) - len(table)
        if need > len(self.free_list):
            return None
        for _ in range(need):
            table.append(self.free_list.pop())
        return list(table)

    def start(self, rids: Sequence[Hashable]) -> int:
        blocks = [b for r in rids for b in self.tables[r]]
        self.pins.update(blocks)
        self._next_launch += 1
        self.running[self._next_launch] = blocks
        return self._next_launch

    def finish(self, launch_id: int) -> None:
        for b in self.running.pop(launch_id):
            self.pins[b] -= 1
            if self.pins[b] == 0 and b in self.deferred:
                self.deferred.discard(b)
                self.free_list.append(b)

    def release(self, rid: Hashable) -> None:
        for b in reversed(self.tables.pop(rid)):
            if self.pins[b]:
                self.deferred.add(b)
            else:
                self.free_list.append(b)

    def num_unheld(self) -> int:
        return len(self.free_list) + len(self.deferred)


class EagerFreeAllocator(FreeListAllocator):
    """The bug: blocks go back on the free list at once, even while a launch reads them."""

    def release(self, rid: Hashable) -> None:
        for b in reversed(self.tables.pop(rid)):
            self.free_list.append(b)


class FreeListAdapter(BaseAdapter):
    """``FreeListAllocator`` (or a subclass) behind the adapter protocol."""

    capabilities = Capabilities(launches=True, prefix_caching=False, fork=False)
    allocator_class: type[FreeListAllocator] = FreeListAllocator

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.alloc = self.allocator_class(num_blocks, block_size)
        self.num_blocks, self.block_size = num_blocks, block_size

    def add_request(self, rid: Hashable, tokens: Sequence[int], salt: str | None) -> int:
        self.alloc.add(rid)
        return 0  # no prefix caching

    def allocate(self, rid: Hashable, num_tokens: int) -> list[int] | None:
        return self.alloc.grow(rid, num_tokens)

    def launch(self, rids: Sequence[Hashable]) -> int:
        return self.alloc.start(rids)

    def complete(self, handle: int) -> None:
        self.alloc.finish(handle)

    def free(self, rid: Hashable) -> None:
        self.alloc.release(rid)

    def block_table(self, rid: Hashable) -> list[int]:
        return list(self.alloc.tables[rid])

    def num_free_blocks(self) -> int:
        return self.alloc.num_unheld()


class EagerFreeAdapter(FreeListAdapter):
    allocator_class = EagerFreeAllocator


def main() -> int:
    from hypothesis import settings

    from pagedkv.testing import CheckFailed, run

    quick = settings(max_examples=100, stateful_step_count=30, derandomize=True,
                     database=None, deadline=None)
    outcomes = run(FreeListAdapter, settings=quick, name="FreeListMachine")
    print(f"FreeListAllocator: passed ({sum(outcomes.values())} calls checked)")
    try:
        run(EagerFreeAdapter, settings=quick, name="EagerFreeMachine")
    except CheckFailed as exc:
        print(f"EagerFreeAllocator: caught\n{exc}")
        return 0
    print("EagerFreeAllocator: NOT caught")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
