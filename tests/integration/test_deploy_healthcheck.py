"""deploy/healthcheck.py (the images' HEALTHCHECK) against real control planes on 127.0.0.1, run as the
image runs it: ``python healthcheck.py control`` with the container's environment."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

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
