"""Where the shared vLLM KV-cache anchor may be: ``$PAGEDKV_SHARED``, the ``shared`` folder
beside the repository, or ``/work/shared`` (each ``.../anchors/vllm_kvcache``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

VLLM_KVCACHE_CANDIDATES = [
    Path(p) / "anchors" / "vllm_kvcache" for p in filter(None, [
        os.environ.get("PAGEDKV_SHARED"),
        str(Path(__file__).resolve().parents[1].parent / "shared"), "/work/shared"])]


def anchor_unavailable(why: str) -> NoReturn:
    """The test is skipped where the anchor is missing, or fails under ``CI=true`` (where
    CI runs it, so a missing anchor is an error, not a skip)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: the vLLM anchor must be there, but {why}")
    pytest.skip(why)
