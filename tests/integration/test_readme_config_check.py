"""README "Running it": `corral config --check` prints the effective configuration and exits 0, also when
its output goes into a pipe whose reader left (`corral config --check | head`), as `corral list` does."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import ROOT, base_env
from tests.support.cli import CORRAL


def _into_a_closed_pipe(*args: str) -> tuple[int, str]:
    """Run `corral ARGS` with its stdout a pipe that nobody reads any more; its exit status and stderr."""
    proc = subprocess.Popen(
        [*CORRAL, *args],
        cwd=ROOT,
        env=base_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader left before the first line (as `head` does after its lines)
    err = proc.stderr.read().decode()
    return proc.wait(60), err


@pytest.mark.parametrize(
    "args",
    [("config", "--check"), ("config", "--check", "--json"), ("config", "--check", "--worker")],
    ids=" ".join,
)
def test_config_check_into_a_closed_pipe_exits_0(args: tuple[str, ...]) -> None:
    # When the configuration table (or JSON) goes into a pipe whose reader left
    code, err = _into_a_closed_pipe(*args)
    # Then it exits 0 without a word: it used to print a BrokenPipeError traceback and exit 1
    assert (code, err) == (0, "")


def test_config_check_still_exits_2_on_a_bad_setting_into_a_closed_pipe() -> None:
    proc = subprocess.Popen(
        [*CORRAL, "config", "--check", "--grpc-port", "70000"],
        cwd=ROOT,
        env=base_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 2, err
    assert "CORRAL_GRPC_PORT" in err
