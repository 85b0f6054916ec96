"""``pagedkv diagram``: the block lifecycle, generated from ``pagedkv.spec``.

The edges are not read from the doc strings: they are found by running the spec. Breadth-first
from ``spec.initial_state``, every transition of ``spec.TRANSITIONS`` is tried with every
parameter value of a small pool (``blocks`` blocks, ``holders`` holders, ``block_size``
slots, the hashes ``hashes``, at most ``max_inflight`` launches in flight and ``max_window``
issued past the watermark), its guard evaluated and its effect applied on concrete values
(``CONCRETE`` ops, as ``spec.check.step`` does). Each firing of a transition that takes a
block ``b`` records the edge ``state[b] before -> state[b] after``; one that takes a holder and
no block (``open_holder``/``close_holder``) records ``alive[r]`` before and after; one that
takes neither (``launch``, ``complete``, ``advance``) records an edge for every block whose state
it changes - none: they move the clock, not blocks. The generation counter ``gen`` is left out
of the visited-state key (no guard reads it; it only counts history), and states are kept as
seen from their watermark (``proofs.epochs.normalize``), so the launch clock does not make the
search infinite.

Edge labels (``edge_label``): the transition's name; a qualifier where one transition leaves
a state for two different states, told apart by the block's reference count before it fired
("last reference" / "other references remain"); what it does, from the doc string less the
state changes the edge already shows; and its guard in words, the doc string's ``[...]``.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CliError, ToolMissing

STATE_LABELS = {"CACHED": "ZERO-REF CACHED"}


@dataclass(frozen=True)
class Edge:
    transition: str
    source: str
    target: str
    qualifier: str
    words: str
    guard: str


@dataclass
class Lifecycle:
    states: list[str]
    edges: list[Edge]
    holder_edges: list[Edge]
    explored_states: int
    config: dict[str, Any] = field(default_factory=dict)


_STATE = r"[A-Z][A-Z-]*(?: [A-Z][A-Z-]*)*"


def guard_words(doc: str) -> str:
    """The guard of a transition's doc string: its ``[...]`` part ("" when it has none)."""
    m = re.search(r"\[([^\]]*)\]", doc)
    return m.group(1).strip() if m else ""


def doc_words(doc: str) -> str:
    """The rest of the doc string, less the state changes the edge itself shows: a leading
    ``STATE -> STATE`` and every ``;``-separated clause with an arrow in it."""
    text = re.sub(r"\[[^\]]*\]", "", doc)
    text = re.sub(rf"^\s*{_STATE} -> {_STATE}\b", "", text)
    clauses = [c.strip() for c in text.split(";")]
    return "; ".join(c for c in clauses if c and "->" not in c)


def _key(s: Any, blocks: tuple[int, ...], holders: tuple[int, ...], hashes: tuple[int, ...],
         states: tuple[int, ...], launches: tuple[int, ...]) -> tuple[Any, ...]:
    from pagedkv.spec import BLOCK_FIELDS, ISSUED, WATERMARK

    per_block = tuple(tuple(getattr(s, f)[b] for b in blocks)
                      for f in BLOCK_FIELDS if f != "gen")
    return (per_block, tuple(s.hmap[h] for h in hashes),
            tuple(tuple(bool(s.holds[r][b]) for b in blocks) for r in holders),
            tuple(bool(s.alive[r]) for r in holders), tuple(s.nheld[r] for r in holders),
            tuple(s.count[x] for x in states), (s.clock[ISSUED], s.clock[WATERMARK]),
            tuple(bool(s.inflight[L]) for L in launches))


def derive(blocks: int = 1, holders: int = 2, block_size: int = 1,
           hashes: tuple[int, ...] = (1,), max_inflight: int = 2, max_window: int = 2,
           progress: Callable[[int], Any] | None = None,
           transitions: Mapping[str, Any] | None = None) -> Lifecycle:
    """Explore the spec on a small pool and collect the lifecycle edges it exercises.
    ``transitions``: the pool transitions to explore (default ``spec.TRANSITIONS``)."""
    from pagedkv.proofs import epochs
    from pagedkv.spec import (
        ALL_STATES,
        CONCRETE,
        NO_HASH,
        PARAM_KINDS,
        TRANSITIONS,
        initial_state,
        state_name,
    )

    block_ids, holder_ids = tuple(range(blocks)), tuple(range(holders))
    all_hashes = (NO_HASH, *hashes)
    launches = tuple(range(max_window + 1))  # states seen from the watermark: it is 0
    by_kind = {"block": block_ids, "holder": holder_ids, "hash": all_hashes,
               "slots": tuple(range(block_size + 1)), "bool": (False, True),
               "launch": launches}
    kinds = {p: PARAM_KINDS[p] for p in PARAM_KINDS}
    domains = {name: by_kind[kind] for name, kind in PARAM_KINDS.items()}
    moves = []
    for name, t in (TRANSITIONS if transitions is None else transitions).items():
        unknown = [p for p in t.params if p not in domains]
        if unknown:
            raise CliError(f"diagram: transition {name!r} has parameters {unknown} that the "
                           "diagram generator does not know how to enumerate")
        for values in itertools.product(*(domains[p] for p in t.params)):
            moves.append((name, t, dict(zip(t.params, values, strict=True))))

    init = initial_state(blocks, block_size, holder_ids)
    seen = {_key(init, block_ids, holder_ids, all_hashes, ALL_STATES, launches)}
    queue = deque([init])
    found: dict[tuple[str, str, str], set[int]] = {}  # (name, from, to) -> refs before
    holder_found: set[tuple[str, str, str]] = set()
    while queue:
        s = queue.popleft()
        for name, t, p in moves:
            if not t.guard(CONCRETE, s, **p):
                continue
            s2 = t.effect(CONCRETE, s, **p).flattened()
            if (len(epochs.in_flight(s2)) > max_inflight
                    or epochs.window(s2) > max_window):
                continue  # the launch bounds
            block_ps = [v for q, v in p.items() if kinds.get(q) == "block"]
            holder_ps = [v for q, v in p.items() if kinds.get(q) == "holder"]
            if block_ps:
                moved = block_ps[:1]
            elif holder_ps:
                r = holder_ps[0]
                holder_found.add((name, _holder(s.alive[r]), _holder(s2.alive[r])))
                moved = []
            else:
                moved = [b for b in block_ids if s.state[b] != s2.state[b]]
            for b in moved:
                edge = (name, state_name(s.state[b]), state_name(s2.state[b]))
                found.setdefault(edge, set()).add(s.ref[b])
            s2 = epochs.normalize(s2)
            k = _key(s2, block_ids, holder_ids, all_hashes, ALL_STATES, launches)
            if k not in seen:
                seen.add(k)
                queue.append(s2)
                if progress is not None:
                    progress(1)

    order = list(TRANSITIONS)
    state_order = [state_name(x) for x in ALL_STATES]
    edges = []
    for (name, a, b), refs in sorted(found.items(), key=lambda e: (
            order.index(e[0][0]), state_order.index(e[0][1]), state_order.index(e[0][2]))):
        targets = {to for (n, fr, to) in found if n == name and fr == a}
        qualifier = ""
        if len(targets) > 1:
            if refs == {1}:
                qualifier = "last reference"
            elif min(refs) > 1:
                qualifier = "other references remain"
        doc = TRANSITIONS[name].doc
        edges.append(Edge(name, a, b, qualifier, doc_words(doc), guard_words(doc)))
    holder_edges = [Edge(n, a, b, "", doc_words(TRANSITIONS[n].doc),
                         guard_words(TRANSITIONS[n].doc))
                    for (n, a, b) in sorted(holder_found, key=lambda e: order.index(e[0]))]
    return Lifecycle(state_order, edges, holder_edges, len(seen),
                     {"blocks": blocks, "holders": holders, "block_size": block_size,
                      "hashes": list(hashes), "max_inflight": max_inflight,
                      "max_window": max_window})


def _holder(alive: Any) -> str:
    return "OPEN" if alive else "NO_TABLE"


def edge_label(e: Edge) -> str:
    """``name (qualifier), what it does [guard]``, safe inside a Mermaid or dot label."""
    text = e.transition + (f" ({e.qualifier})" if e.qualifier else "")
    if e.words:
        text += f", {e.words}"
    if e.guard:
        text += f" [{e.guard}]"
    # A Mermaid label ends at ':', ';', '#' or a newline: keep the words, not those.
    text = text.replace("->", "→").replace(":", ",").replace(";", ",").replace("#", "no.")
    return re.sub(r"\s+", " ", text).strip()


def to_mermaid(lc: Lifecycle) -> str:
    out = ["stateDiagram-v2",
           "    %% generated by `pagedkv diagram` from pagedkv.spec.TRANSITIONS: do not edit"]
    for st, label in STATE_LABELS.items():
        out.append(f'    state "{label}" as {st}')
    out.append("    [*] --> FREE")
    out += [f"    {e.source} --> {e.target} : {edge_label(e)}" for e in lc.edges]
    if lc.holder_edges:
        out.append('    state "holder r (a request table)" as HOLDER {')
        out.append("        [*] --> NO_TABLE")
        out += [f"        {e.source} --> {e.target} : {edge_label(e)}" for e in lc.holder_edges]
        out.append("    }")
    return "\n".join(out) + "\n"


def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(lc: Lifecycle) -> str:
    out = ["digraph pagedkv_block_lifecycle {",
           "  // generated by `pagedkv diagram --format dot` from pagedkv.spec.TRANSITIONS",
           "  rankdir=LR;",
           '  node [shape=box, style="rounded"];',
           "  start [shape=point];",
           "  start -> FREE;"]
    for st in lc.states:
        out.append(f"  {st} [label={_dot_str(STATE_LABELS.get(st, st))}];")
    for e in lc.edges:
        out.append(f"  {e.source} -> {e.target} [label={_dot_str(edge_label(e))}];")
    if lc.holder_edges:
        out.append("  subgraph cluster_holder {")
        out.append(f"    label={_dot_str('holder r (a request table)')};")
        out.append("    holder_start [shape=point];")
        out.append("    holder_start -> NO_TABLE;")
        for e in lc.holder_edges:
            out.append(f"    {e.source} -> {e.target} [label={_dot_str(edge_label(e))}];")
        out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def render_with_dot(dot_text: str, path: Path) -> Path:
    """Render to ``path`` (.svg or .png) with Graphviz; ToolMissing without ``dot``."""
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("svg", "png"):
        raise CliError(f"--render {path}: the file name must end in .svg or .png")
    exe = shutil.which("dot")
    if exe is None:
        raise ToolMissing("--render needs Graphviz's `dot` on PATH, which is not installed; "
                          "the diagram text is printed without --render")
    proc = subprocess.run([exe, f"-T{fmt}", "-o", str(path)], input=dot_text, text=True,
                          capture_output=True, check=False)
    if proc.returncode != 0:
        raise CliError(f"dot failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return path
