"""Run the refinement state machine. Budget per profile (HYPOTHESIS_PROFILE):
ci ≈ 3·10⁴ steps, derandomized (`pagedkv verify` runs a further 8·10⁴-step campaign); dev a
quick run; deep a long one."""

from __future__ import annotations

import os

from hypothesis import settings

from pagedkv.proofs.refinement import AllocatorMachine

BUDGETS = {"ci": (600, 50), "dev": (200, 40), "deep": (20000, 80), "mutation": (300, 40)}
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
EXAMPLES, STEPS = BUDGETS.get(PROFILE, BUDGETS["dev"])


class TestRefinement(AllocatorMachine.TestCase):
    settings = settings(
        settings.get_profile(PROFILE), max_examples=EXAMPLES, stateful_step_count=STEPS
    )
