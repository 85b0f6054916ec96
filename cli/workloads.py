"""Workloads for ``pagedkv simulate``: built-in presets and JSONL traces.

A workload is a list of ``WorkloadRequest``: a prompt (token ids), the output tokens the model
will "sample" (fixed in advance, so a run is a pure function of the workload and the
scheduler's settings), a cache salt (the tenant) and an arrival. Times are scheduler steps.
A request with a ``parent`` is the next turn of a conversation: its prompt is the parent's
prompt + the parent's output + new text, and it arrives ``think`` steps after the parent
finished.

Presets (``preset_workload``), all seeded, lengths lognormal (median, sigma), clipped:

- ``chat``: per-tenant system prompts (median 400 tokens) on 90% of conversations, user turns
  (median 120), outputs (median 200); a conversation continues with probability 0.4 (next
  turn: median 60 new tokens, think time median 20 steps), up to 6 turns.
- ``rag``: a per-tenant system prompt (median 150), 1-3 retrieved documents (median 500 tokens)
  drawn Zipf-popular from a per-tenant corpus of 24, a question (median 40), short outputs
  (median 100); follow-up probability 0.15.
- ``agents``: one of two per-tenant tool prompts (median 1500), a task (median 200), then 2-8
  turns of tool call (output, median 60) + tool result (median 250), think time 0-3 steps.
- ``mixed``: each conversation is chat (50%), rag (25%) or agents (25%).

Four tenants, each with its own salt (``tenant-0`` .. ``tenant-3``): shared prefixes hit only
within a tenant. Conversations start as a Poisson stream (``rate`` per step; a first burst
of 16 at step 0). ``length_scale`` multiplies every length (for small test runs);
``max_len`` caps prompt + output of every request (a conversation stops before a turn that
would pass it).

Trace (``read_trace``): one JSON object per line, ``{"arrival": <steps >= 0>, "prompt_tokens":
[ids] | "prompt_len": <int >= 1>, "output_len": <int >= 1>, "salt": <str | null>, "id": <str |
int>}`` (``salt`` and ``id`` optional; ``prompt_len`` draws seeded random token ids). A bad
record is a ``BadTrace`` naming the line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CliError

PRESETS = ("chat", "rag", "agents", "mixed")
DEFAULT_RATE = {"chat": 0.5, "rag": 0.5, "agents": 0.25, "mixed": 0.4}
NUM_TENANTS = 4
VOCAB = 32000
FIRST_BURST = 16
TRACE_KEYS = ("arrival", "prompt_tokens", "prompt_len", "output_len", "salt", "id")


class BadTrace(CliError):
    """A ``--trace`` file that is missing, empty, or holds a record that is not valid."""


@dataclass
class WorkloadRequest:
    """One request of a workload (see the module docstring)."""

    rid: str
    prompt: np.ndarray  # int64 token ids
    output: np.ndarray  # int64 token ids the model samples, in order (output_len of them)
    salt: str | None
    arrival: int = 0  # root requests: the step it arrives
    parent: str | None = None  # follow-up turns: the request whose output it continues
    think: int = 0  # follow-up turns: steps after the parent finished
    kind: str = "trace"

    @property
    def prompt_len(self) -> int:
        return int(len(self.prompt))

    @property
    def output_len(self) -> int:
        return int(len(self.output))

    @property
    def max_positions(self) -> int:
        """KV positions the request ever holds: prompt + output - 1 (the last sampled token
        is never fed back)."""
        return self.prompt_len + self.output_len - 1


@dataclass
class Workload:
    source: str
    requests: list[WorkloadRequest]
    notes: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        p = np.array([r.prompt_len for r in self.requests], dtype=np.int64)
        o = np.array([r.output_len for r in self.requests], dtype=np.int64)
        t = p + o

        def dist(a: np.ndarray) -> dict[str, float]:
            if not len(a):
                return {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0}
            return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
                    "p99": float(np.percentile(a, 99)), "max": int(a.max())}

        return {
            "source": self.source,
            "requests": len(self.requests),
            "follow_ups": sum(r.parent is not None for r in self.requests),
            "tenants": len({r.salt for r in self.requests}),
            "prompt_tokens": dist(p),
            "output_tokens": dist(o),
            "total_tokens": int(t.sum()),
            "max_len": int(t.max()) if len(t) else 0,
            **self.notes,
        }


# ---- presets -------------------------------------------------------------------------------
class _Gen:
    """Seeded sampling helpers and the per-tenant shared texts of the presets."""

    def __init__(self, seed: int, length_scale: float, max_len: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.scale = length_scale
        self.max_len = max_len
        self.salts = [f"tenant-{k}" for k in range(NUM_TENANTS)]
        self.chat_systems = [[self.tokens(self.length(400, 0.5, 64, 1500)) for _ in range(2)]
                             for _ in range(NUM_TENANTS)]
        self.rag_systems = [self.tokens(self.length(150, 0.4, 32, 600))
                            for _ in range(NUM_TENANTS)]
        self.rag_docs = [[self.tokens(self.length(500, 0.5, 64, 2000)) for _ in range(24)]
                         for _ in range(NUM_TENANTS)]
        self.tools = [[self.tokens(self.length(1500, 0.3, 400, 4000)) for _ in range(2)]
                      for _ in range(NUM_TENANTS)]

    def length(self, median: float, sigma: float, low: int, high: int) -> int:
        s = self.scale
        x = self.rng.lognormal(math.log(median * s), sigma)
        return int(min(max(round(x), max(1, round(low * s))), max(1, round(high * s))))

    def tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(1, VOCAB, size=n, dtype=np.int64)

    def first(self, head: np.ndarray, text_len: int, out_len: int) -> tuple[np.ndarray, int]:
        """A first-turn prompt (head + new text) and output length within ``max_len``."""
        out_len = max(1, min(out_len, self.max_len // 4))
        room = self.max_len - out_len
        head = head[: max(0, room - 1)]
        text = self.tokens(max(1, min(text_len, room - len(head))))
        return np.concatenate([head, text]), out_len


@dataclass
class _Session:
    """A conversation: its first prompt and output length, then each follow-up turn as (new
    tokens, output length, think steps after the previous turn finished)."""

    prompt: np.ndarray
    output_len: int
    follow_ups: list[tuple[int, int, int]] = field(default_factory=list)


def _chat(g: _Gen, tenant: int) -> _Session:
    head = np.zeros(0, dtype=np.int64)
    if g.rng.random() < 0.9:
        systems = g.chat_systems[tenant]
        head = systems[int(g.rng.integers(len(systems)))]
    s = _Session(*g.first(head, g.length(120, 0.9, 4, 4000), g.length(200, 0.8, 4, 1024)))
    while len(s.follow_ups) < 5 and g.rng.random() < 0.4:
        s.follow_ups.append((g.length(60, 0.9, 2, 2000), g.length(200, 0.8, 4, 1024),
                             g.length(20, 0.8, 1, 200)))
    return s


def _rag(g: _Gen, tenant: int) -> _Session:
    docs = g.rag_docs[tenant]
    k = int(g.rng.integers(1, 4))
    picked = [min(int(g.rng.zipf(1.5)) - 1, len(docs) - 1) for _ in range(k)]
    head = np.concatenate([g.rag_systems[tenant], *[docs[i] for i in picked]])
    s = _Session(*g.first(head, g.length(40, 0.6, 4, 400), g.length(100, 0.7, 4, 512)))
    if g.rng.random() < 0.15:
        s.follow_ups.append((g.length(40, 0.6, 4, 400), g.length(100, 0.7, 4, 512),
                             g.length(20, 0.8, 1, 200)))
    return s


def _agents(g: _Gen, tenant: int) -> _Session:
    tools = g.tools[tenant]
    head = tools[int(g.rng.integers(len(tools)))]
    s = _Session(*g.first(head, g.length(200, 0.6, 8, 1000), g.length(60, 0.6, 4, 400)))
    for _ in range(int(g.rng.integers(1, 8))):
        s.follow_ups.append((g.length(250, 0.8, 8, 2000), g.length(60, 0.6, 4, 400),
                             int(g.rng.integers(0, 4))))
    return s


_SESSIONS: dict[str, Callable[[_Gen, int], _Session]] = {
    "chat": _chat, "rag": _rag, "agents": _agents,
}


def preset_workload(preset: str, num_requests: int, *, seed: int = 0, rate: float | None = None,
                    length_scale: float = 1.0, max_len: int = 8192) -> Workload:
    """``num_requests`` requests (every turn counts) of the named preset (module docstring)."""
    if preset not in PRESETS:
        raise CliError(f"unknown preset {preset!r} (one of {', '.join(PRESETS)})")
    if num_requests < 1:
        raise CliError(f"--requests must be >= 1, got {num_requests}")
    rate = DEFAULT_RATE[preset] if rate is None else rate
    if not (math.isfinite(rate) and rate > 0):
        raise CliError(f"--rate must be a finite number > 0, got {rate}")
    if not (math.isfinite(length_scale) and length_scale > 0):
        raise CliError(f"--length-scale must be a finite number > 0, got {length_scale}")
    if max_len < 2:
        raise CliError(f"--max-model-len must be >= 2 tokens, got {max_len}")
    g = _Gen(seed, length_scale, max_len)
    out: list[WorkloadRequest] = []
    t = 0.0
    session = 0
    while len(out) < num_requests:
        kind = preset
        if preset == "mixed":
            kind = str(g.rng.choice(["chat", "rag", "agents"], p=[0.5, 0.25, 0.25]))
        tenant = int(g.rng.integers(NUM_TENANTS))
        conv = _SESSIONS[kind](g, tenant)
        if session >= FIRST_BURST:
            t += g.rng.exponential(1.0 / rate)
        req = WorkloadRequest(rid=f"{kind}{session:04d}.0", prompt=conv.prompt,
                              output=g.tokens(conv.output_len), salt=g.salts[tenant],
                              arrival=int(t), kind=kind)
        out.append(req)
        for k, (new_len, out_len, think) in enumerate(conv.follow_ups, 1):
            if len(out) >= num_requests:
                break
            prompt = np.concatenate([req.prompt, req.output, g.tokens(new_len)])
            if len(prompt) + out_len > max_len:
                break  # the conversation would pass the model's context: it ends
            req = WorkloadRequest(rid=f"{kind}{session:04d}.{k}", prompt=prompt,
                                  output=g.tokens(out_len), salt=g.salts[tenant],
                                  parent=req.rid, think=think, kind=kind)
            out.append(req)
        session += 1
    return Workload(f"preset:{preset}", out, {"rate": rate, "length_scale": length_scale,
                                               "sessions": session})


# ---- traces --------------------------------------------------------------------------------
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _record(obj: Any, where: str, seed: int, line: int,
            seen: set[str]) -> WorkloadRequest:
    if not isinstance(obj, dict):
        raise BadTrace(f"{where}: a record must be a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(TRACE_KEYS))
    if unknown:
        raise BadTrace(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} (a record has "
                       f"{', '.join(TRACE_KEYS)})")
    if "arrival" not in obj:
        raise BadTrace(f"{where}: 'arrival' is missing (the step it arrives, a number >= 0)")
    arrival = obj["arrival"]
    if isinstance(arrival, bool) or not isinstance(arrival, int | float) or not (
            math.isfinite(arrival) and arrival >= 0):
        raise BadTrace(f"{where}: 'arrival' must be a finite number >= 0 (steps), got "
                       f"{arrival!r}")
    has_tokens, has_len = "prompt_tokens" in obj, "prompt_len" in obj
    if has_tokens == has_len:
        raise BadTrace(f"{where}: give exactly one of 'prompt_tokens' (token ids) and "
                       "'prompt_len' (a length)")
    if has_tokens:
        toks = obj["prompt_tokens"]
        if not isinstance(toks, list) or not toks:
            raise BadTrace(f"{where}: 'prompt_tokens' must be a non-empty list of token ids")
        for i, tok in enumerate(toks):
            if not _is_int(tok) or not 0 <= tok < 2**63:
                raise BadTrace(f"{where}: 'prompt_tokens'[{i}] is {tok!r}: token ids are ints "
                               "in [0, 2**63)")
        prompt = np.asarray(toks, dtype=np.int64)
    else:
        n = obj["prompt_len"]
        if not _is_int(n) or n < 1:
            raise BadTrace(f"{where}: 'prompt_len' must be an int >= 1, got {n!r}")
        if n > 10_000_000:
            raise BadTrace(f"{where}: 'prompt_len' {n} is past 10,000,000 tokens")
        prompt = np.random.default_rng([seed, line, 0]).integers(1, VOCAB, n, dtype=np.int64)
    if "output_len" not in obj:
        raise BadTrace(f"{where}: 'output_len' is missing (tokens to generate, an int >= 1)")
    out_len = obj["output_len"]
    if not _is_int(out_len) or out_len < 1 or out_len > 10_000_000:
        raise BadTrace(f"{where}: 'output_len' must be an int in [1, 10,000,000], got "
                       f"{out_len!r}")
    salt = obj.get("salt")
    if salt is not None and not isinstance(salt, str):
        raise BadTrace(f"{where}: 'salt' must be a string or null, got {salt!r}")
    rid = obj.get("id", f"line{line}")
    if not (isinstance(rid, str) or _is_int(rid)):
        raise BadTrace(f"{where}: 'id' must be a string or an int, got {rid!r}")
    rid = str(rid)
    if rid in seen:
        raise BadTrace(f"{where}: id {rid!r} is used by an earlier record")
    seen.add(rid)
    output = np.random.default_rng([seed, line, 1]).integers(1, VOCAB, out_len, dtype=np.int64)
    return WorkloadRequest(rid=rid, prompt=prompt, output=output, salt=salt,
                           arrival=int(math.floor(arrival)), kind="trace")


def read_trace(path: Path, *, seed: int = 0, limit: int | None = None) -> Workload:
    """The records of a JSONL trace (module docstring), in file order; ``limit``: the first N."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise BadTrace(f"--trace {path}: cannot read it ({why})") from exc
    out: list[WorkloadRequest] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        where = f"--trace {path}, line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadTrace(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        out.append(_record(obj, where, seed, n, seen))
    if not out:
        raise BadTrace(f"--trace {path}: no records in it (one JSON object per line)")
    return Workload(f"trace:{path}", out)


__all__ = [
    "DEFAULT_RATE", "PRESETS", "BadTrace", "Workload", "WorkloadRequest", "preset_workload",
    "read_trace",
]
