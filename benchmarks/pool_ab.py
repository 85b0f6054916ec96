"""NativePool against vLLM 0.33.0's real ``BlockPool`` in one process, chunk by chunk.

``allocator_bench.py --with-vllm`` times vLLM's pool in a subprocess after pagedkv's rows, so
the machine's drift between the two falls into the ratios (its sha256 row, the same hashlib
call on both sides, has come out anywhere from 0.71x to 1.14x). Here both pools run in this
process, and each workload is cut into chunks (``CHUNKS``: a few milliseconds of work each)
timed side by side: chunk ``i`` on every side (the order rotated each chunk) before chunk
``i + 1`` on any, so a round's ratio compares times taken within the same few milliseconds
(timing whole runs of 50-200 ms back to back read 1.8x-3.6x by round for one workload). The
figure is the best round of each side; each round's ratio and their median are printed too:

- ``alloc+free n``: vLLM ``get_new_blocks(n)`` + ``free_blocks(reversed(...))``; pagedkv
  ``take_many("r", n)`` + ``release_many("r", blocks[::-1])``, its holder open (as
  ``allocator_bench.alloc_free_native``), and at n = 1 also ``take("r")`` +
  ``release(b, "r")``;
- ``prefix hits`` and ``prefix lifecycle``: ``allocator_bench``'s prefix workload (64 shared
  blocks, 2 own, 2,000 requests) on both sides, vLLM's loops as its anchor's ``bench.py``
  writes them, pagedkv's ``_native_hit`` and ``_native_request``; the requests in order, a
  chunk a run of consecutive ones.

Unchecked and checked pagedkv rows. Needs the vLLM anchor (``../shared/anchors/vllm_blockpool``,
its ``setup.sh``) and numba.

    python benchmarks/pool_ab.py [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import allocator_bench as ab

from pagedkv.allocator.native_pool import NativePool

SIZES = (1, 16, 256)


def vllm_modules() -> tuple[object, object, object, object]:
    """vLLM's ``BlockPool``, ``kv_cache_utils``, ``Request`` and ``sha256`` from the anchor's
    unpacked tree (its ``setup.sh`` prints where)."""
    tree = subprocess.run([str(ab.ANCHOR / "setup.sh")], capture_output=True, text=True,
                          timeout=600, check=True).stdout.strip()
    sys.path.insert(0, tree)
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.request import Request

    return BlockPool, kv_cache_utils, Request, sha256


CHUNKS = 40  # the chunks each workload's round is cut into
Chunked = tuple[Callable[[int], None], int]  # (run chunk i of CHUNKS, the units a round does)


def _spread(total: int, i: int) -> range:
    """Chunk i's share of ``range(total)``."""
    return range(total * i // CHUNKS, total * (i + 1) // CHUNKS)


def workloads(vllm: tuple[object, ...]) -> dict[str, dict[str, Chunked]]:
    """Per workload, per side, (a chunk's run, the units of a round)."""
    BlockPool, U, Request, sha256 = vllm
    out: dict[str, dict[str, Chunked]] = {}
    for n in SIZES:
        rounds = 400_000 // n
        pool = BlockPool(ab.NUM_BLOCKS, True, hash_block_size=ab.B)

        def vllm_run(i: int, pool=pool, n=n, rounds=rounds) -> None:
            for _ in _spread(rounds, i):
                pool.free_blocks(reversed(pool.get_new_blocks(n)))

        out[f"alloc+free n={n}"] = {"vLLM": (vllm_run, rounds * n)}
        for mode in ("unchecked", "checked"):
            p = NativePool(ab.NUM_BLOCKS, ab.B, checked=mode == "checked")
            p.open_holder("r")

            def native_run(i: int, p=p, n=n, rounds=rounds) -> None:
                take_many, release_many = p.take_many, p.release_many
                for _ in _spread(rounds, i):
                    release_many("r", take_many("r", n)[::-1])

            out[f"alloc+free n={n}"][mode] = (native_run, rounds * n)
            if n == 1:
                def single_run(i: int, p=p, rounds=rounds) -> None:
                    take, release = p.take, p.release
                    for _ in _spread(rounds, i):
                        release(take("r"), "r")

                out.setdefault("alloc+free n=1, take + release", {
                    "vLLM": (vllm_run, rounds)})[mode] = (single_run, rounds)
    out.update(prefix_workloads(BlockPool, U, Request, sha256))
    return out


def prefix_workloads(BlockPool: object, U: object, Request: object, sha256: object
                     ) -> dict[str, dict[str, Chunked]]:
    B, nreq = ab.B, ab.NREQ
    toks = ab.prefix_tokens(nreq)
    U.init_none_hash(sha256)
    hasher = U.get_request_block_hasher(B, sha256)
    reqs = [Request(str(i), t, block_hasher=hasher) for i, t in enumerate(toks)]
    pool = BlockPool(ab.PREFIX_POOL, True, hash_block_size=B)
    first = pool.get_new_blocks(ab.PREFIX_BLOCKS + ab.SUFFIX_BLOCKS + 1)
    pool.cache_full_blocks(reqs[0], first, 0, ab.PREFIX_BLOCKS + ab.SUFFIX_BLOCKS, B, 0)
    pool.free_blocks(reversed(first))

    def hits(r: object) -> list[object]:
        found = []
        for h in r.block_hashes[: (r.num_tokens - 1) // B]:
            c = pool.get_cached_block(h, [0])
            if not c:
                break
            found.append(c[0])
        return found

    def vllm_hits(i: int) -> None:
        for j in _spread(nreq, i):
            r = reqs[j]
            hit = hits(r)
            pool.touch(hit)
            pool.free_blocks(reversed(hit))

    def vllm_life(i: int) -> None:
        for j in _spread(nreq - 1, i):
            r = reqs[j + 1]
            hit = hits(r)
            pool.touch(hit)
            blocks = hit + pool.get_new_blocks(-(-r.num_tokens // B) - len(hit))
            pool.cache_full_blocks(r, blocks, len(hit), len(r.block_hashes), B, 0)
            pool.free_blocks(reversed(blocks))

    out = {"prefix hits (req)": {"vLLM": (vllm_hits, nreq)},
           "prefix lifecycle (req)": {"vLLM": (vllm_life, nreq - 1)}}
    hashes = [ab.chain(t) for t in toks]
    for mode in ("unchecked", "checked"):
        p = NativePool(ab.PREFIX_POOL, B, checked=mode == "checked")
        ab._native_request(p, 0, toks[0], hashes[0])

        def native_hits(i: int, p=p) -> None:
            for j in _spread(nreq, i):
                ab._native_hit(p, ("h", j), toks[j], hashes[j])

        def native_life(i: int, p=p) -> None:
            for j in _spread(nreq - 1, i):
                ab._native_request(p, j + 1, toks[j + 1], hashes[j + 1])

        out["prefix hits (req)"][mode] = (native_hits, nreq)
        out["prefix lifecycle (req)"][mode] = (native_life, nreq - 1)
    return out


def time_round(sides: dict[str, Chunked]) -> dict[str, float]:
    """One round of a workload: its chunks in order, each on every side (the order rotated
    each chunk); the seconds per side."""
    names = list(sides)
    total = dict.fromkeys(names, 0.0)
    clock = time.perf_counter
    gc.collect()
    for i in range(CHUNKS):
        k = i % len(names)
        for side in names[k:] + names[:k]:
            run = sides[side][0]
            t0 = clock()
            run(i)
            total[side] += clock() - t0
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    table = workloads(vllm_modules())
    best: dict[str, dict[str, float]] = {w: {} for w in table}
    ratios: dict[str, list[float]] = {w: [] for w in table}
    for rnd in range(args.rounds):
        line = []
        for name, sides in table.items():
            times = time_round(sides)
            for side, t in times.items():
                best[name][side] = min(best[name].get(side, float("inf")), t)
            ratios[name].append(times["vLLM"] / times["unchecked"])
            line.append(f"{name} {ratios[name][-1]:.2f}x")
        print(f"round {rnd + 1}: " + ", ".join(line), flush=True)
    print(f"\n{'workload':34s} {'vLLM /s':>10s} {'pagedkv /s':>11s} {'checked /s':>11s} "
          f"{'x vLLM':>7s} {'checked':>8s} {'median':>7s}")
    result = {}
    for name, sides in table.items():
        rate = {side: sides[side][1] / best[name][side] for side in sides}
        result[name] = {**rate, "round_ratios": ratios[name],
                        "median_ratio": statistics.median(ratios[name])}
        print(f"{name:34s} {rate['vLLM']:10.3g} {rate['unchecked']:11.3g} "
              f"{rate['checked']:11.3g} {rate['unchecked'] / rate['vLLM']:6.2f}x "
              f"{rate['checked'] / rate['vLLM']:7.2f}x "
              f"{statistics.median(ratios[name]):6.2f}x")
    print("(x vLLM, checked: best round of each side; median: of the rounds' ratios, unchecked)")
    if args.json:
        args.json.write_text(json.dumps({"command": "python benchmarks/pool_ab.py "
                                         + " ".join(sys.argv[1:]), "chunks": CHUNKS,
                                         "rates": result}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
