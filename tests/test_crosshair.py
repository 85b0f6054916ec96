"""CrossHair: the runner grades every condition, and a planted bug in each checked function is
found (a counterexample, not just "not confirmed").

Each planted bug lives in a copy of the package: ``allocator/table.py``, ``allocator/hashing.py``
(with ``errors.py``), ``spec/`` and ``proofs/crosshair_targets.py`` are copied under a fresh
package name in a tmp folder, one textual mutation is applied, and CrossHair checks the one
target that covers the mutated function, with that target's unchanged contract.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pagedkv.proofs import crosshair_check as cc
from pagedkv.proofs import crosshair_targets as ct

ROOT = Path(__file__).resolve().parents[1]

# (target function, file in the copied package, original text, planted bug)
MUTANTS: list[tuple[str, str, str, str]] = [
    ("allocator.table.blocks_needed", "allocator/table.py",
     "return -(-num_tokens // block_size)", "return num_tokens // block_size"),
    ("allocator.table.resolve", "allocator/table.py",
     "return block_table[index], position - index * block_size",
     "return block_table[index - 1], position - index * block_size"),
    ("allocator.table.slot", "allocator/table.py",
     "return block_id * block_size + offset", "return block_id + block_size * offset"),
    ("crosshair_targets.slot_mapping_bounded", "allocator/table.py",
     "* block_size + p % block_size for p", "* block_size + (p + 1) % block_size for p"),
    ("crosshair_targets.writes_per_block_bounded", "allocator/table.py",
     "end = min(stop, (index + 1) * block_size)", "end = min(stop, (index + 1) * block_size + 1)"),
    ("crosshair_targets.frame_bounded", "allocator/hashing.py",
     'length.to_bytes(8, "big")', 'length.to_bytes(8, "little")'),
    ("crosshair_targets.encode_fields_roundtrip", "allocator/hashing.py",
     'return b"".join(frame(kind, payload) for kind, payload in fields)',
     'return b"".join(bytes([kind]) + payload for kind, payload in fields)'),
    ("crosshair_targets.decode_fields_roundtrip", "allocator/hashing.py",
     "data[i + 9 : i + 9 + n]))", "data[i + 9 : i + 8 + n]))"),
    ("crosshair_targets.encode_tokens_injective", "allocator/hashing.py",
     'struct.pack(f">{len(tokens)}q", *tokens)',
     'struct.pack(f">{len(tokens)}q", *map(abs, tokens))'),
    ("crosshair_targets.extra_key_int_injective", "allocator/hashing.py",
     "return kind, key.to_bytes(", "return kind, abs(key).to_bytes("),
    ("crosshair_targets.extra_key_bytes_injective", "allocator/hashing.py",
     "return kind, bytes(key)", "return kind, bytes(key)[:2]"),
    ("crosshair_targets.extra_key_str_injective", "allocator/hashing.py",
     'return kind, key.encode("utf-8")', 'return kind, key[:1].encode("utf-8")'),
    ("crosshair_targets.extra_key_kinds_distinct", "allocator/hashing.py",
     "bytes: KIND_BYTES}", "bytes: KIND_STR}"),
    ("crosshair_targets.allocate_keeps_block_invariants", "spec/transitions.py",
     "ref=_set(ops, s.ref, b, 1),", "ref=_set(ops, s.ref, b, 2),"),
    ("crosshair_targets.publish_keeps_block_invariants", "spec/transitions.py",
     "return s.replace(**_move(ops, s, b, PUBLISHED))",
     "return s.replace(**_move(ops, s, b, REFERENCED))"),
    ("crosshair_targets.begin_write_keeps_block_invariants", "spec/transitions.py",
     "        s.state[b] == PUBLISHED,\n        s.ref[b] == 1,\n", "        s.ref[b] == 1,\n"),
    ("crosshair_targets.end_write_keeps_block_invariants", "spec/transitions.py",
     "return ops.And(*_in_pool(s, b), s.wpend[b] > 0)", "return ops.And(*_in_pool(s, b))"),
    ("crosshair_targets.launch_keeps_block_invariants", "spec/transitions.py",
     "clock=_set(ops, s.clock, ISSUED, s.clock[ISSUED] + 1)",
     "clock=_set(ops, s.clock, ISSUED, s.clock[ISSUED] - 1)"),
    # "watermark = last completed + 1": wrong once launches complete out of order
    ("crosshair_targets.complete_keeps_block_invariants", "spec/transitions.py",
     "return s.replace(inflight=_set(ops, s.inflight, L, False))",
     "return s.replace(inflight=_set(ops, s.inflight, L, False), "
     "clock=_set(ops, s.clock, WATERMARK, L + 1))"),
    ("crosshair_targets.advance_keeps_block_invariants", "spec/transitions.py",
     "return ops.And(low < s.clock[ISSUED], ops.Not(s.inflight[low]))",
     "return low < s.clock[ISSUED]"),
    ("crosshair_targets.rewind_keeps_block_invariants", "spec/transitions.py",
     "        k >= 0,\n", ""),
    ("crosshair_targets.commit_keeps_block_invariants", "spec/transitions.py",
     "        s.filled[b] == s.block_size,\n", ""),
    ("crosshair_targets.share_keeps_block_invariants", "spec/transitions.py",
     "ops.Or(st == PUBLISHED, st == REFERENCED, st == CACHED),",
     "ops.Or(st == ALLOCATED, st == PUBLISHED, st == REFERENCED, st == CACHED),"),
    ("crosshair_targets.release_keeps_block_invariants", "spec/transitions.py",
     "invalidate = ops.And(last, st != REFERENCED)",
     "invalidate = ops.And(last, st == ALLOCATED)"),
    ("crosshair_targets.evict_keeps_block_invariants", "spec/transitions.py",
     "        hash=_set(ops, s.hash, b, NO_HASH),\n", ""),
    ("crosshair_targets.recycle_keeps_block_invariants", "spec/transitions.py",
     "s.state[b] == RECLAIMED, s.retire[b] <= s.clock[WATERMARK], s.wpend[b] == 0)",
     "s.state[b] == RECLAIMED, s.wpend[b] == 0)"),
    ("crosshair_targets.open_holder_keeps_block_invariants", "spec/transitions.py",
     "return s.replace(alive=_set(ops, s.alive, r, True))",
     "return s.replace(alive=_set(ops, s.alive, r, True), **_hold(ops, s, r, 0, False))"),
    ("crosshair_targets.close_holder_keeps_block_invariants", "spec/transitions.py",
     "return s.replace(alive=_set(ops, s.alive, r, False))",
     "return s.replace(alive=_set(ops, s.alive, r, False), **_hold(ops, s, r, 0, True))"),
    ("crosshair_targets.release_refused_to_non_holder", "spec/transitions.py",
     "s.ref[b] > 0, s.holds[r][b], _held_state", "s.ref[b] > 0, _held_state"),
]


def _checked_names() -> set[str]:
    names = {n.removeprefix("pagedkv.") for n in ct.REAL_TARGETS}
    return names | {f"crosshair_targets.{n}" for n in ct.WRAPPER_TARGETS}


def test_every_checked_function_has_a_planted_bug() -> None:
    assert {m[0] for m in MUTANTS} == _checked_names()


def _copy_package(dest: Path) -> None:
    """allocator (table, hashing, errors), spec/ and crosshair_targets under package ``dest``."""
    (dest / "allocator").mkdir(parents=True)
    (dest / "__init__.py").write_text("")
    (dest / "allocator" / "__init__.py").write_text("")
    for name in ("errors.py", "table.py", "hashing.py"):
        shutil.copy(ROOT / "allocator" / name, dest / "allocator" / name)
    shutil.copytree(ROOT / "spec", dest / "spec", ignore=shutil.ignore_patterns("__pycache__"))
    targets = (ROOT / "proofs" / "crosshair_targets.py").read_text()
    targets = targets.replace("from pagedkv.", f"from {dest.name}.")
    assert f"from {dest.name}.allocator import" in targets and f"from {dest.name}.spec" in targets
    (dest / "crosshair_targets.py").write_text(targets)


@pytest.fixture(scope="module")
def mutant_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[str]]:
    root = tmp_path_factory.mktemp("crosshair_mutants")
    names = []
    for i, (target, path, old, new) in enumerate(MUTANTS):
        pkg = root / f"pkvmut{i}"
        _copy_package(pkg)
        source = (pkg / path).read_text()
        assert source.count(old) == 1, f"mutation site for {target} not unique/found: {old!r}"
        (pkg / path).write_text(source.replace(old, new))
        names.append(f"{pkg.name}.{target}")
    result = cc.run_targets(names, iterations=cc.FULL_ITERATIONS, extra_paths=[str(root)])
    return result, names


def test_planted_bugs_are_found(mutant_results: tuple[dict, list[str]]) -> None:
    result, names = mutant_results
    assert not result["errors"], result["errors"]
    missed = {
        n: result["functions"][n]["status"]
        for n in names
        if not result["functions"][n]["status"].startswith("counterexample")
    }
    assert not missed, f"planted bugs CrossHair did not find: {missed}"
    assert result["ok"] is False


def test_pure_targets_confirmed() -> None:
    """The table and hashing contracts are confirmed over all paths (transitions: full run)."""
    names = [
        n for n in cc.default_targets()
        if "_keeps_block_invariants" not in n and "release_refused" not in n
        and not n.endswith("extra_key_str_injective")
    ]
    result = cc.run_targets(names)
    bad = {n: f["status"] for n, f in result["functions"].items() if f["status"] != "confirmed"}
    assert not bad, bad
    assert result["ok"] and result["totals"]["confirmed"] == sum(
        len(f["conditions"]) for f in result["functions"].values()
    )


def _fake_target(tmp_path: Path) -> tuple[str, Path]:
    mod = tmp_path / "fake_cx_mod.py"
    mod.write_text(
        'def f(x: int) -> int:\n    """\n    pre: x > 0\n    post: __return__ > 0\n'
        '    post: __return__ > 1\n    """\n    return x\n'
    )
    return "fake_cx_mod.f", mod


def test_grading_reads_every_condition(tmp_path: Path) -> None:
    name, mod = _fake_target(tmp_path)
    t = cc._locate(name, [str(tmp_path)])
    assert [c.line for c in t.conditions] == [4, 5]
    stray = cc._grade([t], f"{mod}:4: info: Confirmed over all paths.\nnoise\n"
                           f"{mod}:5: error: false when calling f(1) (which returns 1)\n"
                           f"/elsewhere.py:3: error: boom\n")
    assert [c.status for c in t.conditions] == [
        "confirmed", "counterexample: false when calling f(1) (which returns 1)"
    ]
    assert stray == ["/elsewhere.py:3: error: boom"]
    t2 = cc._locate(name, [str(tmp_path)])
    cc._grade([t2], f"{mod}:4: info: Not confirmed.\n{mod}:7: error: ZeroDivisionError: x\n")
    assert [c.status for c in t2.conditions] == [
        "unknown", "unknown", "counterexample: ZeroDivisionError: x"
    ]


def test_exit_code_zero_is_not_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A condition CrossHair never confirms is "unknown" and fails, unless allowlisted."""
    name, _ = _fake_target(tmp_path)
    result = cc.run_targets([name], iterations=3, extra_paths=[str(tmp_path)])
    statuses = [c["status"] for c in result["functions"][name]["conditions"]]
    assert statuses[0] == "confirmed"
    assert statuses[1].startswith("counterexample")
    assert not result["ok"]
    monkeypatch.setitem(cc.ALLOWLIST, name, "test reason")
    monkeypatch.setattr(
        cc, "_run_one", lambda names, it, ep, to: (["x"], "", 0, 0.0)
    )
    result = cc.run_targets([name], extra_paths=[str(tmp_path)])
    assert [c["status"] for c in result["functions"][name]["conditions"]] == [
        "allowlisted: test reason", "allowlisted: test reason"
    ]
    assert result["ok"]
    monkeypatch.delitem(cc.ALLOWLIST, name)
    result = cc.run_targets([name], extra_paths=[str(tmp_path)])
    assert result["totals"]["unknown"] == 2 and not result["ok"]


def test_allowlist_entries_have_reasons() -> None:
    from pagedkv.proofs.crosshair_allowlist import ALLOWLIST

    known = set(cc.default_targets())
    for key, reason in ALLOWLIST.items():
        assert key.split(":")[0] in known, key
        assert len(reason) > 20, key
