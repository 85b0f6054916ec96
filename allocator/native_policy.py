# ruff: noqa: F821
"""The native pool's own structures and loops, around the spec's compiled transitions.

Not imported: ``native_source.module_source`` pastes this text into the generated module,
after the constants and before the ``g_<name>`` / ``e_<name>`` functions it calls (the spec's
guards and effects, generated), and compiles every function with numba. What lives here is
what the spec abstracts away, as ``BlockPool`` keeps it: the ``holds`` set's hashing, the
eviction queue's links, the busy count of cached blocks, and the order in which a take walks
the queue. ``take_many``, ``release_many``, ``share_many``, ``end_write_many`` and
``recycle_where`` do what ``BlockPool``'s methods of the same names do, block by block.
"""

if "njit" not in globals():  # imported as a module rather than pasted: importable, inert
    def njit(**options):
        return lambda fn: fn


MIX = 0x5851F42D4C957F2D


@njit(cache=True, inline="always")
def _probe(K, key):
    return ((key * MIX) >> 17) & (K.shape[0] - 1)


@njit(cache=True, inline="always")
def has_key(K, r, b):
    key = (r << 32) | b
    mask = K.shape[0] - 1
    i = _probe(K, key)
    while True:
        k = K[i]
        if k == key:
            return True
        if k == EMPTY_KEY:
            return False
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def add_key(K, M, r, b):
    key = (r << 32) | b
    mask = K.shape[0] - 1
    i = _probe(K, key)
    while True:
        k = K[i]
        if k == key:
            return
        if k == EMPTY_KEY:
            break
        i = (i + 1) & mask
    K[i] = key
    M[KEYS_USED] += 1


@njit(cache=True, inline="always")
def discard_key(K, M, r, b):
    """The key goes and its cell is closed up, with no deleted marker left (linear probing's
    deletion): each later key of its run moves back into the gap unless its home cell lies
    cyclically after the gap, up to its own cell (it would then not be found from home)."""
    key = (r << 32) | b
    mask = K.shape[0] - 1
    i = _probe(K, key)
    while True:
        k = K[i]
        if k == key:
            break
        if k == EMPTY_KEY:
            return
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        k = K[j]
        if k == EMPTY_KEY:
            break
        if ((j - _probe(K, k)) & mask) >= ((j - i) & mask):
            K[i] = k
            i = j
    K[i] = EMPTY_KEY
    M[KEYS_USED] -= 1


@njit(cache=True)
def rehash(K, new):
    """Every key of K into the empty set ``new``."""
    mask = new.shape[0] - 1
    for k in K:
        if k >= 0:
            i = _probe(new, k)
            while new[i] != EMPTY_KEY:
                i = (i + 1) & mask
            new[i] = k


@njit(cache=True)
def holder_blocks(K, r, out):
    """The blocks holder r holds, into ``out``; returns how many (any order)."""
    n = 0
    for k in K:
        if k >= 0 and (k >> 32) == r:
            out[n] = k & 0xFFFFFFFF
            n += 1
    return n


# ---- the eviction queue: a doubly linked list through rows prev/next, sentinel column S ----
@njit(cache=True, inline="always")
def q_unlink(B, M, b):
    p = B[ROW_PREV, b]
    q = B[ROW_NEXT, b]
    B[ROW_NEXT, p] = q
    B[ROW_PREV, q] = p
    M[QLEN] -= 1


@njit(cache=True, inline="always")
def q_push_tail(B, M, b):
    s = B.shape[1] - 1
    last = B[ROW_PREV, s]
    B[ROW_NEXT, last] = b
    B[ROW_PREV, b] = last
    B[ROW_NEXT, b] = s
    B[ROW_PREV, s] = b
    M[QLEN] += 1


@njit(cache=True, inline="always")
def q_push_head(B, M, b):
    s = B.shape[1] - 1
    first = B[ROW_NEXT, s]
    B[ROW_PREV, first] = b
    B[ROW_NEXT, b] = first
    B[ROW_PREV, b] = s
    B[ROW_NEXT, s] = b
    M[QLEN] += 1


@njit(cache=True)
def q_order(B, out):
    s = B.shape[1] - 1
    n = 0
    b = B[ROW_NEXT, s]
    while b != s:
        out[n] = b
        n += 1
        b = B[ROW_NEXT, b]
    return n


@njit(cache=True, inline="always")
def _recycle_if_safe(B, M, H, K, X, b):
    """What ``BlockPool._recycle_if_safe`` does: a RECLAIMED block whose recycle guard holds
    becomes FREE, at the queue's head."""
    if B[ROW_STATE, b] == RECLAIMED and g_recycle(B, M, H, K, X, b):
        e_recycle(B, M, H, K, X, b)
        q_push_head(B, M, b)


# ---- the loops ------------------------------------------------------------------------------
TAKE_OK, TAKE_EXHAUSTED, TAKE_EVICT_REFUSED, TAKE_ALLOCATE_REFUSED, TAKE_SCRATCH_FULL = range(5)


@njit(cache=True)
def take_many(B, M, H, K, X, r, n, out, S):
    """Allocate the queue's head for holder r, n times, evicting CACHED heads on the way (LRU
    order; an idle evicted block is recycled to the head and taken next): ``BlockPool.take``
    n times. Returns (blocks taken: into ``out``, hash slots evicted: row 1 of ``S``, blocks
    touched: row 2, the refused block or -1, a ``TAKE_*`` status). Stops with
    ``TAKE_SCRATCH_FULL`` before a step that would write past ``S``'s rows (the caller grows
    them and takes the rest)."""
    evicted = S[1]
    touched = S[2]
    room = S.shape[1]
    s = B.shape[1] - 1
    taken = 0
    nev = 0
    nt = 0
    while taken < n:
        b = B[ROW_NEXT, s]
        if b == s:
            return taken, nev, nt, -1, TAKE_EXHAUSTED
        if nt == room:
            return taken, nev, nt, -1, TAKE_SCRATCH_FULL
        if B[ROW_STATE, b] == CACHED:
            if not g_evict(B, M, H, K, X, b):
                return taken, nev, nt, b, TAKE_EVICT_REFUSED
            q_unlink(B, M, b)
            if B[ROW_RETIRE, b] > M[CLOCK0 + WATERMARK]:
                M[CACHED_BUSY] -= 1
            evicted[nev] = B[ROW_HASH, b]
            nev += 1
            e_evict(B, M, H, K, X, b)
            touched[nt] = b
            nt += 1
            _recycle_if_safe(B, M, H, K, X, b)
            continue
        if not g_allocate(B, M, H, K, X, b, r):
            return taken, nev, nt, b, TAKE_ALLOCATE_REFUSED
        q_unlink(B, M, b)
        e_allocate(B, M, H, K, X, b, r)
        out[taken] = b
        taken += 1
        touched[nt] = b
        nt += 1
    return taken, nev, nt, -1, TAKE_OK


@njit(cache=True)
def release_many(B, M, H, K, X, r, blocks, n, S):
    """``BlockPool.release(b, r)`` for each of ``blocks[:n]`` in turn, stopping at the first
    whose guard fails. Returns (how many were released, how many of them were retired above
    the watermark: into row 0 of ``S``, for the pool's retire queue at the current clock)."""
    retired = S[0]
    nret = 0
    for i in range(n):
        b = blocks[i]
        if b < 0 or b >= B.shape[1] - 1 or not g_release(B, M, H, K, X, b, r):
            return i, nret
        stamp = M[CLOCK0 + ISSUED]
        busy = stamp > M[CLOCK0 + WATERMARK]
        before = B[ROW_RETIRE, b]
        e_release(B, M, H, K, X, b, r)
        if B[ROW_REF, b] == 0:
            if busy and before != stamp:
                retired[nret] = b
                nret += 1
            if B[ROW_STATE, b] == CACHED:
                q_push_tail(B, M, b)
                if busy:
                    M[CACHED_BUSY] += 1
            else:
                _recycle_if_safe(B, M, H, K, X, b)
    return n, nret


@njit(cache=True)
def share_many(B, M, H, K, X, r, blocks, n):
    """``BlockPool.share(b, r)`` for each of ``blocks[:n]``, stopping at the first refusal;
    returns how many were shared (a revived CACHED block leaves the queue)."""
    for i in range(n):
        b = blocks[i]
        if b < 0 or b >= B.shape[1] - 1 or not g_share(B, M, H, K, X, b, r):
            return i
        if B[ROW_STATE, b] == CACHED:
            q_unlink(B, M, b)
            if B[ROW_RETIRE, b] > M[CLOCK0 + WATERMARK]:
                M[CACHED_BUSY] -= 1
        e_share(B, M, H, K, X, b, r)
    return n


@njit(cache=True)
def end_write_many(B, M, H, K, X, blocks, n):
    """``BlockPool.end_write(b)`` for each, stopping at the first refusal (each block is
    recycled if it can be now)."""
    for i in range(n):
        b = blocks[i]
        if b < 0 or b >= B.shape[1] - 1 or not g_end_write(B, M, H, K, X, b):
            return i
        e_end_write(B, M, H, K, X, b)
        _recycle_if_safe(B, M, H, K, X, b)
    return n


@njit(cache=True)
def share_prefix(B, M, H, K, X, r, slots, n, out):
    """``registered_prefix`` of ``slots[:n]`` into ``out``, then ``share_many`` of those blocks
    for holder r (a prefix hit's references). Returns (blocks found, blocks shared)."""
    k = registered_prefix(X, slots, n, out)
    return k, share_many(B, M, H, K, X, r, out, k)


@njit(cache=True, inline="always")
def cache_if_due(B, M, H, K, X, b, r, h):
    """The spec's ``commit`` of b for holder r under hash slot h where ``cache_due`` holds
    (else nothing); False where it was due and its guard refused."""
    if not g_cache_due(B, M, H, K, X, b, h):
        return True
    if not g_commit(B, M, H, K, X, b, r, h):
        return False
    e_commit(B, M, H, K, X, b, r, h)
    return True


@njit(cache=True, inline="always")
def any_unregistered(X, hslots, n):
    """Whether a hash slot of ``hslots[:n]`` names no block (a digest interned for a commit
    not made, for the caller to release)."""
    for i in range(n):
        if X[hslots[i]] == NO_BLOCK:
            return True
    return False


@njit(cache=True)
def cache_many(B, M, H, K, X, r, blocks, hslots, n):
    """``cache_if_due`` of each of ``blocks[:n]`` under ``hslots[:n]`` in order (a later
    block whose hash an earlier one just registered is not due), stopping at the first
    refusal. Returns (the refused index or -1, ``any_unregistered``)."""
    for i in range(n):
        b = blocks[i]
        if b < 0 or b >= B.shape[1] - 1 or not cache_if_due(B, M, H, K, X, b, r, hslots[i]):
            return i, any_unregistered(X, hslots, n)
    return -1, any_unregistered(X, hslots, n)


@njit(cache=True)
def recycle_where(B, M, H, K, X, blocks, n):
    """Recycle each of ``blocks[:n]`` that can be now (the watermark's drain)."""
    for i in range(n):
        _recycle_if_safe(B, M, H, K, X, blocks[i])


@njit(cache=True)
def registered_prefix(X, slots, n, out):
    """Into ``out``, the block each hash slot of ``slots[:n]`` names, up to the first that
    names none (a prefix hit stops at the first miss); returns how many."""
    for i in range(n):
        b = X[slots[i]]
        if b == NO_BLOCK:
            return i
        out[i] = b
    return n


ADMIT_TAKEN, ADMIT_NO_ROOM, ADMIT_OPEN_REFUSED, ADMIT_SHARE_REFUSED = range(4)


@njit(cache=True)
def admit(B, M, H, K, X, r, slots, nh, n, out, S):
    """``BlockPool.admit``: ``registered_prefix`` of ``slots[:nh]`` into ``out`` (k hits);
    then, where n - k blocks are usable once the hits an allocation could take (the spec's
    ``takeable``) are revived, holder r opened (the spec's ``open_holder``), the hits shared
    (``share_many``) and n - k blocks taken into ``out[k:]`` (``take_many``). Returns (an
    ``ADMIT_*`` status, k, the hits shared, or the blocks usable where ``ADMIT_NO_ROOM``,
    then ``take_many``'s five answers: zeros, -1 and ``TAKE_OK`` where it did not run)."""
    k = registered_prefix(X, slots, nh, out)
    usable = M[COUNT0 + FREE] + M[COUNT0 + CACHED] - M[CACHED_BUSY]
    for i in range(k):
        if g_takeable(B, M, H, K, X, out[i]):
            usable -= 1
    if n - k > usable:
        return ADMIT_NO_ROOM, k, usable, 0, 0, 0, -1, TAKE_OK
    if not g_open_holder(B, M, H, K, X, r):
        return ADMIT_OPEN_REFUSED, k, 0, 0, 0, 0, -1, TAKE_OK
    e_open_holder(B, M, H, K, X, r)
    done = share_many(B, M, H, K, X, r, out, k)
    if done < k:
        return ADMIT_SHARE_REFUSED, k, done, 0, 0, 0, -1, TAKE_OK
    taken, nev, nt, refused, status = take_many(B, M, H, K, X, r, n - k, out[k:], S)
    return ADMIT_TAKEN, k, done, taken, nev, nt, refused, status


@njit(cache=True)
def finish(B, M, H, K, X, r, blocks, n, S):
    """``BlockPool.finish``: ``release_many`` of ``blocks[:n]`` for holder r, then, where every
    one was released and the spec's ``close_holder`` guard holds, r closed. Returns
    (``release_many``'s two answers, whether r was closed)."""
    done, nret = release_many(B, M, H, K, X, r, blocks, n, S)
    if done < n or not g_close_holder(B, M, H, K, X, r):
        return done, nret, False
    e_close_holder(B, M, H, K, X, r)
    return done, nret, True
