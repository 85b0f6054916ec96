"""pagedkv.cli — the ``pagedkv`` command: verify, plan, lab, diagram.

``pagedkv verify`` is the existing implementation in ``pagedkv.proofs.cli`` (delegated to
unchanged); ``plan``, ``lab`` and ``diagram`` live here. Run ``pagedkv --help``.
"""

from .errors import CliError
from .main import main

__all__ = ["CliError", "main"]
