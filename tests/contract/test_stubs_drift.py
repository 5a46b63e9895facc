"""The committed stubs in corral/v1 are exactly what protos/ generates."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_stubs_match_the_protos() -> None:
    result = subprocess.run(
        [sys.executable, "protos/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
