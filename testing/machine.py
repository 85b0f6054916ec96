"""The reusable state machine: any allocator behind an ``AllocatorAdapter``, driven by
hypothesis and checked against the machine's own reference model after every call.

Rules (each prints as one readable step of the shrunk program; requests and launches are
hypothesis bundle variables, ``req_0``, ``launch_0``, and the allocator sees the same names):
``admit`` (add_request + the first allocate), ``append_tokens``, ``allocate``, ``launch``,
``complete`` (then commit what completed launches wrote), ``serve`` (one engine step for a
request), ``fork``, ``free``, ``preempt`` (free + re-admit) and ``misuse`` (calls that must be
refused or do nothing). Rules an adapter lacks the capability for are never drawn.

Every adapter call is noted (hypothesis prints the notes of the failing example) and a failed
check raises ``CheckFailed`` naming the check, what broke in words, and the last calls.
"""

from __future__ import annotations

import unittest
from collections import Counter, deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar, NoReturn

from hypothesis import HealthCheck, note
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pagedkv.spec import (
    ALLOCATED,
    ISSUED,
    PUBLISHED,
    REFERENCED,
    TRANSITIONS,
    state_name,
    states_equal,
    step,
    violations,
)
from pagedkv.spec.explain import explain_refusal
from pagedkv.spec.requests import tables

from .adapter import AdapterFactory, AllocatorAdapter, SpecView
from .model import CheckFailed, LaunchRec, ObservedModel, Req

REQ, LAUNCH = "req", "launch"  # bundle names: hypothesis names values req_0, launch_0, ...
MAX_LIVE = 4
CALLS_SHOWN = 16
SHARED_PREFIX = list(range(100, 116))
SALTS = st.sampled_from([None, None, "tenant-a"])
TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=4)
MISUSE = ("add_live", "free_again", "allocate_unknown", "launch_unknown", "complete_again")


class AdapterMachine(RuleBasedStateMachine):
    """The machine; ``make_machine`` makes a subclass for one adapter factory."""

    requests = Bundle(REQ)
    launches = Bundle(LAUNCH)
    outcomes: ClassVar[Counter[str]] = Counter()  # per subclass: "rule: outcome" -> count

    def __init__(self) -> None:
        super().__init__()
        self.adapter: AllocatorAdapter | None = None
        self.calls: list[str] = []
        self.added = 0  # requests named so far (mirrors hypothesis's bundle naming)
        self.named_launches = 0
        self.served = 0
        self.freed: list[Hashable] = []
        self.completed: list[LaunchRec] = []
        self.spec: Any = None
        self.ever: set[Hashable] = set()

    # ---- set-up ---------------------------------------------------------------------------
    def _setup(self, factory: AdapterFactory, num_blocks: int, block_size: int) -> None:
        adapter = factory(num_blocks, block_size)
        self.adapter = adapter
        self.caps = adapter.capabilities
        self.B = adapter.block_size
        self.model = ObservedModel(adapter.num_blocks, adapter.block_size)
        self._log(f"factory({num_blocks}, {block_size}): {adapter.num_blocks} blocks of "
                  f"{adapter.block_size}, {self.caps}")
        if self.caps.spec_view:
            if not isinstance(adapter, SpecView):
                raise TypeError(f"{type(adapter).__name__} declares spec_view but lacks "
                                "abstract() / transitions()")
            adapter.transitions()  # what the set-up did is the starting state
            pool, requests = adapter.abstract()
            self.spec = pool
            bad = violations(pool, requests)
            if bad:
                self._fail(f"invariant:{bad[0][0]}", f"the initial state fails at {bad[0][1]!r}")

    def _outcome(self, label: str) -> None:
        type(self).outcomes[label] += 1

    # ---- calls ----------------------------------------------------------------------------
    def _log(self, line: str) -> None:
        """One adapter call; noted as a comment, so the printed program stays Python (each
        step's calls come just before the step)."""
        self.calls.append(line)
        note(f"# {line}")

    def _fail(self, check: str, detail: str) -> NoReturn:
        raise CheckFailed(check, detail, self.calls[-CALLS_SHOWN:])

    def _call(self, text: str, fn: Callable[[], Any], name: str = "") -> tuple[bool, Any]:
        """(raised, result) of one adapter call; an AssertionError is a failure, not a refusal.
        With a spec view, the transitions it performed are replayed at once. ``name``: what
        the machine calls the result (a launch's label) in the log."""
        try:
            result = fn()
        except AssertionError as exc:
            self._log(f"{text} raised {type(exc).__name__}: {exc}")
            self._fail("calls_succeed", f"{text} failed an internal check: "
                                        f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - any other exception is a refusal
            self._log(f"{text} raised {type(exc).__name__}: {exc}")
            self._replay(text)
            return True, exc
        shown = f"{name} = {text}" if name and result is not None else text
        self._log(f"{shown} -> {result!r}" if result is not None else text)
        self._replay(text)
        return False, result

    def _ints(self, values: Any, what: str) -> list[int]:
        try:
            return [int(v) for v in values]
        except (TypeError, ValueError):
            self._fail("table_shape", f"{what} is {values!r}, not a sequence of block ids")

    def _must(self, text: str, fn: Callable[[], Any]) -> Any:
        raised, result = self._call(text, fn)
        if raised:
            self._fail("calls_succeed", f"{text} raised {type(result).__name__}: {result}")
        return result

    def _maybe(self, text: str, fn: Callable[[], Any], name: str = "") -> tuple[bool, Any]:
        """(refused, result): refused when the call raised or returned None."""
        raised, result = self._call(text, fn, name)
        return raised or result is None, result

    # ---- what can be observed --------------------------------------------------------------
    def _observe(self) -> dict[str, Any]:
        a = self.adapter
        snap: dict[str, Any] = {
            "tables": {r: tuple(a.block_table(r)) for r in self.model.reqs},
            "num_free_blocks()": a.num_free_blocks(),
            "num_cached_blocks()": a.num_cached_blocks(),
        }
        if self.caps.spec_view:
            pool, requests = a.abstract()
            snap["spec"] = pool
            snap["spec tables"] = tables(requests)
        return snap

    def _unchanged(self, before: dict[str, Any], text: str) -> None:
        after = self._observe()
        for key, old in before.items():
            new = after[key]
            if key == "spec":
                diffs = states_equal(old, new)
                if diffs:
                    self._fail("refusal_changes_nothing",
                               f"{text} was refused but changed the spec state: {diffs[:4]}")
            elif old != new:
                self._fail("refusal_changes_nothing",
                           f"{text} was refused but changed {key}: {old!r} -> {new!r}")

    def _replay(self, text: str, *, compare: bool = False) -> None:
        """Replay the transitions the last call performed on the spec model; then (if there
        were any, or ``compare``) the model must equal ``abstract()``."""
        if not self.caps.spec_view:
            return
        performed = self.adapter.transitions()  # type: ignore[attr-defined]
        if not performed and not compare:
            return
        for name, params in performed:
            shown = f"{name}({', '.join(f'{k}={v!r}' for k, v in params.items())})"
            if name not in TRANSITIONS:
                self._fail("spec_guard", f"{text} performed {shown}, not a spec transition")
            m = self.spec
            r = params.get("r")
            if name == "open_holder" and r not in m.holder_ids:
                m = m.replace(holder_ids=(*m.holder_ids, r))
            post = step(m, name, **params)
            if post is None:
                why = explain_refusal(TRANSITIONS[name], m, **params)
                self._fail("spec_guard", f"{text} performed {shown}, which the spec refuses: "
                                         f"{why}")
            if name == "close_holder":
                post = post.replace(holder_ids=tuple(h for h in post.holder_ids if h != r))
            self.spec = post
        pool, _ = self.adapter.abstract()  # type: ignore[attr-defined]
        diffs = states_equal(self.spec, pool)
        if diffs:
            self._fail("spec_refinement", f"after {text}, abstract() differs from the spec "
                                          f"model's state: {diffs[:5]}")

    @invariant()
    def observations_agree(self) -> None:
        """After every step: the observations agree with the reference model (and the spec)."""
        if self.adapter is not None:
            self._check_observations(self.calls[-1] if self.calls else "set-up")

    def _check_observations(self, last: str) -> None:
        a, m = self.adapter, self.model
        m.note_released()
        self._replay(f"observing (after {last})", compare=True)
        for rid, req in m.reqs.items():
            table = self._ints(a.block_table(rid), f"block_table({rid!r})")
            if table != req.table:
                self._fail("tables_only_grow",
                           f"block_table({rid!r}) is {table}, but the last call that could "
                           f"change it left {req.table} (now after {last})")
        held = m.held()
        free = a.num_free_blocks()
        if free != m.capacity - len(held):
            self._fail("free_block_accounting",
                       f"num_free_blocks() is {free}, but {m.capacity - len(held)} of the "
                       f"{m.capacity} blocks are in no live table (after {last})")
        cached = a.num_cached_blocks()
        bound = len([b for b in m.content if b not in held]) if self.caps.prefix_caching else 0
        if not 0 <= cached <= bound:
            self._fail("cached_accounting",
                       f"num_cached_blocks() is {cached}, but only {bound} blocks in no live "
                       f"table hold committed KV (after {last})")
        if self.caps.spec_view:
            self._check_spec(last)

    def _check_spec(self, last: str) -> None:
        pool, requests = self.adapter.abstract()  # type: ignore[attr-defined]
        bad = violations(pool, requests)
        if bad:
            name, where = bad[0]
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            self._fail(f"invariant:{name}", f"invariant {name!r} fails at {where!r}{more} "
                                            f"after {last}")
        by_holder = tables(requests)
        for rid, req in self.model.reqs.items():
            t = by_holder.get(rid)
            if t is None or list(t[0]) != req.table:
                shown = None if t is None else list(t[0])
                self._fail("spec_tables", f"abstract() has table {shown} for {rid!r}, the "
                                          f"allocator's block_table is {req.table}")
        for holder in by_holder:
            if holder in self.ever and holder not in self.model.reqs:
                self._fail("spec_tables", f"abstract() still has a table for {holder!r}, "
                                          f"which was freed")
        self._check_pins(f"after {last}", pool)

    def _check_pins(self, when: str, pool: Any = None) -> None:
        """Each block an in-flight launch reads is protected in the spec state: the launch is
        in flight there and the block is held, or was retired after the launch's number (so
        the watermark, which stays at or below every in-flight launch, cannot reach it)."""
        if pool is None:
            pool, _ = self.adapter.abstract()  # type: ignore[attr-defined]
        for rec in self.model.inflight.values():
            L = rec.number
            if L is None:
                continue
            if not pool.inflight[L]:
                self._fail("launch_pins", f"{rec.label} ({rec.call}) is in flight, but the "
                                          f"spec state has launch {L} completed ({when})")
            for b in sorted(rec.pins):
                if pool.state[b] in (ALLOCATED, PUBLISHED, REFERENCED) or pool.retire[b] > L:
                    continue
                self._fail("launch_pins",
                           f"block {b} is read by in-flight {rec.label} ({rec.call}), launch "
                           f"{L} in the spec, but the spec state has it "
                           f"{state_name(pool.state[b])}, retired at clock {pool.retire[b]} "
                           f"({when}): nothing would stop it "
                           f"being recycled while the kernels read it")

    # ---- model updates, shared by the rules ------------------------------------------------
    def _check_new_blocks(self, text: str, req: Req, table: list[int], start: int,
                          hits: int) -> None:
        """Entries ``table[start:]`` are new: the first ``hits`` are prefix hits, the rest
        fresh blocks."""
        m = self.model
        if len(set(table)) != len(table):
            self._fail("table_shape", f"{text} returned {table}: a block appears twice")
        held, pinned = m.held(), m.pinned()
        for i in range(start, len(table)):
            b = table[i]
            if i - start < hits:
                if m.content.get(b) != m.key(req, i):
                    self._fail("hits_on_committed_kv",
                               f"{text} took block {b} as the prefix hit for positions "
                               f"{i * self.B}..{(i + 1) * self.B - 1} of {req.rid!r} (tokens "
                               f"{req.tokens[: (i + 1) * self.B]}, salt {req.salt!r}), but "
                               f"{m.describe(b)}")
                continue
            self._check_fresh(text, b, held, pinned)
            m.content.pop(b, None)

    def _check_fresh(self, text: str, b: int, held: set[int], pinned: set[int]) -> None:
        m = self.model
        if b in held:
            self._fail("fresh_block_unheld", f"{text} handed out block {b}, which the table "
                                             f"of {m.holders(b)} already holds")
        if b in pinned:
            who = ", ".join(m.pinned_by(b))
            self._fail("no_reuse_while_in_flight",
                       f"{text} handed out block {b}, which in-flight {who} still reads")

    def _grow(self, req: Req, n: int) -> bool:
        m = self.model
        text = f"allocate({req.rid!r}, {n})"
        need = m.blocks_for(n) - len(req.table)
        available = m.available()
        before = self._observe()
        refused, table = self._maybe(text, lambda: self.adapter.allocate(req.rid, n))
        if refused:
            self._unchanged(before, text)
            if self.caps.exact_capacity and need <= available:
                self._fail("refuses_only_when_full",
                           f"{text} was refused, but it needs {need} new blocks and "
                           f"{available} are free to reuse (in no live table, waiting for "
                           f"no in-flight launch)")
            self._outcome("allocate: refused")
            return False
        self._accept_table(text, req, n, table, 0)
        self._outcome("allocate: ok")
        return True

    def _accept_table(self, text: str, req: Req, n: int, table: Any, hits: int) -> None:
        table = self._ints(table, f"{text}'s result")
        observed = self._ints(self.adapter.block_table(req.rid), f"block_table({req.rid!r})")
        if observed != table:
            self._fail("table_shape", f"{text} returned {table}, but block_table"
                                      f"({req.rid!r}) is {observed}")
        old = req.table
        if table[: len(old)] != old:
            self._fail("tables_only_grow", f"{text} returned {table}: the table was {old}")
        if len(table) != self.model.blocks_for(n):
            self._fail("table_shape", f"{text} returned {len(table)} entries for {n} "
                                      f"positions of {self.B}")
        self._check_new_blocks(text, req, table, len(old), hits)
        req.table, req.reserved = table, n
        self.model.note_released()

    def _admit(self, rid: Hashable, prompt: list[int], salt: str | None, chunk: int) -> Any:
        m, a = self.model, self.adapter
        before = self._observe()
        hits = self._must(f"add_request({rid!r}, {prompt}, salt={salt!r})",
                          lambda: a.add_request(rid, list(prompt), salt))
        self.ever.add(rid)
        req = Req(rid, list(prompt), salt)
        if (isinstance(hits, bool) or not isinstance(hits, int) or hits < 0
                or hits % self.B or hits >= len(prompt)
                or (hits and not self.caps.prefix_caching)):
            self._fail("hits_on_committed_kv",
                       f"add_request({rid!r}) reported {hits!r} cached tokens of a "
                       f"{len(prompt)}-token prompt (blocks of {self.B}, prefix caching "
                       f"{'on' if self.caps.prefix_caching else 'off'})")
        for i in range(hits // self.B):
            if not m.candidates(req, i):
                self._fail("hits_on_committed_kv",
                           f"add_request({rid!r}, {prompt}, salt={salt!r}) reported {hits} "
                       f"cached tokens, but no block "
                           f"holds committed KV of tokens {prompt[: (i + 1) * self.B]} "
                           f"(salt {salt!r})")
        n = min(hits + chunk, len(prompt))
        text = f"allocate({rid!r}, {n})"
        need = m.blocks_for(n) - hits // self.B
        busy = m.unavailable()
        revive = sum(1 for i in range(hits // self.B)
                     if any(b not in busy for b in m.candidates(req, i)))
        available = m.available()
        after_add = self._observe()
        refused, table = self._maybe(text, lambda: a.allocate(rid, n))
        if refused:
            self._unchanged(after_add, text)
            if self.caps.exact_capacity and need + revive <= available:
                self._fail("refuses_only_when_full",
                           f"{text} was refused at admission, but it needs {need} new blocks "
                           f"(+ {revive} cached ones revived) and {available} are free to "
                           f"reuse (in no live table, waiting for no in-flight launch)")
            self._must(f"free({rid!r})", lambda: a.free(rid))
            self._unchanged(before, f"add_request({rid!r}) + a refused allocate + free")
            self._outcome("admit: refused")
            return multiple()
        self._accept_table(text, req, n, table, hits // self.B)
        req.issued = req.computed = hits
        m.reqs[rid] = req
        self.added += 1
        self._outcome("admit: ok" + (" with prefix hits" if hits else ""))
        return rid

    def _next_rid(self) -> str:
        return f"{REQ}_{self.added}"

    def _launch(self, rids: Sequence[Hashable], label: str) -> LaunchRec | None:
        m, a = self.model, self.adapter
        m.note_released()  # blocks let go before this launch do not wait for it
        reqs = [m.reqs[r] for r in rids]
        writes = {
            r.rid: range(r.issued // self.B, m.blocks_for(r.reserved))
            if r.reserved > r.issued else range(0) for r in reqs
        }
        writers: Counter[int] = Counter()
        for r in reqs:
            for i in writes[r.rid]:
                if len(m.holders(r.table[i])) > 1:
                    writers[r.table[i]] += 1
        copies = sum(min(k, len(m.holders(b)) - 1) for b, k in writers.items())
        available = m.available()
        text = f"launch({list(rids)!r})"
        before = self._observe()
        # the spec numbers launches in publish order: this one takes the next number
        number = a.abstract()[0].clock[ISSUED] if self.caps.spec_view else None  # type: ignore[attr-defined]
        refused, handle = self._maybe(text, lambda: a.launch(list(rids)), label)
        if refused:
            self._unchanged(before, text)
            if not copies:
                self._fail("calls_succeed", f"{text} was refused; it needs no copy-on-write")
            if self.caps.exact_capacity and copies <= available:
                self._fail("refuses_only_when_full",
                           f"{text} was refused, but its {copies} copy-on-write copies fit in "
                           f"the {available} blocks free to reuse (in no live table, waiting "
                           f"for no in-flight launch)")
            self._outcome("launch: refused (no room for copy-on-write)")
            return None
        held, pinned = m.held(), m.pinned()
        sources, fresh = set(), set()
        after: dict[Hashable, list[int]] = {}
        for r in reqs:
            table = self._ints(a.block_table(r.rid), f"block_table({r.rid!r})")
            if len(table) != len(r.table):
                self._fail("tables_only_grow", f"{text} changed {r.rid!r}'s table from "
                                               f"{r.table} to {table}")
            for i, (old, new) in enumerate(zip(r.table, table, strict=True)):
                if old == new:
                    continue
                if i not in writes[r.rid] or len(m.holders(old)) < 2:
                    self._fail("tables_only_grow",
                               f"{text} replaced entry {i} of {r.rid!r}'s table ({old} -> "
                               f"{new}), a block it does not write or that is not shared")
                self._check_fresh(text, new, held | fresh, pinned)
                sources.add(old)
                fresh.add(new)
                m.content.pop(new, None)
            after[r.rid] = table
        for r in reqs:
            r.table = after[r.rid]
        for r in reqs:
            for i in writes[r.rid]:
                b = r.table[i]
                if m.holders(b) != [r.rid]:
                    others = [h for h in m.holders(b) if h != r.rid]
                    self._fail("copy_on_write",
                               f"{text} writes positions {max(r.issued, i * self.B)}.."
                               f"{min(r.reserved, (i + 1) * self.B) - 1} of {r.rid!r} into "
                               f"block {b}, which the table of {others} also holds")
        pins = {b for r in reqs for b in r.table} | sources
        rec = LaunchRec(label, tuple(rids), frozenset(pins), handle, text, number)
        m.inflight[label] = rec
        m.note_released()  # copy-on-write sources it replaced wait for it
        for r in reqs:
            r.issued = r.reserved
            r.launches.append((label, r.reserved))
        if self.caps.spec_view:
            self._check_pins(f"right after {text}")
        self._outcome("launch: ok" + (" with copy-on-write" if sources else ""))
        return rec

    def _complete(self, label: str) -> None:
        m = self.model
        rec = m.inflight[label]
        self._must(f"complete({label})", lambda: self.adapter.complete(rec.handle))
        m.note_released()
        del m.inflight[label]
        m.done.add(label)
        self.completed.append(rec)
        for req in list(m.reqs.values()):
            target = m.commit_target(req)
            if target is None:
                continue
            self._commit(req, target)

    def _commit(self, req: Req, n: int) -> None:
        if self.caps.prefix_caching:
            self._must(f"commit({req.rid!r}, {n})", lambda: self.adapter.commit(req.rid, n))
        self.model.record_commit(req, n)

    # ---- rules ----------------------------------------------------------------------------
    @precondition(lambda self: len(self.model.reqs) < MAX_LIVE)
    @rule(target=requests, shared=st.integers(0, 9), tail=st.lists(st.integers(0, 3), max_size=3),
          salt=SALTS, chunk=st.integers(1, 6))
    def admit(self, shared: int, tail: list[int], salt: str | None, chunk: int) -> Any:
        """Admit a prompt of the first ``shared`` tokens of a common prefix (100, 101, ...)
        then ``tail``: add_request, then the first allocate of ``hits + chunk`` positions."""
        prompt = SHARED_PREFIX[:shared] + tail or [0]
        return self._admit(self._next_rid(), prompt, salt, chunk)

    @rule(rid=requests, tokens=TOKENS)
    def append_tokens(self, rid: Hashable, tokens: list[int]) -> None:
        self._must(f"append_tokens({rid!r}, {tokens})",
                   lambda: self.adapter.append_tokens(rid, list(tokens)))
        self.model.reqs[rid].tokens += tokens

    @rule(rid=requests, extra=st.integers(1, 8))
    def allocate(self, rid: Hashable, extra: int) -> None:
        """Grow the table by ``extra`` positions (at most up to the known tokens)."""
        req = self.model.reqs[rid]
        n = min(req.reserved + extra, len(req.tokens))
        if n > req.reserved:
            self._grow(req, n)

    @precondition(lambda self: self.caps.launches)
    @rule(target=launches, rids=st.lists(requests, min_size=1, max_size=3, unique=True))
    def launch(self, rids: list[Hashable]) -> Any:
        label = f"{LAUNCH}_{self.named_launches}"
        if self._launch(rids, label) is None:
            return multiple()
        self.named_launches += 1
        return label

    @rule(launch=consumes(launches))
    def complete(self, launch: str) -> None:
        self._complete(launch)
        self._outcome("complete: ok")

    @rule(target=launches, rid=requests, in_flight=st.booleans(), token=st.integers(0, 3))
    def serve(self, rid: Hashable, in_flight: bool, token: int) -> Any:
        """One engine step: allocate the known tokens, launch, then (unless ``in_flight``)
        complete, commit and append the sampled ``token``."""
        req = self.model.reqs[rid]
        if len(req.tokens) > req.reserved and not self._grow(req, len(req.tokens)):
            return multiple()
        if not self.caps.launches:
            req.issued = req.reserved
            self._commit(req, req.reserved)
            self.append_tokens(rid, [token])
            self._outcome("serve: ok (no launches)")
            return multiple()
        if in_flight:
            label = f"{LAUNCH}_{self.named_launches}"
            if self._launch([rid], label) is None:
                return multiple()
            self.named_launches += 1
            self._outcome("serve: left in flight")
            return label
        label = f"served_{self.served}"
        self.served += 1
        if self._launch([rid], label) is None:
            return multiple()
        self._complete(label)
        self.append_tokens(rid, [token])
        self._outcome("serve: served")
        return multiple()

    @precondition(lambda self: self.caps.fork and len(self.model.reqs) < MAX_LIVE)
    @rule(target=requests, parent=requests)
    def fork(self, parent: Hashable) -> Any:
        child = self._fork(parent)
        return multiple() if child is None else child

    @precondition(lambda self: self.caps.fork and len(self.model.reqs) < MAX_LIVE)
    @rule(target=requests, parent=requests, token=st.integers(0, 3))
    def fork_then_write(self, parent: Hashable, token: int) -> Any:
        """Serve ``parent`` (its last written block is then usually partial), fork it, and
        serve the child with a token of its own: the child's launch writes the partial block
        it shares, which must go to a copy (copy-on-write)."""
        self.serve(parent, False, token)
        child = self._fork(parent)
        if child is None:
            return multiple()
        self.append_tokens(child, [(token + 1) % 4])
        self.serve(child, False, token)
        return child

    def _fork(self, parent: Hashable) -> Hashable | None:
        m, a = self.model, self.adapter
        child = self._next_rid()
        p = m.reqs[parent]
        written = m.blocks_for(p.issued)  # entries holding written KV
        fresh_needed = len(p.table) - written
        busy = any(label not in m.done for label, _ in p.launches)
        available = m.available()
        text = f"fork({parent!r}, {child!r})"
        before = self._observe()
        refused, table = self._maybe(text, lambda: a.fork(parent, child))
        if refused:
            self._unchanged(before, text)
            if self.caps.exact_capacity and not busy and fresh_needed <= available:
                self._fail("refuses_only_when_full",
                           f"{text} was refused, but the parent has no launch in flight and "
                           f"its {fresh_needed} unwritten blocks fit in {available}")
            self._outcome("fork: refused")
            return None
        self.ever.add(child)
        table = self._ints(table, f"{text}'s result")
        observed = self._ints(a.block_table(child), f"block_table({child!r})")
        if observed != table or len(table) != len(p.table):
            self._fail("table_shape", f"{text} returned {table} (block_table says "
                                      f"{observed}) for a parent table of {len(p.table)}")
        if len(set(table)) != len(table):
            self._fail("table_shape", f"{text} returned {table}: a block appears twice")
        held, pinned = m.held(), m.pinned()
        for i, (pb, cb) in enumerate(zip(p.table, table, strict=True)):
            if pb == cb:
                continue
            if i < written:
                self._fail("fork_shares_written_kv",
                           f"{text} gave the child block {cb} at entry {i}, where the parent's "
                           f"block {pb} holds written KV (positions < {p.issued})")
            self._check_fresh(text, cb, held, pinned)
            m.content.pop(cb, None)
        m.reqs[child] = Req(child, list(p.tokens), p.salt, table, p.reserved, p.issued,
                            p.computed, deque(p.launches))
        self.added += 1
        self._outcome("fork: ok" + (", shares written blocks" if written else ""))
        return child

    @precondition(lambda self: len(self.model.reqs) > 1)  # preempt frees the last one
    @rule(rid=consumes(requests))
    def free(self, rid: Hashable) -> None:
        self._free(rid)
        self._outcome("free: ok")

    def _free(self, rid: Hashable) -> Req:
        self._must(f"free({rid!r})", lambda: self.adapter.free(rid))
        self.freed.append(rid)
        if any(rid in rec.rids for rec in self.model.inflight.values()):
            self._outcome("freed while a launch is in flight")
        return self.model.reqs.pop(rid)

    @rule(target=requests, rid=consumes(requests))
    def preempt(self, rid: Hashable) -> Any:
        """free, then admit the same tokens again as a new request (re-hits its prefix)."""
        req = self._free(rid)
        return self._admit(self._next_rid(), req.tokens, req.salt, len(req.tokens))

    @precondition(lambda self: self.model.reqs)
    @rule(kind=st.sampled_from(MISUSE), pick=st.integers(0, 7))
    def misuse(self, kind: str, pick: int) -> None:
        """A call that must be refused (or, for free / complete again, may do nothing) and
        must change nothing observable."""
        a = self.adapter
        live = sorted(self.model.reqs, key=str)
        if kind == "add_live" and live:
            rid = live[pick % len(live)]
            text = f"add_request({rid!r}, [0], salt=None) of a live request"
            before = self._observe()
            raised, _ = self._call(text, lambda: a.add_request(rid, [0], None))
            if not raised:
                self._fail("misuse_refused", f"{text} was accepted")
        elif kind == "allocate_unknown":
            text = "allocate('ghost', 1) of an unknown request"
            before = self._observe()
            refused, _ = self._maybe(text, lambda: a.allocate("ghost", 1))
            if not refused:
                self._fail("misuse_refused", f"{text} was accepted")
        elif kind == "launch_unknown" and self.caps.launches:
            text = "launch(['ghost']) of an unknown request"
            before = self._observe()
            refused, _ = self._maybe(text, lambda: a.launch(["ghost"]))
            if not refused:
                self._fail("misuse_refused", f"{text} was accepted")
        elif kind == "complete_again" and self.completed:
            rec = self.completed[pick % len(self.completed)]
            text = f"complete({rec.label}) again"
            before = self._observe()
            self._call(text, lambda: a.complete(rec.handle))
        else:
            rid = self.freed[pick % len(self.freed)] if self.freed else "ghost"
            text = f"free({rid!r}) of a request that is not live"
            before = self._observe()
            self._call(text, lambda: a.free(rid))
            kind = "free_again"
        self._unchanged(before, text)
        self._outcome(f"misuse: {kind}")

    def teardown(self) -> None:
        close = getattr(self.adapter, "close", None)
        if callable(close):
            close()


def default_settings() -> Settings:
    """The loaded hypothesis profile, without a deadline (a step that replays the spec can be
    slow) and without the too-slow / filter health checks."""
    return Settings(deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def make_machine(
    adapter_factory: AdapterFactory,
    *,
    num_blocks: tuple[int, int] = (5, 14),
    block_sizes: Sequence[int] = (1, 2, 4),
    name: str | None = None,
) -> type[AdapterMachine]:
    """A state machine class for allocators made by ``adapter_factory(num_blocks,
    block_size)``; each run draws ``num_blocks`` in the closed range and a block size.
    ``Machine.outcomes`` counts what the rules did (``"admit: ok with prefix hits"``, ...)."""
    lo, hi = num_blocks
    sizes = tuple(block_sizes)

    class Machine(AdapterMachine):
        outcomes: ClassVar[Counter[str]] = Counter()

        @initialize(target=AdapterMachine.requests, num_blocks=st.integers(lo, hi),
                    block_size=st.sampled_from(sizes), shared=st.integers(0, 9),
                    tail=st.lists(st.integers(0, 3), max_size=3), salt=SALTS)
        def setup(self, num_blocks: int, block_size: int, shared: int, tail: list[int],
                  salt: str | None) -> Any:
            """A fresh allocator, and a first request admitted with one position."""
            self._setup(adapter_factory, num_blocks, block_size)
            return self._admit(self._next_rid(), SHARED_PREFIX[:shared] + tail or [0], salt, 1)

    Machine.__name__ = Machine.__qualname__ = name or "AdapterMachine"
    return Machine


def make_test_case(
    adapter_factory: AdapterFactory,
    *,
    settings: Settings | None = None,
    num_blocks: tuple[int, int] = (5, 14),
    block_sizes: Sequence[int] = (1, 2, 4),
    name: str | None = None,
) -> type[unittest.TestCase]:
    """A ``unittest.TestCase`` subclass (pytest collects it) that runs the machine against
    ``adapter_factory``'s allocators; ``settings`` as for any hypothesis stateful test
    (``default_settings()`` when None)."""
    machine = make_machine(adapter_factory, num_blocks=num_blocks, block_sizes=block_sizes,
                           name=name)
    attrs = {"machine": machine, "settings": settings or default_settings()}
    return type(f"Test{machine.__name__}", (machine.TestCase,), attrs)


def run(
    adapter_factory: AdapterFactory,
    *,
    settings: Settings | None = None,
    num_blocks: tuple[int, int] = (5, 14),
    block_sizes: Sequence[int] = (1, 2, 4),
    name: str | None = None,
) -> Counter[str]:
    """Run the machine now (in a test function); raises ``CheckFailed`` (after hypothesis
    prints the shrunk program) if a check fails. Returns the rule outcomes counted."""
    machine = make_machine(adapter_factory, num_blocks=num_blocks, block_sizes=block_sizes,
                           name=name)
    run_state_machine_as_test(machine, settings=settings or default_settings())
    return machine.outcomes


__all__ = ["AdapterMachine", "default_settings", "make_machine", "make_test_case", "run"]
