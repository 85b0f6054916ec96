"""``pagedkv``: verify the allocator, plan capacity and block size, run the cache lab, draw the
block lifecycle, simulate serving.

    pagedkv verify [--quick]            proofs, checks and the invariant report
    pagedkv plan --free-gb 40 --kv-bytes-per-token 250KB --max-len 8192 --mean-len 500 ...
    pagedkv lab --capacity 4 --stride 5 --time 10 [--step]
    pagedkv diagram [--format mermaid|dot] [--render lifecycle.svg]
    pagedkv simulate --preset mixed --requests 200 [--kv] [--json out.json] [--plot out.png]
    pagedkv --version

Bad arguments exit with status 2 and a message saying what is wrong.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import CliError, MissingInput
from .units import parse_size

PROG = "pagedkv"


def package_version() -> str:
    """The installed distribution's version, else the version in the source pyproject.toml."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pagedkv")
    except PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def _size(what: str):
    def parse(text: str) -> float:
        try:
            return parse_size(text, what)
        except CliError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = "size"
    return parse


class _NoProgress:
    """Stands in for a tqdm bar when tqdm (the [verify] extra) is not installed."""

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None

    def close(self) -> None:
        return None


def _progress(total: int | None, desc: str, quiet: bool, unit: str = "it"):
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=quiet,
                mininterval=0.5, leave=False)


def _write_json(path: Path | None, payload: dict[str, Any]) -> None:
    if path is None:
        return
    try:
        Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")
    except OSError as exc:
        raise CliError(f"--json {path}: cannot write it ({exc.strerror or exc})") from exc


# ---- plan ----------------------------------------------------------------------------------
def _bytes_per_token(args: argparse.Namespace) -> tuple[float | None, str]:
    from .plan import bytes_per_token_from_shape

    shape = {"--layers": args.layers, "--kv-heads": args.kv_heads, "--head-dim": args.head_dim}
    given = [k for k, v in shape.items() if v is not None]
    if args.kv_bytes_per_token is not None:
        if given:
            raise CliError("give --kv-bytes-per-token or a model shape "
                           f"({', '.join(shape)}, --dtype), not both")
        if not args.kv_bytes_per_token > 0:
            raise CliError("--kv-bytes-per-token must be > 0")
        return args.kv_bytes_per_token, ""
    if not given:
        return None, ""
    missing = [k for k, v in shape.items() if v is None]
    if missing:
        raise MissingInput(f"a model shape needs {', '.join(shape)}; missing "
                           f"{', '.join(missing)}")
    bpt = bytes_per_token_from_shape(args.layers, args.kv_heads, args.head_dim, args.dtype)
    return bpt, (f" (2 x {args.layers} layers x {args.kv_heads} kv heads x "
                 f"{args.head_dim} head dim x {args.dtype})")


def cmd_plan(args: argparse.Namespace) -> int:
    from . import plan

    if args.free_gb is None and args.lengths is None:
        raise MissingInput("plan needs --free-gb (capacity) and/or --lengths FILE "
                           "(the block-size advisor)")
    if args.lengths is not None and args.mean_len is not None:
        raise CliError("give --lengths FILE or --mean-len, not both")
    if args.requests is not None and args.mean_len is None:
        raise MissingInput("--requests needs --mean-len (N requests x L tokens)")
    for name in ("max_len", "mean_len", "requests", "block_size", "max_blocks_per_request"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise CliError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if args.kernel_slack < 0 or not math.isfinite(args.kernel_slack):
        raise CliError(f"--kernel-slack must be a finite number >= 0, got {args.kernel_slack}")
    if args.kernel_bench is not None and args.lengths is None:
        raise MissingInput("--kernel-bench is used by the block-size advisor, which needs "
                           "--lengths FILE")
    bpt, source = _bytes_per_token(args)
    lengths = plan.read_lengths(args.lengths) if args.lengths is not None else None
    figures: dict[str, Any] = {"bytes_per_token": bpt}
    out: list[str] = []
    if args.free_gb is not None:
        if not (math.isfinite(args.free_gb) and args.free_gb > 0):
            raise CliError(f"--free-gb must be a finite number > 0, got {args.free_gb}")
        if bpt is None:
            raise MissingInput("capacity needs the KV bytes per token: --kv-bytes-per-token "
                               "(e.g. 250KB) or --layers, --kv-heads, --head-dim, --dtype")
        max_len, note = args.max_len, ""
        if max_len is None:
            if lengths is None:
                raise MissingInput("capacity needs --max-len (the longest request a contiguous "
                                   "reservation must hold)")
            max_len, note = max(lengths), ", the longest given length"
            if max_len == 0:
                raise MissingInput("every given length is 0: give --max-len for the "
                                   "contiguous reservations")
        c = plan.capacity(args.free_gb * 1e9, bpt, max_len, args.block_size, lengths,
                          args.mean_len, args.requests)
        figures["capacity"] = c
        out += plan.render_capacity(c, source, note)
    if lengths is not None:
        kernel, ksource = None, None
        if args.kernel_bench is not None:
            kernel, ksource = plan.read_kernel_bench(args.kernel_bench)
        bounds = plan.Bounds(args.kernel_slack, args.max_metadata_bytes,
                             args.max_blocks_per_request)
        a = plan.advise(lengths, bpt, kernel, bounds)
        a["kernel_source"] = ksource
        figures["block_size_advice"] = a
        if out:
            out.append("")
        out += plan.render_advice(a)
    print("\n".join(out))
    _write_json(args.json, {"command": "plan", **figures})
    return 0


# ---- lab -----------------------------------------------------------------------------------
def cmd_lab(args: argparse.Namespace) -> int:
    from . import lab

    n = lab.requests_for_time(args.time) if math.isfinite(args.time) and args.time >= 0 else 0
    with _progress(n, "lab requests", args.quiet or args.step, "req") as bar:
        result = lab.run_lab(args.capacity, args.stride, args.time, args.block_size,
                             record=args.step or args.json is not None, progress=bar.update)
    if args.step:
        for s in result.steps:
            print(lab.render_step(s))
    print(lab.render_summary(result))
    _write_json(args.json, {"command": "lab", **result.to_dict(with_steps=args.step)})
    return 0


# ---- diagram -------------------------------------------------------------------------------
def cmd_diagram(args: argparse.Namespace) -> int:
    from . import diagram

    with _progress(None, "exploring the spec", args.quiet, "state") as bar:
        lc = diagram.derive(progress=bar.update)
    text = diagram.to_mermaid(lc) if args.format == "mermaid" else diagram.to_dot(lc)
    if args.output is not None:
        try:
            Path(args.output).write_text(text)
        except OSError as exc:
            raise CliError(f"--output {args.output}: cannot write it "
                           f"({exc.strerror or exc})") from exc
    else:
        sys.stdout.write(text)
    if args.render is not None:
        path = diagram.render_with_dot(diagram.to_dot(lc), Path(args.render))
        if not args.quiet:
            print(f"rendered {path}", file=sys.stderr)
    return 0


# ---- simulate ------------------------------------------------------------------------------
def cmd_simulate(args: argparse.Namespace) -> int:
    from . import simulate as sim
    from . import workloads

    if args.trace is not None and args.preset is not None:
        raise CliError("give --preset or --trace, not both")
    if args.trace is not None and (args.rate is not None or args.length_scale != 1.0):
        raise CliError("--rate and --length-scale shape the presets, not a --trace")
    if args.requests is not None and args.requests < 1:
        raise CliError(f"--requests must be >= 1, got {args.requests}")
    shape = sim.ModelShape(args.layers, args.kv_heads, args.heads, args.head_dim, args.dtype)
    cfg = sim.SimConfig(num_blocks=args.num_blocks, block_size=args.block_size,
                        token_budget=args.token_budget, max_running=args.max_running,
                        prefix_caching=not args.no_prefix_caching, checked=not args.unchecked,
                        kv=args.kv, shape=shape,
                        kv_backend=args.kv_backend, kv_tolerance=args.kv_tolerance,
                        contiguous_max_len=args.contiguous_max_len,
                        preempt=args.preempt, host_blocks=args.host_blocks)
    cfg.check()
    if args.trace is not None:
        wl = workloads.read_trace(args.trace, seed=args.seed, limit=args.requests)
    else:
        max_len = min(args.max_model_len, (args.num_blocks - 1) * args.block_size)
        wl = workloads.preset_workload(args.preset or "mixed", args.requests or 200,
                                       seed=args.seed,
                                       rate=args.rate, length_scale=args.length_scale,
                                       max_len=max_len)
    if args.plot is not None:  # fail before the run, not after it
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise CliError("--plot needs matplotlib, which is not installed (pip install "
                           "matplotlib, or pip install 'pagedkv[plot]')")
    with _progress(len(wl.requests), "simulate", args.quiet, "req") as bar:
        result = sim.simulate(wl, cfg, progress=bar.update)
    print(sim.render(result.report))
    _write_json(args.json, {**result.report, "series": result.series})
    if args.plot is not None:
        sim.plot(result.series, result.report, args.plot)
        if not args.quiet:
            print(f"plotted {args.plot}", file=sys.stderr)
    return 0 if result.passed else 1


# ---- the parser ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.splitlines()[0] + " " + __doc__.splitlines()[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `pagedkv <command> --help` for a command's options.")
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    quiet = argparse.ArgumentParser(add_help=False)
    quiet.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", type=Path, default=None, metavar="PATH",
                         help="also write the figures as JSON to PATH")

    sub.add_parser("verify", add_help=False,
                   help="prove the spec, check the code against it, print the invariant "
                        "report (`pagedkv verify --help`)")

    p = sub.add_parser("plan", parents=[quiet, as_json],
                       help="capacity (contiguous vs paged) and a block-size recommendation",
                       description="Capacity: how many requests fit with contiguous "
                       "maximum-length reservations and with paged blocks. Block-size "
                       "advisor (with --lengths): tail waste, table entries, metadata and "
                       "kernel time for block sizes 1..256, and a recommendation.")
    p.add_argument("--free-gb", type=float, metavar="GB",
                   help="free KV-cache memory in GB (1 GB = 1e9 bytes)")
    p.add_argument("--kv-bytes-per-token", type=_size("--kv-bytes-per-token"), metavar="SIZE",
                   help="KV bytes per token, e.g. 250KB (= 250e3), 800000, 1MiB")
    p.add_argument("--layers", type=int, help="model shape: layers")
    p.add_argument("--kv-heads", type=int, help="model shape: KV heads")
    p.add_argument("--head-dim", type=int, help="model shape: head dimension")
    p.add_argument("--dtype", choices=["fp16", "bf16", "fp32", "fp8"], default="fp16",
                   help="model shape: KV dtype (default fp16)")
    p.add_argument("--max-len", type=int, metavar="TOKENS",
                   help="maximum request length (contiguous reservations; default: the "
                        "longest of --lengths)")
    p.add_argument("--lengths", type=Path, metavar="FILE",
                   help="measured sequence lengths, one integer per line ('#' comments)")
    p.add_argument("--mean-len", type=int, metavar="TOKENS",
                   help="a uniform workload: every request has this many tokens")
    p.add_argument("--requests", type=int, metavar="N",
                   help="with --mean-len: the number of requests (memory for N x L)")
    p.add_argument("--block-size", type=int, default=16, metavar="B",
                   help="block size for the capacity figures (default 16)")
    p.add_argument("--kernel-bench", type=Path, metavar="FILE",
                   help='kernel times: benchmarks/kernel_bench.py JSON, or {"<B>": seconds}')
    p.add_argument("--kernel-slack", type=float, default=0.10, metavar="F",
                   help="advisor bound: kernel time <= (1 + F) x the fastest measured "
                        "(default 0.10)")
    p.add_argument("--max-metadata-bytes", type=_size("--max-metadata-bytes"), metavar="SIZE",
                   help="advisor bound: total int32 table bytes for the given lengths")
    p.add_argument("--max-blocks-per-request", type=int, metavar="N",
                   help="advisor bound: table width (blocks of the longest request)")
    p.set_defaults(run=cmd_plan)

    lab = sub.add_parser("lab", parents=[quiet, as_json],
                         help="the prefix-cache lab on the real BlockPool and its LRU order",
                         description="A pool of C blocks, N = min(4096, 16 + floor(2t)) "
                         "requests; request i wants identity i mod s. A pure function of "
                         "(C, s, t): every run starts from an empty pool.")
    lab.add_argument("--capacity", type=int, required=True, metavar="C",
                     help="blocks in the pool")
    lab.add_argument("--stride", type=int, required=True, metavar="S",
                     help="request i wants identity i mod S")
    lab.add_argument("--time", type=float, default=0.0, metavar="T",
                     help="N = min(4096, 16 + floor(2T)) requests (default 0: 16)")
    lab.add_argument("--block-size", type=int, default=16, metavar="B",
                     help="slots per block; each miss writes all of them (default 16)")
    lab.add_argument("--step", action="store_true",
                     help="print the pool after each request (identity per block, LRU order)")
    lab.set_defaults(run=cmd_lab)

    d = sub.add_parser("diagram", parents=[quiet],
                       help="the block lifecycle, generated from the spec",
                       description="States and transitions (with their guards in words), "
                       "derived by running spec.TRANSITIONS on a small concrete pool.")
    d.add_argument("--format", choices=["mermaid", "dot"], default="mermaid",
                   help="Mermaid (default) or Graphviz dot")
    d.add_argument("--output", type=Path, metavar="FILE", help="write the text to FILE")
    d.add_argument("--render", type=Path, metavar="FILE.svg|FILE.png",
                   help="also render with Graphviz `dot` (must be installed)")
    d.set_defaults(run=cmd_diagram)

    from .simulate import KV_BACKENDS, KV_DTYPES, PREEMPT_MODES
    from .workloads import PRESETS

    sm = sub.add_parser(
        "simulate", parents=[quiet, as_json],
        help="replay a serving workload through the engine front door (optionally checking "
             "every attention output against dense attention: --kv)",
        description="A continuous-batching scheduler (FCFS, token budget, chunked prefill, "
        "preemption by recompute or swap) drives pagedkv.engine.KVCacheManager with the checked "
        "allocator over a preset workload or a JSONL trace; reports allocator throughput, "
        "concurrency, occupancy, tail waste, prefix hits, preemptions, admission headroom "
        "and paged vs contiguous capacity. Exit status 1 if the --kv check fails.")
    w = sm.add_argument_group("workload")
    w.add_argument("--preset", choices=PRESETS, default=None,
                   help="a built-in workload (default mixed)")
    w.add_argument("--trace", type=Path, metavar="FILE.jsonl",
                   help='one record a line: {"arrival": steps, "prompt_tokens": [...] | '
                        '"prompt_len": N, "output_len": N, "salt": str|null, "id": ...}')
    w.add_argument("--requests", type=int, default=None, metavar="N",
                   help="requests to replay, every turn counts (preset: default 200; "
                        "--trace: the first N records, default all)")
    w.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    w.add_argument("--rate", type=float, default=None, metavar="R",
                   help="preset: new conversations per step after the first 16 (default "
                        "per preset)")
    w.add_argument("--length-scale", type=float, default=1.0, metavar="F",
                   help="preset: multiply every length by F (default 1)")
    w.add_argument("--max-model-len", type=int, default=8192, metavar="TOKENS",
                   help="preset: prompt + output cap per request (default 8192, and at most "
                        "the pool)")
    e = sm.add_argument_group("engine")
    e.add_argument("--num-blocks", type=int, default=2048, metavar="N",
                   help="blocks in the pool, the null block included (default 2048)")
    e.add_argument("--block-size", type=int, default=16, metavar="B",
                   help="tokens per block (default 16)")
    e.add_argument("--token-budget", type=int, default=2048, metavar="T",
                   help="tokens scheduled per step (default 2048)")
    e.add_argument("--max-running", type=int, default=64, metavar="N",
                   help="running requests at most (default 64)")
    e.add_argument("--preempt", choices=PREEMPT_MODES, default="recompute",
                   help="recompute: a preempted request's KV is recomputed (default); swap: "
                        "it is copied to a host tier and back (recompute where that fails)")
    e.add_argument("--host-blocks", type=int, default=None, metavar="N",
                   help="--preempt swap: blocks in the host tier (default: --num-blocks)")
    e.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    e.add_argument("--unchecked", action="store_true",
                   help="the allocator without checked mode (to time what checking costs; "
                        "the default is checked=True)")
    k = sm.add_argument_group("KV check and model shape")
    k.add_argument("--kv", action="store_true",
                   help="write and read real KV through a KVCachePool and check every "
                        "attention output against dense attention")
    k.add_argument("--kv-backend", choices=KV_BACKENDS, default="auto",
                   help="auto: numba kernels on a GPU, else the torch reference on CPU")
    k.add_argument("--kv-tolerance", type=float, default=None, metavar="REL",
                   help="max relative error (default: 2e-5 fp32, 2e-3 fp16, 1.6e-2 bf16)")
    k.add_argument("--layers", type=int, default=2, help="model shape: layers (default 2)")
    k.add_argument("--kv-heads", type=int, default=2, help="model shape: KV heads (default 2)")
    k.add_argument("--heads", type=int, default=4, help="model shape: query heads (default 4)")
    k.add_argument("--head-dim", type=int, default=16,
                   help="model shape: head dimension (default 16)")
    k.add_argument("--dtype", choices=sorted(set(KV_DTYPES) | {"fp8"}), default="fp32",
                   help=f"model shape: KV dtype (default fp32; --kv takes {', '.join(KV_DTYPES)})")
    o = sm.add_argument_group("output")
    o.add_argument("--contiguous-max-len", type=int, default=None, metavar="TOKENS",
                   help="the contiguous reservation per request (default: the longest request)")
    o.add_argument("--plot", type=Path, metavar="OUT.png",
                   help="draw occupancy, evictable cached, headroom and running requests over "
                        "time (needs matplotlib)")
    sm.set_defaults(run=cmd_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "verify":
        # Exactly today's `pagedkv verify`: its own parser, report files and exit code.
        from pagedkv.proofs.cli import main as verify_main

        return verify_main(args_list)
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        return args.run(args)
    except CliError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `pagedkv lab --step | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
