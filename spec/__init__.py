"""pagedkv.spec — the block lifecycle, written once: states, transitions, invariants."""

from .check import launch_ids, live_instances, request_violations, spec_digest, step, violations
from .invariants import INVARIANTS, PROPERTIES, Invariant
from .model import BLOCK_FIELDS, PoolState, initial_state, states_equal
from .ops import CONCRETE, Arr, ConcreteOps, Overlay, Z3Ops, flatten
from .request_invariants import REQUEST_INVARIANTS
from .request_spec import REQUEST_SPEC, RequestSpec
from .requests import REQUEST_TRANSITIONS, RequestState, initial_request_state, request_step
from .states import (
    ALL_STATES,
    ALLOCATED,
    CACHED,
    FREE,
    ISSUED,
    NO_BLOCK,
    NO_HASH,
    PUBLISHED,
    RECLAIMED,
    REFERENCED,
    WATERMARK,
    BlockState,
    state_name,
)
from .transitions import (
    PARAM_KINDS,
    TRANSITIONS,
    Transition,
    cache_due,
    slots_written,
    takeable,
)

__all__ = [
    "ALL_STATES", "ALLOCATED", "Arr", "BLOCK_FIELDS", "BlockState", "CACHED", "CONCRETE",
    "ConcreteOps", "FREE", "INVARIANTS", "ISSUED", "PARAM_KINDS", "Invariant", "NO_BLOCK",
    "NO_HASH", "WATERMARK",
    "Overlay",
    "PROPERTIES", "PUBLISHED", "PoolState", "RECLAIMED", "REFERENCED", "TRANSITIONS",
    "REQUEST_INVARIANTS", "REQUEST_SPEC", "REQUEST_TRANSITIONS", "RequestSpec", "RequestState",
    "initial_request_state",
    "request_step", "request_violations", "Transition", "Z3Ops", "flatten", "initial_state",
    "launch_ids", "live_instances",
    "slots_written",
    "takeable",
    "cache_due",
    "spec_digest", "state_name", "states_equal", "step", "violations",
]
