"""The `corral` command as tests run it: a subprocess from the repository root, output captured."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, base_env

CORRAL = [sys.executable, "-m", "corral.cli"]


def corral(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the `corral` command to completion and capture its output; ``env`` adds to the environment,
    ``input`` is its standard input."""
    return subprocess.run(
        [*CORRAL, *args],
        cwd=ROOT,
        env=base_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        input=input,
    )
