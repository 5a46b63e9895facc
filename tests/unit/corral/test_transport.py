"""corral.transport: the gRPC transport default is set before grpc loads, and never over the user's."""

import os
import subprocess
import sys
from importlib import metadata

import pytest

from corral.transport import GRPC_EXPERIMENTS, MEASURED_ON

SHOW = "import os; print(os.environ.get('GRPC_EXPERIMENTS', '<unset>'))"


def run(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
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
