"""The verify parts that run in worker processes: the campaign's shards and their merge, and
the guarded process pool (a part's exception, or a worker's death, fails that part)."""

from __future__ import annotations

import os
from functools import partial

from pagedkv.proofs import cli, refinement


def test_a_shard_runs_its_own_seeds_to_its_target_and_no_further():
    shard = cli.campaign_shard(300, shard=1, shards=2, step_count=20)
    steps = shard["counts"][refinement.STEPS]
    assert 300 <= steps < 300 + 20
    assert shard["seeds"][0] == 1 and all(s % 2 == 1 for s in shard["seeds"])
    assert any(k.startswith(refinement.LIVE) for k in shard["counts"])


def test_merge_adds_the_shards_and_fails_when_one_failed():
    a = cli.campaign_shard(120, 0, 2, step_count=20)
    b = cli.campaign_shard(120, 1, 2, step_count=20)
    part = cli.merge_campaign([a, b], 240)
    assert part["ok"] and part["shards"] == 2
    assert part["steps"] == a["counts"][refinement.STEPS] + b["counts"][refinement.STEPS]
    assert part["seeds"] == sorted(a["seeds"] + b["seeds"])
    def outcomes(shard):
        return sum(n for k, n in shard["counts"].items()
                   if k != refinement.STEPS and not k.startswith(refinement.LIVE))

    assert sum(r["calls"] for r in part["rules"].values()) == outcomes(a) + outcomes(b) > 0
    assert not cli.merge_campaign([a, b], part["steps"] + 1)["ok"]
    broken = {"ok": False, "error": "RuntimeError: boom", "elapsed_s": 1.0}
    failed = cli.merge_campaign([a, broken], 240)
    assert not failed["ok"] and failed["error"] == "RuntimeError: boom"


def _fine(x: int) -> dict:
    return {"ok": True, "x": x, "pid": os.getpid()}


def _raises() -> dict:
    raise ValueError("planted")


def _dies() -> dict:
    os._exit(3)


def test_parts_run_in_other_processes_and_an_exception_fails_only_its_part():
    done = cli.run_parts({"a": partial(_fine, 1), "b": _raises, "c": partial(_fine, 2)},
                         workers=2)
    assert done["a"]["ok"] and done["a"]["x"] == 1 and done["c"]["x"] == 2
    assert done["a"]["pid"] != os.getpid()
    assert not done["b"]["ok"] and "ValueError: planted" in done["b"]["error"]
    assert "elapsed_s" in done["a"]


def test_a_dead_worker_fails_the_verdict_instead_of_hanging():
    done = cli.run_parts({"dies": _dies}, workers=1)
    assert not done["dies"]["ok"] and "worker for dies died" in done["dies"]["error"]
