"""Prefix-cache block hashes: sha256 over a canonical, length-prefixed, domain-separated encoding.

A block's hash covers (parent hash, the block's token ids, each extra key tagged by its kind,
and the cache salt on the first block only). Every field is framed as
``tag byte | 8-byte length | payload`` so that different (kind, value) sequences never encode to
the same bytes, whatever strings they carry (see ``encode_fields``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from typing import Any

from .errors import InvalidArgument

_DOMAIN = b"pagedkv.block.v1"
# Field kinds. Each is a distinct tag byte; the framing makes the encoding injective.
KIND_PARENT = 1
KIND_TOKENS = 2
KIND_SALT = 3
KIND_STR = 4
KIND_INT = 5
KIND_BYTES = 6
_EXTRA_KINDS = {str: KIND_STR, int: KIND_INT, bytes: KIND_BYTES}


def frame(kind: int, payload: bytes) -> bytes:
    """One field: kind tag, payload length (8 bytes, big-endian), payload.

    pre: 0 <= kind < 256
    post: __return__[0] == kind
    post: int.from_bytes(__return__[1:9], "big") == len(payload)
    post: __return__[9:] == payload
    """
    assert 0 <= kind < 256
    return bytes([kind]) + len(payload).to_bytes(8, "big") + payload


def encode_fields(fields: Sequence[tuple[int, bytes]]) -> bytes:
    """Concatenate framed fields. Injective: distinct field sequences give distinct bytes.

    pre: all(0 <= kind < 256 for kind, _ in fields)
    post: decode_fields(__return__) == list(fields)
    """
    return b"".join(frame(kind, payload) for kind, payload in fields)


def decode_fields(data: bytes) -> list[tuple[int, bytes]]:
    """The inverse of ``encode_fields`` (used to state and test its injectivity)."""
    out: list[tuple[int, bytes]] = []
    i = 0
    while i < len(data):
        if i + 9 > len(data):
            raise ValueError("truncated field header")
        n = int.from_bytes(data[i + 1 : i + 9], "big")
        if i + 9 + n > len(data):
            raise ValueError("truncated field payload")
        out.append((data[i], data[i + 9 : i + 9 + n]))
        i += 9 + n
    return out


def encode_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as fixed-width signed 8-byte big-endian integers.

    post: len(__return__) == 8 * len(token_ids)
    """
    try:
        return struct.pack(f">{len(token_ids)}q", *token_ids)
    except struct.error as exc:
        raise InvalidArgument(f"token id not a 64-bit integer: {exc}") from None


def encode_extra_key(key: Any) -> tuple[int, bytes]:
    """An extra key (adapter id, multimodal hash, ...) tagged by its kind."""
    if isinstance(key, bool):
        raise InvalidArgument("extra keys must be str, int or bytes, not bool")
    kind = _EXTRA_KINDS.get(type(key))
    if kind is None:
        raise InvalidArgument(f"extra keys must be str, int or bytes, not {type(key).__name__}")
    if kind == KIND_STR:
        return kind, key.encode("utf-8")
    if kind == KIND_INT:
        return kind, key.to_bytes((key.bit_length() + 8) // 8 + 1, "big", signed=True)
    return kind, bytes(key)


def block_hash(
    parent: int,
    token_ids: Sequence[int],
    extra_keys: Iterable[Any] = (),
    salt: str | bytes | None = None,
) -> int:
    """The non-zero integer hash of one full block, chained on its parent's hash (0 for none)."""
    fields: list[tuple[int, bytes]] = [
        (KIND_PARENT, parent.to_bytes(32, "big")),
        (KIND_TOKENS, encode_tokens(token_ids)),
    ]
    if salt is not None:
        fields.append((KIND_SALT, salt.encode("utf-8") if isinstance(salt, str) else bytes(salt)))
    fields += [encode_extra_key(k) for k in extra_keys]
    digest = hashlib.sha256(_DOMAIN + encode_fields(fields)).digest()
    return int.from_bytes(digest, "big") or 1  # 0 is the spec's NO_HASH


def chain_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    start: int = 0,
    parent: int = 0,
    extra_keys: Sequence[Any] = (),
    salt: str | bytes | None = None,
) -> list[int]:
    """Hashes of the full blocks from block index ``start`` on; ``parent`` is block start-1's."""
    out: list[int] = []
    for i in range(start, len(token_ids) // block_size):
        parent = block_hash(
            parent,
            token_ids[i * block_size : (i + 1) * block_size],
            extra_keys,
            salt if i == 0 else None,
        )
        out.append(parent)
    return out
