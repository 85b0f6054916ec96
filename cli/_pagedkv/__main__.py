"""``python -m pagedkv``: the same as the ``pagedkv`` console script.

pyproject.toml maps the ``pagedkv`` namespace to this folder, which holds only this file (no
``__init__.py``): ``pagedkv`` stays an implicit namespace package, and runpy runs a namespace
package's ``__main__`` like a regular package's.
"""

import sys

from pagedkv.cli.main import main

sys.exit(main())
