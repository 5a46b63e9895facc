"""corral.transport: the gRPC transport default is set before grpc loads, and never over the user's; addresses."""

import os
import subprocess
import sys
from importlib import metadata

import pytest

from corral.transport import BACKUP_POLL_MS, GRPC_EXPERIMENTS, MEASURED_ON, host_port, loopback

SHOW = "import os; print(os.environ.get('GRPC_EXPERIMENTS', '<unset>'))"
POLL = "GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS"
SHOW_POLL = f"import os; print(os.environ.get('{POLL}', '<unset>'))"


def run(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("GRPC_EXPERIMENTS", POLL)}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, check=True)
    return out.stdout.strip()


MEASURED = metadata.version("grpcio").startswith(MEASURED_ON)


@pytest.mark.parametrize("first", ["corral", "control", "worker"])
def test_importing_a_corral_package_first_sets_the_default(first: str) -> None:
    # On a grpcio release the setting was not measured on, gRPC's own defaults stay.
    assert run(f"import {first}; {SHOW}") == (GRPC_EXPERIMENTS if MEASURED else "<unset>")


def test_a_value_already_set_wins_even_an_empty_one() -> None:
    assert run(f"import corral; {SHOW}", GRPC_EXPERIMENTS="-event_engine_dns") == "-event_engine_dns"
    assert run(f"import corral; {SHOW}", GRPC_EXPERIMENTS="") == ""


def test_grpc_loaded_first_keeps_grpc_defaults() -> None:
    # gRPC has read its settings by then: setting the variable would only mislead.
    assert run(f"import grpc; import corral; {SHOW}") == "<unset>"


def test_the_backup_poll_interval_comes_with_the_experiments_and_never_over_the_users() -> None:
    assert run(f"import corral; {SHOW_POLL}") == (BACKUP_POLL_MS if MEASURED else "<unset>")
    assert run(f"import corral; {SHOW_POLL}", **{POLL: "5000"}) == "5000"
    # The user's own experiments mean gRPC's defaults were chosen: the interval is left alone too.
    assert run(f"import corral; {SHOW_POLL}", GRPC_EXPERIMENTS="") == "<unset>"


def test_the_grpcio_release_is_read_without_loading_grpc_and_as_its_metadata_says() -> None:
    code = "import sys, corral.transport as t; print(t._grpcio_version(), 'grpc' in sys.modules)"
    assert run(code, GRPC_EXPERIMENTS="") == f"{metadata.version('grpcio')} False"


@pytest.mark.parametrize(
    ("host", "port", "address"),
    [
        ("127.0.0.1", 50051, "127.0.0.1:50051"),
        ("localhost", 1, "localhost:1"),
        ("::1", 50051, "[::1]:50051"),
        ("[::1]", 50051, "[::1]:50051"),
        ("fe80::1%lo", 8080, "[fe80::1%lo]:8080"),
    ],
)
def test_host_port_brackets_ipv6_literals(host: str, port: int, address: str) -> None:
    assert host_port(host, port) == address


@pytest.mark.parametrize(
    ("bound", "reach"),
    [
        ("0.0.0.0", "127.0.0.1"),
        ("", "127.0.0.1"),
        ("::", "::1"),
        ("[::]", "::1"),
        ("::1", "::1"),
        ("10.1.2.3", "10.1.2.3"),
    ],
)
def test_loopback_reaches_a_wildcard_bind_on_this_machine(bound: str, reach: str) -> None:
    assert loopback(bound) == reach
