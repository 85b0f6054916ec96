"""Decode benchmark: paged_attention_decode against torch gather + SDPA, and against the
device-to-device copy bandwidth.

    python benchmarks/kernel_bench.py                 # on a CUDA GPU
    python benchmarks/kernel_bench.py --sweep         # also try a few thread layouts
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/kernel_bench.py --tiny   # smoke run, no GPU

Achieved bandwidth counts the K and V bytes each launch must read (sum of lengths x kv_heads x
head_dim x 2 x element size); the copy bandwidth counts bytes read plus bytes written.
Results go to ``benchmarks/results/kernel_bench_<date>.{json,md}`` (and ``$OUT`` if set).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

if "--tiny" in sys.argv:  # the simulator must be chosen before numba is imported
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pagedkv.kernels import KernelConfig, default_config, paged_attention_decode  # noqa: E402


@dataclass
class Case:
    name: str
    batch: int
    seq_len: int
    kv_heads: int
    head_dim: int
    group: int
    block_size: int
    dtype: str = "float16"


@dataclass
class Result:
    case: Case
    config: str
    kernel_us: float
    kernel_gbps: float
    pct_of_copy: float
    sdpa_us: float | None
    speedup: float | None
    max_rel_err: float | None


def main_cases() -> list[Case]:
    cases = []
    for bs in (16, 32):
        for g in (1, 4, 8):
            cases.append(Case(f"b64x4k-g{g}-B{bs}", 64, 4096, 8, 128, g, bs))
    cases.append(Case("short-b256x256-g4-B16", 256, 256, 8, 128, 4, 16))
    cases.append(Case("long-b1x128k-g4-B16", 1, 131072, 8, 128, 4, 16))
    cases.append(Case("long-b1x128k-g8-B32", 1, 131072, 8, 128, 8, 32))
    return cases


def tiny_cases() -> list[Case]:
    return [Case("tiny-g2-B8", 2, 20, 2, 16, 2, 8), Case("tiny-g4-B4-f32", 2, 9, 1, 8, 4, 4,
                                                        "float32")]


class Timer:
    """Median time of one call, in microseconds: CUDA events around ``reps`` back-to-back calls
    (so host overhead overlaps the GPU work), or wall time on the CPU."""

    def __init__(self, cuda: bool, iters: int, reps: int) -> None:
        self.cuda, self.iters, self.reps = cuda, iters, reps

    def __call__(self, fn) -> float:
        fn()  # warm up (and compile)
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6
        torch.cuda.synchronize()
        times = []
        for _ in range(self.iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(self.reps):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / self.reps)
        return statistics.median(times)


def copy_bandwidth(device: str, nbytes: int, timer: Timer) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + written)."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
    dst = torch.empty_like(src)
    us = timer(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (us * 1e-6) / 1e9


def build(case: Case, device: str, seed: int = 0):
    dtype = getattr(torch, case.dtype)
    blocks_per_seq = -(-case.seq_len // case.block_size)
    num_blocks = case.batch * blocks_per_seq + 1
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = (num_blocks, case.block_size, case.kv_heads, case.head_dim)
    k_cache = torch.empty(shape, dtype=dtype, device=device).normal_()
    v_cache = torch.empty(shape, dtype=dtype, device=device).normal_()
    perm = torch.randperm(num_blocks - 1, generator=gen)[: case.batch * blocks_per_seq]
    tables = perm.view(case.batch, blocks_per_seq).to(torch.int32).to(device)
    seq_lens = torch.full((case.batch,), case.seq_len, dtype=torch.int32, device=device)
    q = torch.randn(case.batch, case.kv_heads * case.group, case.head_dim, generator=gen)
    return q.to(dtype).to(device), k_cache, v_cache, tables, seq_lens


def sdpa_decode(q, k_cache, v_cache, tables, seq_len: int):
    """torch baseline: gather each sequence's K/V through the table, then SDPA (GQA)."""
    n, h, d = q.shape
    hkv = k_cache.shape[2]
    k = k_cache[tables.long()].reshape(n, -1, hkv, d)[:, :seq_len].transpose(1, 2)
    v = v_cache[tables.long()].reshape(n, -1, hkv, d)[:, :seq_len].transpose(1, 2)
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True)
    return out.squeeze(2)


def run_case(case: Case, device: str, timer: Timer, copy_gbps: float | None,
             configs: list[KernelConfig | None], baseline: bool) -> list[Result]:
    q, k_cache, v_cache, tables, seq_lens = build(case, device)
    es = k_cache.element_size()
    kv_bytes = 2 * case.batch * case.seq_len * case.kv_heads * case.head_dim * es
    sdpa_us = None
    ref = None
    if baseline:
        try:
            ref = sdpa_decode(q, k_cache, v_cache, tables, case.seq_len)
            sdpa_us = timer(lambda: sdpa_decode(q, k_cache, v_cache, tables, case.seq_len))
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    results = []
    out = torch.empty_like(q)
    for cfg in configs:
        def launch(cfg=cfg):
            paged_attention_decode(q, k_cache, v_cache, tables, seq_lens, out=out,
                                   max_seq_len=case.seq_len, config=cfg)
        us = timer(launch)
        err = None
        if ref is not None:
            launch()
            err = float(((out.double() - ref.double()).abs().max()
                         / ref.double().abs().max()).item())
        gbps = kv_bytes / (us * 1e-6) / 1e9
        used = cfg or default_config(case.head_dim, case.group, case_kind(case), prefill=False)
        results.append(Result(
            case, str(used), us, gbps, 100 * gbps / copy_gbps if copy_gbps else float("nan"),
            sdpa_us, (sdpa_us / us) if sdpa_us else None, err,
        ))
    return results


def case_kind(case: Case) -> str:
    return {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}[case.dtype]


def sweep_configs(case: Case) -> list[KernelConfig | None]:
    base = default_config(case.head_dim, case.group, case_kind(case), prefill=False)
    out: list[KernelConfig | None] = [None]
    for lanes in (base.lanes, base.lanes * 2, max(1, base.lanes // 2)):
        for unroll in (2, 4):
            rows = case.group
            slots = max(1, 128 // (rows * lanes))
            cfg = KernelConfig(lanes, slots, unroll, 1)
            if cfg != base and cfg not in out and lanes * rows * slots <= 1024:
                out.append(cfg)
    return out


def versions() -> dict[str, str]:
    import numba

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "numba": numba.__version__}
    try:
        import numba_cuda

        info["numba-cuda"] = getattr(numba_cuda, "__version__", "?")
    except ImportError:
        info["numba-cuda"] = "not installed"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["torch.cuda"] = str(torch.version.cuda)
    return info


def to_markdown(meta: dict, results: list[Result]) -> str:
    lines = [f"# Decode kernel benchmark ({meta['date']})", ""]
    lines += [f"- {k}: {v}" for k, v in meta["versions"].items()]
    lines += [f"- device-to-device copy: {meta['copy_gbps']:.0f} GB/s"
              if meta["copy_gbps"] else "- device-to-device copy: not measured", ""]
    lines += ["| case | config | kernel µs | GB/s | % copy | SDPA µs | speedup | rel err |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        sd = f"{r.sdpa_us:.1f}" if r.sdpa_us else "-"
        sp = f"{r.speedup:.2f}x" if r.speedup else "-"
        er = f"{r.max_rel_err:.1e}" if r.max_rel_err is not None else "-"
        lines.append(f"| {r.case.name} | {r.config} | {r.kernel_us:.1f} | {r.kernel_gbps:.0f} "
                     f"| {r.pct_of_copy:.1f} | {sd} | {sp} | {er} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes for the CUDA simulator")
    ap.add_argument("--sweep", action="store_true", help="also time a few thread layouts")
    ap.add_argument("--no-baseline", action="store_true", help="skip torch gather + SDPA")
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out-dir", default=None,
                    help="where to write results (default benchmarks/results, none with --tiny)")
    args = ap.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    if not args.tiny and device != "cuda":
        print("no CUDA GPU: use --tiny for a simulator smoke run", file=sys.stderr)
        return 2
    timer = Timer(device == "cuda", args.iters, args.reps)
    copy_gbps = copy_bandwidth(device, 1 << 30, timer) if device == "cuda" else None
    if copy_gbps:
        print(f"device-to-device copy: {copy_gbps:.0f} GB/s", flush=True)
    results: list[Result] = []
    for case in tiny_cases() if args.tiny else main_cases():
        configs = sweep_configs(case) if args.sweep else [None]
        case_results = run_case(case, device, timer, copy_gbps, configs, not args.no_baseline)
        if device == "cuda":
            torch.cuda.empty_cache()
        for r in case_results:
            results.append(r)
            sp = f"{r.speedup:.2f}x" if r.speedup else "-"
            print(f"{case.name:24s} {r.config:60s} {r.kernel_us:9.1f} us {r.kernel_gbps:7.0f} "
                  f"GB/s {r.pct_of_copy:5.1f}% of copy  SDPA speedup {sp}  "
                  f"err {r.max_rel_err}", flush=True)
    if args.tiny:
        bad = [r for r in results if r.max_rel_err is None or not r.max_rel_err < 2e-3]
        if bad:
            print(f"tiny run: kernel disagrees with SDPA: {bad}", file=sys.stderr)
            return 1
    date = _dt.datetime.now().strftime("%Y-%m-%d_%H%M")
    meta = {"date": date, "versions": versions(), "copy_gbps": copy_gbps, "tiny": args.tiny}
    out_dirs = []
    if args.out_dir or not args.tiny:
        out_dirs.append(Path(args.out_dir or Path(__file__).parent / "results"))
    if os.environ.get("OUT"):
        out_dirs.append(Path(os.environ["OUT"]))
    payload = {"meta": meta, "results": [
        {**asdict(r), "case": asdict(r.case)} for r in results]}
    for d in out_dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / f"kernel_bench_{date}.json").write_text(json.dumps(payload, indent=2))
        (d / f"kernel_bench_{date}.md").write_text(to_markdown(meta, results))
        print(f"wrote {d}/kernel_bench_{date}.{{json,md}}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
