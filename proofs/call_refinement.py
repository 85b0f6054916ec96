"""Call-level refinement: each allocator call against its program in ``spec.calls``.

Both directions, on every call: the allocator must succeed exactly when the call's program can
run (``spec.calls.call_allowed``, the spec's own block choices, which find a block whenever one
exists), a refusal for want of blocks must be ``OutOfBlocks``, and a success must end in the
state the program reaches with the allocator's own block choices (read off its pool trace),
table by table and block by block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pagedkv.allocator import AllocatorError, BlockAllocator, OutOfBlocks
from pagedkv.spec import REQUEST_SPEC, RequestSpec, request_step, states_equal
from pagedkv.spec.calls import CallRefused, CallRun, call_allowed, run_call
from pagedkv.spec.requests import RequestState, summary


class TraceChooser:
    """The blocks the allocator took, in order, each with the cached blocks it evicted on the
    way (its pool trace: evict* then allocate, per take)."""

    def __init__(self, trace: Sequence[tuple[str, dict[str, Any]]]) -> None:
        self.takes: list[tuple[list[int], int]] = []
        evicted: list[int] = []
        for name, params in trace:
            if name == "evict":
                evicted.append(params["b"])
            elif name == "allocate":
                self.takes.append((evicted, params["b"]))
                evicted = []
        self.next = 0

    def take(self, s: RequestState) -> tuple[list[int], int] | None:
        if self.next == len(self.takes):
            return None
        self.next += 1
        return self.takes[self.next - 1]


class CallModel:
    """The request layer's state as the spec's programs leave it, checked against an
    allocator after every call. ``spec``: the request layer the programs run in; by default
    the spec as written, so an allocator given a changed spec is checked against the real one."""

    def __init__(self, alloc: BlockAllocator, spec: RequestSpec = REQUEST_SPEC) -> None:
        self.alloc = alloc
        self.spec = spec
        self.state: RequestState = alloc.abstract().requests
        self.last: CallRun | None = None

    def allowed(self, call: str, *args: Any) -> CallRun | CallRefused:
        return call_allowed(self.state, call, *args, prefix_caching=self.alloc.prefix_caching,
                            spec=self.spec)

    def check(self, call: str, args: tuple[Any, ...], do: Callable[[], Any]) -> Any:
        """Run ``do`` (the allocator call) and check it against the program of ``call``.
        Returns what ``do`` returned, or the AllocatorError it raised."""
        trace = self.alloc.pool.trace
        start = len(trace)
        spec = self.allowed(call, *args)
        try:
            out = do()
        except AllocatorError as exc:
            assert isinstance(spec, CallRefused), (
                f"the spec allows {call}{args!r} ({len(spec.steps)} request steps); "
                f"the allocator refused: {exc!r}")
            if spec.room:
                assert isinstance(exc, OutOfBlocks), (
                    f"{call}{args!r}: the spec refuses for want of blocks, the allocator "
                    f"raised {exc!r}")
            return exc
        assert not isinstance(spec, CallRefused), (
            f"{call}{args!r} succeeded where the spec refuses: {spec.reason}")
        run = run_call(self.state, call, *args, chooser=TraceChooser(trace[start:]),
                       prefix_caching=self.alloc.prefix_caching, spec=self.spec)
        self.expect_state(run.state, f"{call}{args!r}")
        self.last = run
        return out

    def expect_state(self, state: RequestState, what: str) -> None:
        a = self.alloc.abstract()
        diffs = states_equal(state.pool, a.pool)
        assert not diffs, f"after {what}, the pool differs from the spec's program: {diffs[:5]}"
        mine, theirs = summary(state), summary(a.requests)
        assert mine == theirs, (
            f"after {what}, the tables differ from the spec's program:\n"
            f"  spec:      {mine}\n  allocator: {theirs}")
        self.state = state

    def follow(self, trace: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Direct pool calls that touch no table (evict, recycle): the same request
        transitions on the model, which must end where the allocator is."""
        state = self.state
        for name, params in trace:
            post = request_step(state, name, self.spec.transitions, **params)
            assert post is not None, f"{name}{params}: the spec's guard does not hold"
            state = post
        self.expect_state(state, f"pool steps {list(trace)}")
