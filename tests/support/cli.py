"""The `corral` command as tests run it: a subprocess from the repository root, output captured."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, base_env

CORRAL = [sys.executable, "-m", "corral.cli"]


def corral(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the `corral` command to completion and capture its output."""
    return subprocess.run(
        [*CORRAL, *args], cwd=ROOT, env=base_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
