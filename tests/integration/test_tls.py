"""TLS and mutual TLS against a real control plane and real workers on 127.0.0.1, with certificates
made by the test (:mod:`tests.support.certs`).

- TLS: clients (Python, CLI) and workers that trust the CA work over gRPC, the REST bridge answers
  over HTTPS; plaintext and a client trusting another CA do not get through.
- Mutual TLS for workers: a worker with a certificate from the client CA registers on the worker port
  and runs jobs, while clients on the main port need no certificate. A certificate from another CA,
  a self-signed one or none fails the handshake; the worker stream on the main port (no certificate
  asked there) is refused with UNAUTHENTICATED.
- The loopback bridge mode works behind TLS; bad TLS settings stop start-up naming the variable.
"""

from __future__ import annotations

import http.client
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

import corral
from control.config import ConfigError, ControlConfig
from corral.v1 import workers_pb2, workers_pb2_grpc
from tests.conftest import ROOT, ControlProc, base_env, wait_until
from tests.integration.test_auth import logged_twice, token
from tests.support.certs import Pki, make_pki
from worker.config import ConfigError as WorkerConfigError
from worker.config import WorkerConfig


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def tls_env(pki: Pki) -> dict[str, str]:
    return {"CORRAL_TLS_CERT": str(pki.server_cert), "CORRAL_TLS_KEY": str(pki.server_key)}


def https(port: int, path: str, ca: Path, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_clients_workers_and_rest_speak_tls(make_control_plane: Any, spawn_worker: Any, pki: Pki) -> None:
    cp = make_control_plane(**tls_env(pki))
    cp.tls_ca = pki.ca
    spawn_worker(cp, env={"CORRAL_TLS_CA": str(pki.ca)})  # waits until registered, over TLS

    with corral.Client(cp.address, tls_ca=pki.ca) as client:
        job = client.submit("add_numbers", {"a": 2, "b": 3})
        assert client.wait(job.id, timeout=30).result == {"sum": 5}
    # Plaintext, or TLS trusting another CA, does not get through.
    for ca in (None, pki.rogue_ca):
        with corral.Client(cp.address, timeout=5, tls_ca=ca) as client, pytest.raises(corral.Unavailable):
            client.stats()
    cli = subprocess.run(
        [sys.executable, "-m", "corral.cli", "stats", "--json", "--control", cp.address],
        cwd=ROOT, env=base_env({"CORRAL_TLS_CA": str(pki.ca)}), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr

    # The REST bridge, health and metrics answer over HTTPS, and only over HTTPS.
    status, body = https(cp.http_port, "/v1/stats", pki.ca)
    assert status == 200 and b"workers" in body
    assert https(cp.http_port, "/healthz", pki.ca)[0] == 200
    with pytest.raises(ssl.SSLError):
        https(cp.http_port, "/healthz", pki.rogue_ca)
    plain = http.client.HTTPConnection("127.0.0.1", cp.http_port, timeout=10)
    with pytest.raises((http.client.HTTPException, OSError)):
        plain.request("GET", "/healthz")
        plain.getresponse()
    plain.close()


@dataclass
class Mutual:
    """A control plane with client tokens, a worker token and mutual TLS for workers."""

    cp: ControlProc
    pki: Pki
    worker_token: str

    @property
    def worker_address(self) -> str:
        return f"127.0.0.1:{self.cp.worker_port}"

    def connect(self, address: str, cert: Path | None, key: Path | None, worker_token: str | None) -> Any:
        """Open a worker stream as a raw client; returns the first message or the RpcError."""
        credentials = grpc.ssl_channel_credentials(
            self.pki.ca.read_bytes(), key.read_bytes() if key else None, cert.read_bytes() if cert else None
        )
        metadata = (("authorization", f"Bearer {worker_token}"),) if worker_token else None
        hello = workers_pb2.WorkerMessage(register=workers_pb2.Register(worker_id="probe", threads=1, slots=1))
        with grpc.secure_channel(address, credentials) as channel:
            call = workers_pb2_grpc.WorkerServiceStub(channel).Connect(iter([hello]), metadata=metadata, timeout=10)
            try:
                return next(call)
            except grpc.RpcError as err:
                return err
            finally:
                call.cancel()


@pytest.fixture
def mutual(make_control_plane: Any, pki: Pki) -> Mutual:
    worker_token = token()
    cp = make_control_plane(
        **tls_env(pki),
        CORRAL_TLS_CLIENT_CA=str(pki.ca),
        CORRAL_WORKER_PORT="0",
        CORRAL_AUTH_TOKENS=(client := token()),
        CORRAL_WORKER_TOKEN=worker_token,
    )
    cp.tls_ca, cp.token = pki.ca, client
    assert cp.worker_port not in (0, cp.port)
    return Mutual(cp, pki, worker_token)


def worker_env(pki: Pki, cert: Path, key: Path, worker_token: str) -> dict[str, str]:
    return {
        "CORRAL_TLS_CA": str(pki.ca),
        "CORRAL_WORKER_TLS_CERT": str(cert),
        "CORRAL_WORKER_TLS_KEY": str(key),
        "CORRAL_WORKER_TOKEN": worker_token,
    }


def test_a_worker_with_a_good_certificate_registers_and_runs_jobs(mutual: Mutual, spawn_worker: Any) -> None:
    pki, cp = mutual.pki, mutual.cp
    env = worker_env(pki, pki.worker_cert, pki.worker_key, mutual.worker_token)
    worker = spawn_worker(cp, env=env, address=mutual.worker_address)
    # Clients use the main port with a token and no certificate.
    with corral.Client(cp.address, tls_ca=pki.ca, token=cp.token) as client:
        job = client.submit("add_numbers", {"a": 20, "b": 22})
        done = client.wait(job.id, timeout=30)
        assert done.result == {"sum": 42} and done.worker_id == worker.worker_id


def test_other_certificates_fail_the_handshake_and_the_main_port_refuses_workers(
    mutual: Mutual, spawn_worker: Any
) -> None:
    pki, cp, address = mutual.pki, mutual.cp, mutual.worker_address
    # Given the right certificate and token, the raw stream is registered (the baseline the rest breaks).
    first = mutual.connect(address, pki.worker_cert, pki.worker_key, mutual.worker_token)
    assert isinstance(first, workers_pb2.ControlMessage) and first.HasField("registered")

    for name, cert, key in (
        ("signed by another CA", pki.rogue_cert, pki.rogue_key),
        ("self-signed", pki.self_cert, pki.self_key),
        ("no certificate", None, None),
    ):
        err = mutual.connect(address, cert, key, mutual.worker_token)
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.UNAVAILABLE, name  # type: ignore[attr-defined]

    # A good certificate without the worker token is not enough.
    err = mutual.connect(address, pki.worker_cert, pki.worker_key, None)
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    # The main port asks for no certificate, so the worker stream is refused there even with the token.
    err = mutual.connect(cp.address, None, None, mutual.worker_token)
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    assert "client certificate" in err.details()  # type: ignore[attr-defined]

    # A worker process with a certificate from another CA keeps failing and never registers.
    rogue = spawn_worker(
        cp, env=worker_env(pki, pki.rogue_cert, pki.rogue_key, mutual.worker_token), address=address, wait=False
    )
    wait_until(logged_twice(rogue.log, "UNAVAILABLE"), 20, what="the rogue worker to fail twice")
    assert rogue.worker_id not in {w.id for w in cp.workers()}


def test_a_certificate_alone_admits_workers_when_there_is_no_worker_token(
    make_control_plane: Any, spawn_worker: Any, pki: Pki
) -> None:
    cp = make_control_plane(
        **tls_env(pki), CORRAL_TLS_CLIENT_CA=str(pki.ca), CORRAL_WORKER_PORT="0", CORRAL_AUTH_TOKENS=token()
    )
    cp.tls_ca, cp.token = pki.ca, cp.env["CORRAL_AUTH_TOKENS"]
    env = {"CORRAL_TLS_CA": str(pki.ca), "CORRAL_WORKER_TLS_CERT": str(pki.worker_cert)}
    env["CORRAL_WORKER_TLS_KEY"] = str(pki.worker_key)
    spawn_worker(cp, env=env, address=f"127.0.0.1:{cp.worker_port}")


def test_the_loopback_bridge_works_behind_tls(make_control_plane: Any, spawn_worker: Any, pki: Pki) -> None:
    client, worker_token = token(), token()
    cp = make_control_plane(
        **tls_env(pki), CORRAL_GATEWAY_MODE="loopback", CORRAL_AUTH_TOKENS=client, CORRAL_WORKER_TOKEN=worker_token
    )
    cp.tls_ca, cp.token = pki.ca, client
    spawn_worker(cp, env={"CORRAL_TLS_CA": str(pki.ca), "CORRAL_WORKER_TOKEN": worker_token})
    status, body = https(cp.http_port, "/v1/workers", pki.ca, {"Authorization": f"Bearer {client}"})
    assert status == 200 and b"workers" in body
    assert https(cp.http_port, "/v1/workers", pki.ca)[0] == 401


def test_bad_tls_settings_are_refused_naming_the_variable(pki: Pki, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cert, key = str(pki.server_cert), str(pki.server_key)
    cases: list[tuple[dict[str, str], str]] = [
        ({"CORRAL_TLS_CERT": cert}, "CORRAL_TLS_KEY must be set together with CORRAL_TLS_CERT"),
        ({"CORRAL_TLS_KEY": key}, "CORRAL_TLS_CERT must be set together with CORRAL_TLS_KEY"),
        ({"CORRAL_TLS_CLIENT_CA": str(pki.ca)}, "CORRAL_TLS_CLIENT_CA needs CORRAL_TLS_CERT and CORRAL_TLS_KEY"),
        ({"CORRAL_TLS_CERT": "/nonexistent.pem", "CORRAL_TLS_KEY": key}, "CORRAL_TLS_CERT must be a readable file"),
        ({"CORRAL_TLS_CERT": str(garbage), "CORRAL_TLS_KEY": key}, "CORRAL_TLS_CERT must hold PEM certificates"),
        (
            {"CORRAL_TLS_CERT": cert, "CORRAL_TLS_KEY": str(pki.worker_key)},
            "CORRAL_TLS_KEY must be the unencrypted PEM private key of CORRAL_TLS_CERT",
        ),
        (
            {"CORRAL_TLS_CERT": cert, "CORRAL_TLS_KEY": key, "CORRAL_TLS_CLIENT_CA": str(garbage)},
            "CORRAL_TLS_CLIENT_CA must hold PEM CA certificates",
        ),
        (
            {"CORRAL_TLS_CERT": cert, "CORRAL_TLS_KEY": key, "CORRAL_TLS_CLIENT_CA": str(pki.ca)},
            "CORRAL_WORKER_PORT must differ from CORRAL_GRPC_PORT",
        ),
    ]
    for env, message in cases:
        with pytest.raises(ConfigError, match="^" + message):
            ControlConfig.from_env({**env, "CORRAL_WORKER_PORT": env.get("CORRAL_WORKER_PORT", "50051")})

    with pytest.raises(WorkerConfigError, match="CORRAL_WORKER_TLS_KEY must be set together with"):
        WorkerConfig.from_env({"CORRAL_WORKER_TLS_CERT": str(pki.worker_cert)})
    with pytest.raises(WorkerConfigError, match="CORRAL_TLS_CA must be a readable file"):
        WorkerConfig.from_env({"CORRAL_TLS_CA": "/nonexistent.pem"})
    done = subprocess.run(
        [sys.executable, "-m", "worker", "--tls-cert", str(pki.worker_cert)],
        cwd=ROOT, env=base_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "CORRAL_WORKER_TLS_KEY must be set together" in done.stderr
