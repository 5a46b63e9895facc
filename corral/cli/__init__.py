"""The ``corral`` command-line tool (``corral = "corral.cli:main"``).

Modules, one concern each:

- ``main``        the entry point: parse, dispatch, map errors to exit statuses.
- ``parser``      every sub-command and its arguments.
- ``values``      argument value types (JSON payload, ``--at`` times, labels, addresses).
- ``job_file``    the JSON batch of jobs ``corral submit-many`` reads (the body of REST's batchSubmit).
- ``commands``    the client commands: submit, submit-many, get, list, cancel, retry, watch, stats, workers, shares, drain.
- ``account_commands``  login, logout, whoami, register, accounts (list, passwd, delete).
- ``login_file``  the login ``corral login`` saves, and which control plane it is for.
- ``render``      rich tables, coloured states, JSON output.
- ``exitcode``    what the exit statuses mean, and the one-line error printer.
- ``child``       one supervised child process.
- ``supervisor``  runs a control plane and N workers; restarts crashed workers; stops them in order.
- ``up``          ``corral up``: the supervisor in the foreground.
- ``demo``        ``corral demo``: the built-in job types on an embedded (or given) Corral.
- ``demoboard``   the demo's live scoreboard and results table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.cli.main import main

__all__ = ["main"]


def __getattr__(name: str) -> object:
    """Load :func:`main` on first use (PEP 562).

    ``python -m control`` and ``python -m worker`` import ``corral.cli.config_check`` from this
    package; the commands, their parser and the terminal library behind ``main`` would add about a
    twentieth of a second to every start of them."""
    if name != "main":
        raise AttributeError(f"module 'corral.cli' has no attribute {name!r}")
    from corral.cli.main import main as entry  # the import binds the module here as `main` ...

    globals()["main"] = entry  # ... and the entry point replaces it, as the eager import did
    return entry
