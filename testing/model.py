"""The machine's own reference model, at the level of observable behaviour.

It knows only what the calls and their results say: each live request's tokens, salt, table
and positions (reserved, launched, committed), the launches in flight and the blocks they
pin, and which blocks hold committed KV of which (salt, token prefix). It never reads the
allocator's internals. ``CHECKS`` names every check the machine makes, in words; a failure
is a ``CheckFailed`` naming one of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

CHECKS: dict[str, str] = {
    # observable behaviour: every adapter
    "calls_succeed": "a valid call does not raise (free of a live request, add_request of a "
                     "new id, append_tokens, complete of an in-flight launch, commit)",
    "refusal_changes_nothing": "a refused or rejected call changes nothing observable "
                               "(tables, free and cached counts, and the spec state if any)",
    "misuse_refused": "add_request of a live id, allocate and launch of an unknown id are "
                      "refused",
    "refuses_only_when_full": "an allocation, fork or launch is refused only when too few "
                              "blocks are in no live table, pinned by no in-flight launch and "
                              "let go while no launch still in flight was running",
    "tables_only_grow": "a table changes only by appending entries, except that a launch may "
                        "replace a shared block it writes by a fresh copy (copy-on-write)",
    "table_shape": "a table covering n positions has ceil(n / B) entries, no block twice",
    "fresh_block_unheld": "a newly handed-out block is in no live table",
    "no_reuse_while_in_flight": "blocks an in-flight launch reads are not handed out again "
                                "until it completes",
    "copy_on_write": "a block a launch writes is held by the writing request's table alone",
    "fork_shares_written_kv": "a fork's child has the parent's blocks where KV is written; a "
                              "fresh block only where nothing is written yet",
    "hits_on_committed_kv": "a prefix hit is a block holding committed KV (written by a "
                            "completed launch) of the same salt and tokens; none without "
                            "prefix caching; never the last prompt token",
    "free_block_accounting": "num_free_blocks() = the blocks in no live table",
    "cached_accounting": "num_cached_blocks() <= the blocks in no live table that hold "
                         "committed KV (0 without prefix caching)",
    # the spec view (capability spec_view)
    "spec_guard": "every spec transition the allocator performs has its guard true in the "
                  "machine's spec model",
    "spec_refinement": "the spec model, after replaying those transitions, equals abstract()",
    "spec_tables": "abstract()'s tables are the live requests' tables",
    "launch_pins": "every block of an in-flight launch is, in the spec state, held or retired "
                   "after that launch's number (so it cannot be recycled before it completes)",
    "invariant": "every invariant of pagedkv.spec.INVARIANTS holds after every step",
}


class CheckFailed(AssertionError):
    """A check of the machine failed. ``check`` is its name in ``CHECKS`` (for the spec's
    invariants, ``invariant:<name>``); the message says what broke, in words, the rule it
    breaks, and the calls that led there."""

    def __init__(self, check: str, detail: str, calls: Iterable[str] = ()) -> None:
        rule = CHECKS.get(check.split(":")[0], "")
        if check.startswith("invariant:"):
            from pagedkv.spec import INVARIANTS

            inv = INVARIANTS.get(check.split(":", 1)[1])
            if inv is not None:
                rule = f"{inv.doc} (safety property: {inv.property})"
        lines = [f"[{check}] {detail}"]
        if rule:
            lines.append(f"  rule: {rule}")
        calls = list(calls)
        if calls:
            lines.append("  calls (most recent last):")
            lines += [f"    {c}" for c in calls]
        super().__init__("\n".join(lines))
        self.check = check
        self.detail = detail


@dataclass
class Req:
    """What the machine knows of a live request."""

    rid: Hashable
    tokens: list[int]
    salt: str | None
    table: list[int] = field(default_factory=list)
    reserved: int = 0  # positions the table covers
    issued: int = 0  # positions launches were issued to write
    computed: int = 0  # positions committed (prefix hits included)
    launches: deque[tuple[str, int]] = field(default_factory=deque)  # (label, covered)


@dataclass
class LaunchRec:
    label: str
    rids: tuple[Hashable, ...]
    pins: frozenset[int]
    handle: Any
    call: str = ""  # the launch call, for messages
    number: int | None = None  # the spec's launch number (spec view only)


class ObservedModel:
    """Bookkeeping of the reference model; the checks live in the machine."""

    def __init__(self, capacity: int, block_size: int) -> None:
        self.capacity = capacity
        self.B = block_size
        self.reqs: dict[Hashable, Req] = {}
        self.inflight: dict[str, LaunchRec] = {}
        self.done: set[str] = set()
        self.content: dict[int, tuple[Any, ...]] = {}  # block -> (salt, token prefix) it holds
        # blocks that left their last table -> the launches in flight at that moment
        self.retired: dict[int, frozenset[str]] = {}
        self._held_seen: set[int] = set()

    def key(self, req: Req, i: int) -> tuple[Any, ...]:
        """The identity of full block i's KV: the salt and every token up to its end."""
        return (req.salt, tuple(req.tokens[: (i + 1) * self.B]))

    def holders(self, b: int) -> list[Hashable]:
        return [r.rid for r in self.reqs.values() if b in r.table]

    def held(self) -> set[int]:
        return {b for r in self.reqs.values() for b in r.table}

    def pinned(self) -> set[int]:
        return {b for rec in self.inflight.values() for b in rec.pins}

    def pinned_by(self, b: int) -> list[str]:
        return [f"{rec.label} ({rec.call})" for rec in self.inflight.values() if b in rec.pins]

    def note_released(self) -> None:
        """Record, for each block that left its last table since the previous call, the
        launches in flight then. Called after every call that may shrink a table and before a
        launch is added or removed."""
        held = self.held()
        now = frozenset(self.inflight)
        for b in self._held_seen - held:
            self.retired[b] = now
        for b in held:
            self.retired.pop(b, None)
        self._held_seen = held

    def waiting(self) -> set[int]:
        """Blocks that left their last table while a launch still in flight was running: an
        allocator may keep them until that launch completes (epoch-based reclamation waits
        for every launch published before the release, whether or not it read the block)."""
        self.note_released()
        live = self.inflight.keys()
        return {b for b, launches in self.retired.items() if launches & live}

    def unavailable(self) -> set[int]:
        """Blocks held by a table, pinned by an in-flight launch, or waiting for one."""
        return self.held() | self.pinned() | self.waiting()

    def available(self) -> int:
        """Blocks in no live table, pinned by no in-flight launch and released while no launch
        still in flight was running."""
        return self.capacity - len(self.unavailable())

    def blocks_for(self, n: int) -> int:
        return -(-n // self.B)

    def candidates(self, req: Req, i: int) -> list[int]:
        """The blocks known to hold the committed KV of the request's full block i."""
        k = self.key(req, i)
        return [b for b, c in self.content.items() if c == k]

    def describe(self, b: int) -> str:
        k = self.content.get(b)
        if k is None:
            return f"block {b} holds no committed KV the machine knows of"
        return f"block {b} holds the KV of tokens {list(k[1])} (salt {k[0]!r})"

    def commit_target(self, req: Req) -> int | None:
        """After completions: the positions covered by the request's completed launches, in
        order (whole blocks only while a later launch may still write the last one)."""
        target = None
        while req.launches and req.launches[0][0] in self.done:
            target = req.launches.popleft()[1]
        if target is None:
            return None
        if req.launches:
            target -= target % self.B
        return target if target > req.computed else None

    def record_commit(self, req: Req, n: int) -> None:
        for i in range(req.computed // self.B, n // self.B):
            self.content[req.table[i]] = self.key(req, i)
        req.computed = n


__all__ = ["CHECKS", "CheckFailed", "LaunchRec", "ObservedModel", "Req"]
