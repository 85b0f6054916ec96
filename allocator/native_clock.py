# ruff: noqa: F821
"""The launch clock's set of launches in flight, natively: an open-addressing set in ``M``.

Not imported: ``native_source.module_source`` pastes this text into the generated module with
the pool's loops (``native_policy.py``). The spec's ``inflight[L]`` reads ``has_launch(M, L)``
and its stores call ``add_launch`` / ``discard_launch``: the cells of ``M`` from ``LAUNCHES0``
on hold launch numbers (``LAUNCH_EMPTY`` never used, ``LAUNCH_TOMB`` a deleted one: the two
least int64 values, which no launch number is, so any other int can be a member), and
``M[LAUNCH_USED]`` bounds the cells in use, so that the pool rehashes (``rehash_launches``)
before an insertion could find no empty cell. ``advance_while`` is the watermark's loop:
the spec's ``advance`` while its guard holds.
"""

if "njit" not in globals():  # imported as a module rather than pasted: importable, inert
    def njit(**options):
        return lambda fn: fn


@njit(cache=True, inline="always")
def _launch_cell(M, L):
    cap = M.shape[0] - LAUNCHES0
    return LAUNCHES0 + (((L * MIX) >> 17) & (cap - 1)), cap


@njit(cache=True, inline="always")
def has_launch(M, L):
    i, cap = _launch_cell(M, L)
    for _ in range(cap):
        k = M[i]
        if k == L:
            return True
        if k == LAUNCH_EMPTY:
            return False
        i = LAUNCHES0 + ((i - LAUNCHES0 + 1) & (cap - 1))
    return False


@njit(cache=True, inline="always")
def add_launch(M, L):
    i, cap = _launch_cell(M, L)
    tomb = -1
    for _ in range(cap):
        k = M[i]
        if k == L:
            return
        if k == LAUNCH_TOMB and tomb < 0:
            tomb = i
        if k == LAUNCH_EMPTY:
            break
        i = LAUNCHES0 + ((i - LAUNCHES0 + 1) & (cap - 1))
    if tomb >= 0:
        M[tomb] = L
    else:
        M[i] = L
        M[LAUNCH_USED] += 1


@njit(cache=True, inline="always")
def discard_launch(M, L):
    i, cap = _launch_cell(M, L)
    for _ in range(cap):
        k = M[i]
        if k == L:
            M[i] = LAUNCH_TOMB
            return
        if k == LAUNCH_EMPTY:
            return
        i = LAUNCHES0 + ((i - LAUNCHES0 + 1) & (cap - 1))


@njit(cache=True)
def launch_members(M, out):
    """The launches in flight, into ``out``; returns how many (any order)."""
    n = 0
    for i in range(LAUNCHES0, M.shape[0]):
        if M[i] > LAUNCH_TOMB:
            out[n] = M[i]
            n += 1
    return n


@njit(cache=True)
def rehash_launches(M, new):
    """``M``'s cells into ``new`` (a copy of its head, every launch cell empty): the live
    launches re-inserted, ``LAUNCH_USED`` their number."""
    new[LAUNCH_USED] = 0
    for i in range(LAUNCHES0, M.shape[0]):
        if M[i] > LAUNCH_TOMB:
            add_launch(new, M[i])


@njit(cache=True)
def advance_while(B, M, H, K, X):
    """The spec's ``advance`` as long as its guard holds: how many times it ran."""
    n = 0
    while g_advance(B, M, H, K, X):
        e_advance(B, M, H, K, X)
        n += 1
    return n
