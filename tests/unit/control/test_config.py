"""Configuration: defaults, environment names, and errors that name the variable."""

from pathlib import Path

import pytest

from control.config import ConfigError, ControlConfig
from tests.support.certs import make_pki


def test_defaults() -> None:
    c = ControlConfig.from_env({})
    assert (c.grpc_port, c.http_port, c.heartbeat_timeout_sec, c.backoff_cap_sec) == (50051, 8080, 10.0, 300.0)


def test_environment_and_flags() -> None:
    c = ControlConfig.from_env({"WORKER_HEARTBEAT_TIMEOUT_SEC": "3", "CORRAL_GRPC_PORT": "1"}, grpc_port=2)
    assert (c.heartbeat_timeout_sec, c.grpc_port) == (3.0, 2)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"WORKER_HEARTBEAT_TIMEOUT_SEC": "-1"},
            "WORKER_HEARTBEAT_TIMEOUT_SEC must be > CORRAL_HEARTBEAT_INTERVAL_SEC",
        ),
        ({"WORKER_HEARTBEAT_TIMEOUT_SEC": "abc"}, "WORKER_HEARTBEAT_TIMEOUT_SEC must be a number"),
        ({"CORRAL_GRPC_PORT": "70000"}, "CORRAL_GRPC_PORT must be 0..65535"),
        ({"CORRAL_BACKOFF_BASE_SEC": "10", "CORRAL_BACKOFF_CAP_SEC": "5"}, "CORRAL_BACKOFF_CAP_SEC must be >="),
        ({"CORRAL_SELECTION": "random"}, "CORRAL_SELECTION must be round_robin, lru or least_loaded"),
        ({"CORRAL_DB_SYNC": "sometimes"}, "CORRAL_DB_SYNC must be normal or full"),
        ({"CORRAL_JOB_RETENTION_SEC": "-1"}, "CORRAL_JOB_RETENTION_SEC must be >= 0"),
        ({"CORRAL_PRIORITY_AGING_SEC": "-5"}, r"CORRAL_PRIORITY_AGING_SEC must be >= 0 \(0: no aging\), got -5"),
        ({"CORRAL_PRIORITY_AGING_SEC": "nan"}, "CORRAL_PRIORITY_AGING_SEC must be a finite number"),
        (
            {"CORRAL_FAIR_SHARE": "on", "CORRAL_FAIR_SHARE_HALF_LIFE_SEC": "-60"},
            r"CORRAL_FAIR_SHARE_HALF_LIFE_SEC must be >= 0 \(0: off\), got -60",
        ),
        ({"CORRAL_FAIR_SHARE_HALF_LIFE_SEC": "an hour"}, "CORRAL_FAIR_SHARE_HALF_LIFE_SEC must be a number"),
        ({"CORRAL_FAIR_SHARE_HALF_LIFE_SEC": "3600"}, "CORRAL_FAIR_SHARE_HALF_LIFE_SEC needs CORRAL_FAIR_SHARE=on"),
        (
            {"CORRAL_NOTIFY_WEBHOOK_SECRET": "short"},
            r"CORRAL_NOTIFY_WEBHOOK_SECRET must be 16..1024 characters, or empty for unsigned webhooks, got '5 char",
        ),
        (
            {"CORRAL_FAILED_RETENTION_SEC": "3600"},
            r"CORRAL_FAILED_RETENTION_SEC must be 0 or at least IDEMPOTENCY_TTL_SEC \(86400\)",
        ),
    ],
)
def test_bad_values_name_the_variable_and_rule(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ControlConfig.from_env(env)


_TOKENS = {"CORRAL_AUTH_TOKENS": "alice:" + "a" * 20, "CORRAL_WORKER_TOKEN": "w" * 20}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({**_TOKENS, "CORRAL_JOB_VISIBILITY": "team"}, "CORRAL_JOB_VISIBILITY must be all, group or owner"),
        ({"CORRAL_JOB_VISIBILITY": "owner"}, "CORRAL_JOB_VISIBILITY=owner needs client tokens"),
        ({**_TOKENS, "CORRAL_AUTH_ADMINS": "alice"}, "CORRAL_AUTH_ADMINS needs CORRAL_JOB_VISIBILITY=owner"),
        (
            {**_TOKENS, "CORRAL_JOB_VISIBILITY": "owner", "CORRAL_AUTH_ADMINS": "alice,mallory"},
            "CORRAL_AUTH_ADMINS: 'mallory' is not the name of any client token",
        ),
        ({**_TOKENS, "CORRAL_JOB_VISIBILITY": "group"}, "CORRAL_JOB_VISIBILITY=group needs CORRAL_GROUPS"),
        ({**_TOKENS, "CORRAL_GROUPS": "physics=alice,mallory"}, "CORRAL_GROUPS: 'mallory' is not the name"),
        ({**_TOKENS, "CORRAL_GROUPS": "physics"}, "CORRAL_GROUPS: 'physics': each group is NAME=MEMBER"),
    ],
)
def test_bad_isolation_settings_name_the_variable_and_rule(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ControlConfig.from_env(env)


def test_isolation_settings_are_read() -> None:
    c = ControlConfig.from_env({**_TOKENS, "CORRAL_JOB_VISIBILITY": "Owner", "CORRAL_AUTH_ADMINS": " alice ,"})
    assert (c.job_visibility, c.auth_admins) == ("owner", ("alice",))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"CORRAL_WORKER_NETWORK": "bridge"},
            r"^CORRAL_AUTOSCALE_CONTROL_ADDRESS must be set when CORRAL_WORKER_NETWORK is not host and"
            r" AUTOSCALE_MODE=docker: the default, 127\.0\.0\.1 \(from CORRAL_HOST\), is the container's own"
            r" loopback inside its network, got CORRAL_WORKER_NETWORK='bridge'$",
        ),
        ({"CORRAL_WORKER_NETWORK": "corral-net", "CORRAL_HOST": "0.0.0.0"}, "^CORRAL_AUTOSCALE_CONTROL_ADDRESS must"),
        ({"CORRAL_WORKER_NETWORK": "container:sidecar", "CORRAL_HOST": "::1"}, r"the default, ::1 \(from"),
        ({"CORRAL_WORKER_NETWORK": "none", "CORRAL_HOST": "localhost"}, "^CORRAL_AUTOSCALE_CONTROL_ADDRESS must"),
    ],
)
def test_docker_mode_off_the_host_network_needs_an_address_the_containers_reach(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        ControlConfig.from_env({"AUTOSCALE_MODE": "docker", **env})


@pytest.mark.parametrize(
    "env",
    [
        {
            "AUTOSCALE_MODE": "docker",
            "CORRAL_WORKER_NETWORK": "bridge",
            "CORRAL_AUTOSCALE_CONTROL_ADDRESS": "10.0.0.5:1",
        },
        {"AUTOSCALE_MODE": "docker", "CORRAL_WORKER_NETWORK": "bridge", "CORRAL_HOST": "10.0.0.5"},
        {"AUTOSCALE_MODE": "docker", "CORRAL_WORKER_NETWORK": "host"},
        {"AUTOSCALE_MODE": "recommend", "CORRAL_WORKER_NETWORK": "bridge"},  # starts no container
    ],
)
def test_worker_networks_the_containers_can_dial_from_are_accepted(env: dict[str, str]) -> None:
    ControlConfig.from_env(env)


def test_docker_mode_refuses_a_ca_for_the_containers_when_the_control_plane_speaks_plaintext(tmp_path: Path) -> None:
    ca = str(make_pki(tmp_path).ca)
    with pytest.raises(ConfigError) as err:
        ControlConfig.from_env({"AUTOSCALE_MODE": "docker", "CORRAL_AUTOSCALE_TLS_CA": ca})
    assert str(err.value) == (
        "CORRAL_AUTOSCALE_TLS_CA needs CORRAL_TLS_CERT when AUTOSCALE_MODE=docker: without it the control plane"
        " speaks plaintext, and worker containers given a CA would try TLS against it"
    )
    ControlConfig.from_env({"AUTOSCALE_MODE": "recommend", "CORRAL_AUTOSCALE_TLS_CA": ca})  # starts no container


def test_unset_retention_follows_a_longer_key_ttl_and_a_set_one_is_checked() -> None:
    # Given a key TTL longer than the default retention of finished jobs (7 days; FAILED 14)
    ttl = {"IDEMPOTENCY_TTL_SEC": str(20 * 86_400)}
    # Then retention left unset keeps jobs at least as long as their keys (a release before retention
    # accepted this TTL, and an upgrade must not stop on a setting the operator never made)
    config = ControlConfig.from_env(ttl)
    assert (config.job_retention_sec, config.failed_retention_sec) == (20 * 86_400, 20 * 86_400)
    # and a shorter TTL leaves the defaults as they are
    assert ControlConfig.from_env({"IDEMPOTENCY_TTL_SEC": "3600"}).job_retention_sec == 7 * 86_400
    # But a retention set shorter than the TTL is still refused, by its own name
    with pytest.raises(ConfigError, match=r"CORRAL_JOB_RETENTION_SEC must be 0 or at least IDEMPOTENCY_TTL_SEC"):
        ControlConfig.from_env({**ttl, "CORRAL_JOB_RETENTION_SEC": str(7 * 86_400)})
