"""Optional job types: never loaded by default; a worker operator turns each on with ``--import``.

Modules:
    command    ``command``: run an allowed program with the job's cores and memory
               (``corral worker --import runner.extra.command``, with ``CORRAL_COMMAND_ALLOW`` set)

Importing this package loads none of them: each module registers its type as it is imported.
"""

from __future__ import annotations

__all__: list[str] = []
