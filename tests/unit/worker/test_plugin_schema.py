"""A plug-in that declares a schema the control plane refuses stops the worker at once: exit 2, naming
the type and the rule, as for a plug-in that does not import. Before, the worker started, and retried
its registration for ever (INVALID_ARGUMENT each time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fake_control import worker_env

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("module", "said"),
    [
        (
            "tests.support.plugin_bad_pattern",
            "BadPattern.schema: not a valid JSON Schema: '(unclosed' is not a 'regex' (at /properties/a/pattern)",
        ),
        (
            "tests.support.plugin_bad_minimum",
            "BadMinimum.schema: not a valid JSON Schema: 'x' is not of type 'number' (at /properties/n/minimum)",
        ),
    ],
)
def test_a_plugin_with_an_invalid_schema_stops_the_worker_with_exit_2_naming_it(module: str, said: str) -> None:
    # Given a worker whose plug-in declares an invalid JSON Schema (no control plane needed: it stops first)
    done = subprocess.run(
        [sys.executable, "-m", "worker", "--import", module, "--threads", "1"],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then it exits 2 with the plug-in's name and what is wrong in its schema, no traceback
    assert done.returncode == 2, done.stderr
    assert f"cannot import job-type plug-in '{module}': ValueError: {said}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
