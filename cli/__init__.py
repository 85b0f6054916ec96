"""pagedkv.cli — the ``pagedkv`` command: verify, plan, lab, diagram.

``pagedkv verify`` is the existing implementation in ``pagedkv.proofs.cli`` (delegated to
unchanged); ``plan``, ``lab`` and ``diagram`` live here. Run ``pagedkv --help``.
"""

from .errors import CliError
from .main import main
from .main import package_version as _package_version

__all__ = ["CliError", "main"]

# the installed distribution's version (pyproject.toml's in a bare source tree), as --version
__version__: str = _package_version()
