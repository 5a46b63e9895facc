"""README "Running it": `corral config --check` prints the effective configuration and exits 0, also when
its output goes into a pipe whose reader left (`corral config --check | head`), as `corral list` does."""

from __future__ import annotations

import pytest

from tests.support.cli import into_a_closed_pipe


@pytest.mark.parametrize(
    "args",
    [("config", "--check"), ("config", "--check", "--json"), ("config", "--check", "--worker")],
    ids=" ".join,
)
def test_config_check_into_a_closed_pipe_exits_0(args: tuple[str, ...]) -> None:
    # When the configuration table (or JSON) goes into a pipe whose reader left
    code, err = into_a_closed_pipe(*args)
    # Then it exits 0 without a word: it used to print a BrokenPipeError traceback and exit 1
    assert (code, err) == (0, "")


def test_config_check_still_exits_2_on_a_bad_settinginto_a_closed_pipe() -> None:
    code, err = into_a_closed_pipe("config", "--check", "--grpc-port", "70000")
    assert code == 2, err
    assert "CORRAL_GRPC_PORT" in err
