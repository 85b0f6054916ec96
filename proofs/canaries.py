"""CI canaries: planted bugs that every verification run must catch.

``CANARIES[name]`` is a context manager that plants one bug and yields the spec to check
(nothing on disk changes); ``DETECTORS[name]`` are the checks that must notice, each called
with that spec. ``run_canaries()`` first runs every detector on the spec as written, with no
bug planted (each must pass: a detector that always fails would "catch" everything), then
plants each canary and runs its detectors in order until one reports it::

    from pagedkv.proofs.canaries import run_canaries
    rep = run_canaries(progress=print)
    rep["ok"]                      # every canary caught and the baseline clean
    rep["canaries"]["recycle_ignores_watermark"]  # {"caught", "by", "evidence", "seconds"}

Spec-level bugs (weakened guards, a dropped effect) are a changed copy of ``spec.TRANSITIONS``,
passed in: to the z3 provers and the explorer (``transitions=``), and to the allocator and the
refinement machine's model (``spec=``, ``AllocatorMachine.for_spec``); no module global is
patched. Runtime bugs are the allocator's own code, patched for the duration, with the spec as
written. Each spec-level canary is caught by a z3 counterexample or an explorer trace, in the
spec's words (``retire=...``, ``clock: issued=... watermark=...``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

Progress = Callable[[str], None] | None
Spec = Mapping[str, Any] | None  # pool transitions by name; None: the spec as written
Detector = Callable[[Spec], str | None]


# --- planting ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _patched(obj: Any, attr: str, value: Any) -> Iterator[None]:
    old = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, old)


@contextlib.contextmanager
def _guard(name: str, make: Callable[[Any], Callable[..., Any]]) -> Iterator[Spec]:
    """The spec with transition ``name``'s guard replaced by ``make(original_guard)``."""
    from pagedkv.spec import TRANSITIONS

    original = TRANSITIONS[name]
    yield dict(TRANSITIONS, **{name: dataclasses.replace(original, guard=make(original.guard))})


@contextlib.contextmanager
def _effect(name: str, make: Callable[[Any], Callable[..., Any]]) -> Iterator[Spec]:
    """The spec with transition ``name``'s effect replaced by ``make(original_effect)``."""
    from pagedkv.spec import TRANSITIONS

    original = TRANSITIONS[name]
    yield dict(TRANSITIONS,
               **{name: dataclasses.replace(original, effect=make(original.effect))})


def _in_pool(s: Any, b: Any) -> list[Any]:
    return [b >= 0, b < s.num_blocks]


@contextlib.contextmanager
def release_without_holder_check() -> Iterator[Spec]:
    """release forgets "r holds b": any holder can drop anyone's reference (double free)."""
    from pagedkv.spec import ALLOCATED, PUBLISHED, REFERENCED

    def make(_g: Any) -> Callable[..., Any]:
        def guard(ops: Any, s: Any, b: Any, r: Any) -> Any:
            st = s.state[b]
            return ops.And(*_in_pool(s, b), s.ref[b] > 0,
                           ops.Or(st == ALLOCATED, st == PUBLISHED, st == REFERENCED))
        return guard

    with _guard("release", make) as spec:
        yield spec


@contextlib.contextmanager
def recycle_ignores_watermark() -> Iterator[Spec]:
    """recycle forgets ``retire[b] <= clock[WATERMARK]``: a block a launch in flight may still
    read is reused."""
    from pagedkv.spec import RECLAIMED

    def make(_g: Any) -> Callable[..., Any]:
        def guard(ops: Any, s: Any, b: Any) -> Any:
            return ops.And(*_in_pool(s, b), s.state[b] == RECLAIMED, s.wpend[b] == 0)
        return guard

    with _guard("recycle", make) as spec:
        yield spec


@contextlib.contextmanager
def recycle_ignores_writes() -> Iterator[Spec]:
    """recycle forgets "no write pending": a block a kernel still writes is reused."""
    from pagedkv.spec import RECLAIMED, WATERMARK

    def make(_g: Any) -> Callable[..., Any]:
        def guard(ops: Any, s: Any, b: Any) -> Any:
            return ops.And(*_in_pool(s, b), s.state[b] == RECLAIMED,
                           s.retire[b] <= s.clock[WATERMARK])
        return guard

    with _guard("recycle", make) as spec:
        yield spec


@contextlib.contextmanager
def release_without_retire_stamp() -> Iterator[Spec]:
    """release lets go of the last reference without stamping ``retire[b] = clock[ISSUED]``:
    the launches issued so far no longer pin the block."""

    def make(effect: Any) -> Callable[..., Any]:
        def release(ops: Any, s: Any, b: Any, r: Any) -> Any:
            return effect(ops, s, b, r).replace(retire=s.retire)
        return release

    with _effect("release", make) as spec:
        yield spec


@contextlib.contextmanager
def advance_past_inflight() -> Iterator[Spec]:
    """advance forgets "the oldest launch completed": the watermark passes a launch in flight
    (what "watermark = last completed + 1" does when launches complete out of order)."""
    from pagedkv.spec import ISSUED, WATERMARK

    def make(_g: Any) -> Callable[..., Any]:
        def guard(ops: Any, s: Any) -> Any:
            return s.clock[WATERMARK] < s.clock[ISSUED]
        return guard

    with _guard("advance", make) as spec:
        yield spec


@contextlib.contextmanager
def publish_non_allocated() -> Iterator[Spec]:
    """publish takes a FREE block too (one that holds no initialized record)."""
    from pagedkv.spec import ALLOCATED, FREE

    def make(_g: Any) -> Callable[..., Any]:
        def guard(ops: Any, s: Any, b: Any, r: Any) -> Any:
            st = s.state[b]
            return ops.And(*_in_pool(s, b), ops.Or(st == ALLOCATED, st == FREE), s.alive[r])
        return guard

    with _guard("publish", make) as spec:
        yield spec


@contextlib.contextmanager
def commit_unwritten() -> Iterator[Spec]:
    """commit registers a block in the prefix cache without checking it is full."""
    from pagedkv.spec import NO_BLOCK, NO_HASH, PUBLISHED

    def make(_g: Any) -> Callable[..., Any]:
        def guard(ops: Any, s: Any, b: Any, r: Any, h: Any) -> Any:
            return ops.And(*_in_pool(s, b), s.state[b] == PUBLISHED, s.holds[r][b],
                           s.wpend[b] == 0, h != NO_HASH, s.hmap[h] == NO_BLOCK)
        return guard

    with _guard("commit", make) as spec:
        yield spec


@contextlib.contextmanager
def share_revive_keeps_queued() -> Iterator[Spec]:
    """share revives a CACHED block but leaves it in the eviction queue: the single transition
    (a fork) and a batch of them (an admission's prefix hits) alike."""
    from pagedkv.allocator.pool import BlockPool
    from pagedkv.spec import CACHED

    original = BlockPool.share
    after_batch = BlockPool._after_share

    def share(self: Any, b: int, r: Any, *args: Any) -> None:
        was_cached = self.state[b] == CACHED
        original(self, b, r, *args)
        if was_cached and not self.queue.inq[b]:
            self.queue.push_tail(b)

    def after_share(self: Any, done: Any, revived: Any) -> None:
        after_batch(self, done, revived)
        for b in dict.fromkeys(revived):
            if not self.queue.inq[b]:
                self.queue.push_tail(b)

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(BlockPool, "share", share))
        stack.enter_context(_patched(BlockPool, "_after_share", after_share))
        yield


@contextlib.contextmanager
def slot_mapping_off_by_one() -> Iterator[Spec]:
    """The slot of each written position is one past where it belongs."""
    import pagedkv.allocator.allocator as allocator_module
    from pagedkv.allocator import table

    original = table.slot_mapping

    def slot_mapping(block_table: Any, block_size: int, start: int, stop: int) -> list[int]:
        return [x + 1 for x in original(block_table, block_size, start, stop)]

    launch_slots = allocator_module._launch_slots  # a launch's slot mapping, either path

    def slots(*args: Any) -> Any:
        return launch_slots(*args) + 1

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(table, "slot_mapping", slot_mapping))
        stack.enter_context(_patched(allocator_module, "_launch_slots", slots))
        yield


@contextlib.contextmanager
def hash_without_length_framing() -> Iterator[Spec]:
    """A hash field is encoded as tag | payload, without its length: not injective."""
    from pagedkv.allocator import hashing

    def frame(kind: int, payload: bytes) -> bytes:
        return bytes([kind]) + payload

    with _patched(hashing, "frame", frame):
        yield


CANARIES: dict[str, Callable[[], contextlib.AbstractContextManager[Spec]]] = {
    "release_without_holder_check": release_without_holder_check,
    "recycle_ignores_watermark": recycle_ignores_watermark,
    "recycle_ignores_writes": recycle_ignores_writes,
    "release_without_retire_stamp": release_without_retire_stamp,
    "advance_past_inflight": advance_past_inflight,
    "publish_non_allocated": publish_non_allocated,
    "commit_unwritten": commit_unwritten,
    "share_revive_keeps_queued": share_revive_keeps_queued,
    "slot_mapping_off_by_one": slot_mapping_off_by_one,
    "hash_without_length_framing": hash_without_length_framing,
}


# --- detecting ---------------------------------------------------------------------------------
# Each detector returns None (nothing wrong) or the evidence it found.
_NAMES = re.compile(
    r"(refines:\w+|DoubleFree|PendingAccess|PublishError|CommitError|OutOfBlocks|"
    r"InvariantViolation|StaleTableError|AssertionError)")


def _evidence(text: str) -> str:
    from pagedkv.spec import INVARIANTS

    found = [n for n in INVARIANTS if re.search(rf"\b{n}\b", text)]
    found += [m for m in dict.fromkeys(_NAMES.findall(text)) if m not in found]
    last = [ln.strip() for ln in text.strip().splitlines() if ln.strip()][-1:]
    return ", ".join(found[:4]) + (f" ({last[0][:140]})" if last else "")


def _provers(spec: Spec) -> dict[str, Any]:
    """The provers' keyword for the spec to prove (none: the spec as written)."""
    return {} if spec is None else {"transitions": spec}


def _induction(transition: str) -> Detector:
    def check(spec: Spec) -> str | None:
        from pagedkv.proofs.induction import COUNTEREXAMPLE, induction_matrix

        obs = induction_matrix("bounded", only={"transitions": [transition]},
                               **_provers(spec))
        bad = [o.invariant for o in obs if o.result == COUNTEREXAMPLE]
        return f"counterexample to {', '.join(bad)} / {transition}" if bad else None

    check.__name__ = f"z3 induction ({transition}, bounded)"
    return check


def _safety(transition: str) -> Detector:
    def check(spec: Spec) -> str | None:
        from pagedkv.proofs.induction import COUNTEREXAMPLE
        from pagedkv.proofs.safety import prove_safety

        res = prove_safety(only={transition}, modes=("bounded",), **_provers(spec))
        bad = [c for r in res.values() for c in r.claims if c.result == COUNTEREXAMPLE]
        if not bad:
            return None
        c = bad[0]
        cx = c.counterexample or {}
        g, post = cx.get("ghost") or {}, cx.get("post") or {}
        where = c.claim
        if g:
            blk = next((r for k, r in post.get("blocks", {}).items() if str(k) == g["block"]), {})
            clock = post.get("clock", {})
            where = (f"launch {g['launch']} in flight may read block {g['block']}, "
                     f"retire={blk.get('retire')} issued={clock.get('issued')} "
                     f"watermark={clock.get('watermark')}")
        return f"{c.text}\nsafety cx via {transition}: {where} ({c.prop})"

    check.__name__ = f"z3 safety claims ({transition}, bounded)"
    return check


def explorer(spec: Spec) -> str | None:
    """A small exhaustive exploration of the spec (pool layer, readers ghost on)."""
    from pagedkv.proofs.explore import ExploreConfig, explore

    r = explore(ExploreConfig(blocks=2, holders=1, block_size=1, max_inflight=1, max_window=2,
                              stop_at_first=True), **_provers(spec))
    if not r.violations:
        return None
    v = next(iter(r.violations.values()))
    return f"{v.text}\nexplorer: {v.invariant} at {v.where}: {', '.join(v.trace)}"


explorer.__name__ = "explorer (2 blocks, pool layer)"


def stateful(spec: Spec, max_examples: int = 400, steps: int = 40) -> str | None:
    """A short derandomized run of the refinement state machine, no shrinking: the allocator
    enforces ``spec`` and the machine's model runs it."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from pagedkv.proofs.refinement import AllocatorMachine

    cfg = settings(max_examples=max_examples, stateful_step_count=steps, derandomize=True,
                   database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
                   print_blob=False)
    try:
        run_state_machine_as_test(AllocatorMachine.for_spec(spec), settings=cfg)
    except BaseException as exc:  # noqa: BLE001 - any failure is what we look for
        return _evidence("".join(traceback.format_exception(exc)))
    return None


stateful.__name__ = "stateful refinement run"


def _scenario(spec: Spec, checked: bool, probe: Callable[[Any, Any], None]) -> str | None:
    """Serve a few requests that share a prefix: prefill, commit, finish (blocks become CACHED),
    re-admit (prefix hits revive them), decode; ``probe`` sees every launch. Invariants are
    scanned after every step."""
    from pagedkv.allocator import AllocatorError, BlockAllocator

    a = BlockAllocator(8, 4, checked=checked, spec=spec)
    prompt = list(range(10, 21))
    try:
        for round_ in range(2):
            for rid in ("x", "y"):
                a.add_request(rid, prompt + [round_])
                a.allocate(rid, len(prompt) + 1)
                a.check_invariants()
                launch = a.publish([rid])
                probe(a, launch)
                launch.complete()
                a.commit(rid, len(prompt) + 1)
                a.append_tokens(rid, [7])
                a.allocate(rid, len(prompt) + 2)
                launch = a.publish([rid])
                probe(a, launch)
                launch.complete()
                a.check_invariants()
            for rid in ("x", "y"):
                a.free(rid)
                a.check_invariants()
    except (AllocatorError, AssertionError) as exc:
        return _evidence("".join(traceback.format_exception_only(exc)))
    return None


def _no_probe(a: Any, launch: Any) -> None:
    return None


def lifecycle_unchecked(spec: Spec) -> str | None:
    """Prefix-cache lifecycle on an unchecked allocator, invariants scanned each step."""
    return _scenario(spec, False, _no_probe)


def slots_match_tables(spec: Spec) -> str | None:
    """Every written position's slot is (its table entry's block) * B + its offset."""

    def probe(a: Any, launch: Any) -> None:
        B, k = a.block_size, 0
        for i in range(len(launch.rids)):
            seq, q = int(launch.seq_lens[i]), int(launch.query_lens[i])
            for p in range(seq - q, seq):
                want = int(launch.block_tables[i, p // B]) * B + p % B
                got = int(launch.slot_mapping[k])
                assert got == want, f"slot of position {p} is {got}, the table says {want}"
                k += 1
        assert k == len(launch.slot_mapping), "slot mapping has extra entries"

    return _scenario(spec, False, probe)


def hashes_injective(spec: Spec) -> str | None:
    """Field sequences that only framing keeps apart hash differently; decode inverts encode
    (the hashing is the runtime's alone: ``spec`` is not read)."""
    from pagedkv.allocator.hashing import (
        KIND_STR,
        block_hash,
        decode_fields,
        encode_fields,
    )

    pairs = [
        (dict(extra_keys=["a", "b"]), dict(extra_keys=["a" + chr(KIND_STR) + "b"])),
        (dict(extra_keys=["ab"]), dict(extra_keys=["a", "b"])),
        (dict(salt="s", extra_keys=[]), dict(salt="", extra_keys=["s"])),
    ]
    for x, y in pairs:
        if block_hash(0, [1, 2], **x) == block_hash(0, [1, 2], **y):
            return f"hash collision: {x} and {y}"
    fields = [(KIND_STR, b"a"), (KIND_STR, b""), (2, b"\x00" * 9)]
    try:
        back = decode_fields(encode_fields(fields))
    except ValueError as exc:
        return f"decode_fields(encode_fields(f)) fails: {exc}"
    if back != fields:
        return f"decode_fields(encode_fields(f)) == {back!r} != {fields!r}"
    return None


lifecycle_unchecked.__name__ = "prefix lifecycle (unchecked, invariant scans)"
slots_match_tables.__name__ = "slot mapping vs tables"
hashes_injective.__name__ = "hash encoding injective"

DETECTORS: dict[str, list[Detector]] = {
    "release_without_holder_check": [_induction("release"), stateful],
    "recycle_ignores_watermark": [_induction("recycle"), stateful],
    "recycle_ignores_writes": [_induction("recycle"), stateful],
    "release_without_retire_stamp": [_safety("release"), explorer, stateful],
    "advance_past_inflight": [_induction("advance"), stateful],
    "publish_non_allocated": [_induction("publish"), stateful],
    "commit_unwritten": [_induction("commit"), stateful],
    "share_revive_keeps_queued": [lifecycle_unchecked, stateful],
    "slot_mapping_off_by_one": [slots_match_tables],
    "hash_without_length_framing": [hashes_injective],
}


def _run(check: Detector, spec: Spec) -> str | None:
    try:
        return check(spec)
    except Exception as exc:  # noqa: BLE001 - a crash is a detection too
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def run_canaries(progress: Progress = None, names: list[str] | None = None) -> dict[str, Any]:
    """Baseline (every detector passes with no bug planted), then each canary is caught.

    Returns ``{"ok", "seconds", "baseline": {"ok", "failed", "seconds", "checks"},
    "canaries": {name: {"caught", "by", "evidence", "seconds", "doc"}}}``."""
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    selected = names or list(CANARIES)
    detectors: list[Detector] = []
    for n in selected:
        for d in DETECTORS[n]:
            if d not in detectors:
                detectors.append(d)
    checks: dict[str, Any] = {}
    failed: list[str] = []
    for d in detectors:
        tt = time.perf_counter()
        found = _run(d, None)
        checks[d.__name__] = {"ok": found is None, "detail": found,
                              "seconds": round(time.perf_counter() - tt, 2)}
        if found:
            failed.append(f"{d.__name__}: {found}")
        say(f"baseline {d.__name__}: {'ok' if found is None else 'FAILS: ' + found}")
    baseline = {"ok": not failed, "failed": failed, "checks": checks,
                "seconds": round(time.perf_counter() - t0, 2)}
    canaries: dict[str, Any] = {}
    for n in selected:
        tt = time.perf_counter()
        row: dict[str, Any] = {"caught": False, "by": None, "evidence": None,
                               "doc": (CANARIES[n].__doc__ or "").strip()}
        with CANARIES[n]() as spec:
            for d in DETECTORS[n]:
                found = _run(d, spec)
                if found:
                    row.update(caught=True, by=d.__name__, evidence=found)
                    break
        row["seconds"] = round(time.perf_counter() - tt, 2)
        canaries[n] = row
        say(f"canary {n}: " + (f"caught by {row['by']} ({row['evidence']})" if row["caught"]
                               else "NOT CAUGHT") + f" [{row['seconds']} s]")
    ok = baseline["ok"] and all(c["caught"] for c in canaries.values())
    return {"ok": ok, "seconds": round(time.perf_counter() - t0, 2), "baseline": baseline,
            "canaries": canaries}


def main() -> int:
    import json
    import sys

    rep = run_canaries(progress=lambda m: print(m, file=sys.stderr))
    print(json.dumps(rep, indent=1, default=str))
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
