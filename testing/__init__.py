"""pagedkv.testing — the refinement state machine, reusable against any allocator.

Testing your own allocator
--------------------------

``pagedkv.testing`` runs the hypothesis state machine that checks pagedkv's allocator against
any block allocator that an engine team can put behind a small adapter. The adapter speaks
the vocabulary of a paged KV cache: ``add_request(rid, tokens, salt) -> hit_tokens``,
``allocate(rid, num_tokens) -> table | None``, ``append_tokens``, ``launch(rids) -> handle``,
``complete(handle)``, ``commit(rid, n)``, ``fork(parent, child)``, ``free(rid)``, and the
observations ``block_table(rid)``, ``num_free_blocks()`` and ``num_cached_blocks()``. Its
``capabilities`` say what the allocator has (launches, prefix caching, fork); the rules for
what it lacks are never drawn::

    from hypothesis import settings
    from pagedkv.testing import BaseAdapter, Capabilities, make_test_case

    class MyAdapter(BaseAdapter):
        capabilities = Capabilities(launches=True, prefix_caching=True)

        def __init__(self, num_blocks, block_size):
            self.alloc = MyAllocator(num_blocks, block_size)
            self.num_blocks, self.block_size = num_blocks, block_size

        def add_request(self, rid, tokens, salt):
            return self.alloc.lookup_and_register(rid, tokens, salt)
        def allocate(self, rid, num_tokens):     # the whole table, or None if it won't fit
            return self.alloc.grow(rid, num_tokens)
        ...                                      # launch, complete, commit, free, observations

    TestMyAllocator = make_test_case(MyAdapter, settings=settings(max_examples=200))

Each run builds a fresh allocator with ``MyAdapter(num_blocks, block_size)`` and checks every
call against the machine's own model of what can be observed: tables only grow (except a
copy-on-write of a shared block a launch writes), no block sits in two live tables unless a
prefix hit or a fork shared it, blocks an in-flight launch reads are not handed out again
before it completes, ``num_free_blocks()`` counts exactly the blocks in no live table, prefix
hits name blocks holding committed KV of the same salt and tokens, and a refused call changes
nothing (nor is it refused while the blocks it needs are free). An allocator that can map
itself to pagedkv's spec state also implements ``abstract()`` and ``transitions()``
(``SpecView``, capability ``spec_view``): then every transition it performs is replayed on the
spec, its guard must hold and the result must equal ``abstract()``, every spec invariant is
checked after every step, and every block of an in-flight launch must be pinned. A failure
prints the shrunk program (``req_0 = state.admit(...)``, ``state.free(rid=req_0)``, ...), the
adapter calls each step made (as ``# ...`` comments), and the check that broke, in words,
e.g. ``[no_reuse_while_in_flight] allocate('req_1', 1) handed out block 0, which in-flight
launch_0 (launch(['req_0'])) still reads``. ``run(factory, settings=...)`` does the same
inside a test function; both need hypothesis (the ``verify`` extra). ``BlockAllocatorAdapter``
and ``EngineAdapter`` are the adapters of pagedkv's own allocator and engine front door;
``examples/third_party_allocator.py`` plugs in a plain free-list allocator, and a buggy
variant of it that the machine catches.
"""

try:
    import hypothesis  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("pagedkv.testing needs hypothesis: pip install 'pagedkv[verify]'") from exc

from .adapter import AdapterFactory, AllocatorAdapter, BaseAdapter, Capabilities, SpecView
from .adapters import BlockAllocatorAdapter, EngineAdapter
from .machine import AdapterMachine, default_settings, make_machine, make_test_case, run
from .model import CHECKS, CheckFailed

__all__ = [
    "CHECKS", "AdapterFactory", "AdapterMachine", "AllocatorAdapter", "BaseAdapter",
    "BlockAllocatorAdapter", "Capabilities", "CheckFailed", "EngineAdapter", "SpecView",
    "default_settings", "make_machine", "make_test_case", "run",
]
