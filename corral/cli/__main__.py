"""``python -m corral.cli``: the same as the ``corral`` command."""

import sys

from corral.cli.main import main

sys.exit(main())
