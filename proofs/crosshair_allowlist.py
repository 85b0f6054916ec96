"""Conditions CrossHair may leave unconfirmed, each with the reason it is acceptable.

Keys are ``"<qualified function name>"`` (every condition of that function) or
``"<qualified function name>:<n>"`` (its n-th ``post:`` line, from 1). An entry excuses only a
condition CrossHair could not confirm ("unknown"); a counterexample is never excused. An entry
whose condition is confirmed is reported as stale so the list does not rot.
"""

from __future__ import annotations

ALLOWLIST: dict[str, str] = {}
