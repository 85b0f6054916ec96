"""Where the shared vLLM KV-cache anchor may be: ``$PAGEDKV_SHARED``, the ``shared`` folder
beside the repository, or ``/work/shared`` (each ``.../anchors/vllm_kvcache``)."""

from __future__ import annotations

import os
from pathlib import Path

VLLM_KVCACHE_CANDIDATES = [
    Path(p) / "anchors" / "vllm_kvcache" for p in filter(None, [
        os.environ.get("PAGEDKV_SHARED"),
        str(Path(__file__).resolve().parents[1].parent / "shared"), "/work/shared"])]
