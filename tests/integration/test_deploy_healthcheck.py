"""deploy/healthcheck.py (the images' HEALTHCHECK) against real control planes on 127.0.0.1, run as the
image runs it: ``python healthcheck.py control`` with the container's environment."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, ControlProc
from tests.support.certs import make_pki

HEALTHCHECK = ROOT / "deploy" / "healthcheck.py"


def run_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The check with only ``env`` (as in the container: no variable of this test run leaks in)."""
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), "control"], env=env, capture_output=True, text=True, timeout=30
    )


def test_a_control_plane_serving_https_is_healthy(
    make_control_plane: Callable[..., ControlProc], tmp_path: Path
) -> None:
    # Given a control plane with CORRAL_TLS_CERT: its HTTP port speaks HTTPS only
    pki = make_pki(tmp_path / "pki")
    tls = {"CORRAL_TLS_CERT": str(pki.server_cert), "CORRAL_TLS_KEY": str(pki.server_key)}
    cp = make_control_plane(**tls)

    # When the image's check runs with the same environment
    done = run_check({"CORRAL_HOST": "0.0.0.0", "CORRAL_HTTP_PORT": str(cp.http_port), **tls})

    # Then it is healthy: the check speaks HTTPS to it (liveness on loopback: the certificate, issued
    # for the service's name, is not what is checked)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"https://127.0.0.1:{cp.http_port}/healthz answered 200"


def test_a_plaintext_control_plane_is_still_checked_over_http(make_control_plane: Callable[..., ControlProc]) -> None:
    cp = make_control_plane()
    done = run_check({"CORRAL_HOST": "127.0.0.1", "CORRAL_HTTP_PORT": str(cp.http_port)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"http://127.0.0.1:{cp.http_port}/healthz answered 200"


def _healthcheck_module() -> Any:
    spec = importlib.util.spec_from_file_location("healthcheck", HEALTHCHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("cmdline", "found"),
    [
        # the image's entry point, with flags after the image name; the last of a flag wins, as in argparse
        (["tini", "--", "python", "-m", "control", "--http-port", "9000", "--host=0.0.0.0", "--http-port=9001"],
         {"CORRAL_HTTP_PORT": "9001", "CORRAL_HOST": "0.0.0.0"}),
        (["tini", "--", "python", "-m", "control", "--db", "--http-port"], {}),  # a flag's value, and one without
        (["tini", "--", "python", "-m", "worker", "--http-port", "9000"], {}),  # another module's process
        (["/sbin/init"], {}),  # not in such a container
    ],
)  # fmt: skip
def test_the_check_reads_the_flags_of_the_container_s_main_process(
    tmp_path: Path, cmdline: list[str], found: dict[str, str]
) -> None:
    # /proc/1/cmdline as the kernel gives it (NUL-separated), in a directory standing in for /proc: this
    # machine's own PID 1 is not a container's main process (the images' test runs the real one)
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
    check = _healthcheck_module()
    assert check.main_flags("control", check.CONTROL_FLAGS, tmp_path) == found
    assert check.main_flags("control", check.CONTROL_FLAGS, tmp_path / "none") == {}


def test_a_worker_s_control_addresses_may_be_a_list() -> None:
    check = _healthcheck_module()
    assert check.control_ports({"CORRAL_CONTROL_ADDR": "10.0.0.1:50051, [::1]:50052"}) == {50051, 50052}
    assert check.control_ports({}) == {50051}
    with pytest.raises(check.Unhealthy, match="HOST:PORT or a comma-separated list"):
        check.control_ports({"CORRAL_CONTROL_ADDR": "a:1,b"})
