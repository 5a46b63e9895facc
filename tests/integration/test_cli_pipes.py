"""The `corral` command writing into a pipe whose reader went away (`corral list | head -1`), against a real
control plane on 127.0.0.1: that is no failure of the command, tables or JSON alike."""

from __future__ import annotations

import subprocess

import pytest

import corral as corral_client
from tests.conftest import ROOT, ControlProc, base_env
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


@pytest.mark.parametrize("args", [("list",), ("list", "--json"), ("stats",), ("get", "{id}")], ids=str)
def test_a_reader_that_goes_away_is_not_a_failure(control_plane: ControlProc, args: tuple[str, ...]) -> None:
    with corral_client.Client(control_plane.address) as client:
        job = client.submit("noop", name="piped")
    # When the command's output goes into a pipe whose reader left
    code, err = _into_a_closed_pipe(*(a.format(id=job.id) for a in args), "--control", control_plane.address)
    # Then it exits 0 without a word, as `print` does for JSON: a table used to exit 1 (rich's SystemExit)
    assert (code, err) == (0, "")
