"""The `corral` command writing into a pipe whose reader went away (`corral list | head -1`), against a real
control plane on 127.0.0.1: that is no failure of the command, tables or JSON alike."""

from __future__ import annotations

import pytest

import corral as corral_client
from tests.conftest import ControlProc
from tests.support.cli import into_a_closed_pipe


@pytest.mark.parametrize("args", [("list",), ("list", "--json"), ("stats",), ("get", "{id}")], ids=str)
def test_a_reader_that_goes_away_is_not_a_failure(control_plane: ControlProc, args: tuple[str, ...]) -> None:
    with corral_client.Client(control_plane.address) as client:
        job = client.submit("noop", name="piped")
    # When the command's output goes into a pipe whose reader left
    code, err = into_a_closed_pipe(*(a.format(id=job.id) for a in args), "--control", control_plane.address)
    # Then it exits 0 without a word, as `print` does for JSON: a table used to exit 1 (rich's SystemExit)
    assert (code, err) == (0, "")
