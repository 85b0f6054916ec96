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
 STEP_TOO_WIDE, STEP_ROLLBACK, STEP_KEYS_ROOM, STEP_COUNT) = range(15)


@njit(cache=True, inline="always")
def _cdiv(a, b):
    return -((-a) // b)


@njit(cache=True)
def grow_many(B, M, H, K, X, R, T, rows, targets, n, S, grown):
    """``BlockAllocator.allocate_many``: each request ``rows[i]`` (a non-empty table) grows to
    cover ``targets[i]`` positions, taking new blocks from the queue's head (evicting cached
    ones on the way, as ``take_many``). Every request is checked first and the room for all of
    them planned (``usable``: FREE, idle cached): a refusal changes nothing (as where the
    holds set has no room for the new keys at a load of one half: ``STEP_KEYS_ROOM``, with
    the keys needed, for the caller to make room). ``grown[i]``: the entries request i
    added. Returns (refused request or -1, ``STEP_*``, blocks needed or the refused block,
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
    if 2 * (M[KEYS_USED] + need_all) > K.shape[0]:  # the caller makes room and calls again
        return -1, STEP_KEYS_ROOM, need_all, 0, 0
    return _grow(B, M, H, K, X, R, T, rows, targets, n, S, grown)


@njit(cache=True)
def grow_running(B, M, H, K, X, R, T, rows, computed, counts, n, S, grown, targets, TB, TG, TL,
                 E):
    """A scheduler's running pass (``KVCacheManager.allocate_slots_many``): request
    ``rows[i]``, ``computed[rows[i]]`` positions computed, grows by ``counts[i]`` new ones, to
    cover ``max(computed + counts[i], reserved)`` positions (into ``targets``), in order, as
    long as the blocks it needs are usable then; the first that does not fit and those after
    it are unchanged. Stops before any change where the rows are too narrow
    (``STEP_TOO_WIDE``) or the holds set has no room for the new keys (``STEP_KEYS_ROOM``).
    Refused, changing nothing: a count not > 0 (``STEP_COUNT``), a non-empty table whose
    request has fewer positions computed than issued (a rollback:
    ``BlockAllocator.truncate``). The entries each one grown added (``grown[i]`` of them) are
    appended to the launches' rows and to ``E`` (``put_grown``). Returns (requests grown or
    the refused one, ``STEP_*``, the refused block (when grown: the blocks touched, none if
    no table grew), evicted hash slots, touched blocks, entries put in ``E`` (-1 - i where
    row i's launch copy was not at its table's previous end))."""
    Bsz = M[BLOCK_SIZE]
    for i in range(n):
        r = rows[i]
        if counts[i] <= 0:
            return i, STEP_COUNT, 0, 0, 0, 0
        if R[R_TLEN, r] == 0:
            return i, STEP_EMPTY_TABLE, 0, 0, 0, 0
        if computed[r] < R[R_ISSUED, r]:
            return i, STEP_ROLLBACK, 0, 0, 0, 0
        targets[i] = max(computed[r] + counts[i], R[R_RESERVED, r])
    room = M[COUNT0 + FREE] + M[COUNT0 + CACHED] - M[CACHED_BUSY]
    fit = n
    need_all = 0
    for i in range(n):
        need = _cdiv(targets[i], Bsz) - R[R_TLEN, rows[i]]
        if need > 0:
            if need > room:
                fit = i
                break
            room -= need
            need_all += need
    widest = 0
    for i in range(fit):
        widest = max(widest, _cdiv(targets[i], Bsz))
    if widest > T.shape[1]:  # the caller widens the rows and calls again
        return fit, STEP_TOO_WIDE, widest, 0, 0, 0
    if 2 * (M[KEYS_USED] + need_all) > K.shape[0]:  # the caller makes room and calls again
        return fit, STEP_KEYS_ROOM, need_all, 0, 0, 0
    i, status, refused, nev, nt = _grow(B, M, H, K, X, R, T, rows, targets, fit, S, grown)
    if status != STEP_OK:
        return i, status, refused, nev, nt, 0
    if not nt:
        return fit, STEP_OK, nt, nev, nt, 0
    bad, k = put_grown(B, R, T, rows, grown, fit, TB, TG, TL, E)
    return fit, STEP_OK, nt, nev, nt, k if bad < 0 else -1 - bad


@njit(cache=True)
def _grow(B, M, H, K, X, R, T, rows, targets, n, S, grown):
    """The growth of ``rows[:n]`` to ``targets`` (planned: it fits)."""
    Bsz = M[BLOCK_SIZE]
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
    return -1, STEP_OK, -1, nev, nt


@njit(cache=True)
def launch_plan(B, M, H, K, X, R, T, rows, n):
    """What publishing ``rows[:n]`` writes, changing nothing: (refused request or -1,
    ``STEP_*``, positions written, blocks written, the longest table). Refused: a request
    with no positions allocated, or one whose first written block is shared (a copy would be
    needed: only ``BlockAllocator`` copies on write)."""
    Bsz = M[BLOCK_SIZE]
    npos = 0
    nblocks = 0
    longest = 0
    for i in range(n):
        r = rows[i]
        longest = max(longest, R[R_TLEN, r])
        reserved = R[R_RESERVED, r]
        issued = R[R_ISSUED, r]
        if reserved == 0:
            return i, STEP_NOTHING_ALLOCATED, 0, 0, 0
        if issued < reserved:
            if issued % Bsz != 0 and B[ROW_REF, T[r, issued // Bsz]] > 1:
                return i, STEP_SHARED_WRITE, 0, 0, 0
            npos += reserved - issued
            nblocks += _cdiv(reserved, Bsz) - issued // Bsz
    return -1, STEP_OK, npos, nblocks, longest


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
def commit_scan(B, M, H, K, X, R, T, rows, news, n, filled, apply):
    """``BlockAllocator.commit_many``'s checks, then (if ``apply``) its commits of positions:
    each request ``rows[i]`` commits up to ``news[i]`` (the spec's ``commit_bounds`` on issued
    and known positions, ``slots_written`` on every block committed). Checks all before
    changing anything; then sets the computed positions and writes to ``filled`` the
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
    if not apply:
        return -1, STEP_OK, -1, 0
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


@njit(cache=True)
def launch_rows(B, M, H, K, X, R, T, rows, n, slots, starts, lens, written):
    """``publish_rows``, the spec's ``launch`` (numbered ``clock[ISSUED]``) and
    ``write_rows`` in one call (what ``BlockAllocator.publish`` does, in its order: the new
    blocks published, the launch numbered, then the writes marked). Returns (the stage
    refused: 0 none, 1 publish, 2 launch, 3 begin_write; the refused request, block and
    write, the launch number, blocks written)."""
    i, b = publish_rows(B, M, H, K, X, R, T, rows, n)
    if i >= 0:
        return 1, i, b, 0, -1, 0
    L = M[CLOCK0 + ISSUED]
    if not g_launch(B, M, H, K, X, L):
        return 2, -1, -1, 0, L, 0
    e_launch(B, M, H, K, X, L)
    i, b, w, npos, nw = write_rows(B, M, H, K, X, R, T, rows, n, slots, starts, lens,
                                   written)
    if i >= 0:
        return 3, i, b, w, L, nw
    return 0, -1, -1, 0, L, nw


@njit(cache=True)
def complete_launch(B, M, H, K, X, written, n, L):
    """A launch's completion (``BlockAllocator``'s): the spec's ``end_write`` of each block
    it wrote (each recycled if it can be then), its ``complete``, then ``advance`` while the
    guard holds. Returns (-1 or the index of the refused write, whether ``complete`` was
    refused, how many times the watermark advanced)."""
    done = end_write_many(B, M, H, K, X, written, n)
    if done < n:
        return done, False, 0
    if not g_complete(B, M, H, K, X, L):
        return -1, True, 0
    e_complete(B, M, H, K, X, L)
    return -1, False, advance_while(B, M, H, K, X)


@njit(cache=True)
def commit_blocks(B, M, H, K, X, blocks, holders, hslots, n):
    """``cache_if_due`` of each block for its holder (``BlockAllocator``'s caching at
    commit), in order (so a block of a later request with a hash an earlier one just
    registered is skipped). Returns (the refused index or -1, ``any_unregistered``)."""
    for i in range(n):
        if not cache_if_due(B, M, H, K, X, blocks[i], holders[i], hslots[i]):
            return i, True
    return -1, any_unregistered(X, hslots, n)


(FUSED_DONE, FUSED_PLAN, FUSED_SCRATCH, FUSED_LAUNCH_ROOM, FUSED_ISSUE) = range(5)


@njit(cache=True)
def launch_complete_commit(B, M, H, K, X, R, T, rows, n, slots, starts, lens, written, news,
                           filled):
    """``launch_plan``, ``launch_rows`` and ``complete_and_commit`` in one call: a launch
    that completes at once (a driver's step that already ran). Stops before changing
    anything where the plan refuses (``FUSED_PLAN``), where ``slots`` or ``written`` are too
    short for it (``FUSED_SCRATCH``) or the launch set needs room first (the pool's
    ``_room_for_launch`` test: ``FUSED_LAUNCH_ROOM``); after ``launch_rows`` where it
    refuses (``FUSED_ISSUE``). Returns (the stop, then ``launch_plan``'s five results,
    ``launch_rows``' six and ``complete_and_commit``'s seven, each run or zeros)."""
    i, status, npos, nblocks, longest = launch_plan(B, M, H, K, X, R, T, rows, n)
    issue = (0, -1, -1, 0, -1, 0)
    done = (-1, False, 0, -1, STEP_OK, -1, 0)
    plan = (i, status, npos, nblocks, longest)
    if status != STEP_OK:
        return FUSED_PLAN, plan, issue, done
    if npos > slots.shape[0] or nblocks > written.shape[0]:
        return FUSED_SCRATCH, plan, issue, done
    if 2 * (M[LAUNCH_USED] + 1) > M.shape[0] - LAUNCHES0:
        return FUSED_LAUNCH_ROOM, plan, issue, done
    issue = launch_rows(B, M, H, K, X, R, T, rows, n, slots, starts, lens, written)
    if issue[0] != 0:
        return FUSED_ISSUE, plan, issue, done
    done = complete_and_commit(B, M, H, K, X, R, T, written, issue[5], issue[4], rows, n, news,
                               filled)
    return FUSED_DONE, plan, issue, done


@njit(cache=True)
def filled_entries(R, T, rows, filled, nf, blocks, holders):
    """The entries ``commit_scan`` reported filled (``filled[:, :nf]``: index into ``rows``,
    first entry, end entry), request by request, into ``blocks``, with each one's holder
    slot into ``holders``. Returns how many."""
    k = 0
    for f in range(nf):
        r = rows[filled[0, f]]
        h = R[R_HOLDER, r]
        for j in range(filled[1, f], filled[2, f]):
            blocks[k] = T[r, j]
            holders[k] = h
            k += 1
    return k



@njit(cache=True)
def cache_filled(B, M, H, K, X, R, T, rows, filled, nf, hslots, blocks, holders):
    """``filled_entries`` into ``blocks`` / ``holders``, then ``commit_blocks`` of them with
    their hash slots ``hslots``: the caching at commit of the full blocks the commits
    completed, in one call. Returns ``commit_blocks``' results."""
    n = filled_entries(R, T, rows, filled, nf, blocks, holders)
    return commit_blocks(B, M, H, K, X, blocks, holders, hslots, n)

@njit(cache=True)
def current_prefix(X, G, slots, stamps, blocks, n):
    """How many of the hash slots ``slots[:n]`` lead with each still holding the interning
    stamped ``stamps[i]`` and naming block ``blocks[i]``: of a request's leading hits found
    earlier, those whose digest is still interned since and registered to the same block
    (so a lookup of them finds those blocks now)."""
    for i in range(n):
        s = slots[i]
        if s >= X.shape[0] or G[s] != stamps[i] or X[s] != blocks[i]:
            return i
    return n


@njit(cache=True)
def count_known(M, R, rows, n, filled):
    """One more token id known for each request ``rows[:n]``; into ``filled`` the indices of
    those whose known tokens now end a block (its hash is due). Returns how many."""
    Bsz = M[BLOCK_SIZE]
    nf = 0
    for i in range(n):
        r = rows[i]
        R[R_KNOWN, r] += 1
        if R[R_KNOWN, r] % Bsz == 0:
            filled[nf] = i
            nf += 1
    return nf


@njit(cache=True)
def count_takeable(B, M, H, K, X, blocks, n):
    """How many of ``blocks[:n]`` the spec's ``takeable`` holds for (ids in range)."""
    c = 0
    for i in range(n):
        if g_takeable(B, M, H, K, X, blocks[i]):
            c += 1
    return c


@njit(cache=True)
def complete_and_commit(B, M, H, K, X, R, T, written, nw, L, rows, n, news, filled):
    """``complete_launch`` of launch L (its writes ``written[:nw]``), then each of its
    requests ``rows[:n]`` commits what the launch wrote whose token ids are known
    (``min(reserved, known)`` into ``news``: what a front door commits at completion) as
    ``commit_scan`` does. Returns (``complete_launch``'s three results, then
    ``commit_scan``'s four)."""
    failed, refused, advanced = complete_launch(B, M, H, K, X, written, nw, L)
    if failed >= 0 or refused:
        return failed, refused, advanced, -1, STEP_OK, -1, 0
    for i in range(n):
        r = rows[i]
        news[i] = min(R[R_RESERVED, r], R[R_KNOWN, r])
    i, status, block, nf = commit_scan(B, M, H, K, X, R, T, rows, news, n, filled, True)
    return failed, refused, advanced, i, status, block, nf


@njit(cache=True)
def put_grown(B, R, T, rows, grown, n, TB, TG, TL, E):
    """The entries each of ``rows[:n]`` just added (``grown[i]`` of them) appended to the
    launches' int32 rows (``TableRows``: blocks ``TB``, generations ``TG``, lengths ``TL``),
    as ``TableRows.put`` appends, and to ``E``, one after another (row by row). Returns (the
    index of a row whose copy is not at the table's previous end, for the caller to put, or
    -1; the entries written to ``E``)."""
    k = 0
    for i in range(n):
        g = grown[i]
        if g == 0:
            continue
        r = rows[i]
        end = R[R_TLEN, r]
        if TL[r] != end - g:
            return i, k
        for j in range(end - g, end):
            b = T[r, j]
            TB[r, j] = b
            TG[r, j] = B[ROW_GEN, b]
            E[k] = b
            k += 1
        TL[r] = end
    return -1, k


@njit(cache=True)
def copy_rows(TB, TG, rows, n, tables, generations):
    """A fresh copy of the launch rows ``rows[:n]`` (``TableRows``' blocks ``TB`` and
    generations ``TG``), ``tables.shape[1]`` wide, -1 past the rows' width: what
    ``TableRows.take`` copies for a launch too small to keep incrementally."""
    width = min(tables.shape[1], TB.shape[1])
    for i in range(n):
        r = rows[i]
        for j in range(width):
            tables[i, j] = TB[r, j]
            generations[i, j] = TG[r, j]
        for j in range(width, tables.shape[1]):
            tables[i, j] = -1
            generations[i, j] = -1
