# ruff: noqa: F821
"""The request layer's step-level loops, over a native pool and request arrays.

Not imported: ``native_source.module_source`` pastes this text into the generated module after
the pool's loops (``native_policy.py``) and the spec's generated functions, which it calls:
``g_<name>`` / ``e_<name>`` of the pool transitions, ``take_many`` (the queue's head run) and
the request rules ``rule_commit_bounds`` / ``g_slots_written`` generated from the
``RequestSpec``. ``NativeAllocator`` (``native_allocator.py``) keeps per request row ``r``:

- ``R[FIELD, r]`` (``R_HOLDER`` the pool's holder slot, ``R_TLEN`` table entries, and the
  positions ``R_RESERVED``, ``R_ISSUED``, ``R_COMPUTED``, ``R_KNOWN``, plus ``R_PUBLISHED``
  the leading entries published);
- ``T[r, i]`` table entry i (-1 past the table's end).

Each loop does what ``BlockAllocator``'s call of the same meaning does, request by request,
and checks every request before it changes anything (the step-level calls are all or
nothing); it returns the index of the request that is refused, with a ``STEP_*`` code.
"""

if "njit" not in globals():  # imported as a module rather than pasted: importable, inert
    def njit(**options):
        return lambda fn: fn


R_HOLDER, R_TLEN, R_RESERVED, R_ISSUED, R_PUBLISHED, R_COMPUTED, R_KNOWN = range(7)
R_FIELDS = 7

(STEP_OK, STEP_SHRINKS, STEP_EMPTY_TABLE, STEP_NO_ROOM, STEP_REFUSED, STEP_NOTHING_ALLOCATED,
 STEP_SHARED_WRITE, STEP_BELOW_COMPUTED, STEP_NOT_ISSUED, STEP_NOT_KNOWN, STEP_PENDING,
 STEP_TOO_WIDE) = range(12)


@njit(cache=True, inline="always")
def _cdiv(a, b):
    return -((-a) // b)


@njit(cache=True)
def grow_many(B, M, H, K, X, R, T, rows, targets, n, S, grown):
    """``BlockAllocator.allocate_many``: each request ``rows[i]`` (a non-empty table) grows to
    cover ``targets[i]`` positions, taking new blocks from the queue's head (evicting cached
    ones on the way, as ``take_many``). Every request is checked first and the room for all of
    them planned (``usable``: FREE, idle cached): a refusal changes nothing. ``grown[i]``: the
    entries request i added. Returns (refused request or -1, ``STEP_*``, blocks needed,
    hash slots evicted: row 0 of ``S``, blocks touched: row 2)."""
    Bsz = M[BLOCK_SIZE]
    need_all = 0
    for i in range(n):
        r = rows[i]
        t = targets[i]
        if t < R[R_RESERVED, r]:
            return i, STEP_SHRINKS, 0, 0, 0
        tlen = R[R_TLEN, r]
        if tlen == 0:
            return i, STEP_EMPTY_TABLE, 0, 0, 0
        need = _cdiv(t, Bsz) - tlen
        if need > 0:
            need_all += need
    if need_all > M[COUNT0 + FREE] + M[COUNT0 + CACHED] - M[CACHED_BUSY]:
        return -1, STEP_NO_ROOM, need_all, 0, 0
    for i in range(n):  # the caller widened the rows for every table that fits
        if _cdiv(targets[i], Bsz) > T.shape[1]:
            return i, STEP_TOO_WIDE, 0, 0, 0
    nev = 0
    nt = 0
    for i in range(n):
        r = rows[i]
        t = targets[i]
        tlen = R[R_TLEN, r]
        need = _cdiv(t, Bsz) - tlen
        grown[i] = 0
        if need > 0:
            view = S[:, nt:]
            taken, ev, touched, refused, status = take_many(
                B, M, H, K, X, R[R_HOLDER, r], need, T[r, tlen:tlen + need], view)
            for j in range(ev):
                S[0, nev + j] = view[1, j]
            nev += ev
            nt += touched
            R[R_TLEN, r] = tlen + taken
            if status != TAKE_OK:
                return i, STEP_REFUSED, refused, nev, nt
            grown[i] = need
        if t > R[R_RESERVED, r]:
            R[R_RESERVED, r] = t
    return -1, STEP_OK, need_all, nev, nt


@njit(cache=True)
def launch_plan(B, M, H, K, X, R, T, rows, n):
    """What publishing ``rows[:n]`` writes, changing nothing: (refused request or -1,
    ``STEP_*``, positions written, blocks written). Refused: a request with no positions
    allocated, or one whose first written block is shared (a copy would be needed: only
    ``BlockAllocator`` copies on write)."""
    Bsz = M[BLOCK_SIZE]
    npos = 0
    nblocks = 0
    for i in range(n):
        r = rows[i]
        reserved = R[R_RESERVED, r]
        issued = R[R_ISSUED, r]
        if reserved == 0:
            return i, STEP_NOTHING_ALLOCATED, 0, 0
        if issued < reserved:
            if issued % Bsz != 0 and B[ROW_REF, T[r, issued // Bsz]] > 1:
                return i, STEP_SHARED_WRITE, 0, 0
            npos += reserved - issued
            nblocks += _cdiv(reserved, Bsz) - issued // Bsz
    return -1, STEP_OK, npos, nblocks


@njit(cache=True)
def publish_rows(B, M, H, K, X, R, T, rows, n):
    """Publish each request's entries past its published ones that are ALLOCATED (spec:
    publish, as ``BlockAllocator.publish`` does before numbering the launch). Returns (the
    request whose block is refused, the block) or (-1, -1)."""
    for i in range(n):
        r = rows[i]
        h = R[R_HOLDER, r]
        for j in range(R[R_PUBLISHED, r], R[R_TLEN, r]):
            b = T[r, j]
            if B[ROW_STATE, b] == ALLOCATED:
                if not g_publish(B, M, H, K, X, b, h):
                    return i, b
                e_publish(B, M, H, K, X, b, h)
        R[R_PUBLISHED, r] = R[R_TLEN, r]
    return -1, -1


@njit(cache=True)
def write_rows(B, M, H, K, X, R, T, rows, n, slots, starts, lens, written):
    """The launch's writes (spec: begin_write of each block, the positions it writes): per
    request its positions from issued to reserved, which it then has issued. Fills the slot
    mapping (``block * B + offset`` per position, in launch order), ``starts`` / ``lens``
    (issued before, reserved) and ``written`` (the blocks, in order). Returns (refused
    request or -1, its refused block and write, positions, blocks)."""
    Bsz = M[BLOCK_SIZE]
    npos = 0
    nw = 0
    for i in range(n):
        r = rows[i]
        h = R[R_HOLDER, r]
        issued = R[R_ISSUED, r]
        reserved = R[R_RESERVED, r]
        starts[i] = issued
        lens[i] = reserved
        p = issued
        while p < reserved:
            j = p // Bsz
            end = min(reserved, (j + 1) * Bsz)
            b = T[r, j]
            if not g_begin_write(B, M, H, K, X, b, h, end - p):
                return i, b, end - p, npos, nw
            e_begin_write(B, M, H, K, X, b, h, end - p)
            written[nw] = b
            nw += 1
            for q in range(p, end):
                slots[npos] = b * Bsz + q - j * Bsz
                npos += 1
            p = end
        R[R_ISSUED, r] = reserved
    return -1, -1, 0, npos, nw


@njit(cache=True)
def commit_scan(B, M, H, K, X, R, T, rows, news, n, filled):
    """``BlockAllocator.commit_many``'s checks, then its commits of positions: each request
    ``rows[i]`` commits up to ``news[i]`` (the spec's ``commit_bounds`` on issued and known
    positions, ``slots_written`` on every block committed). Checks all before changing
    anything; then sets the computed positions and writes to ``filled`` the
    (index, first entry, end entry) of each request whose commit fills blocks (for the
    prefix cache). Returns (refused request or -1, ``STEP_*``, the pending block, rows of
    ``filled``)."""
    Bsz = M[BLOCK_SIZE]
    for i in range(n):
        r = rows[i]
        new = news[i]
        computed = R[R_COMPUTED, r]
        if new < computed:
            return i, STEP_BELOW_COMPUTED, -1, 0
        if new == computed:
            continue
        ok_issued, ok_known = rule_commit_bounds(Bsz, new, R[R_ISSUED, r], R[R_KNOWN, r])
        if not ok_issued:
            return i, STEP_NOT_ISSUED, -1, 0
        if not ok_known:
            return i, STEP_NOT_KNOWN, -1, 0
        for j in range(computed // Bsz, _cdiv(new, Bsz)):
            b = T[r, j]
            if not g_slots_written(B, M, H, K, X, b, min(Bsz, new - j * Bsz)):
                return i, STEP_PENDING, b, 0
    nf = 0
    for i in range(n):
        r = rows[i]
        first = R[R_COMPUTED, r] // Bsz
        full = news[i] // Bsz
        R[R_COMPUTED, r] = news[i]
        if full > first:
            filled[0, nf] = i
            filled[1, nf] = first
            filled[2, nf] = full
            nf += 1
    return -1, STEP_OK, -1, nf
