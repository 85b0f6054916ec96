"""The batched loops' code generation (``allocator.compiled.batch_source``): every pool cell
the spec's effect reads is read once per element, after the guard, and only where reading it
is safe whatever branch the effect takes; a repeated subexpression is computed once. Whether
the loops compute the spec's effect is checked against the interpreted spec
(tests/test_batched_transitions.py); this file checks the rewriting itself."""

from __future__ import annotations

import re

import pytest

from pagedkv.allocator.compiled import _hoisted, _wrapped, batch_agrees, batch_source
from pagedkv.allocator.pool import BlockPool
from pagedkv.spec import TRANSITIONS

_CELL = re.compile(r"\b(state|ref|retire|wpend|filled|gen|init|queued|clock)\[(b|0|1)\]")


def _after_guard(src: str) -> list[str]:
    lines = src.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "return _i") + 1
    start = next(i for i, line in enumerate(lines[start:], start)
                 if line.strip() == "return _i") + 1  # past the TypeError branch too
    return lines[start:lines.index("    return -1")]  # run_many's, not run_where's


@pytest.mark.parametrize("name", BlockPool.BATCHED)
def test_each_cell_the_effect_reads_is_read_once_after_the_guard(name):
    src = batch_source(TRANSITIONS[name])
    assert src is not None
    body = _after_guard(src)
    reads = [line for line in body if re.match(r"\s+_[ct]\d+ = ", line)]
    cells = [m.group(0) for line in reads for m in _CELL.finditer(line.split(" = ", 1)[1])]
    assert len(cells) == len(set(cells)), f"{name} reads a cell twice: {cells}"
    for line in reads:  # a cell is read by its own local, and only there
        rhs = line.split(" = ", 1)[1]
        assert not _CELL.search(rhs) or _CELL.fullmatch(rhs), line


def test_release_computes_its_new_state_once():
    body = "\n".join(_after_guard(batch_source(TRANSITIONS["release"])))
    new_state = re.search(r"(_t\d+) = \(4 if", body).group(1)
    assert body.count("(4 if") == 1  # the new state is reused by the count stores
    assert f"state[b] = {new_state}" in body


def test_a_cell_at_an_unchecked_parameter_is_not_hoisted():
    guard = "((b >= 0) and (b < num_blocks) and (x in held))"
    out = _hoisted(["        _t0 = (state[b] + ref[x] + clock[1])"], guard, ("b", "x"))
    assert out == ["        _c0 = state[b]", "        _c1 = clock[1]",
                   "        _t0 = (_c0 + ref[x] + _c1)"]


def test_only_whole_parenthesized_expressions_are_reused():
    assert _wrapped("((a) + (b))") and _wrapped("(x)")
    assert not _wrapped("(a) + (b)") and not _wrapped("a") and not _wrapped("(a))(")
    out = _hoisted(["        _t0 = (a) + (b)", "        _t1 = (z - (a) + (b))",
                    "        _t2 = (q * (z - (a) + (b)))"], "", ())
    assert out[1] == "        _t1 = (z - (a) + (b))"  # "(a) + (b)" is no subexpression here
    assert out[2] == "        _t2 = (q * _t1)"


def test_a_wrong_rewriting_is_caught_before_it_runs(monkeypatch):
    """A hoisting that reads a cell of the wrong block yields a loop the probe states
    refuse (the pool then runs the single transitions)."""
    import pagedkv.allocator.compiled as compiled

    t = TRANSITIONS["release"]
    real = compiled._hoisted

    def wrong(reads, guard, params):
        return [line.replace("= ref[b]", "= ref[0]") for line in real(reads, guard, params)]

    monkeypatch.setattr(compiled, "_hoisted", wrong)
    src = batch_source(t)
    assert "= ref[0]" in src
    assert not batch_agrees(t, compile(src, "<wrong>", "exec"))


@pytest.mark.parametrize("cell", ["retire", "ref", "state", "filled"])
def test_a_hoisting_that_reads_block_0_of_any_cell_is_caught(monkeypatch, cell):
    """Reading ``x[0]`` for ``x[b]`` matters only where the guard holds at some b != 0, which
    random probe pools rarely give (retire's went unnoticed); the witness pools give it."""
    import pagedkv.allocator.compiled as compiled

    real = compiled._hoisted

    def wrong(reads, guard, params):
        return [line.replace(f"= {cell}[b]", f"= {cell}[0]")
                for line in real(reads, guard, params)]

    monkeypatch.setattr(compiled, "_hoisted", wrong)
    mutated = [name for name in BlockPool.BATCHED
               if f"= {cell}[0]" in batch_source(TRANSITIONS[name])]
    assert mutated, cell
    for name in mutated:
        src = batch_source(TRANSITIONS[name])
        assert not batch_agrees(TRANSITIONS[name], compile(src, "<wrong>", "exec")), name


def test_hash_map_stores_remove_on_the_default_and_store_otherwise():
    """The hash map is a dict with a default (``NO_BLOCK``): evict's store of the default at
    the block's hash removes that key, commit's store of b at h sets it (as
    ``PoolStorage.write`` writes an interpreted post-state back)."""
    evict = "\n".join(_after_guard(batch_source(TRANSITIONS["evict"])))
    key = re.search(r"(_c\d+) = hash\[b\]", evict).group(1)
    assert re.search(rf"hmap\.pop\(_t\d+, None\)|hmap\.pop\({key}, None\)", evict)
    assert "hmap[" not in evict
    commit = "\n".join(_after_guard(batch_source(TRANSITIONS["commit"])))
    assert "hmap[h] = b" in commit and "hash[b] = h" in commit


@pytest.mark.parametrize("name, wrong", [("evict", ("hmap.pop(", "hmap.get(")),
                                         ("commit", ("hmap[h] = b", "hmap[h] = 0"))])
def test_a_wrong_hash_map_store_is_caught_before_it_runs(name, wrong):
    src = batch_source(TRANSITIONS[name])
    assert wrong[0] in src
    bad = src.replace(*wrong)
    assert not batch_agrees(TRANSITIONS[name], compile(bad, "<wrong>", "exec"))


@pytest.mark.parametrize("name", BlockPool.BATCHED)
@pytest.mark.parametrize("wrong", [("                continue\n", "                pass\n"),
                                   ("        _done.append(_item)\n", "")])
def test_a_run_where_that_applies_refused_elements_or_misreports_is_caught(name, wrong):
    """``run_where`` (apply where the guard holds, skip the rest) is checked on the probe
    states beside ``run_many``: one that applies an element its guard refuses, or returns
    other elements than it applied, is refused (the pool then runs single transitions)."""
    t = TRANSITIONS[name]
    src = batch_source(t)
    assert src.count(wrong[0]) == 1
    code = compile(src.replace(*wrong), "<wrong>", "exec")
    assert batch_agrees(t, code) and not batch_agrees(t, code, "run_where")
