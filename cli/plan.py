"""``pagedkv plan``: how many requests fit, contiguous against paged, and which block size.

Capacity. ``free`` bytes of KV memory, ``bpt`` bytes of KV per token (given, or from a model
shape: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes):

- contiguous, one maximum-length reservation per request: ``free / (max_len * bpt)`` requests
  (the exact ratio, and its floor: the whole requests);
- paged with block size ``B``: a request of ``L`` tokens takes ``ceil(L / B)`` blocks of ``B``
  slots; the memory of a workload is the sum of that times ``B * bpt``, its tail waste the sum
  of ``ceil(L / B) * B - L`` slots; "requests that fit" counts the given requests, in the
  given order, until the next one would not fit (a uniform workload: ``floor(free / per
  request)``).

Block-size advisor, for ``B`` in 1, 2, 4, ..., 256 over measured sequence lengths: the exact
tail waste (slots and bytes), the table entries (sum of ``ceil(L / B)``), their metadata bytes
(int32 entries), the longest table (blocks of the longest request) and, with a kernel
benchmark result, the kernel time per block size. The recommendation is the size with the
least tail waste among those within the stated bounds (ties: the larger size, fewer
entries), and the reason names the bound that excluded the size that would have wasted less.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BadKernelBench, BadLengths, CliError
from .units import fmt_bytes, fmt_num

DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1}
ADVISOR_BLOCK_SIZES = tuple(2**i for i in range(9))  # 1, 2, 4, ..., 256
TABLE_ENTRY_BYTES = 4  # int32 block-table entries (what publish() hands to kernels)
DEFAULT_KERNEL_SLACK = 0.10


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def bytes_per_token_from_shape(layers: int, kv_heads: int, head_dim: int, dtype: str) -> int:
    """KV bytes per token: 2 (K and V) x layers x kv_heads x head_dim x bytes of the dtype."""
    if dtype not in DTYPE_BYTES:
        raise CliError(f"unknown dtype {dtype!r} (one of {', '.join(DTYPE_BYTES)})")
    for name, v in (("layers", layers), ("kv-heads", kv_heads), ("head-dim", head_dim)):
        if v < 1:
            raise CliError(f"--{name} must be >= 1, got {v}")
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def read_lengths(path: Path) -> list[int]:
    """Integers >= 0, one per line; blank lines and ``#`` comments are skipped."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise BadLengths(f"--lengths {path}: cannot read it ({exc.strerror or exc})") from exc
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            raise BadLengths(f"--lengths {path}, line {n}: {item!r} is not an integer "
                             "(one sequence length, in tokens, per line)") from None
        if value < 0:
            raise BadLengths(f"--lengths {path}, line {n}: length {value} is negative")
        out.append(value)
    if not out:
        raise BadLengths(f"--lengths {path}: no lengths in it")
    return out


# ---- capacity ------------------------------------------------------------------------------
def contiguous(free_bytes: float, max_len: int, bpt: float) -> dict[str, Any]:
    per_request = max_len * bpt
    ratio = free_bytes / per_request
    return {"max_len": max_len, "bytes_per_request": per_request, "ratio": ratio,
            "requests": math.floor(ratio)}


def _fit_in_order(lengths: list[int], block_size: int, bpt: float, free_bytes: float) -> int:
    used, n = 0.0, 0
    for L in lengths:
        used += ceil_div(L, block_size) * block_size * bpt
        if used > free_bytes:
            break
        n += 1
    return n


def paged(free_bytes: float, bpt: float, block_size: int, lengths: list[int] | None = None,
          mean_len: int | None = None, requests: int | None = None) -> dict[str, Any]:
    """Paged memory of a workload: ``lengths`` (measured), or ``requests`` x ``mean_len``
    (uniform; without ``requests``, one request and how many such fit)."""
    if lengths is not None:
        workload = lengths
        uniform = None
    else:
        uniform = mean_len
        workload = [mean_len] * (requests if requests is not None else 1)
    blocks = [ceil_div(L, block_size) for L in workload]
    tokens = sum(workload)
    slots = sum(blocks) * block_size
    out: dict[str, Any] = {
        "block_size": block_size,
        "requests": len(workload) if (lengths is not None or requests is not None) else None,
        "tokens": tokens,
        "blocks": sum(blocks),
        "memory_bytes": slots * bpt,
        "memory_bytes_block_size_1": tokens * bpt,
        "tail_waste_slots": slots - tokens,
        "tail_waste_bytes": (slots - tokens) * bpt,
    }
    if uniform is not None:
        per_req = ceil_div(uniform, block_size) * block_size * bpt
        out.update({
            "tokens_per_request": uniform,
            "blocks_per_request": ceil_div(uniform, block_size),
            "blocks_per_request_exact": uniform / block_size,
            "fit_requests": math.floor(free_bytes / per_req) if per_req else None,
            "fit_requests_block_size_1": (math.floor(free_bytes / (uniform * bpt))
                                          if uniform else None),
        })
    else:
        out.update({
            "fit_requests": _fit_in_order(workload, block_size, bpt, free_bytes),
            "fit_requests_block_size_1": _fit_in_order(workload, 1, bpt, free_bytes),
        })
    return out


def capacity(free_bytes: float, bpt: float, max_len: int, block_size: int,
             lengths: list[int] | None = None, mean_len: int | None = None,
             requests: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"free_bytes": free_bytes, "bytes_per_token": bpt,
                           "contiguous": contiguous(free_bytes, max_len, bpt)}
    if lengths is not None or mean_len is not None:
        out["paged"] = paged(free_bytes, bpt, block_size, lengths, mean_len, requests)
        if lengths is not None:
            out["lengths_over_max_len"] = sum(L > max_len for L in lengths)
    return out


def render_capacity(c: dict[str, Any], source: str, max_len_note: str = "") -> list[str]:
    free, bpt = c["free_bytes"], c["bytes_per_token"]
    con = c["contiguous"]
    lines = [
        f"capacity: free KV memory {fmt_bytes(free)} ({fmt_num(free)} bytes), "
        f"{fmt_bytes(bpt)} ({fmt_num(bpt)} bytes) of KV per token{source}",
        f"  contiguous, one maximum-length reservation per request "
        f"({fmt_num(con['max_len'])} tokens{max_len_note} x {fmt_bytes(bpt)} = "
        f"{fmt_bytes(con['bytes_per_request'])} each):",
        f"    {fmt_bytes(free)} / {fmt_bytes(con['bytes_per_request'])} = "
        f"{fmt_num(con['ratio'])} -> {con['requests']:,} whole requests",
    ]
    p = c.get("paged")
    if p is None:
        lines.append("  paged: give --lengths FILE or --mean-len (and --requests) for the "
                     "paged figures")
        return lines
    B = p["block_size"]
    if "tokens_per_request" in p:
        L = p["tokens_per_request"]
        head = (f"{p['requests']:,} requests x {L:,} tokens" if p["requests"] is not None
                else f"one request of {L:,} tokens")
        lines += [f"  paged, {head}:"]
        if B != 1:
            lines.append(f"    block size 1 (exact tokens): {p['tokens']:,} tokens = "
                         f"{fmt_bytes(p['memory_bytes_block_size_1'])}")
        lines += [
            f"    block size {B}: {L:,} / {B} = {fmt_num(p['blocks_per_request_exact'])} -> "
            f"{p['blocks_per_request']:,} blocks per request, {p['blocks']:,} blocks = "
            f"{fmt_bytes(p['memory_bytes'])} (tail waste {p['tail_waste_slots']:,} slots = "
            f"{fmt_bytes(p['tail_waste_bytes'])})",
            f"    requests of {L:,} tokens that fit in {fmt_bytes(free)}: "
            f"{p['fit_requests']:,} with block size {B}"
            + (f" ({p['fit_requests_block_size_1']:,} with block size 1)" if B != 1 else "")
            + f", against {con['requests']:,} contiguous",
        ]
    else:
        n = p["requests"]
        lines += [f"  paged, the {n:,} given lengths ({p['tokens']:,} tokens):"]
        if B != 1:
            lines.append("    block size 1 (exact tokens): "
                         f"{fmt_bytes(p['memory_bytes_block_size_1'])}")
        lines += [
            f"    block size {B}: {p['blocks']:,} blocks = {fmt_bytes(p['memory_bytes'])} "
            f"(tail waste {p['tail_waste_slots']:,} slots = "
            f"{fmt_bytes(p['tail_waste_bytes'])})",
            f"    requests that fit in {fmt_bytes(free)}, taken in the file's order: "
            f"{p['fit_requests']:,} of {n:,} with block size {B}"
            + (f" ({p['fit_requests_block_size_1']:,} with block size 1)" if B != 1 else "")
            + f", against {min(n, con['requests']):,} contiguous",
        ]
        over = c.get("lengths_over_max_len", 0)
        if over:
            lines.append(f"    note: {over:,} of the lengths exceed the maximum length "
                         f"{con['max_len']:,} (a contiguous reservation could not hold them)")
    return lines


# ---- kernel benchmark results --------------------------------------------------------------
def read_kernel_bench(path: Path) -> tuple[dict[int, float], str]:
    """Kernel seconds per block size, and how they were obtained.

    Two formats: a JSON object ``{"16": 1.2e-5, "32": 1.1e-5}`` (block size -> seconds), or
    the output of ``benchmarks/kernel_bench.py`` (``{"meta": ..., "results": [{"case":
    {..., "block_size": B}, "kernel_us": t}, ...]}``). From the latter: for every case shape
    (the case less its name and block size) measured at every block size in the file, the
    fastest configuration's time, summed over those shapes.
    """
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise BadKernelBench(f"--kernel-bench {path}: cannot read it "
                             f"({exc.strerror or exc})") from exc
    except json.JSONDecodeError as exc:
        raise BadKernelBench(f"--kernel-bench {path}: not JSON ({exc})") from exc
    if isinstance(data, dict) and isinstance(data.get("results"), list):
        return _from_kernel_bench(data["results"], path)
    if isinstance(data, dict) and data:
        out = {}
        for k, v in data.items():
            try:
                b = int(k)
            except (TypeError, ValueError):
                raise BadKernelBench(
                    f"--kernel-bench {path}: key {k!r} is not a block size; expected "
                    '{"<block size>": <seconds>, ...} or benchmarks/kernel_bench.py output'
                ) from None
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise BadKernelBench(f"--kernel-bench {path}: block size {b}: {v!r} is not "
                                     "a positive number of seconds")
            out[b] = float(v)
        return out, f"{path}: seconds per block size"
    raise BadKernelBench(f"--kernel-bench {path}: expected a JSON object "
                         '{"<block size>": <seconds>} or benchmarks/kernel_bench.py output')


def _from_kernel_bench(results: list[Any], path: Path) -> tuple[dict[int, float], str]:
    best: dict[tuple[Any, int], float] = {}
    for i, r in enumerate(results):
        try:
            case, us = r["case"], float(r["kernel_us"])
            b = int(case["block_size"])
        except (KeyError, TypeError, ValueError):
            raise BadKernelBench(f"--kernel-bench {path}: results[{i}] has no case.block_size "
                                 "and kernel_us") from None
        shape = tuple(sorted((k, str(v)) for k, v in case.items()
                             if k not in ("name", "block_size")))
        best[(shape, b)] = min(us, best.get((shape, b), math.inf))
    sizes = sorted({b for _, b in best})
    shapes = {s for s, _ in best}
    common = sorted(s for s in shapes if all((s, b) in best for b in sizes))
    if len(sizes) < 2 or not common:
        raise BadKernelBench(f"--kernel-bench {path}: no case shape was measured at more than "
                             "one block size, so the times do not compare block sizes")
    out = {b: sum(best[(s, b)] for s in common) * 1e-6 for b in sizes}
    return out, (f"{path}: fastest config, summed over the {len(common)} case shapes measured "
                 f"at every block size {sizes}")


# ---- block-size advisor --------------------------------------------------------------------
@dataclass(frozen=True)
class Bounds:
    kernel_slack: float = DEFAULT_KERNEL_SLACK
    max_metadata_bytes: float | None = None
    max_blocks_per_request: int | None = None

    def describe(self, have_kernel: bool) -> list[str]:
        out = []
        if have_kernel:
            out.append(f"kernel time <= {1 + self.kernel_slack:.4g} x the fastest measured "
                       f"(--kernel-slack {self.kernel_slack:g}); sizes not measured are out")
        else:
            out.append("kernel time: not applied (no --kernel-bench)")
        out.append(f"metadata <= {fmt_bytes(self.max_metadata_bytes)}"
                   if self.max_metadata_bytes is not None
                   else "metadata: unbounded (no --max-metadata-bytes)")
        out.append(f"blocks per request <= {self.max_blocks_per_request:,}"
                   if self.max_blocks_per_request is not None
                   else "blocks per request: unbounded (no --max-blocks-per-request)")
        return out


def advise(lengths: list[int], bpt: float | None = None,
           kernel: dict[int, float] | None = None, bounds: Bounds = Bounds(),  # noqa: B008
           block_sizes: tuple[int, ...] = ADVISOR_BLOCK_SIZES) -> dict[str, Any]:
    if not lengths:
        raise BadLengths("the advisor needs at least one sequence length")
    tokens, longest = sum(lengths), max(lengths)
    measured = {b: t for b, t in (kernel or {}).items() if b in block_sizes}
    if kernel and not measured:
        raise BadKernelBench("the kernel benchmark measured none of the block sizes "
                             f"{list(block_sizes)}")
    fastest = min(measured.values()) if measured else None
    rows = []
    for B in block_sizes:
        entries = sum(ceil_div(L, B) for L in lengths)
        waste = entries * B - tokens
        row: dict[str, Any] = {
            "block_size": B,
            "table_entries": entries,
            "metadata_bytes": entries * TABLE_ENTRY_BYTES,
            "tail_waste_slots": waste,
            "tail_waste_bytes": waste * bpt if bpt is not None else None,
            "tail_waste_fraction": waste / (entries * B) if entries else 0.0,
            "max_blocks_per_request": ceil_div(longest, B),
            "kernel_s": measured.get(B),
            "kernel_vs_fastest": (measured[B] / fastest if B in measured else None),
        }
        excluded = []
        if kernel:
            if B not in measured:
                excluded.append("kernel: not measured")
            elif measured[B] > (1 + bounds.kernel_slack) * fastest:
                excluded.append(f"kernel: {row['kernel_vs_fastest']:.3g} x the fastest > "
                                f"{1 + bounds.kernel_slack:.4g} x")
        if bounds.max_metadata_bytes is not None and row["metadata_bytes"] > \
                bounds.max_metadata_bytes:
            excluded.append(f"metadata: {fmt_bytes(row['metadata_bytes'])} > "
                            f"{fmt_bytes(bounds.max_metadata_bytes)}")
        if bounds.max_blocks_per_request is not None and row["max_blocks_per_request"] > \
                bounds.max_blocks_per_request:
            excluded.append(f"blocks per request: {row['max_blocks_per_request']:,} > "
                            f"{bounds.max_blocks_per_request:,}")
        row["excluded_by"] = excluded
        rows.append(row)
    ok = [r for r in rows if not r["excluded_by"]]
    result: dict[str, Any] = {
        "lengths": len(lengths), "tokens": tokens, "longest": longest,
        "bytes_per_token": bpt, "bounds": bounds.describe(bool(kernel)), "rows": rows,
        "kernel_source": None,
    }
    if not ok:
        result.update(recommended=None, decided_by="no block size is within every bound",
                      reason="no block size is within every bound: relax --kernel-slack, "
                             "--max-metadata-bytes or --max-blocks-per-request")
        return result
    best = min(ok, key=lambda r: (r["tail_waste_slots"], -r["block_size"]))
    better = [r for r in rows if r["tail_waste_slots"] < best["tail_waste_slots"]]
    waste = _waste_words(best, bpt)
    if not better:
        if len(ok) == len(rows) and not kernel:
            decided = "tail waste alone (no bound excluded any size)"
        else:
            decided = "tail waste alone (no size wastes less)"
        reason = f"block size {best['block_size']}: the least tail waste ({waste}) of all sizes"
        ties = [r["block_size"] for r in rows if r is not best
                and r["tail_waste_slots"] == best["tail_waste_slots"]]
        if ties:
            reason += (f"; of the sizes with that waste ({', '.join(map(str, ties))} too), "
                       "the largest within the bounds (fewest table entries)")
        if not kernel:
            reason += ("; no kernel timings were given, so kernel cost did not count "
                       "(give --kernel-bench)")
    else:
        rival = max(better, key=lambda r: (r["tail_waste_slots"], r["block_size"]))
        decided = "; ".join(b.split(":")[0] + " bound" for b in rival["excluded_by"])
        reason = (f"block size {best['block_size']}: the least tail waste ({waste}) among "
                  f"the sizes within the bounds; block size {rival['block_size']} would waste "
                  f"less ({_waste_words(rival, bpt)}) but is out: "
                  + "; ".join(rival["excluded_by"]))
    result.update(recommended=best["block_size"], decided_by=decided, reason=reason)
    return result


def _waste_words(row: dict[str, Any], bpt: float | None) -> str:
    s = f"{row['tail_waste_slots']:,} slots"
    if bpt is not None:
        s += f" = {fmt_bytes(row['tail_waste_bytes'])}"
    return s


def render_advice(a: dict[str, Any]) -> list[str]:
    has_kernel = any(r["kernel_s"] is not None for r in a["rows"])
    lines = [f"block-size advisor: {a['lengths']:,} measured lengths, {a['tokens']:,} tokens, "
             f"longest {a['longest']:,}"]
    if a.get("kernel_source"):
        lines.append(f"  kernel times: {a['kernel_source']}")
    head = ["B", "table entries", "metadata", "tail waste (slots)", "tail waste",
            "waste / KV", "blocks/req (max)"]
    if has_kernel:
        head += ["kernel", "vs fastest"]
    head.append("within bounds")
    table = [head]
    for r in a["rows"]:
        cells = [str(r["block_size"]), f"{r['table_entries']:,}",
                 fmt_bytes(r["metadata_bytes"]), f"{r['tail_waste_slots']:,}",
                 fmt_bytes(r["tail_waste_bytes"]) if r["tail_waste_bytes"] is not None else "-",
                 f"{100 * r['tail_waste_fraction']:.2f}%",
                 f"{r['max_blocks_per_request']:,}"]
        if has_kernel:
            cells += [f"{r['kernel_s'] * 1e6:.4g} us" if r["kernel_s"] is not None else "-",
                      f"{r['kernel_vs_fastest']:.3g}x" if r["kernel_vs_fastest"] else "-"]
        cells.append("yes" if not r["excluded_by"] else "no: " + "; ".join(r["excluded_by"]))
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for n, row in enumerate(table):
        cells = [c.rjust(w) if i < len(row) - 1 else c
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  " + "  ".join(cells).rstrip())
        if n == 0:
            lines.append("  " + "-" * (sum(widths) + 2 * (len(widths) - 1)))
    lines.append("  bounds: " + "; ".join(a["bounds"]))
    if a["recommended"] is not None:
        lines.append(f"  recommended block size: {a['recommended']}  (decided by: "
                     f"{a['decided_by']})")
    lines.append(f"  reason: {a['reason']}")
    return lines
