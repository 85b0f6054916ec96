"""EngineRequest: the request record the engine front door works on (vLLM's ``Request``, reduced
to what the KV cache reads). Plain data; no vLLM import."""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from pagedkv.allocator.hashing import all_ints


class RequestStatus(enum.IntEnum):
    """A request's scheduling status, with vLLM 0.33.0's names. The scheduler sets it; the
    manager only reads it (the watermark applies to WAITING / PREEMPTED requests)."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


def _as_token(t: Any) -> int:
    if isinstance(t, bool) or not hasattr(t, "__index__"):
        raise TypeError(f"token ids must be ints, got {type(t).__name__}")
    return int(t.__index__())


def _as_tokens(ts: Iterable[Any]) -> list[int]:
    """Token ids as a new list of plain ints (``_as_token`` of each; a list of plain ints is
    copied as is)."""
    if isinstance(ts, list | tuple) and all_ints(ts):
        return list(ts)
    return [_as_token(t) for t in ts]


class EngineRequest:
    """One request: its prompt, the tokens sampled so far, its cache salt and extra hash keys.

    - ``request_id``: any hashable id (vLLM uses str).
    - ``prompt_token_ids``: the prompt; ``output_token_ids``: the sampled tokens, in order
      (both copies of the one list the request keeps)
      (append them with ``append_output_token_ids`` or ``KVCacheManager.append_token``);
      ``all_token_ids`` is prompt + output, ``num_tokens`` its length.
    - ``cache_salt``: mixed into the first block's hash (no hit across salts).
    - ``extra_keys``: str / int / bytes keys mixed into every block's hash (multimodal hashes,
      adapter ids, ...); ``lora_name`` too (as vLLM does with the LoRA name), ``lora_id`` is
      reported in KV events only.
    - ``num_computed_tokens``: the scheduler's count of computed tokens (the scheduler
      updates it, as in vLLM); ``status``; ``num_preemptions``.
    - ``block_hashes``: the chain hash of each full block of ``all_token_ids``, filled in by
      the ``KVCacheManager`` that uses the request (for its block size).
    """

    __slots__ = (
        "request_id", "_num_prompt", "_all", "cache_salt", "extra_keys", "lora_name",
        "lora_id", "num_computed_tokens", "status", "num_preemptions", "block_hashes",
        "_hash_key",
    )

    def __init__(
        self,
        request_id: Hashable,
        prompt_token_ids: Sequence[int],
        *,
        cache_salt: str | bytes | None = None,
        extra_keys: Iterable[str | int | bytes] = (),
        lora_name: str | None = None,
        lora_id: int | None = None,
        output_token_ids: Sequence[int] = (),
    ) -> None:
        hash(request_id)  # TypeError for an unhashable id
        if isinstance(prompt_token_ids, str | bytes):
            raise TypeError("prompt_token_ids must be a sequence of ints, not a string")
        if cache_salt is not None and not isinstance(cache_salt, str | bytes):
            raise TypeError("cache_salt must be str, bytes or None")
        if isinstance(extra_keys, str | bytes):
            raise TypeError("extra_keys must be a sequence of keys, not a bare string")
        if lora_name is not None and not isinstance(lora_name, str):
            raise TypeError("lora_name must be a str or None")
        self.request_id = request_id
        # One list holds prompt and output: the prompt is its first _num_prompt tokens.
        self._all: list[int] = _as_tokens(prompt_token_ids)
        self._num_prompt = len(self._all)
        self._all += _as_tokens(output_token_ids)
        self.cache_salt = cache_salt
        self.extra_keys: tuple[str | int | bytes, ...] = tuple(extra_keys)
        self.lora_name = lora_name
        self.lora_id = lora_id
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.num_preemptions = 0
        self.block_hashes: list[int] = []
        self._hash_key: tuple[Any, ...] | None = None  # (block size, keys) block_hashes are for

    # ---- tokens --------------------------------------------------------------------------
    @property
    def all_token_ids(self) -> list[int]:
        """Prompt + output tokens (a copy)."""
        return list(self._all)

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt's tokens (a copy: the request keeps its tokens in one list)."""
        return self._all[:self._num_prompt]

    @property
    def output_token_ids(self) -> list[int]:
        """The sampled tokens (a copy)."""
        return self._all[self._num_prompt:]

    @property
    def num_tokens(self) -> int:
        return len(self._all)

    @property
    def num_prompt_tokens(self) -> int:
        return self._num_prompt

    @property
    def num_output_tokens(self) -> int:
        return len(self._all) - self._num_prompt

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Record sampled token(s); the manager hashes the blocks they fill on its next call."""
        if isinstance(token_ids, int) and not isinstance(token_ids, bool):
            self._all.append(token_ids)
        else:
            self._all.extend(_as_token(t) for t in token_ids)  # type: ignore[union-attr]

    @property
    def hash_keys(self) -> tuple[str | int | bytes, ...]:
        """The extra keys every block hash covers: the LoRA name (``""`` for none) first, then
        ``extra_keys`` (fixed positions, so no two (lora, keys) pairs encode alike)."""
        return (self.lora_name or "", *self.extra_keys)

    def __repr__(self) -> str:
        return (f"EngineRequest({self.request_id!r}, {self.num_tokens} tokens, "
                f"computed={self.num_computed_tokens}, {self.status.name})")


__all__ = ["EngineRequest", "RequestStatus"]
