"""pagedkv.testing — the refinement state machine, reusable against any allocator."""
