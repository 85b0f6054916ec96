"""Conditions CrossHair may leave unconfirmed, each with the reason it is acceptable.

Keys are ``"<qualified function name>"`` (every condition of that function) or
``"<qualified function name>:<n>"`` (its n-th ``post:`` line, from 1). An entry excuses only a
condition CrossHair could not confirm ("unknown"); a counterexample is never excused. An entry
whose condition is confirmed is reported as stale so the list does not rot.
"""

from __future__ import annotations

ALLOWLIST: dict[str, str] = {
    "pagedkv.proofs.crosshair_targets.extra_key_str_injective": (
        "CrossHair 0.0.112 realizes a symbolic str in str.encode('utf-8'), so the path tree "
        "over code points never closes; UTF-8 is injective by construction (RFC 3629) and the "
        "search still finds a counterexample for a planted bug (tests/test_crosshair.py)"
    ),
}
