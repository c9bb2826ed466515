"""``python -m flashcompress``: the same command line as the ``flashcompress`` script."""

import sys

from .cli import main

sys.exit(main())
