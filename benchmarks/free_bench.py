"""Cost of ``BlockAllocator.free`` per request and per block, checked and unchecked.

    python benchmarks/free_bench.py [--blocks 16,100,400] [--requests 200]

Each request is admitted with ``blocks * 16`` distinct tokens, allocated, published, completed
and committed (so every block is cached when freed: the path a finished request takes), then
freed; only ``free`` is timed. Prints the median over the requests and the cost per block. To
compare two versions of the code, run this script from each, interleaved, several times (the
machine's speed drifts): ratios of runs next to each other, not times.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from pagedkv.allocator import BlockAllocator

B = 16


def free_times(blocks: int, requests: int, checked: bool, seed: int = 0) -> list[float]:
    a = BlockAllocator(blocks * (requests + 30) + 1, B, checked=checked)
    rng = random.Random(seed)
    out = []
    for i in range(requests + 20):  # the first 20 warm the compiled batches up
        rid = f"r{i}"
        tokens = [rng.randrange(32000) for _ in range(blocks * B)]
        a.add_request(rid, tokens)
        a.allocate(rid, len(tokens))
        a.publish([rid]).complete()
        a.commit(rid, len(tokens))
        t0 = time.perf_counter()
        a.free(rid)
        if i >= 20:
            out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="16,100,400", help="blocks per request, comma-separated")
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args(argv)
    print("| blocks | mode | free us (median) | us per block |")
    print("|---:|---|---:|---:|")
    for n in (int(x) for x in args.blocks.split(",")):
        for checked in (False, True):
            med = statistics.median(free_times(n, args.requests, checked)) * 1e6
            mode = "checked" if checked else "unchecked"
            print(f"| {n} | {mode} | {med:.1f} | {med / n:.2f} |")


if __name__ == "__main__":
    main()
