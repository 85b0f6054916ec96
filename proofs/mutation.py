"""Mutation testing of the allocator and spec guards, without touching files on disk.

``python -m pagedkv.proofs.mutation [--quick] [--jobs N] [--out PATH] [--rev REV]
[--update] [--file PATH]... [--ids LIST] [--list]``

A small AST-located, text-level mutator (the mutated source keeps every line where it was, so
tracebacks and ``inspect.getsource`` stay meaningful) over the spec's guards and invariants, the
pool, the queue, the hashing, the whole request layer, launches and the table arithmetic.
Operators: comparison swap, +/- swap, integer and bool constants, dropped conjuncts and
``and`` clauses, negated ``if`` tests, deleted statements, and dropped copies (``list(x)`` ->
``x``: a table or hash chain then aliases another request's, or a caller's list is kept by
reference). Each mutant runs in a forked child process that installs a ``sys.meta_path`` finder
returning the mutated source for its module, then runs the kill suite in stages, cheapest
first, stopping at the first failure:

1. ``pytest -x`` over the fast tests (allocator API, spec lint, the call programs and the
   position rules, the table rows, ``tests/test_kill_*.py``);
2. spec mutants: the z3 obligations (induction symbolic + bounded, safety, non-vacuity);
   then a z3 equivalence check (``_z3_equivalence``): a mutant proved equivalent on every
   pool the invariants allow is reported ``equivalent`` and skips the slower stages;
3. ``tests/test_stateful.py`` with ``HYPOTHESIS_PROFILE=mutation`` (derandomized, no shrink);
4. spec mutants: ``proofs.runner.run_all(quick=True)`` (explorer and BMC too);
5. the CI canaries (``proofs/canaries.py``: planted bugs must still be caught, and not
   reported without one) and the weakened-guard tests of ``tests/test_proofs.py`` and
   ``tests/test_allocator_guard_mutations.py``: the tests that show an invariant catches
   real bugs, which is what kills a weakened invariant.

A mutant whose fast stage (seconds, unmutated) runs past 90 s hangs: it is reported as
``timeout`` and counted as killed; so is one that runs past the overall per-mutant timeout
(the report lists every timeout, with the stage it was in).
Mutants shown to be equivalent are listed in ``EQUIVALENT`` with the reason.

``--rev REV`` runs against ``git archive REV`` extracted to a temporary folder (a consistent
snapshot while others edit the tree); the default is the working tree at ``HEAD``. The report
records the commit and whether the mutated files differed from it.

Mutant ids number the mutants of all targets, in TARGETS order, whatever ``--file`` selects.
``--update`` reads the report at ``--out``: killed and timeout verdicts (and z3 equivalence
proofs of files unchanged since, working tree included) are kept by mutant key, the rest run.
With ``--update``, ``--file`` / ``--ids`` only choose what may run: the report still covers
every target, the mutants not selected keeping their previous verdicts (pending if new).
Without ``--update`` the report holds only the selected mutants. The baseline (no mutant)
runs first; if it fails the kill suite, the run stops and the report is left as it was.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import hashlib
import importlib.abc
import importlib.util
import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = "benchmarks/results/mutation-report.json"
# Every pagedkv.X package that is folder X of the tree: a snapshot's run imports all of them
# from the snapshot (a package left out would be imported from the working tree instead).
PACKAGES = {"spec", "allocator", "proofs", "kernels", "engine", "testing", "cli"}

KILLED, SURVIVED, EQUIV, TIMEOUT, ERROR = "killed", "survived", "equivalent", "timeout", "error"
PENDING = "pending"  # not run yet (a report written while the run goes on)


@dataclasses.dataclass(frozen=True)
class Target:
    """One file to mutate: its module, kind, and which functions (None: all)."""

    path: str
    module: str
    kind: str  # "spec" or "allocator"
    functions: frozenset[str] | None = None
    skip_functions: frozenset[str] = frozenset()
    delete_statements: bool = True


TARGETS = (
    Target("spec/transitions.py", "pagedkv.spec.transitions", "spec",
           skip_functions=frozenset({"enabled", "apply"}), delete_statements=False),
    Target("spec/invariants.py", "pagedkv.spec.invariants", "spec", delete_statements=False),
    # the transitions, the guard protocol and the spec views; not the guard compiler (which
    # self-checks against the interpreted spec and falls back to it), nor diagnostics
    Target("allocator/pool.py", "pagedkv.allocator.pool", "allocator",
           functions=frozenset({"__getitem__", "_enter", "check_block_id", "_move",
                                "open_holder", "close_holder", "allocate", "publish",
                                "begin_write", "end_write", "launch", "complete", "advance",
                                "advance_watermark", "_drain", "busy", "rewind", "commit",
                                "share", "release", "evict", "recycle", "_invalidate",
                                "_unqueue_cached", "_recycle_if_safe", "usable", "waiting",
                                "take", "lookup"})),
    # the one mapping of storage onto the spec's pool state: views, abstract(), write-back
    Target("allocator/storage.py", "pagedkv.allocator.storage", "allocator",
           functions=frozenset({"__getitem__", "items", "_view_of", "_plain", "__init__",
                                "abstract"})),
    # the request records as the spec's request-layer state
    Target("allocator/request_view.py", "pagedkv.allocator.request_view", "allocator"),
    # what each allocator call means: its program of request transitions
    Target("spec/calls.py", "pagedkv.spec.calls", "spec", delete_statements=False),
    Target("allocator/lru.py", "pagedkv.allocator.lru", "allocator"),
    Target("allocator/hashing.py", "pagedkv.allocator.hashing", "allocator"),
    # the whole request layer: argument checks, prefix hits, room planning, every public
    # method and query, the spec view and the invariant scan
    Target("allocator/allocator.py", "pagedkv.allocator.allocator", "allocator"),
    # launches: completion (poll / complete / event_done) and the stale-table check
    Target("allocator/launch.py", "pagedkv.allocator.launch", "allocator"),
    # block-table arithmetic and the integer / count checks every public call goes through
    Target("allocator/table.py", "pagedkv.allocator.table", "allocator"),
    # the tables again as int32 rows, and the launch copies kernels read (a wrong entry there
    # reads another request's KV)
    Target("allocator/table_rows.py", "pagedkv.allocator.table_rows", "allocator"),
)

# Mutants proved or argued equivalent (no test can tell them apart from the original), keyed
# by ``Mutant.key`` (file, function, operator, original -> mutated line). Filled from the
# survivors of a run, each with its reason.
_FAST_RANGE = ("fast-path id check: an id this lets through goes to check_block_id, which "
               "repeats the full check (0 <= b < num_blocks, int, not bool); only the "
               "fast path is skipped")
_STRICT = ("every caller passes exactly t.params positionally (a wrong arity is a TypeError "
           "at the method call), so zip never sees unequal lengths")
_PREV_INIT = ("only _prev[0..n] is ever read; the mutant appends unread entries after the "
              "sentinel's slot, which still holds n - 1")
_FAST_COUNT = ("fast-path check: a value this lets through goes to check_count, which repeats "
               "the full check against the same bounds (bounds included) and returns the same "
               "int; only the fast path is skipped")
_FAST_PARENT = ("fast-path check: a parent this lets through goes to _check_parent, which "
                "repeats the full check (0 <= p < 2**256) and returns the same int")
_WRITERS_REF1 = ("writers is read only by copies_needed: a block with ref 1 adds "
                 "min(k, ref - 1) = 0 to it, so counting its writers changes nothing")
_ALIGNED = ("when issued is a multiple of B the entry at issued // B has never been published "
            "(publish issues up to reserved; hits and forks share only full or published "
            "blocks, and a fork gives the child fresh blocks for ALLOCATED ones), so its ref is "
            "1 and no copy is made either way")
EQUIVALENT: dict[str, str] = {
    "allocator/allocator.py:_plan_room:cmp:if not hits and need <= pool.usable():  # the "
    "common case: it fits now -> if not hits and need < pool.usable():  # the common case: "
    "it fits now":
        "fast path: with no hits and need == usable() the general path finds available == "
        "usable() and returns the same empty list",
    **{f"allocator/allocator.py:_check_tokens:cmp:if type(t) is int and _I64_MIN <= t <= "
       f"_I64_MAX: -> if type(t) is int and {new}:":
       "fast path for one plain-int token: a token at an int64 bound it sends on takes the "
       "general path, which accepts it and returns a new one-item list with the same value"
       for new in ("_I64_MIN < t <= _I64_MAX", "_I64_MIN <= t < _I64_MAX")},
    "spec/calls.py:free_many:drop-copy:_distinct(run, list(rids), \"free_many\") -> "
    "_distinct(run, rids, \"free_many\")":
        "every caller passes a list or tuple of ids (the allocator's free_many its checked "
        "list; _confirmed the call's argument, refused by _ordered first unless a sequence): "
        "_distinct's len and set see the same items either way",
    "spec/calls.py:commit:drop-and-clause:if s.pool.state[b] == PUBLISHED and "
    "s.pool.hmap[s.content[b]] == NO_BLOCK: -> if True and s.pool.hmap[s.content[b]] == "
    "NO_BLOCK:":
        "a committed entry's block is PUBLISHED or REFERENCED (held, written); a REFERENCED "
        "one is hashed, its hash is its content and the hash map maps it to itself, so the "
        "second clause is false for it anyway",
    "spec/calls.py:_seal_touched:drop-and-clause:if run.state.content[b] == NO_HASH and "
    "run.enabled(\"seal\", r=r, b=b): -> if True and run.enabled(\"seal\", r=r, b=b):":
        "seal's guard requires s.content[b] == NO_HASH itself: the clause only spares "
        "evaluating the guard on blocks sealed already",
    "spec/calls.py:why_refused:bool:if when is True or when: -> if when is False or when:":
        "the mutant also walks a step whose run condition is False; only truncate_tail has "
        "such a step (its rewind), and it is the plan's only step, so a transition refused "
        "with that condition False is refused by its table conditions, said before the walk",
    **{f"allocator/pool.py:{fn}:{op}:if type(b) is not int or not 0 <= b < self.num_blocks: "
       f"-> if type(b) is not int or not {new} < self.num_blocks:": _FAST_RANGE
       for fn in ("allocate", "publish", "begin_write", "end_write", "rewind", "commit",
                  "share", "release", "evict", "recycle")
       for op, new in (("int+1", "1 <= b"), ("cmp", "0 < b"))},
    "allocator/pool.py:_enter:bool:params = dict(zip(t.params, args, strict=True)) -> "
    "params = dict(zip(t.params, args, strict=False))": _STRICT,
    "allocator/pool.py:_enter:bool:self.trace.append((name, dict(zip(t.params, args, "
    "strict=True)))) -> self.trace.append((name, dict(zip(t.params, args, strict=False))))":
        _STRICT,
    "allocator/pool.py:_enter:bool:return t.effect(CONCRETE, self.view, **dict(zip(t.params, "
    "args, strict=True))) -> return t.effect(CONCRETE, self.view, **dict(zip(t.params, args, "
    "strict=False)))": _STRICT,
    "allocator/lru.py:__init__:arith:self._prev = [n] + list(range(0, n - 1)) + [n - 1] -> "
    "self._prev = [n] + list(range(0, n + 1)) + [n - 1]": _PREV_INIT,
    "allocator/lru.py:__init__:int-1:self._prev = [n] + list(range(0, n - 1)) + [n - 1] -> "
    "self._prev = [n] + list(range(0, n - 0)) + [n - 1]": _PREV_INIT,
    "allocator/storage.py:__getitem__:int+1:return 0 if blocks is None else len(blocks) -> "
    "return 1 if blocks is None else len(blocks)":
        "the view's nheld of a holder that does not exist: read only by close_holder's "
        "interpreted guard, next to alive[r], which is False for it",
    "allocator/pool.py:_enter:int+1:if entry is None or entry[0] is not t: -> "
    "if entry is None or entry[1] is not t:":
        "entry[1] (a guard function) is never the Transition, so every call rebinds: the "
        "same compiled or interpreted functions, only slower",
    "allocator/pool.py:allocate:delete-stmt:self.filled[b] = 0 -> pass":
        "allocate's guard needs FREE and exclusive_writes makes FREE blocks have filled == 0: "
        "the store writes the value already there",
    "allocator/pool.py:_recycle_if_safe:drop-and-clause:if self.state[b] == RECLAIMED and "
    "self._entry(\"recycle\")[1](b): -> if True and self._entry(\"recycle\")[1](b):":
        "the recycle guard itself requires state == RECLAIMED; the first test is a fast path",
    **{f"allocator/lru.py:structure_errors:{op}:{a} -> {b}":
       "`steps` is never read (a dead counter)" for op, a, b in (
           ("int+1", "b, steps = self._sentinel, 0", "b, steps = self._sentinel, 1"),
           ("arith", "b, steps = nxt, steps + 1", "b, steps = nxt, steps - 1"),
           ("int-1", "b, steps = nxt, steps + 1", "b, steps = nxt, steps + 0"))},
    "allocator/lru.py:structure_errors:delete-stmt:errors.append(f\"block {nxt} twice in the "
    "queue\") -> pass":
        "unreachable: the walk stops at the first link whose back pointer disagrees, and "
        "re-entering a block already seen needs its back pointer to name two predecessors",
    **{"allocator/allocator.py:chain_hashes:drop-and-clause:if type(token_ids) is not list "
       f"and type(token_ids) is not tuple: -> if {a}:":
       "a list or a tuple sent through _ordered as well comes back as a list of the same "
       "items: only the copy is not saved"
       for a in ("True and type(token_ids) is not tuple",
                 "type(token_ids) is not list and True")},
    "allocator/allocator.py:_extend_hashes:cmp:if full > first: -> if full >= first:":
        "hashes never run past the full blocks, so full == first is the only new case, where "
        "the chain of no tokens is empty and hashes += [] changes nothing",
    **{f"allocator/allocator.py:fork:bool:{a}strict=True){b} -> {a}strict=False){b}":
       "fresh is built from p.table just above: the zipped sequences have equal lengths"
       for a, b in (("pool.take(child) if f else b for b, f in zip(p.table, fresh, ", ""),
                    ("for b, f in zip(p.table, fresh, ", ":"))},
    "allocator/allocator.py:publish:drop-and-clause:if req.issued < req.reserved and "
    "req.issued % B: -> if req.issued < req.reserved and True:": _ALIGNED,
    **{f"allocator/allocator.py:publish:{op}:if pool.ref[b] > 1: -> if pool.ref[b] {new}:":
       _WRITERS_REF1 for op, new in (("cmp", ">= 1"), ("int-1", "> 0"))},
    "allocator/allocator.py:_reclaim_launches:bool:self._complete(launch, False) -> "
    "self._complete(launch, True)":
        "strict only matters for a launch already completed; every launch passed is taken from "
        "_inflight (a completion pops it) under the lock just before, and an event whose "
        "query() completes a launch makes that scan of _inflight raise first (RuntimeError: "
        "dict changed size) in the original too",
    "allocator/allocator.py:publish:int+1:if req.issued < req.reserved and req.issued % B and "
    "holders.get(req.table[i], 0) > 1: -> if req.issued < req.reserved and req.issued % B and "
    "holders.get(req.table[i], 1) > 1:":
        "a block holders does not name fails the test with either default (0 > 1 and 1 > 1 "
        "are both false)",
    "allocator/allocator.py:publish:drop-and-clause:if req.issued < req.reserved and "
    "req.issued % B and holders.get(req.table[i], 0) > 1: -> if req.issued < req.reserved and "
    "True and holders.get(req.table[i], 0) > 1:":
        "holders names only a shared block some request of the launch writes from inside it "
        "(issued % B != 0); the block of an entry a request writes from its start is one no "
        "other table holds written slots of (fork shares only entries the parent issued into, "
        "giving the child a fresh block for the rest; hits are full blocks), so it is never in "
        "holders and the dropped test changes nothing",
    "allocator/allocator.py:_grow:cmp:if need > 0:  # the queue's FREE head run in one batch "
    "(as ``need`` takes would) -> if need >= 0:  # the queue's FREE head run in one batch (as "
    "``need`` takes would)":
        "need is never negative, and take_many(rid, 0) takes nothing and returns []",
    "allocator/allocator.py:_grow:cmp:if len(table) > start: -> if len(table) >= start:":
        "the table never shrinks here; with nothing added _put_rows copies an empty range "
        "(start <= the row's width already) and the entry total grows by 0",
    **{f"allocator/allocator.py:_record_tokens:{op}:if (len(req.hashes) + 1) * B <= "
       f"len(req.tokens):  # a block filled: hash it -> if (len(req.hashes) {new}) * B <= "
       f"len(req.tokens):  # a block filled: hash it":
       "pre-check before _extend_hashes, whose loop tests the unmutated condition itself: "
       "the mutant only calls it more often, and it hashes exactly the blocks filled"
       for op, new in (("arith", "- 1"), ("int-1", "+ 0"))},
    **{f"allocator/allocator.py:_append_token:{op}:if (len(req.hashes) + 1) * self.block_size "
       f"<= len(req.tokens):  # a block filled -> if (len(req.hashes) {new}) * self.block_size "
       f"<= len(req.tokens):  # a block filled":
       "pre-check before _extend_hashes, whose loop tests the unmutated condition itself: "
       "the mutant only calls it more often, and it hashes exactly the blocks filled "
       "(as _record_tokens's)"
       for op, new in (("arith", "- 1"), ("int-1", "+ 0"))},
    "allocator/allocator.py:_commits_allowed:cmp:if type(n) is not int or not "
    "req.computed < n <= MAX_COUNT: -> "
    "if type(n) is not int or not req.computed <= n <= MAX_COUNT:":
        "lets a pair with n == computed through the batch check; _commit_check accepts such a "
        "pair without a condition (a commit of nothing new), so commit_many commits the same "
        "pairs and refuses the same batches either way",
    "allocator/allocator.py:_commits_allowed:cmp:if type(n) is not int or not "
    "req.computed < n <= MAX_COUNT: -> "
    "if type(n) is not int or not req.computed < n < MAX_COUNT:":
        "sends a pair with n == MAX_COUNT to the per-pair checks, which decide it fully: the "
        "batch check is a fast path only",
    "allocator/allocator.py:_commits_allowed:cmp:cells.append((table[i], B if k > B else k)) "
    "-> cells.append((table[i], B if k >= B else k))":
        "k == B yields B either way",
    **{f"allocator/allocator.py:publish:{op}:if reserved <= (i + 1) * B:  # one block written "
       f"(a decode step): no split needed -> if {new} * B:  # one block written "
       f"(a decode step): no split needed":
       "fast path for a write within one block: a write the mutated test sends on (every "
       "one, as reserved > issued >= i * B; or one ending at the block's end) takes "
       "writes_per_block, which returns the same one (block, count) pair for a write within "
       "block i"
       for op, new in (("int-1", "reserved <= (i + 0)"), ("arith", "reserved <= (i - 1)"),
                       ("cmp", "reserved < (i + 1)"))},
    **{f"allocator/table.py:check_count:{op}:if type(value) is int and 0 <= value <= maximum:  "
       f"# the common case: nothing to convert -> if type(value) is int and {new}:  # the "
       f"common case: nothing to convert":
       "fast path for a plain int: a value at a bound it no longer lets through takes the "
       "general path, which accepts it (0 and maximum are in range) and returns the same int"
       for op, new in (("int+1", "1 <= value <= maximum"), ("cmp", "0 < value <= maximum"),
                       ("cmp", "0 <= value < maximum"))},
    **{f"allocator/pool.py:begin_write:{op}:if type(w) is not int or not 0 <= w <= "
       f"self.block_size: -> if type(w) is not int or not {new} self.block_size:": _FAST_COUNT
       for op, new in (("int+1", "1 <= w <="), ("cmp", "0 < w <="), ("cmp", "0 <= w <"))},
    **{f"allocator/pool.py:rewind:{op}:if type(k) is not int or not 0 <= k <= "
       f"self.block_size: -> if type(k) is not int or not {new} self.block_size:": _FAST_COUNT
       for op, new in (("int+1", "1 <= k <="), ("cmp", "0 < k <="), ("cmp", "0 <= k <"))},
    **{f"allocator/pool.py:{fn}:{op}:if type(L) is not int or L < 0: -> if type(L) is not int "
       f"or {new}:": _FAST_COUNT
       for fn in ("launch", "complete") for op, new in (("cmp", "L <= 0"), ("int+1", "L < 1"))},
    **{f"allocator/pool.py:commit:{op}:if type(h) is not int or not 0 <= h <= MAX_HASH: -> "
       f"if type(h) is not int or not {new} MAX_HASH:": _FAST_COUNT
       for op, new in (("int+1", "1 <= h <="), ("cmp", "0 < h <="), ("cmp", "0 <= h <"))},
    **{f"allocator/hashing.py:block_hash:{op}:if type(parent) is not int or not 0 <= parent "
       f"< _PARENT_LIMIT: -> if type(parent) is not int or not {new} parent < _PARENT_LIMIT:":
       _FAST_PARENT for op, new in (("int+1", "1 <="), ("cmp", "0 <"))},
    "allocator/hashing.py:normalize_extra_keys:drop-and-clause:if type(k) is str and not "
    "k.isascii(): -> if type(k) is str and True:":
        "the mutant also encodes ASCII keys, which utf-8 always encodes; the isascii test only "
        "skips that check (the result is discarded)",
    "allocator/hashing.py:_keys:cmp:not extra_keys or set(map(type, extra_keys)) <= "
    "_PLAIN_KEY_TYPES -> not extra_keys or set(map(type, extra_keys)) < _PLAIN_KEY_TYPES":
        "a tuple of keys of all three plain types then skips the hot path, and the tests "
        "below return that same tuple (it is a tuple, and its types are plain)",
    "allocator/hashing.py:_keys:cmp:if not keys or set(map(type, keys)) <= _PLAIN_KEY_TYPES: "
    "-> if not keys or set(map(type, keys)) < _PLAIN_KEY_TYPES:":
        "keys of all three plain types then go through _canonical_key, which returns a plain "
        "key as is: an equal tuple",
    **{f"allocator/allocator.py:_within_table:cmp:req.reserved <= num_tokens <= "
       f"len(req.table) * B) -> {new} * B)":
       "fast path for growth within the table (_extend's, allocate_many's): a bound it no "
       "longer lets through (num_tokens equal to the positions reserved, or to the table's "
       "capacity) takes the general path, which finds no hit (the table is not empty), no "
       "block needed and nothing to reclaim, and sets the same positions reserved and totals"
       for new in ("req.reserved < num_tokens <= len(req.table)",
                   "req.reserved <= num_tokens < len(req.table)")},
    "allocator/allocator.py:publish:cmp:fresh = [(b, req.rid) for req in reqs if req.published "
    "< len(req.table) -> fresh = [(b, req.rid) for req in reqs if req.published <= "
    "len(req.table)":
        "a request whose entries are all published (published == len(table)) then slices an "
        "empty tail: no block added to fresh either way",
    "allocator/allocator.py:publish:int+1:width = 0  # the longest table: the launch's tables "
    "are at least as wide (take) -> width = 1  # the longest table: the launch's tables are at "
    "least as wide (take)":
        "every request of a launch has reserved positions (refused above otherwise), so a "
        "table of at least one entry: the width is at least 1 either way",
    "allocator/allocator.py:_grows_within_tables:bool:return True -> return False":
        "the positions are already reserved when it returns: allocate_many's general path "
        "then finds, for each pair, no hit, nothing to take (within the table) and nothing "
        "to add to the totals (num_tokens equals the positions reserved), and returns an "
        "empty list for each, as the fast path does",
    "allocator/allocator.py:publish:cmp:if n > width: -> if n >= width:":
        "a table as long as the widest so far sets the width to the same value",
    # allocator/table_rows.py: which launch copy is reused, and how, changes the work done,
    # not the tables handed out (every launch's arrays are checked against the tables)
    "allocator/table_rows.py:__init__:int+1:self._version = 0 -> self._version = 1":
        "the version is only compared, as 'a row rewritten after this copy', with stamps "
        "it hands out itself (each rewrite stamps the next value); unwritten rows keep 0, "
        "below any copy's version either way",
    "allocator/table_rows.py:put:cmp:elif stop > length: -> elif stop >= length:":
        "stop == length with start == length is a put of no entries: it stores the length "
        "the row already has",
    "allocator/table_rows.py:_copy_rows:cmp:if width <= self.width: -> if width < self.width:":
        "at width == self.width both branches copy every column of the rows (the second "
        "into a -1-filled array of the same shape)",
    "allocator/table_rows.py:_update:cmp:whole = (idx != copy.row_ids) | "
    "(self._rewritten[idx] > copy.version) -> whole = (idx != copy.row_ids) | "
    "(self._rewritten[idx] >= copy.version)":
        "a row stamped at the copy's own version was rewritten before the copy was last "
        "brought up to date: copying it whole again writes the same entries",
    "allocator/table_rows.py:_update:delete-stmt:copy.version = self._version -> pass":
        "a copy left at an older version copies whole every row rewritten since that version "
        "(a superset of those rewritten since the last update): the same entries, more work",
    "allocator/table_rows.py:_resize:cmp:if rows > len(self._lengths): -> if rows >= "
    "len(self._lengths):":
        "at rows == len(_lengths) (a wider resize) the per-row arrays grow by zero entries",
    "allocator/table_rows.py:_resize:arith:grow = rows - len(self._lengths) -> grow = rows + "
    "len(self._lengths)":
        "the per-row length and rewrite stamps grow longer than the rows: the rows beyond "
        "are never opened, so their entries are never read",
}


@dataclasses.dataclass
class Mutant:
    id: int
    file: str
    module: str
    kind: str
    function: str
    line: int
    operator: str
    original: str  # the mutated source line(s), before
    mutated: str  # ... and after
    start: int  # byte offsets in the file
    end: int
    replacement: str
    occurrence: int = 0  # disambiguates identical keys
    status: str = ""
    killer: str = ""
    seconds: float = 0.0

    @property
    def key(self) -> str:
        return (f"{self.file}:{self.function}:{self.operator}:{self.original.strip()} -> "
                f"{self.mutated.strip()}" + (f"#{self.occurrence}" if self.occurrence else ""))

    def summary(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("start", "end", "replacement", "module", "occurrence"):
            d.pop(k)
        d["key"] = self.key
        return d


# --- generating mutants -------------------------------------------------------------------------
_CMP_SWAP = {ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Lt: ("<", "<="),
             ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">")}
_BIN_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+")}
_DELETABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete, ast.Expr)


class _Sites(ast.NodeVisitor):
    def __init__(self, target: Target, src: bytes) -> None:
        self.t = target
        self.src = src
        self.lines = src.splitlines(keepends=True)
        self.starts = [0]
        for ln in self.lines:
            self.starts.append(self.starts[-1] + len(ln))
        self.func: list[str] = []
        self.out: list[tuple[str, int, int, str, int]] = []  # (op, start, end, repl, line)

    def off(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.off(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.off(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def active(self) -> bool:
        if not self.func:
            return False
        if any(f in self.t.skip_functions for f in self.func):
            return False
        return self.t.functions is None or any(f in self.t.functions for f in self.func)

    def add(self, op: str, start: int, end: int, repl: str, line: int) -> None:
        self.out.append((op, start, end, repl, line))

    # functions
    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.func.append(node.name)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # docstring
        for stmt in body:
            self.visit(stmt)
        self.func.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for stmt in node.body:
            self.visit(stmt)

    # operators
    def visit_Compare(self, node: ast.Compare) -> None:
        if self.active():
            left = node.left
            for op, right in zip(node.ops, node.comparators, strict=True):
                swap = _CMP_SWAP.get(type(op))
                if swap:
                    a, b = self.span(left)[1], self.span(right)[0]
                    gap = self.src[a:b].decode()
                    m = re.search(re.escape(swap[0]) + r"(?![=<>])", gap)
                    if m:
                        self.add("cmp", a + m.start(), a + m.end(), swap[1], node.lineno)
                left = right
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        swap = _BIN_SWAP.get(type(node.op))
        if self.active() and swap:
            a, b = self.span(node.left)[1], self.span(node.right)[0]
            gap = self.src[a:b].decode()
            i = gap.find(swap[0])
            if i >= 0:
                self.add("arith", a + i, a + i + 1, swap[1], node.lineno)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not self.active():
            return
        s, e = self.span(node)
        if isinstance(node.value, bool):
            self.add("bool", s, e, str(not node.value), node.lineno)
        elif isinstance(node.value, int):  # one mutant per constant: 0 -> 1, n -> n - 1
            v = node.value
            self.add("int+1" if v == 0 else "int-1", s, e, str(v + 1 if v == 0 else v - 1),
                     node.lineno)

    def _drop(self, op: str, values: list[ast.expr], neutral: str) -> None:
        if len(values) < 2:
            return
        for v in values:
            s, e = self.span(v)
            nl = self.src[s:e].count(b"\n")
            repl = ("*()" if isinstance(v, ast.Starred) else neutral) + "\n" * nl
            self.add(op, s, e, repl, v.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if self.active() and isinstance(f, ast.Attribute) and f.attr == "And":
            self._drop("drop-conjunct", list(node.args), "True")
        if (self.active() and isinstance(f, ast.Name) and f.id == "list" and not node.keywords
                and len(node.args) == 1
                and isinstance(node.args[0], ast.Name | ast.Attribute | ast.Subscript)):
            # list(x) -> x: the copy is dropped, so the result aliases x (a shared table or
            # hash chain, a caller's list kept by reference)
            s, e = self.span(node)
            a, b = self.span(node.args[0])
            self.add("drop-copy", s, e, self.src[a:b].decode(), node.lineno)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        if self.active() and isinstance(node.op, ast.And):
            self._drop("drop-and-clause", list(node.values), "True")
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        if self.active():
            s, e = self.span(node.test)
            text = self.src[s:e].decode()
            self.add("negate-if", s, e, f"not ({text})", node.lineno)
        self.generic_visit(node)

    def generic_visit(self, node: ast.AST) -> None:
        if (self.active() and self.t.delete_statements and isinstance(node, _DELETABLE)
                and self._deletable(node)):
            s, e = self.span(node)
            nl = self.src[s:e].count(b"\n")
            self.add("delete-stmt", s, e, "pass" + "\n" * nl, node.lineno)
        super().generic_visit(node)

    @staticmethod
    def _deletable(node: ast.stmt) -> bool:
        if isinstance(node, ast.Expr):
            return isinstance(node.value, ast.Call)
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            return all(isinstance(t, ast.Subscript | ast.Attribute) for t in targets)
        return True  # AugAssign (state updates), Delete


def generate(target: Target, root: Path = REPO, start_id: int = 0) -> list[Mutant]:
    src = (root / target.path).read_bytes()
    tree = ast.parse(src)
    v = _Sites(target, src)
    v.visit(tree)
    out: list[Mutant] = []
    seen: dict[str, int] = {}
    n_lines = src.count(b"\n")
    for op, s, e, repl, line in sorted(v.out, key=lambda x: (x[1], x[2], x[0])):
        new = src[:s] + repl.encode() + src[e:]
        if new.count(b"\n") != n_lines:
            continue
        try:
            ast.parse(new)
        except SyntaxError:
            continue
        first = src.rfind(b"\n", 0, s) + 1
        last_old = src.find(b"\n", e)
        last_new = new.find(b"\n", s + len(repl.encode()))
        m = Mutant(
            id=0, file=target.path, module=target.module, kind=target.kind,
            function=_function_at(tree, line), line=line, operator=op,
            original=src[first:last_old].decode().rstrip(),
            mutated=new[first:last_new].decode().rstrip(),
            start=s, end=e, replacement=repl,
        )
        m.occurrence = seen.get(m.key, 0)
        seen[m.key] = m.occurrence + 1
        out.append(m)
    for i, m in enumerate(out):
        m.id = start_id + i
    return out


def _function_at(tree: ast.AST, line: int) -> str:
    best, best_span = "<module>", None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end and (best_span is None or end - node.lineno < best_span):
                best, best_span = node.name, end - node.lineno
    return best


def all_mutants(root: Path = REPO, files: list[str] | None = None) -> list[Mutant]:
    """Every target's mutants (or only those of ``files``), numbered over all targets: a
    mutant has the same id whether or not ``files`` selects its file."""
    out: list[Mutant] = []
    n = 0
    for t in TARGETS:
        ms = generate(t, root, start_id=n)
        n += len(ms)
        if not files or t.path in files:
            out += ms
    return out


def mutated_source(m: Mutant, root: Path = REPO) -> bytes:
    src = (root / m.file).read_bytes()
    return src[: m.start] + m.replacement.encode() + src[m.end :]


# --- importing the mutant ------------------------------------------------------------------------
class _Loader(importlib.abc.Loader):
    def __init__(self, source: bytes, path: str) -> None:
        self.source = source
        self.path = path

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        code = compile(self.source, self.path, "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def get_source(self, fullname: str) -> str:
        return self.source.decode()


class TreeFinder(importlib.abc.MetaPathFinder):
    """Imports ``pagedkv.<pkg>`` from ``root/<pkg>``; ``overrides`` maps a module name to the
    (mutated) source to use instead of the file's."""

    def __init__(self, root: Path, overrides: dict[str, bytes] | None = None) -> None:
        self.root = Path(root)
        self.overrides = overrides or {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        parts = fullname.split(".")
        if parts[0] != "pagedkv" or len(parts) < 2 or parts[1] not in PACKAGES:
            return None
        base = self.root / parts[1]
        rest = parts[2:]
        pkg = base.joinpath(*rest)
        if (pkg / "__init__.py").exists():
            return importlib.util.spec_from_file_location(
                fullname, pkg / "__init__.py", submodule_search_locations=[str(pkg)])
        file = base.joinpath(*rest[:-1], rest[-1] + ".py") if rest else None
        if file is None or not file.exists():
            return None
        if fullname in self.overrides:
            loader = _Loader(self.overrides[fullname], str(file))
            return importlib.util.spec_from_file_location(fullname, file, loader=loader)
        return importlib.util.spec_from_file_location(fullname, file)


def install(root: Path, overrides: dict[str, bytes] | None = None) -> None:
    """Route ``pagedkv.*`` imports to ``root`` (with overrides); drop already-imported ones."""
    import linecache

    for name in list(sys.modules):
        if name.startswith("pagedkv.") and name != __name__ and name != "pagedkv.proofs":
            del sys.modules[name]
    sys.meta_path.insert(0, TreeFinder(root, overrides))
    for name, src in (overrides or {}).items():
        parts = name.split(".")
        path = str(Path(root, parts[1], *parts[2:-1], parts[-1] + ".py"))
        lines = src.decode().splitlines(keepends=True)
        linecache.cache[path] = (len(src), None, lines, path)


# --- the kill suite ------------------------------------------------------------------------------
FAST_TESTS = ("tests/test_allocator_api.py", "tests/test_spec_lint.py",
              "tests/test_hostile_allocator.py", "tests/test_request_layer.py",
              "tests/test_explain.py", "tests/test_hostile_hashing.py",
              "tests/test_spec_calls.py", "tests/test_position_rules.py",
              "tests/test_table_rows.py")
STATEFUL_TESTS = ("tests/test_stateful.py",)
BUG_TESTS = (
    "tests/test_proofs.py::test_weakened_guard_gives_counterexample_and_trace",
    "tests/test_proofs.py::test_run_all_reports_failures_and_is_json",
    "tests/test_proofs.py::test_bmc_finds_double_free",
    "tests/test_proofs.py::test_counterexample_uses_spec_vocabulary",
    "tests/test_proofs.py::test_ending_a_write_that_never_began_breaks_no_write_when_free",
    "tests/test_allocator_guard_mutations.py::test_weakened_guard_is_caught",
)


class _FirstFailure:
    """pytest plugin: remember the first failing test id and a short reason."""

    def __init__(self) -> None:
        self.failed: str | None = None
        self.reason = ""

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed and self.failed is None:
            self.failed = report.nodeid
            text = str(report.longrepr)
            self.reason = _evidence(text)

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed and self.failed is None:
            self.failed = f"collect {report.nodeid}"
            self.reason = _evidence(str(report.longrepr))


_EVIDENCE = re.compile(
    r"(InvariantViolation[^\n]{0,120}|DoubleFree|PendingAccess|PublishError|OutOfBlocks|"
    r"CommitError|AssertionError[^\n]{0,120}|[A-Za-z]+Error[^\n]{0,80})")


def _evidence(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
    for ln in lines:
        m = _EVIDENCE.search(ln)
        if m:
            return m.group(0)[:160]
    if lines:
        return lines[0][2:].strip()[:160]
    rest = text.strip().splitlines()
    return rest[-1][:160] if rest else ""


def _pytest(root: Path, args: list[str]) -> str | None:
    import pytest

    plugin = _FirstFailure()
    tests = [str(root / a) for a in args]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rc = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "--rootdir", str(root),
                          "-W", "ignore", *tests], plugins=[plugin])
    if rc in (0, 5):  # passed, or nothing collected
        return None
    if plugin.failed:
        return f"{plugin.failed}" + (f" ({plugin.reason})" if plugin.reason else "")
    return f"pytest exit {rc}"


def _z3_obligations() -> str | None:
    from pagedkv.proofs.induction import PROVED, induction_matrix
    from pagedkv.proofs.nonvacuity import ENABLED, nonvacuity
    from pagedkv.proofs.safety import prove_safety

    for mode in ("symbolic", "bounded"):
        for o in induction_matrix(mode):
            if o.result != PROVED:
                return f"proofs: induction[{mode}] {o.invariant} / {o.transition}: {o.result}"
    for prop, r in prove_safety().items():
        if r.result != PROVED:
            return f"proofs: safety '{prop}': {r.result}"
    for name, es in nonvacuity().items():
        for e in es:
            if e.result != ENABLED:
                return f"proofs: non-vacuity {name} [{e.mode}]: {e.result}"
    return None


def _run_all_quick() -> str | None:
    from pagedkv.proofs.runner import run_all

    rep = run_all(quick=True, parallel=False)
    if rep.ok:
        return None
    return "proofs.runner.run_all(quick=True): " + rep.failures[0].splitlines()[0][:160]


def _canaries() -> str | None:
    from pagedkv.proofs.canaries import run_canaries

    rep = run_canaries()
    if rep["ok"]:
        return None
    if not rep.get("baseline", {}).get("ok", True):
        return f"canaries: baseline fails ({rep['baseline'].get('failed')})"
    missed = [n for n, c in rep["canaries"].items() if not c["caught"]]
    return f"canaries: not caught: {', '.join(missed)}"


def _original_module(m: Mutant, root: Path) -> Any:
    """The unmutated module, loaded beside the mutated one (same package, other name)."""
    import types

    pkg = m.module.rpartition(".")[0]
    mod = types.ModuleType(m.module + "__original")
    mod.__package__ = pkg
    path = root / m.file
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(path.read_bytes(), str(path), "exec"), mod.__dict__)
    return mod


def _z3_equivalence(m: Mutant, root: Path) -> tuple[str, str] | None:
    """For a surviving spec mutant: is it equivalent on every state the invariants allow?

    transitions.py: each transition's guard is the same term, and under the guard its effect is
    the same post-state, on every bounded pool (3 blocks, 3 holders) that satisfies every
    invariant. invariants.py: the conjunction of all invariants is the same predicate on those
    pools (a weakened invariant is then implied by the others). None if not proved."""
    import z3

    from pagedkv.proofs.induction import PROVED, build_frame, solve
    from pagedkv.proofs.z3_model import DEFAULT_BOUNDED, bounded_state, instance
    from pagedkv.spec.model import ARRAY_FIELDS

    orig = _original_module(m, root)
    if m.file == "spec/transitions.py":
        from pagedkv.spec.invariants import INVARIANTS

        mut = sys.modules[m.module]
        for name, t in orig.TRANSITIONS.items():
            tm = mut.TRANSITIONS[name]
            fr = build_frame("bounded", t, INVARIANTS, DEFAULT_BOUNDED)
            g0 = t.guard(fr.ops, fr.s, **fr.params)
            g1 = tm.guard(fr.ops, fr.s, **fr.params)
            if solve(fr.hyps + [g0 != g1], 20000)[0] != PROVED:
                return None
            p0 = t.effect(fr.ops, fr.s, **fr.params)
            p1 = tm.effect(fr.ops, fr.s, **fr.params)
            same = z3.And(*[getattr(p0, f) == getattr(p1, f) for f in ARRAY_FIELDS])
            if solve(fr.hyps + [g0, z3.Not(same)], 20000)[0] != PROVED:
                return None
        return (EQUIV, "z3: every guard and effect unchanged on all pools that satisfy the "
                       "invariants (bounded, 3 blocks / 3 holders)")
    if m.file == "spec/invariants.py":
        from pagedkv.spec.ops import Z3Ops

        mut = sys.modules[m.module]
        s, dom = bounded_state(DEFAULT_BOUNDED, "eq_")
        ops = Z3Ops()
        pts = {"block": list(range(DEFAULT_BOUNDED.blocks)),
               "hash": list(DEFAULT_BOUNDED.hashes),
               "holder": list(range(DEFAULT_BOUNDED.holders)),
               "launch": DEFAULT_BOUNDED.launch_keys, "pool": [None]}

        def conj(invs: Any) -> Any:
            return z3.And(*[instance(ops, inv, s, p) for inv in invs.values()
                            for p in pts[inv.scope]])

        if solve(list(dom) + [conj(orig.INVARIANTS) != conj(mut.INVARIANTS)], 20000)[0] \
                != PROVED:
            return None
        return (EQUIV, "z3: the conjunction of the invariants is unchanged (the weakened "
                       "part is implied by the other invariants; bounded, 3 blocks / 3 "
                       "holders)")
    return None


def stages(kind: str, root: Path, quick: bool, max_stages: int | None = None,
           m: Mutant | None = None) -> list[tuple[str, Callable[[], Any]]]:
    kill_tests = sorted(str(p.relative_to(root)) for p in (root / "tests").glob("test_kill_*.py"))
    out: list[tuple[str, Callable[[], Any]]] = [
        ("fast tests", lambda: _pytest(root, [*FAST_TESTS, *kill_tests])),
    ]
    if kind == "spec":
        out.append(("z3 obligations", _z3_obligations))
        if m is not None and max_stages is None:
            # proved equivalent: no test can kill it, skip the slow stages
            out.append(("z3 equivalence", lambda: _z3_equivalence(m, root)))
    out.append(("stateful", lambda: _pytest(root, list(STATEFUL_TESTS))))
    if kind == "spec" and not quick:
        out.append(("run_all quick", _run_all_quick))
    if not quick:
        out.append(("canaries", _canaries))
        out.append(("bug-finding tests", lambda: _pytest(root, list(BUG_TESTS))))
    return out[:max_stages]


FAST_STAGE_LIMIT_S = 90
STAGE_NAMES = ["fast tests", "z3 obligations (spec)", "z3 equivalence (spec: proved "
               "equivalent, stop)", "stateful", "run_all quick (spec)", "canaries",
               "bug-finding tests"]


class _StageTimeout(BaseException):
    pass


def run_mutant(m: Mutant | None, root: Path, quick: bool, max_stages: int | None = None
               ) -> tuple[str, str]:
    """In this (child) process: import the mutant and run the stages. (status, killer)."""
    os.environ["HYPOTHESIS_PROFILE"] = "mutation"
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    overrides = {m.module: mutated_source(m, root)} if m else {}
    install(root, overrides)
    kind = m.kind if m else "spec"
    import signal

    def hang(signum: int, frame: Any) -> None:
        raise _StageTimeout

    signal.signal(signal.SIGALRM, hang)
    for i, (name, stage) in enumerate(stages(kind, root, quick, max_stages, m)):
        signal.alarm(FAST_STAGE_LIMIT_S if i == 0 else 0)
        try:
            found = stage()
        except _StageTimeout:
            return TIMEOUT, (f"[{name}] did not finish in {FAST_STAGE_LIMIT_S} s (the "
                             "unmutated stage takes a few seconds): the mutant hangs")
        except BaseException as exc:  # noqa: BLE001 - a crash in a stage kills the mutant
            found = f"{name}: {type(exc).__name__}: {str(exc)[:120]}"
        finally:
            signal.alarm(0)
        if isinstance(found, tuple):  # (EQUIV, reason)
            return found
        if found:
            if name == "z3 equivalence":  # the check itself failed: no verdict
                continue
            if "_StageTimeout" in found:  # the alarm went off inside a test: a hang
                return TIMEOUT, (f"[{name}] {found}: did not finish in "
                                 f"{FAST_STAGE_LIMIT_S} s, the mutant hangs")
            return KILLED, f"[{name}] {found}"
    return SURVIVED, ""


# A child's address space: a mutant that makes memory grow without bound (say, a table that
# doubles on every call) then fails its test with a MemoryError, a kill, instead of taking
# the machine's memory until the kernel kills the child (no verdict) or its neighbours.
CHILD_ADDRESS_SPACE = 8 << 30


def _child(m: Mutant | None, root: Path, quick: bool, max_stages: int | None, wfd: int
           ) -> None:
    try:
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE, CHILD_ADDRESS_SPACE))
        result = run_mutant(m, root, quick, max_stages)
    except BaseException as exc:  # noqa: BLE001
        result = (ERROR, "".join(traceback.format_exception(exc))[-400:])
    with os.fdopen(wfd, "w") as fh:
        fh.write(json.dumps(result))
    os._exit(0)


def _preload() -> None:
    """Heavy third-party imports once, in the parent, so each forked child starts warm."""
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    for mod in ("numpy", "z3", "hypothesis", "hypothesis.stateful", "pytest", "_pytest.config"):
        with contextlib.suppress(ImportError):
            __import__(mod)


@dataclasses.dataclass
class _Running:
    m: Mutant | None
    pid: int
    rfd: int
    t0: float


def run_mutants(
    mutants: list[Mutant | None], root: Path, *, jobs: int = 1, timeout: float = 120.0,
    quick: bool = False, progress: Callable[[str], None] | None = None,
    max_stages: int | None = None,
    on_result: Callable[[int, tuple[str, str, float]], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[tuple[str, str, float]]:
    """Run each mutant (None: the unmutated baseline) in a forked child; results in order.
    Once ``stop()`` is true no more are started (those not run get a PENDING result)."""
    _preload()
    say = progress or (lambda _m: None)
    results: dict[int, tuple[str, str, float]] = {}
    queue = list(enumerate(mutants))
    running: dict[int, tuple[int, _Running]] = {}
    while queue or running:
        if stop is not None and stop():
            for idx, _ in queue:
                results[idx] = (PENDING, "", 0.0)
            queue = []
        while queue and len(running) < max(1, jobs):
            idx, m = queue.pop(0)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # child
                os.close(r)
                _child(m, root, quick, max_stages, w)
            os.close(w)
            running[pid] = (idx, _Running(m, pid, r, time.perf_counter()))
        time.sleep(0.05)
        for pid, (idx, run) in list(running.items()):
            elapsed = time.perf_counter() - run.t0
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == 0 and elapsed < timeout:
                continue
            if done == 0:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                result = (TIMEOUT, f"no verdict within {timeout:.0f} s (killed)")
            else:
                with os.fdopen(run.rfd, "r") as fh:
                    data = fh.read()
                run.rfd = -1
                result = tuple(json.loads(data)) if data else (
                    ERROR, f"child exited with status {status} and no verdict")
            if run.rfd >= 0:
                os.close(run.rfd)
            results[idx] = (result[0], result[1], round(elapsed, 2))
            del running[pid]
            if on_result is not None:
                on_result(idx, results[idx])
            label = "baseline" if run.m is None else f"#{run.m.id} {run.m.file}:{run.m.line}"
            say(f"{label} {run.m.operator if run.m else ''}: {result[0]} ({elapsed:.1f}s) "
                f"{result[1][:100]}")
    return [results[i] for i in range(len(mutants))]


# --- the report --------------------------------------------------------------------------------
def git_commit(root: Path) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def summarize(mutants: list[Mutant]) -> dict[str, Any]:
    n = len(mutants)
    counts = {s: sum(m.status == s for m in mutants) for s in (KILLED, TIMEOUT, SURVIVED,
                                                               EQUIV, ERROR, PENDING)}
    killed = counts[KILLED] + counts[TIMEOUT]
    non_equiv = n - counts[EQUIV] - counts[PENDING]
    by_file: dict[str, dict[str, int]] = {}
    for m in mutants:
        row = by_file.setdefault(m.file, {"total": 0, KILLED: 0, TIMEOUT: 0, SURVIVED: 0,
                                          EQUIV: 0, ERROR: 0, PENDING: 0})
        row["total"] += 1
        row[m.status] += 1
    by_op: dict[str, dict[str, int]] = {}
    for m in mutants:
        row = by_op.setdefault(m.operator, {"total": 0, "killed": 0})
        row["total"] += 1
        row["killed"] += m.status in (KILLED, TIMEOUT)
    return {
        "mutants": n,
        **counts,
        "kill_rate": round(killed / non_equiv, 4) if non_equiv else 1.0,
        "kill_rate_all": round(killed / n, 4) if n else 1.0,
        "by_file": by_file,
        "by_operator": by_op,
    }


def build_report(mutants: list[Mutant], *, root: Path, commit: str, dirty: list[str],
                 quick: bool, timeout: float, seconds: float, baseline: tuple[str, str, float],
                 carried: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "carried_over": carried or {},
        "tool": "python -m pagedkv.proofs.mutation",
        "commit": commit,
        "dirty_files": dirty,
        "target_sha256": _digests(root),
        "quick": quick,
        "timeout_s": timeout,
        "time_s": round(seconds, 1),
        "baseline": {"status": baseline[0], "detail": baseline[1], "seconds": baseline[2]},
        "targets": [dataclasses.asdict(t) | {
            "functions": sorted(t.functions) if t.functions else "all",
            "skip_functions": sorted(t.skip_functions)} for t in TARGETS],
        "stages": STAGE_NAMES if not quick else STAGE_NAMES[:4],
        "summary": summarize(mutants),
        "mutants": [m.summary() for m in mutants],
    }


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def to_markdown(rep: dict[str, Any]) -> str:
    s = rep["summary"]
    lines = [
        "# Mutation report",
        "",
        f"Commit `{rep['commit']}`" + (f" (working tree differed in {rep['dirty_files']})"
                                       if rep["dirty_files"] else "") +
        f"; `{rep['tool']}`{' --quick' if rep['quick'] else ''}; {rep['time_s']} s; "
        f"per-mutant timeout {rep['timeout_s']} s (a timeout counts as killed).",
        "",
        f"**Kill rate {s['kill_rate'] * 100:.1f} %** of non-equivalent mutants "
        f"({s['killed']} killed + {s['timeout']} timeouts of {s['mutants'] - s['equivalent']}; "
        f"{s['equivalent']} equivalent, {s['survived']} survived, {s['error']} errors; "
        f"{s['mutants']} mutants in all" + (f"; PARTIAL: {s['pending']} not run yet"
                                            if s["pending"] else "") + ").",
        "",
    ]
    c = rep.get("carried_over") or {}
    if c:
        lines += [f"Verdicts of {c['keys']} mutants (killed, or proved equivalent by z3 in a "
                  "file unchanged since, or not selected by --file / --ids) carried over "
                  "(same file, function, operator and mutated line) from the report at commit "
                  f"`{c['from_commit']}`, each marked with the commit of the report it was "
                  "first carried from; the others ran at the commit above.", ""]
    lines += [
        "Kill suite stages (first failure wins): " + ", ".join(rep["stages"]) + ".",
        f"Baseline (no mutant): {rep['baseline']['status']} "
        f"({rep['baseline']['seconds']} s) {rep['baseline']['detail']}",
        "",
        "| file | total | killed | timeout | equivalent | survived |",
        "|---|---|---|---|---|---|",
    ]
    for f, row in s["by_file"].items():
        lines.append(f"| {f} | {row['total']} | {row['killed']} | {row['timeout']} | "
                     f"{row['equivalent']} | {row['survived']} |")
    lines += ["", "| operator | total | killed (incl. timeout) |", "|---|---|---|"]
    for op, row in sorted(s["by_operator"].items()):
        lines.append(f"| {op} | {row['total']} | {row['killed']} |")
    special = [m for m in rep["mutants"] if m["status"] not in (KILLED, PENDING)]
    if special:
        lines += ["", "## Not killed by a test failure (survived, equivalent, timeout, error)",
                  "", "| # | file:line | function | operator | original → mutated | status | "
                  "why |", "|---|---|---|---|---|---|---|"]
        for m in special:
            lines.append(
                f"| {m['id']} | {m['file']}:{m['line']} | {m['function']} | {m['operator']} | "
                f"`{_md_cell(m['original'])}` → `{_md_cell(m['mutated'])}` | {m['status']} | "
                f"{_md_cell(m['killer'])} |")
    lines += ["", "## All mutants", "", "| # | file:line | operator | original → mutated | "
              "status | killed by / why | s |", "|---|---|---|---|---|---|---|"]
    for m in rep["mutants"]:
        lines.append(
            f"| {m['id']} | {m['file']}:{m['line']} | {m['operator']} | "
            f"`{_md_cell(m['original'])}` → `{_md_cell(m['mutated'])}` | {m['status']} | "
            f"{_md_cell(m['killer'])} | {m['seconds']} |")
    return "\n".join(lines) + "\n"


def load_mutation_report(path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The committed report's summary for ``pagedkv verify``: kill rate, counts, commit.

    None if there is no report (or it cannot be read)."""
    p = Path(path) if path is not None else REPO / DEFAULT_OUT
    if path is None and not p.is_file():  # an installed wheel ships it as package data
        p = Path(__file__).resolve().parent / "data" / Path(DEFAULT_OUT).name
    try:
        rep = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    s = rep.get("summary", {})
    return {
        "path": str(p),
        "commit": rep.get("commit"),
        "dirty_files": rep.get("dirty_files", []),
        "quick": rep.get("quick"),
        "kill_rate": s.get("kill_rate"),
        "mutants": s.get("mutants"),
        "killed": s.get("killed"),
        "timeout": s.get("timeout"),
        "survived": s.get("survived"),
        "equivalent": s.get("equivalent"),
        "error": s.get("error"),
        "time_s": rep.get("time_s"),
        "pending": s.get("pending", 0),
        "ok": s.get("survived") == 0 and s.get("error") == 0 and not s.get("pending"),
    }


@contextlib.contextmanager
def snapshot(rev: str | None) -> Iterator[tuple[Path, str]]:
    """The tree to mutate: a copy of the working tree (rev None: its tracked and untracked,
    not ignored files, taken once at the start, so that edits made while the run goes on
    neither shift the mutants' byte offsets nor change the kill suite), or ``git archive rev``
    extracted."""
    tmp = Path(tempfile.mkdtemp(prefix="pagedkv-mutation-"))
    try:
        if rev is None:
            commit = git_commit(REPO)
            names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"],
                                   cwd=REPO, capture_output=True, check=True).stdout
            for name in sorted(set(names.decode().split("\0")) - {""}):
                src = REPO / name
                if src.is_file() and not src.is_symlink():
                    (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, tmp / name)
        else:
            commit = subprocess.run(["git", "rev-parse", rev], cwd=REPO, capture_output=True,
                                    text=True, check=True).stdout.strip()
            data = subprocess.run(["git", "archive", "--format=tar", commit], cwd=REPO,
                                  capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(tmp)], input=data, check=True)
        yield tmp, commit
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _same_file(commit: str, root: Path, path: str) -> bool:
    """Whether ``root/path`` (the snapshot) has the content it had at ``commit``."""
    try:
        old = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO,
                             capture_output=True, check=True).stdout
        return old == (root / path).read_bytes()
    except (OSError, subprocess.CalledProcessError):
        return False


def _digests(root: Path) -> dict[str, str]:
    """sha256 (12 hex digits) of each target file as mutated: which tree the report is of."""
    return {t.path: hashlib.sha256((root / t.path).read_bytes()).hexdigest()[:12]
            for t in TARGETS if (root / t.path).is_file()}


_AT = re.compile(r" \(at [0-9a-f]{12}\)")


def _carried_killer(killer: str, commit: str) -> str:
    """A carried verdict's reason, marked with the commit of the report it came from: only
    the first (oldest) ``(at ...)`` mark is kept, so repeated updates do not stack them."""
    if not killer:
        return killer
    first = _AT.search(killer)
    if first is None:
        return f"{killer} (at {commit[:12]})"
    return killer[: first.end()] + _AT.sub("", killer[first.end():])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pagedkv.proofs.mutation",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="fast stages only (no canaries / bug-finding tests / run_all)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1200.0,
                    help="seconds per mutant (a hang in the fast stage is cut at "
                         f"{FAST_STAGE_LIMIT_S} s)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="report .json (a .md is written beside)")
    ap.add_argument("--rev", default=None, help="mutate `git archive REV` instead of the tree")
    ap.add_argument("--file", action="append", help="only these target files (repeatable)")
    ap.add_argument("--ids", default=None, help="only these mutant ids (e.g. 3,7,10-12)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--update", action="store_true",
                    help="keep the killed/timeout verdicts (and z3 equivalence proofs of "
                         "unchanged files) of the report at --out, matched by mutant key, and "
                         "run only the other mutants")
    ap.add_argument("--max-stages", type=int, default=None,
                    help="triage: run only the first N stages (survivors are not final)")
    a = ap.parse_args(argv)

    with snapshot(a.rev) as (root, commit):
        everything = all_mutants(root)
        mutants = [m for m in everything if not a.file or m.file in a.file]
        if a.ids:
            wanted: set[int] = set()
            for part in a.ids.split(","):
                lo, _, hi = part.partition("-")
                wanted |= set(range(int(lo), int(hi or lo) + 1))
            mutants = [m for m in mutants if m.id in wanted]
        if a.list:
            for m in mutants:
                print(f"#{m.id} {m.file}:{m.line} [{m.function}] {m.operator}: "
                      f"{m.original.strip()} -> {m.mutated.strip()}")
            print(f"{len(mutants)} mutants")
            return 0
        # target files of the snapshot that differ from the commit it is reported at
        dirty = [t.path for t in TARGETS if not _same_file(commit, root, t.path)]
        t0 = time.perf_counter()
        carried: dict[str, Any] = {}
        selected = {id(m) for m in mutants}
        prev_by_key: dict[str, dict[str, Any]] = {}
        if a.update:
            prev_path = Path(a.out) if Path(a.out).is_absolute() else REPO / a.out
            prev = json.loads(prev_path.read_text())
            prev_by_key = {m["key"]: m for m in prev["mutants"]}
            # the snapshot (working tree or --rev) against the report's tree: its recorded
            # digests, or its commit's files for a report of a clean tree
            prev_digests = prev.get("target_sha256") or {}
            now = _digests(root)
            same = {t.path for t in TARGETS
                    if (prev_digests.get(t.path) == now[t.path] if prev_digests else (
                        t.path not in prev.get("dirty_files", [])
                        and _same_file(prev["commit"], root, t.path)))}
            # killed stays killed; a z3 equivalence proof stays valid while its file is the same
            done_before = {k: m for k, m in prev_by_key.items()
                           if m["status"] in (KILLED, TIMEOUT)
                           or (m["status"] == EQUIV and m["killer"].startswith("z3:")
                               and m["file"] in same)}
            carried = {"from_commit": prev["commit"], "keys": 0}
            # --file / --ids with --update: the report still covers every target; the mutants
            # not selected keep their previous verdict (pending if they are new)
            mutants = everything
        todo = []
        for m in mutants:
            if m.key in EQUIVALENT:
                m.status, m.killer = EQUIV, EQUIVALENT[m.key]
            elif a.update and (m.key in done_before or (
                    id(m) not in selected and m.key in prev_by_key)):
                old = prev_by_key[m.key]
                m.status, m.seconds = old["status"], old["seconds"]
                if "_StageTimeout" in old["killer"]:  # a hang recorded as a test failure
                    m.status = TIMEOUT
                if m.status == EQUIV and not old["killer"].startswith("z3:"):
                    m.status = PENDING  # an argued equivalence no longer in EQUIVALENT
                m.killer = _carried_killer(old["killer"], prev["commit"])
                carried["keys"] += 1
            elif a.update and id(m) not in selected:
                m.status = PENDING  # new, and not selected: not run this time
            else:
                todo.append(m)

        def say(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)

        say(f"{len(mutants)} mutants ({len(todo)} to run), commit {commit[:12]}, "
            f"jobs {a.jobs}")
        for m in todo:
            m.status = PENDING
        out = Path(a.out)
        if not out.is_absolute():
            out = REPO / out
        out.parent.mkdir(parents=True, exist_ok=True)
        first: list[tuple[str, str, float]] = [(PENDING, "", 0.0)]
        done = [0]

        def write(rep: dict[str, Any]) -> None:
            out.write_text(json.dumps(rep, indent=1) + "\n")
            out.with_suffix(".md").write_text(to_markdown(rep))

        def on_result(idx: int, res: tuple[str, str, float]) -> None:
            if idx == 0:
                first[0] = res
            else:
                m = todo[idx - 1]
                m.status, m.killer, m.seconds = res
            done[0] += 1
            if done[0] % 25 == 0 and first[0][0] == SURVIVED:  # a partial report meanwhile
                write(build_report(mutants, root=root, commit=commit, dirty=dirty,
                                   quick=a.quick, timeout=a.timeout,
                                   seconds=time.perf_counter() - t0, baseline=first[0],
                                   carried=carried))

        # the baseline runs first: if the unmutated tree fails the kill suite, every mutant
        # would be "killed" by that failure, so stop and keep the report as it was
        baseline, *results = run_mutants([None, *todo], root, jobs=a.jobs, timeout=a.timeout,
                                         quick=a.quick, progress=say,
                                         max_stages=a.max_stages, on_result=on_result,
                                         stop=lambda: first[0][0] not in (PENDING, SURVIVED))
        if baseline[0] != SURVIVED:
            say(f"the unmutated tree fails the kill suite, no report written: {baseline}")
            return 2
        for m, (status, killer, secs) in zip(todo, results, strict=True):
            m.status, m.killer, m.seconds = status, killer, secs
        rep = build_report(mutants, root=root, commit=commit, dirty=dirty, quick=a.quick,
                           timeout=a.timeout, seconds=time.perf_counter() - t0,
                           baseline=baseline, carried=carried)
        write(rep)
    s = rep["summary"]
    print(f"kill rate {s['kill_rate'] * 100:.1f} %: {s['killed']} killed, {s['timeout']} "
          f"timeout, {s['equivalent']} equivalent, {s['survived']} survived, {s['error']} "
          f"errors of {s['mutants']}; report {out}")
    return 0 if baseline[0] == SURVIVED and s["survived"] == 0 and s["error"] == 0 else 1


def mutant_digest(m: Mutant, root: Path = REPO) -> str:
    return hashlib.sha256(mutated_source(m, root)).hexdigest()[:12]


if __name__ == "__main__":
    sys.exit(main())
