"""The CI canaries: every planted bug is caught, and with none planted the same checks pass."""

from __future__ import annotations

import pytest

from pagedkv.proofs.canaries import CANARIES, DETECTORS, run_canaries
from pagedkv.spec import TRANSITIONS


@pytest.fixture(scope="module")
def report():
    return run_canaries()


def test_baseline_is_clean(report):
    assert report["baseline"]["ok"], report["baseline"]["failed"]
    assert all(c["ok"] for c in report["baseline"]["checks"].values())


@pytest.mark.parametrize("name", sorted(CANARIES))
def test_every_canary_is_caught(report, name):
    row = report["canaries"][name]
    assert row["caught"], f"{name} was not caught"
    assert row["by"] in {d.__name__ for d in DETECTORS[name]}
    assert row["evidence"]


def test_report_is_ok(report):
    # No time bound: the run's time is printed by ``pagedkv verify``, and a timed assertion
    # fails on a loaded machine for no fault of the code.
    assert report["ok"]
    assert set(report["canaries"]) == set(CANARIES)


@pytest.mark.parametrize("name", sorted(CANARIES))
def test_planting_is_undone(name):
    before = dict(TRANSITIONS)
    from pagedkv.allocator import hashing, table
    from pagedkv.allocator.pool import BlockPool

    funcs = (BlockPool.share, table.slot_mapping, hashing.frame)
    with CANARIES[name]() as spec:
        assert TRANSITIONS == before  # a changed spec is passed in, never planted
        assert spec is None or (set(spec) == set(before) and spec != before)
    assert TRANSITIONS == before
    assert all(TRANSITIONS[k] is before[k] for k in before)
    assert (BlockPool.share, table.slot_mapping, hashing.frame) == funcs


def test_a_detector_failing_on_the_baseline_makes_the_run_not_ok(monkeypatch):
    from pagedkv.proofs import canaries

    def always(spec): return "always fails"

    always.__name__ = "always"
    monkeypatch.setitem(canaries.DETECTORS, "slot_mapping_off_by_one", [always])
    rep = run_canaries(names=["slot_mapping_off_by_one"])
    assert not rep["ok"] and not rep["baseline"]["ok"]
    assert rep["canaries"]["slot_mapping_off_by_one"]["caught"]
