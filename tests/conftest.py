"""Test configuration: CUDA simulator unless a real GPU run is requested; hypothesis profiles."""

from __future__ import annotations

import os

# Must happen before numba is imported anywhere. scripts/gpu-check.sh sets PAGEDKV_GPU=1.
if os.environ.get("PAGEDKV_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from hypothesis import HealthCheck, Phase, settings  # noqa: E402

_COMMON = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True, **_COMMON
)
settings.register_profile("dev", deadline=None, **_COMMON)
settings.register_profile("deep", deadline=None, max_examples=2000, **_COMMON)
# Used by mutation runs: no shrinking, so a killed mutant is reported quickly.
settings.register_profile(
    "mutation",
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    **_COMMON,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
