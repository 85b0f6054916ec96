"""Allocator throughput, on the same workloads as the vLLM BlockPool anchor, side by side.

    python benchmarks/allocator_bench.py               # pagedkv only
    python benchmarks/allocator_bench.py --with-vllm   # + vLLM 0.33.0's real BlockPool, same run
    python benchmarks/allocator_bench.py --quick       # smoke run (1/20 of the work, 2 repeats)

Workloads (mirroring ../shared/anchors/vllm_blockpool/bench.py, which times vLLM's BlockPool):

- alloc+free: allocate n blocks then free them, n = 1, 16, 256, 4096, pool of 65,537 blocks,
  400,000 // n rounds per timing; prefix caching on and off (blocks/s). Two layers:
  ``alloc``: BlockAllocator.add_request(rid, []) + allocate(rid, n * B) + free(rid);
  ``pool``: BlockPool.open_holder + take x n + release x n (reversed) + close_holder;
  ``pool, batched``: the same with one ``take_many(r, n)`` and one ``run_many("release", ...)``
  (each a compiled loop of the spec's transition), the closest mirror of vLLM's
  get_new_blocks(n) + free_blocks(reversed(...)), which are one call each too;
  ``native pool``: NativePool (the spec's transitions as numba loops) with one
  ``take_many("r", n)`` and one ``release_many("r", blocks[::-1])`` per round (and at n = 1
  its one-block calls too: ``take("r")`` + ``release(b, "r")``). ``holder open``:
  the holder is opened once before timing (vLLM's BlockPool has no holders, so this is the
  like-for-like figure); ``holder per round``: open_holder + close_holder every round, as the
  pool rows. The native rows are compared with vLLM caching=on (as the pool rows) and again
  with vLLM caching=off (``vs vLLM caching=off``). Skipped ("-") where numba is missing.
- prefix: 2,000 requests, block size 16, a shared 64-block prefix + 2 unique blocks + 1 token.
  ``hit`` (vLLM "lookup + touch + free"): per request, look up the hashes of its leading full
  blocks, take a reference on each hit, free them. pool layer, hashes precomputed (as vLLM's
  Request carries them).
  ``life`` (vLLM "full lifecycle": lookup, touch, allocate the rest, cache the new full blocks,
  free). pagedkv's commit requires the block's writing launch to have completed, so its pool
  lifecycle also performs publish + begin_write + end_write on each new block, and
  the allocator lifecycle is add_request (hashing) + allocate + publish + Launch.complete +
  commit + free; publish/complete (building the numpy launch arrays) is timed apart too.
  ``native pool``: both pool workloads on a NativePool with batched calls: the hits found and
  shared with one ``share_prefix`` (a dict read per hash, then one native loop: the leading
  registered blocks, each shared), then one ``take_many``, ``publish_many``,
  ``begin_write_many``, ``end_write_many``, ``cache_many`` (commits where the spec's
  ``cache_due`` holds: vLLM's ``cache_full_blocks``) and ``release_many`` (reversed) per
  request; its mean hit length is checked (untimed) to equal the pool workload's.
- hashing: pagedkv's block_hash on the requests' blocks (hashes/s), every block hashed; and
  ``native_hash.chain_tokens`` (NativeAllocator's: a request's chain in one native call).

Each figure is the best (minimum time) of ``--repeat`` timings. Checked and unchecked modes.
Ratios use figures measured in this run: ``--with-vllm`` runs the anchor's own workload
functions (its bench.py, imported) with the same min-of-N timing, in a subprocess.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pagedkv.allocator import BlockAllocator, BlockPool
from pagedkv.allocator.hashing import block_hash
from pagedkv.allocator.native_pool import NativePool, NativeUnavailable

ROOT = Path(__file__).resolve().parent.parent
ANCHOR = ROOT.parent / "shared" / "anchors" / "vllm_blockpool"
RESULTS = ROOT / "benchmarks" / "results"

NUM_BLOCKS = 65_537
SIZES = (1, 16, 256, 4096)
B = 16
PREFIX_BLOCKS, SUFFIX_BLOCKS, NREQ, PREFIX_POOL = 64, 2, 2000, 4097


def best_time(fn: Callable[[], object], repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


# ---- alloc + free -----------------------------------------------------------------------------
def alloc_free_alloc(n: int, rounds: int, checked: bool, caching: bool, repeat: int) -> float:
    a = BlockAllocator(NUM_BLOCKS, B, prefix_caching=caching, checked=checked)
    ntok = n * B

    def run() -> None:
        add, alloc, free = a.add_request, a.allocate, a.free
        for _ in range(rounds):
            add("r", [])
            alloc("r", ntok)
            free("r")

    return rounds * n / best_time(run, repeat)


def alloc_free_pool(n: int, rounds: int, checked: bool, repeat: int,
                    batched: bool = False) -> float:
    """``batched``: one ``take_many`` and one ``run_many("release", ...)`` per round instead of
    a call per block."""
    p = BlockPool(NUM_BLOCKS, B, checked=checked)
    take, release, take_many, run_many = p.take, p.release, p.take_many, p.run_many

    def run() -> None:
        for _ in range(rounds):
            p.open_holder("r")
            if batched:
                run_many("release", [(b, "r") for b in reversed(take_many("r", n))])
            else:
                for b in reversed([take("r") for _ in range(n)]):
                    release(b, "r")
            p.close_holder("r")

    return rounds * n / best_time(run, repeat)


def alloc_free_native(n: int, rounds: int, checked: bool, repeat: int,
                      holder_per_round: bool = False) -> float | None:
    """NativePool: one ``take_many("r", n)`` and one ``release_many("r", blocks[::-1])`` per
    round. By default the holder "r" is opened once, before timing: vLLM's BlockPool has no
    holders (get_new_blocks / free_blocks keep no per-request record), so that is the
    like-for-like figure; ``holder_per_round`` opens and closes the holder every round, as
    ``alloc_free_pool`` does. None where the native pool cannot run (numba missing)."""
    try:
        p = NativePool(NUM_BLOCKS, B, checked=checked)
    except NativeUnavailable:
        return None
    take_many, release_many = p.take_many, p.release_many
    open_holder, close_holder = p.open_holder, p.close_holder
    open_holder("r")
    release_many("r", take_many("r", n)[::-1])  # warm: the first call of each signature
    if holder_per_round:
        close_holder("r")

        def run() -> None:
            for _ in range(rounds):
                open_holder("r")
                release_many("r", take_many("r", n)[::-1])
                close_holder("r")
    else:
        def run() -> None:
            for _ in range(rounds):
                release_many("r", take_many("r", n)[::-1])

    t = best_time(run, repeat)
    if not holder_per_round:
        close_holder("r")
    return rounds * n / t


def alloc_free_native_single(rounds: int, checked: bool, repeat: int) -> float | None:
    """NativePool's one-block calls, ``take("r")`` then ``release(b, "r")``, per round (the
    holder open, as ``alloc_free_native``'s default): n = 1 without an array each way, the
    mirror of BlockPool's ``take`` / ``release`` (vLLM's BlockPool has only the batched
    ``get_new_blocks(1)`` / ``free_blocks``)."""
    try:
        p = NativePool(NUM_BLOCKS, B, checked=checked)
    except NativeUnavailable:
        return None
    take, release = p.take, p.release
    p.open_holder("r")
    release(take("r"), "r")

    def run() -> None:
        for _ in range(rounds):
            release(take("r"), "r")

    t = best_time(run, repeat)
    p.close_holder("r")
    return rounds / t


# ---- prefix workload --------------------------------------------------------------------------
def prefix_tokens(nreq: int) -> list[list[int]]:
    prefix = list(range(PREFIX_BLOCKS * B))
    return [prefix + [100000 + i] * (SUFFIX_BLOCKS * B) + [7] for i in range(nreq)]


def chain(tokens: list[int]) -> list[int]:
    out, parent = [], 0
    for i in range(len(tokens) // B):
        parent = block_hash(parent, tokens[i * B:(i + 1) * B])
        out.append(parent)
    return out


def _pool_write(p: BlockPool, b: int, r: object) -> None:
    """What pagedkv requires before commit: published, written by a completed launch."""
    p.publish(b, r)
    p.begin_write(b, r, B)
    p.end_write(b)


def _pool_request(p: BlockPool, r: object, toks: list[int], hashes: list[int]) -> int:
    """Pool-layer full lifecycle of one request; returns its hit length."""
    p.open_holder(r)
    hit = []
    lookup = p.lookup
    for h in hashes[: (len(toks) - 1) // B]:
        b = lookup(h)
        if b is None:
            break
        p.share(b, r)
        hit.append(b)
    need = -(-len(toks) // B) - len(hit)
    new = [p.take(r) for _ in range(need)]
    for b in new:
        _pool_write(p, b, r)
    blocks = hit + new
    for i in range(len(hit), len(hashes)):
        if lookup(hashes[i]) is None:
            p.commit(blocks[i], r, hashes[i])
    for b in reversed(blocks):
        p.release(b, r)
    p.close_holder(r)
    return len(hit)


def prefix_pool(checked: bool, nreq: int, repeat: int) -> dict[str, float]:
    toks = prefix_tokens(nreq)
    t0 = time.perf_counter()
    hashes = [chain(t) for t in toks]
    t_hash = time.perf_counter() - t0
    nhash = sum(len(h) for h in hashes)
    p = BlockPool(PREFIX_POOL, B, checked=checked)
    _pool_request(p, 0, toks[0], hashes[0])  # warm: request 0 populates the prefix

    def hit_loop() -> None:
        lookup, share, release = p.lookup, p.share, p.release
        for i in range(nreq):
            r = ("h", i)
            p.open_holder(r)
            hit = []
            for h in hashes[i][: (len(toks[i]) - 1) // B]:
                b = lookup(h)
                if b is None:
                    break
                share(b, r)
                hit.append(b)
            for b in reversed(hit):
                release(b, r)
            p.close_holder(r)

    t_hit = best_time(hit_loop, repeat)
    hits: list[int] = []

    def full_loop() -> None:
        hits.clear()
        for i in range(1, nreq):
            hits.append(_pool_request(p, i, toks[i], hashes[i]))

    t_full = best_time(full_loop, repeat)
    return {
        "hit_req_s": nreq / t_hit,
        "hit_blockops_s": nreq * PREFIX_BLOCKS / t_hit,
        "life_req_s": (nreq - 1) / t_full,
        "life_mean_hit_blocks": sum(hits) / len(hits),
        "hash_s": nhash / t_hash,
        "hashes_per_req": nhash / nreq,
    }


def _native_request(p: NativePool, r: object, toks: list[int], hashes: list[int]) -> int:
    """``_pool_request`` with the native pool's batched calls (``admit``: the holder opened,
    the leading cached blocks shared, the rest taken; ``cache_many``: a commit of each new
    full block whose hash is not registered yet; ``finish``: every block released, the
    holder closed); returns the hit length. The same decisions: a lookup does not change
    the pool, and a request's chain hashes are distinct, so looking the hits up before
    sharing chooses what the per-block interleaving chooses."""
    blocks, hit = p.admit(r, hashes[: (len(toks) - 1) // B], -(-len(toks) // B))
    new = blocks[hit:]
    p.publish_many(r, new)
    p.begin_write_many(r, new, B)
    p.end_write_many(new)
    rest = hashes[hit:]
    p.cache_many(r, new[:len(rest)], rest)
    p.finish(r, blocks[::-1])
    return hit


def _native_hit(p: NativePool, r: object, toks: list[int], hashes: list[int]) -> None:
    """The hit workload's request on a native pool: its cached prefix shared
    (``share_prefix``: the lookups and the touches in one call), then released and the
    holder closed (``finish``)."""
    p.open_holder(r)
    p.finish(r, p.share_prefix(r, hashes[: (len(toks) - 1) // B])[::-1])


def prefix_native(checked: bool, nreq: int, repeat: int,
                  expect_mean_hit: float | None = None) -> dict[str, float | None]:
    """``prefix_pool``'s two workloads on a NativePool, batched (``_native_request``), in the
    same order (warm request, hit loop, full loop), so the pool makes the same decisions. With
    ``expect_mean_hit`` (``prefix_pool``'s ``life_mean_hit_blocks`` for the same ``nreq`` and
    ``repeat``), the mean hit length is checked against it once, after the timing (ValueError if
    they differ). All None where the native pool cannot run (numba missing)."""
    try:
        p = NativePool(PREFIX_POOL, B, checked=checked)
    except NativeUnavailable:
        return {"hit_req_s": None, "life_req_s": None, "life_mean_hit_blocks": None,
                "hash_s": None}
    from pagedkv.allocator.native_hash import chain_tokens

    toks = prefix_tokens(nreq)
    hashes = [chain(t) for t in toks]
    fulls = [t[:len(t) // B * B] for t in toks]

    def hash_loop() -> None:  # NativeAllocator's hashing: each request's chain in one call
        for t in fulls:
            chain_tokens(0, t, B, (), None)

    t_hash = best_time(hash_loop, repeat)
    if [chain_tokens(0, t, B, (), None) for t in fulls] != hashes:
        raise ValueError("native chain hashing differs from block_hash")
    _native_request(p, 0, toks[0], hashes[0])  # warm: request 0 populates the prefix

    def hit_loop() -> None:
        for i in range(nreq):
            _native_hit(p, ("h", i), toks[i], hashes[i])

    t_hit = best_time(hit_loop, repeat)
    hits: list[int] = []

    def full_loop() -> None:
        hits.clear()
        for i in range(1, nreq):
            hits.append(_native_request(p, i, toks[i], hashes[i]))

    t_full = best_time(full_loop, repeat)
    mean_hit = sum(hits) / len(hits)
    if expect_mean_hit is not None and mean_hit != expect_mean_hit:
        raise ValueError(f"native pool: mean hit {mean_hit} blocks, BlockPool "
                         f"{expect_mean_hit}: the two pools decided differently")
    return {
        "hit_req_s": nreq / t_hit,
        "life_req_s": (nreq - 1) / t_full,
        "life_mean_hit_blocks": mean_hit,
        "hash_s": sum(map(len, hashes)) / t_hash,
    }


def prefix_alloc(checked: bool, nreq: int, repeat: int, memo: bool = True) -> dict[str, float]:
    toks = prefix_tokens(nreq)
    a = BlockAllocator(PREFIX_POOL, B, prefix_caching=True, checked=checked)
    if not memo and hasattr(a, "_hash_memo"):
        a._hash_memo = None  # every block of every request hashed with sha256

    def one(rid: object, t: list[int], acc: list[float]) -> None:
        a.add_request(rid, t)
        a.allocate(rid, len(t))
        t0 = time.perf_counter()
        a.publish([rid]).complete()
        acc[0] += time.perf_counter() - t0
        a.commit(rid, len(t))
        a.free(rid)

    one("warm", toks[0], [0.0])
    pub = [0.0]
    best = (float("inf"), 0.0)

    for _ in range(repeat):
        gc.collect()
        pub[0] = 0.0
        t0 = time.perf_counter()
        for i in range(1, nreq):
            one(i, toks[i], pub)
        t = time.perf_counter() - t0
        if t < best[0]:
            best = (t, pub[0])

    def hit_loop() -> None:  # add_request (hashing) + allocate (hits only) + free
        for i in range(nreq):
            rid = ("h", i)
            a.add_request(rid, toks[i])
            a.allocate(rid, PREFIX_BLOCKS * B)
            a.free(rid)

    t_hit = best_time(hit_loop, repeat)
    t, t_pub = best
    return {
        "life_req_s": (nreq - 1) / t,
        "life_excl_publish_req_s": (nreq - 1) / (t - t_pub),
        "publish_complete_share": t_pub / t,
        "hit_req_s": nreq / t_hit,
    }


# ---- the anchor -------------------------------------------------------------------------------
_ANCHOR_DRIVER = r"""
import json, sys, time, gc, importlib.util
spec = importlib.util.spec_from_file_location("anchor_bench", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
def timeit(fn, repeat=5):  # the same statistic as pagedkv's figures: best of N
    ts = []
    for _ in range(max(repeat, int(sys.argv[2]))):
        gc.collect(); t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return min(ts)
m.timeit = timeit
out = {"python": sys.version.split()[0]}
for caching in (True, False):
    out[f"alloc_free_caching_{caching}"] = m.bench_alloc_free(caching=caching)
out["prefix"] = m.bench_prefix()
print("ANCHOR_JSON " + json.dumps(out))
"""


def run_anchor(repeat: int) -> tuple[dict | None, str]:
    setup = ANCHOR / "setup.sh"
    if not setup.exists():
        return None, f"anchor not found at {ANCHOR}"
    try:
        tree = subprocess.run([str(setup)], capture_output=True, text=True, timeout=600,
                              check=True).stdout.strip()
        env = dict(os.environ, VLLM_ANCHOR_TREE=tree)
        proc = subprocess.run(
            [sys.executable, "-c", _ANCHOR_DRIVER, str(ANCHOR / "bench.py"), str(repeat)],
            capture_output=True, text=True, timeout=1800, env=env, check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        return None, f"anchor failed: {exc} {detail[-500:]}"
    for line in proc.stdout.splitlines():
        if line.startswith("ANCHOR_JSON "):
            data = json.loads(line[len("ANCHOR_JSON "):])
            for key in list(data):
                if key.startswith("alloc_free"):
                    data[key] = {int(k): v for k, v in data[key].items()}
            return data, "ok"
    return None, "anchor printed no result"


def native_status() -> str:
    """Whether the native pool rows ran ("ok"), or why they show "-"."""
    try:
        NativePool(1, B)
    except NativeUnavailable as exc:
        return f"skipped ({exc})"
    return "ok"


# ---- report -----------------------------------------------------------------------------------
def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f} M"
    if v >= 1e3:
        return f"{v / 1e3:.1f} k"
    return f"{v:.2f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def build_rows(res: dict, anchor: dict | None) -> list[tuple[str, str, float | None, ...]]:
    rows = []
    for caching in (True, False):
        v = (anchor or {}).get(f"alloc_free_caching_{caching}", {})
        for n in SIZES:
            rows.append((f"alloc+free n={n} caching={'on' if caching else 'off'} (alloc)",
                         "blocks/s", res["alloc"][f"{caching}"][f"{n}"]["unchecked"],
                         res["alloc"][f"{caching}"][f"{n}"]["checked"], v.get(n)))
    v = (anchor or {}).get("alloc_free_caching_True", {})
    for n in SIZES:
        rows.append((f"alloc+free n={n} (pool layer)", "blocks/s",
                     res["pool"][f"{n}"]["unchecked"], res["pool"][f"{n}"]["checked"], v.get(n)))
    for n in SIZES:
        rows.append((f"alloc+free n={n} (pool layer, batched)", "blocks/s",
                     res["pool_batched"][f"{n}"]["unchecked"],
                     res["pool_batched"][f"{n}"]["checked"], v.get(n)))
    v_off = (anchor or {}).get("alloc_free_caching_False", {})
    for vs, suffix in ((v, ""), (v_off, " vs vLLM caching=off")):
        for key, what in (("pool_native", "holder open"), ("pool_native_holders",
                                                           "holder per round")):
            for n in SIZES:
                rows.append((f"alloc+free n={n} (native pool, {what}){suffix}", "blocks/s",
                             res[key][f"{n}"]["unchecked"], res[key][f"{n}"]["checked"],
                             vs.get(n)))
    rows.append(("alloc+free n=1 (native pool, take + release: one block, no array)",
                 "blocks/s", res["native_single"]["unchecked"], res["native_single"]["checked"],
                 v.get(1)))
    ap = (anchor or {}).get("prefix", {})
    pp, pa, pn = res["prefix_pool"], res["prefix_alloc"], res["prefix_native"]
    v_hit = ap.get("lookup+touch+free req/s")
    v_life = ap.get("full lifecycle req/s")
    v_hash = ap.get("sha256 block-hash/s (Request hasher)")
    hpr = pp["unchecked"]["hashes_per_req"]
    v_life_h = 1 / (1 / v_life + hpr / v_hash) if v_life and v_hash else None
    rows += [
        ("prefix lookup+touch+free (pool)", "req/s", pp["unchecked"]["hit_req_s"],
         pp["checked"]["hit_req_s"], v_hit),
        ("prefix lookup+touch+free (native pool)", "req/s", pn["unchecked"]["hit_req_s"],
         pn["checked"]["hit_req_s"], v_hit),
        ("prefix full lifecycle, pool ops (pool; +publish/access)", "req/s",
         pp["unchecked"]["life_req_s"], pp["checked"]["life_req_s"], v_life),
        ("prefix full lifecycle, pool ops (native pool; +publish/access)", "req/s",
         pn["unchecked"]["life_req_s"], pn["checked"]["life_req_s"], v_life),
        ("prefix full lifecycle excl. publish/complete (alloc, hashing incl.)", "req/s",
         pa["unchecked"]["life_excl_publish_req_s"], pa["checked"]["life_excl_publish_req_s"],
         v_life_h),
        ("prefix full lifecycle incl. publish/complete (alloc, hashing incl.)", "req/s",
         pa["unchecked"]["life_req_s"], pa["checked"]["life_req_s"], v_life_h),
        ("same, every block sha256-hashed (hash memo off)", "req/s",
         pa["nomemo"]["life_req_s"], None, v_life_h),
        ("prefix hits only: add_request+allocate+free (alloc, hashing incl.)", "req/s",
         pa["unchecked"]["hit_req_s"], pa["checked"]["hit_req_s"],
         1 / (1 / v_hit + hpr / v_hash) if v_hit and v_hash else None),
        ("sha256 block hashing", "hashes/s", pp["unchecked"]["hash_s"], None, v_hash),
        ("sha256 block hashing, native chain (NativeAllocator's)", "hashes/s",
         pn["unchecked"]["hash_s"], None, v_hash),
    ]
    return rows


def table(rows: list) -> str:
    head = ("| workload | unit | pagedkv unchecked | pagedkv checked | vLLM 0.33.0 | "
            "unchecked / vLLM | checked / vLLM | checked / unchecked |")
    lines = [head, "|" + "---|" * 8]
    for name, unit, u, c, v in rows:
        lines.append(f"| {name} | {unit} | {fmt(u)} | {fmt(c)} | {fmt(v)} | {ratio(u, v)} | "
                     f"{ratio(c, v)} | {ratio(c, u)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--with-vllm", action="store_true", help="also run the vLLM anchor")
    ap.add_argument("--quick", action="store_true", help="1/20 of the work, 2 repeats")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    repeat = 2 if args.quick else args.repeat
    scale = 20 if args.quick else 1
    nreq = NREQ // scale
    res: dict = {"alloc": {}, "pool": {}, "pool_batched": {}, "pool_native": {},
                 "pool_native_holders": {}, "prefix_pool": {}, "prefix_native": {},
                 "prefix_alloc": {}}
    for caching in (True, False):
        res["alloc"][f"{caching}"] = {}
        for n in SIZES:
            rounds = max(1, 400_000 // n // scale)
            res["alloc"][f"{caching}"][f"{n}"] = {
                mode: alloc_free_alloc(n, rounds, mode == "checked", caching, repeat)
                for mode in ("unchecked", "checked")
            }
    for n in SIZES:
        rounds = max(1, 400_000 // n // scale)
        res["pool"][f"{n}"] = {mode: alloc_free_pool(n, rounds, mode == "checked", repeat)
                               for mode in ("unchecked", "checked")}
        res["pool_batched"][f"{n}"] = {
            mode: alloc_free_pool(n, rounds, mode == "checked", repeat, batched=True)
            for mode in ("unchecked", "checked")}
        for key, per_round in (("pool_native", False), ("pool_native_holders", True)):
            res[key][f"{n}"] = {
                mode: alloc_free_native(n, rounds, mode == "checked", repeat, per_round)
                for mode in ("unchecked", "checked")}
    res["native_single"] = {mode: alloc_free_native_single(400_000 // scale,
                                                           mode == "checked", repeat)
                            for mode in ("unchecked", "checked")}
    for mode in ("unchecked", "checked"):
        res["prefix_pool"][mode] = prefix_pool(mode == "checked", nreq, repeat)
        res["prefix_native"][mode] = prefix_native(
            mode == "checked", nreq, repeat,
            expect_mean_hit=res["prefix_pool"][mode]["life_mean_hit_blocks"])
        res["prefix_alloc"][mode] = prefix_alloc(mode == "checked", nreq, repeat)
    res["prefix_alloc"]["nomemo"] = prefix_alloc(False, nreq, repeat, memo=False)
    anchor, why = (None, "not requested (--with-vllm)")
    if args.with_vllm:
        anchor, why = run_anchor(repeat)
    rows = build_rows(res, anchor)
    text = table(rows)
    cmd = "python benchmarks/allocator_bench.py " + " ".join(sys.argv[1:])
    meta = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "machine": f"nproc={os.cpu_count()}, {platform.machine()}, "
                   f"{platform.processor() or platform.platform()}",
        "python": sys.version.split()[0],
        "command": cmd.strip(),
        "repeat": repeat,
        "statistic": "best (min time) of repeats",
        "vllm_anchor": why,
        "native_pool": native_status(),
    }
    print(text)
    print(f"\nvLLM anchor: {why}")
    print(f"native pool: {meta['native_pool']}")
    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        md = ["# Allocator benchmark", ""] + [f"- {k}: {v}" for k, v in meta.items()] + [
            "", text, "", "Workload definitions: see the docstring of "
            "benchmarks/allocator_bench.py.", ""]
        (RESULTS / "allocator_bench.md").write_text("\n".join(md))
        (RESULTS / "allocator_bench.json").write_text(json.dumps(
            {"meta": meta, "pagedkv": res, "vllm": anchor,
             "rows": [dict(zip(("workload", "unit", "unchecked", "checked", "vllm"), r,
                               strict=True)) for r in rows]}, indent=1))


if __name__ == "__main__":
    main()
