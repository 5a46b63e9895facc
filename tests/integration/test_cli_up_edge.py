"""`corral up` at its edges, as real processes on 127.0.0.1: a control plane with no workers, a host it cannot
listen on, and a Ctrl-C that comes while the workers are still starting."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral as corral_client
from corral.errors import CorralError
from tests.conftest import wait_until
from tests.integration.test_cli import Up, _descendants
from tests.support.ports import free_port

MakeUp = Callable[..., Up]


@pytest.fixture
def make_up(tmp_path: Path) -> Iterator[MakeUp]:
    """Start `corral up` processes (:class:`Up`); whatever is left of them is killed after the test."""
    made: list[Up] = []

    def make(*args: str, env: dict[str, str] | None = None) -> Up:
        made.append(Up(tmp_path, *args, env=env))
        return made[-1]

    yield make
    for up in made:
        up.kill_all()


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_up_with_no_workers_serves_a_control_plane_alone(tmp_path: Path, make_up: MakeUp) -> None:
    # Given corral up asked for a control plane alone (its workers run elsewhere)
    up = make_up("--grpc-port", "0", "--http-port", "0", "--workers", "0", "--db", str(tmp_path / "c.db"))
    # Then it serves, instead of failing with a traceback (ZeroDivisionError sharing the GPUs among 0 workers)
    address = up.wait_up()
    with corral_client.Client(address, timeout=10) as client:
        assert client.workers() == []
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0, up.err.read_text()
    assert "Traceback" not in up.err.read_text()


def test_up_on_a_host_it_cannot_listen_on_is_one_line_not_a_traceback(tmp_path: Path, make_up: MakeUp) -> None:
    # Given a --host that is no address of this machine (RFC 5737's documentation range: nothing is sent
    # there, the bind fails at once) and --http-port 0, whose free port corral up looks for itself
    up = make_up("--host", "192.0.2.1", "--grpc-port", "0", "--http-port", "0", "--db", str(tmp_path / "c.db"))
    # Then it says so in one line and exits 2, as for the other settings it refuses before starting anything
    assert up.proc.wait(60) == 2
    err = up.err.read_text()
    assert "Traceback" not in err, err
    assert err.strip() == (
        "corral: error: cannot listen on '192.0.2.1': Cannot assign requested address (is it an address of this machine?)"
    ), err


def test_a_ctrl_c_while_the_workers_start_stops_without_saying_up_or_timed_out(tmp_path: Path, make_up: MakeUp) -> None:
    # Given corral up whose worker takes a minute to start (a plug-in slow to import) ...
    port = free_port()
    env = {"CORRAL_WORKER_IMPORTS": "tests.support.plugin_slow", "CORRAL_TEST_IMPORT_SEC": "60"}
    args = ("--grpc-port", str(port), "--http-port", "0", "--workers", "1", "--db", str(tmp_path / "c.db"))
    up = make_up(*args, "--ready-timeout", "120", env=env)

    def serving_with_a_worker_starting() -> bool:
        try:
            with corral_client.Client(f"127.0.0.1:{port}", timeout=2) as client:
                client.workers()
        except CorralError:
            return False
        return any(" -m worker " in _cmdline(pid) for pid in _descendants(up.proc.pid))

    wait_until(serving_with_a_worker_starting, 60, what="the control plane serving and its worker starting")
    # ... when Ctrl-C comes before the worker registered
    up.proc.send_signal(signal.SIGINT)
    # Then it stops cleanly, and says neither that it is up nor that the workers did not register in time
    assert up.proc.wait(60) == 0
    out, err = up.text(), up.err.read_text()
    assert "Corral is up" not in out, out
    assert "not every worker registered" not in err, err
    assert "Stopped." in out, out
