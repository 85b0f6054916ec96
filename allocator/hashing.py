"""Prefix-cache block hashes: sha256 over a canonical, length-prefixed, domain-separated encoding.

A block's hash covers (parent hash, the block's token ids, each extra key tagged by its kind,
and the cache salt on the first block only). Every field is framed as
``tag byte | 8-byte length | payload`` so that different (kind, value) sequences never encode to
the same bytes, whatever strings they carry (see ``encode_fields``).
"""

from __future__ import annotations

import functools
import hashlib
import operator
import struct
from collections.abc import Iterable, Mapping, Sequence
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
_PLAIN_KEY_TYPES = frozenset(_EXTRA_KINDS)
_PARENT_LIMIT = 1 << 256  # a parent hash is a sha256 digest (0: no parent)
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
# Containers that are refused where a sequence of token ids or of extra keys is expected: a
# bare string would be silently split into characters (bytes into small ints), and a set's
# iteration order is not stable across processes (str hashing is randomized).
_NOT_A_SEQUENCE = (str, bytes, bytearray, memoryview)
_UNORDERED = (set, frozenset, Mapping)


def _header(kind: int, length: int) -> bytes:
    """A field's first 9 bytes: its kind tag, then its payload's length (8 bytes, big-endian)."""
    return bytes((kind,)) + length.to_bytes(8, "big")


def frame(kind: int, payload: bytes) -> bytes:
    """One field: kind tag, payload length (8 bytes, big-endian), payload.

    pre: 0 <= kind < 256
    post: __return__[0] == kind
    post: int.from_bytes(__return__[1:9], "big") == len(payload)
    post: __return__[9:] == payload
    """
    assert 0 <= kind < 256
    return _header(kind, len(payload)) + payload


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


def _is_bool(x: Any) -> bool:
    """A Python or numpy boolean (never accepted as an integer here)."""
    t = type(x)
    return isinstance(x, bool) or (t.__module__ == "numpy" and t.__name__ in ("bool_", "bool"))


def _as_int(name: str, x: Any) -> int:
    """``x`` as a plain int: any integral non-bool value (Python or numpy integer)."""
    if type(x) is int:
        return x
    if _is_bool(x):
        raise InvalidArgument(f"{name} must be an int, not bool")
    try:
        return operator.index(x)
    except TypeError:
        raise InvalidArgument(f"{name} must be an int, got {type(x).__name__}") from None


def check_parent(parent: Any) -> int:
    """A parent hash: an int in [0, 2**256), else ``InvalidArgument``."""
    p = _as_int("parent hash", parent)
    if not 0 <= p < _PARENT_LIMIT:
        raise InvalidArgument(f"parent hash must lie in [0, 2**256), got {p}")
    return p


def _token_list(token_ids: Any) -> list[int]:
    """The token ids as a list of plain ints in int64 range (the validating slow path)."""
    if isinstance(token_ids, _NOT_A_SEQUENCE):
        raise InvalidArgument(
            f"token ids must be a sequence of ints, not a bare {type(token_ids).__name__}"
        )
    if isinstance(token_ids, _UNORDERED) or not hasattr(token_ids, "__len__"):
        raise InvalidArgument(
            f"token ids must be a sequence of ints, got {type(token_ids).__name__}"
        )
    try:
        items = list(token_ids)
    except TypeError:  # e.g. a 0-d numpy array
        raise InvalidArgument(
            f"token ids must be a sequence of ints, got {type(token_ids).__name__}"
        ) from None
    out = items if all_ints(items) else [_as_int("token id", t) for t in items]
    if out and (min(out) < _I64_MIN or max(out) > _I64_MAX):
        bad = next(t for t in out if not _I64_MIN <= t <= _I64_MAX)
        raise InvalidArgument(f"token id not a 64-bit integer: {bad}")
    return out


def encode_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as fixed-width signed 8-byte big-endian integers.

    ``token_ids``: a sequence of non-bool integers (numpy integers too) in int64 range, else
    ``InvalidArgument``.

    post: len(__return__) == 8 * len(token_ids)
    """
    if type(token_ids) is list or type(token_ids) is tuple:  # the hot path
        try:  # struct takes any integer (operator.index) and refuses floats, str, None, ...
            data = pack_tokens(token_ids)
        except (struct.error, OverflowError) as exc:  # numpy uint64 overflows
            raise InvalidArgument(f"token id not a 64-bit integer: {exc}") from None
        if bool not in map(type, token_ids):  # ... but not bool
            return data
    return pack_tokens(_token_list(token_ids))


def digest_bytes(digests: Iterable[int]) -> bytes:
    """Digests (ints in ``[0, 2**256)``) as their 32 big-endian bytes each, in one string."""
    return b"".join([h.to_bytes(32, "big") for h in digests])


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """``encode_tokens`` of tokens already checked (plain ints in int64 range, no bool)."""
    return struct.pack(f">{len(tokens)}q", *tokens)


def all_ints(values: Sequence[Any]) -> bool:
    """Whether every item is exactly an int (no bool, no numpy integer): a
    type per item compared by identity, at C speed, without hashing any of them."""
    return list(map(type, values)).count(int) == len(values)


def all_ints_in_int64(values: Sequence[Any]) -> bool:
    """``all_ints``, each in int64 range (the range checked by packing them natively)."""
    return packed_int64(values) is not None


def packed_int64(values: Sequence[Any]) -> bytes | None:
    """``pack_native(values)`` if every item is exactly an int in int64 range
    (``all_ints``), else None."""
    if not all_ints(values):
        return None
    try:
        return pack_native(values)
    except (struct.error, OverflowError):
        return None


def pack_native(tokens: Sequence[int]) -> bytes:
    """Integer tokens as 8-byte little-endian signed integers (``struct.error`` or
    ``OverflowError`` outside int64): ``pack_tokens`` with each token's bytes reversed, in a
    third of its time (struct's native-width path)."""
    return struct.pack(f"<{len(tokens)}q", *tokens)


def _canonical_key(key: Any) -> str | int | bytes:
    """An extra key as a plain str, int or bytes; anything else is refused."""
    t = type(key)
    if t in _PLAIN_KEY_TYPES:
        return key
    if _is_bool(key):
        raise InvalidArgument("extra keys must be str, int or bytes, not bool")
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, bytes):
        return bytes(key)
    try:
        return operator.index(key)  # numpy and other integers
    except TypeError:
        raise InvalidArgument(f"extra keys must be str, int or bytes, not {t.__name__}") from None


def normalize_extra_keys(extra_keys: Iterable[Any]) -> tuple[str | int | bytes, ...]:
    """Validate a sequence of extra keys; return it as a tuple of plain str / int / bytes.

    A bare str, bytes, bytearray or memoryview (which would be split into characters or small
    ints), an unordered set, a non-iterable (e.g. None) and any key that is not a str (valid
    unicode), a non-bool integer (numpy integers become ints) or bytes raise
    ``InvalidArgument``. The result is accepted by ``block_hash`` and ``chain_hashes`` as is.
    """
    keys = _keys(extra_keys)
    for k in keys:
        if type(k) is str and not k.isascii():
            _encode_key(k)  # raises on a string utf-8 cannot encode (lone surrogates)
    return keys


def _keys(extra_keys: Iterable[Any]) -> tuple[str | int | bytes, ...]:
    """``normalize_extra_keys`` without the unicode check (``_encode_key`` makes it later)."""
    if type(extra_keys) is tuple and (
        not extra_keys or set(map(type, extra_keys)) <= _PLAIN_KEY_TYPES
    ):  # the hot path
        return extra_keys
    if isinstance(extra_keys, _NOT_A_SEQUENCE):
        raise InvalidArgument(
            f"extra_keys must be a sequence of keys, not a bare {type(extra_keys).__name__} "
            f"(wrap a single key in a tuple: ({extra_keys!r},))"
        )
    if isinstance(extra_keys, _UNORDERED):
        raise InvalidArgument(
            f"extra_keys must be an ordered sequence, not a {type(extra_keys).__name__}"
        )
    if type(extra_keys) is tuple:
        keys = extra_keys
    else:
        try:
            keys = tuple(extra_keys)
        except TypeError:
            raise InvalidArgument(
                f"extra_keys must be a sequence of keys, got {type(extra_keys).__name__}"
            ) from None
    if not keys or set(map(type, keys)) <= _PLAIN_KEY_TYPES:
        return keys
    return tuple(_canonical_key(k) for k in keys)


def _encode_key(key: Any) -> tuple[int, bytes]:
    """The (kind, payload) of a canonical key (a plain str, int or bytes)."""
    kind = _EXTRA_KINDS[type(key)]
    if kind == KIND_STR:
        try:
            return kind, key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"extra key {key!r} is not valid unicode") from None
    if kind == KIND_INT:
        return kind, key.to_bytes((key.bit_length() + 8) // 8 + 1, "big", signed=True)
    return kind, bytes(key)


def encode_extra_key(key: Any) -> tuple[int, bytes]:
    """An extra key (adapter id, multimodal hash, ...) tagged by its kind."""
    return _encode_key(_canonical_key(key))


def salt_bytes(salt: Any) -> bytes:
    """A (non-None) cache salt as bytes: a str (utf-8) or bytes, else ``InvalidArgument``."""
    if isinstance(salt, str):
        try:
            return salt.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"salt {salt!r} is not valid unicode") from None
    if isinstance(salt, bytes):
        return bytes(salt)
    raise InvalidArgument(f"salt must be str, bytes or None, got {type(salt).__name__}")


def digest(
    parent: int, tokens: bytes, keys: tuple[str | int | bytes, ...], salt: bytes | None
) -> int:
    """The hash of checked fields: parent in [0, 2**256), encoded tokens, canonical keys, salt
    bytes or None. It hashes ``_DOMAIN + encode_fields(fields)`` of the fields (parent,
    tokens, salt if any, then each key), the parent's and the tokens' headers looked up."""
    return chain_digests(parent, tokens, len(tokens), 1, keys, salt)[0]


def block_tails(keys: tuple[str | int | bytes, ...], salt: bytes | None) -> tuple[bytes, bytes]:
    """The fields a chain's blocks end with, after their tokens: (a later block's: the keys;
    the first block's: the salt if any, then the keys)."""
    tail = b"".join(frame(*_encode_key(k)) for k in keys) if keys else b""
    return tail, tail if salt is None else frame(KIND_SALT, salt) + tail


def chain_digests(
    parent: int, data: bytes, width: int, count: int, keys: tuple[str | int | bytes, ...],
    salt: bytes | None,
) -> list[int]:
    """``digest`` chained over ``count`` blocks of checked fields: block ``i``'s tokens are
    ``data[i * width:(i + 1) * width]``, its parent block ``i - 1``'s digest (``parent`` for
    the first), the salt in the first block only, the keys in every one. The parent is carried
    as the digest's bytes, so a block costs one sha256 and little else."""
    head = _known_header(KIND_TOKENS, width)
    tail, first_tail = block_tails(keys, salt)
    parent_bytes = parent.to_bytes(32, "big")
    out: list[int] = []
    for i in range(count):
        h = _PREFIX_STATE.copy()  # _DOMAIN and the parent's header, hashed once
        h.update(parent_bytes + head + data[i * width:(i + 1) * width]
                 + (tail if i else first_tail))
        parent_bytes = h.digest()
        value = int.from_bytes(parent_bytes, "big")
        if not value:  # 0 is NO_HASH: the digest stands for 1 then, as parent too
            value, parent_bytes = 1, _ONE
        out.append(value)
    return out


_ONE = (1).to_bytes(32, "big")
_PARENT_HEADER = _header(KIND_PARENT, 32)
_PREFIX_STATE = hashlib.sha256(_DOMAIN + _PARENT_HEADER)
_known_header = functools.lru_cache(maxsize=64)(_header)  # the tokens': one per block size


def block_hash(
    parent: int,
    token_ids: Sequence[int],
    extra_keys: Iterable[Any] = (),
    salt: str | bytes | None = None,
) -> int:
    """The non-zero integer hash of one full block, chained on its parent's hash (0 for none).

    ``parent``: an int in ``[0, 2**256)``; ``token_ids``: a sequence of ints in int64 range;
    ``extra_keys``: see ``normalize_extra_keys``; ``salt``: str, bytes or None. Anything else
    raises ``InvalidArgument``.
    """
    if type(parent) is not int or not 0 <= parent < _PARENT_LIMIT:
        parent = check_parent(parent)
    return digest(parent, encode_tokens(token_ids), _keys(extra_keys),
                  None if salt is None else salt_bytes(salt))


def chain_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    start: int = 0,
    parent: int = 0,
    extra_keys: Sequence[Any] = (),
    salt: str | bytes | None = None,
) -> list[int]:
    """Hashes of the full blocks from block index ``start`` on; ``parent`` is block start-1's.

    ``block_size`` must be an int >= 1 and ``start`` an int >= 0; the other arguments are
    checked as by ``block_hash`` (all of them before any hashing).
    """
    B = _as_int("block_size", block_size)
    if not 1 <= B <= _I64_MAX:
        raise InvalidArgument(f"block_size must be in [1, 2**63), got {B}")
    first = _as_int("start", start)
    if not 0 <= first <= _I64_MAX:
        raise InvalidArgument(f"start must be in [0, 2**63), got {first}")
    h = check_parent(parent)
    data = encode_tokens(token_ids)  # every token checked, and encoded once
    keys = normalize_extra_keys(extra_keys)
    salt_b = None if salt is None else salt_bytes(salt)
    w = 8 * B  # bytes per block
    if first >= len(data) // w:
        return []
    return chain_digests(h, data[first * w:], w, len(data) // w - first, keys,
                         salt_b if first == 0 else None)
