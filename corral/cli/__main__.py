"""``python -m corral.cli``: the same as the ``corral`` command."""

import sys

from corral.cli import main  # the package's entry point (importing the submodule by name would rebind it)

sys.exit(main())
