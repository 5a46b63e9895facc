"""TLS for the worker containers the docker autoscaler starts: the settings' rules and what is copied in."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from control.autoscale.docker_backend import TLS_DIR, tls_archive
from control.config import ConfigError, ControlConfig
from control.tls import ContainerTls
from tests.support.certs import Pki, make_pki

WORKER_TOKEN = "w" * 24


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def server(pki: Pki, mutual: bool = False) -> dict[str, str]:
    env = {"CORRAL_TLS_CERT": str(pki.server_cert), "CORRAL_TLS_KEY": str(pki.server_key)}
    return env | ({"CORRAL_TLS_CLIENT_CA": str(pki.ca)} if mutual else {})


def containers(pki: Pki, cert: bool = True) -> dict[str, str]:
    env = {"CORRAL_AUTOSCALE_TLS_CA": str(pki.ca)}
    return env | ({"CORRAL_AUTOSCALE_TLS_CERT": str(pki.worker_cert), "CORRAL_AUTOSCALE_TLS_KEY": str(pki.worker_key)}
                  if cert else {})  # fmt: skip


def config(env: dict[str, str]) -> ControlConfig:
    return ControlConfig.from_env({"CORRAL_WORKER_TOKEN": WORKER_TOKEN, **env})


def test_docker_mode_against_tls_needs_a_ca_for_the_containers(pki: Pki) -> None:
    with pytest.raises(ConfigError, match=r"^CORRAL_AUTOSCALE_TLS_CA must be set when CORRAL_TLS_CERT is"):
        config({"AUTOSCALE_MODE": "docker", **server(pki)})
    config({"AUTOSCALE_MODE": "docker", **server(pki), **containers(pki, cert=False)})
    config({"AUTOSCALE_MODE": "recommend", **server(pki)})  # starts no container: nothing to hand out


def test_docker_mode_against_mutual_tls_needs_a_client_certificate(pki: Pki) -> None:
    with pytest.raises(ConfigError, match=r"^CORRAL_AUTOSCALE_TLS_CERT and CORRAL_AUTOSCALE_TLS_KEY must be set"):
        config({"AUTOSCALE_MODE": "docker", **server(pki, mutual=True), **containers(pki, cert=False)})
    cfg = config({"AUTOSCALE_MODE": "docker", **server(pki, mutual=True), **containers(pki)})
    assert cfg.autoscale_tls_cert == str(pki.worker_cert)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"CORRAL_AUTOSCALE_TLS_KEY": ""},
            "CORRAL_AUTOSCALE_TLS_KEY must be set together with CORRAL_AUTOSCALE_TLS_CERT",
        ),
        ({"CORRAL_AUTOSCALE_TLS_CA": ""}, "CORRAL_AUTOSCALE_TLS_CERT needs CORRAL_AUTOSCALE_TLS_CA"),
        ({"CORRAL_AUTOSCALE_TLS_CA": "/nonexistent/ca.pem"}, "CORRAL_AUTOSCALE_TLS_CA must be a readable file"),
        ({"CORRAL_AUTOSCALE_TLS_CA": "{key}"}, "CORRAL_AUTOSCALE_TLS_CA must hold PEM CA certificates"),
        ({"CORRAL_AUTOSCALE_TLS_KEY": "{rogue_key}"}, "CORRAL_AUTOSCALE_TLS_KEY must be the unencrypted PEM private"),
    ],
)
def test_bad_container_tls_files_are_refused_by_name(pki: Pki, change: dict[str, str], message: str) -> None:
    env = {"AUTOSCALE_MODE": "docker", **server(pki, mutual=True), **containers(pki)}
    env |= {k: v.format(key=pki.worker_key, rogue_key=pki.rogue_key) for k, v in change.items()}
    with pytest.raises(ConfigError) as err:
        config(env)
    assert str(err.value).startswith(message)


def test_the_archive_holds_the_ca_and_the_client_pair_readable_by_any_user(pki: Pki) -> None:
    tls = ContainerTls.load(str(pki.ca), str(pki.worker_cert), str(pki.worker_key))
    with tarfile.open(fileobj=io.BytesIO(tls_archive(tls))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        folder = TLS_DIR.lstrip("/")
        assert set(members) == {folder, f"{folder}/ca.pem", f"{folder}/cert.pem", f"{folder}/key.pem"}
        assert members[folder].isdir()
        for name, path in (("ca.pem", pki.ca), ("cert.pem", pki.worker_cert), ("key.pem", pki.worker_key)):
            member = members[f"{folder}/{name}"]
            assert member.mode == 0o444
            extracted = tar.extractfile(member)
            assert extracted is not None and extracted.read() == Path(path).read_bytes()
    # Plain TLS: the CA alone.
    with tarfile.open(fileobj=io.BytesIO(tls_archive(ContainerTls.load(str(pki.ca))))) as tar:
        assert [m.name for m in tar.getmembers()] == [folder, f"{folder}/ca.pem"]
