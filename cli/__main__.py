"""``python -m pagedkv.cli``: the same as the ``pagedkv`` console script."""

import sys

from pagedkv.cli.main import main

sys.exit(main())
