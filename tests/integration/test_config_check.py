"""Configuration as the processes see it: ``corral config --check`` prints every setting (variable,
value, where it came from) or the first error, and every bad value stops ``python -m control`` /
``python -m worker`` at start-up with a message naming the variable and the rule, before anything is
written."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from control.config import _ENV, ControlConfig
from corral.cli.config_check import MASK, env_names
from tests.conftest import ROOT, base_env
from tests.support.cli import CORRAL
from worker.config import WorkerConfig

TOKEN = "client-token-0123456789abcdef"
WORKER_TOKEN = "worker-token-0123456789abcdef"


def run(argv: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v for k, v in base_env().items() if k not in _ENV.values() and k not in env_names(WorkerConfig).values()
    }
    return subprocess.run(
        argv, cwd=cwd, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=60, check=False
    )


def check_json(*args: str, env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """``corral config --check --json ARGS``: field -> {env, value, source}."""
    done = run([*CORRAL, "config", "--check", "--json", *args], env)
    assert done.returncode == 0, done.stderr
    return {s["field"]: s for s in json.loads(done.stdout)}


# ---- corral config --check -------------------------------------------------------------------------
def test_every_setting_is_printed_with_its_variable_value_and_default_source() -> None:
    done = run([*CORRAL, "config", "--check"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "configuration OK"
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()[1:-1]}
    # every field of the dataclass, so settings added later show up with no more work
    assert list(rows) == [f.name for f in dataclasses.fields(ControlConfig)]
    assert rows["grpc_port"] == ["grpc_port", "CORRAL_GRPC_PORT", "50051", "default"]
    assert rows["idempotency_ttl_sec"] == ["idempotency_ttl_sec", "IDEMPOTENCY_TTL_SEC", "86400", "default"]
    assert all(row[-1] == "default" for row in rows.values())


def test_the_variables_are_the_ones_the_config_reads() -> None:
    # The check reads each variable from its field's docstring; it must be the one from_env reads.
    assert env_names(ControlConfig) == _ENV


def test_sources_are_default_env_and_flag_and_secrets_are_masked() -> None:
    env = {
        "CORRAL_SELECTION": "lru",
        "CORRAL_GRPC_PORT": "7000",  # a flag beats the variable
        "CORRAL_AUTH_TOKENS": f"ci:{TOKEN}",
        "CORRAL_WORKER_TOKEN": WORKER_TOKEN,
    }
    got = check_json("--grpc-port", "9000", "--idempotency-ttl-sec", "60", env=env)
    assert got["selection"] == {"field": "selection", "env": "CORRAL_SELECTION", "value": "lru", "source": "env"}
    assert (got["grpc_port"]["value"], got["grpc_port"]["source"]) == ("9000", "flag")
    assert (got["idempotency_ttl_sec"]["value"], got["idempotency_ttl_sec"]["source"]) == ("60", "flag")
    assert (got["http_port"]["value"], got["http_port"]["source"]) == ("8080", "default")
    assert got["auth_tokens"]["value"] == MASK and got["worker_token"]["value"] == MASK
    assert TOKEN not in json.dumps(got) and WORKER_TOKEN not in json.dumps(got)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:s3cret-pw@127.0.0.1/db", "postgresql://u:***@127.0.0.1/db"),
        ("postgres://127.0.0.1/db?user=u&password=s3cret-pw&sslmode=disable",
         "postgres://127.0.0.1/db?user=u&password=***&sslmode=disable"),
    ],
)  # fmt: skip
def test_a_store_url_is_shown_without_its_password(url: str, shown: str) -> None:
    # The password in CORRAL_DB was printed as given (logs and start-up errors hid it)
    for args, env in (([], {"CORRAL_DB": url}), (["--db", url], {})):
        got = check_json(*args, env=env)
        assert got["db"]["value"] == shown
        done = run([*CORRAL, "config", "--check", *args], env)
        assert done.returncode == 0 and "s3cret-pw" not in done.stdout + done.stderr, done.stdout


def test_whole_numbers_of_seconds_print_whole() -> None:
    got = check_json(env={"IDEMPOTENCY_TTL_SEC": "1209600"})
    assert got["idempotency_ttl_sec"]["value"] == "1209600"  # was 1.2096e+06
    assert got["job_retention_sec"]["value"] == "1209600"


def test_a_bad_value_prints_the_first_error_and_exits_2() -> None:
    done = run([*CORRAL, "config", "--check"], {"CORRAL_GRPC_PORT": "70000", "CORRAL_MAX_BATCH": "0"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "configuration error: CORRAL_GRPC_PORT must be 0..65535, got 70000"
    done = run([*CORRAL, "config", "--check", "--max-batch", "0"])
    assert done.returncode == 2 and "CORRAL_MAX_BATCH must be >= 1, got 0" in done.stderr


def test_worker_settings_are_checked_with_worker() -> None:
    got = check_json("--worker", "--threads", "3", "--kill-grace-sec", "0.5", env={"CORRAL_WORKER_SLOTS": "2"})
    assert list(got) == [f.name for f in dataclasses.fields(WorkerConfig)]
    assert (got["threads"]["value"], got["threads"]["source"]) == ("3", "flag")
    assert (got["kill_grace_sec"]["value"], got["kill_grace_sec"]["source"]) == ("0.5", "flag")
    assert (got["slots"]["env"], got["slots"]["value"], got["slots"]["source"]) == ("CORRAL_WORKER_SLOTS", "2", "env")
    assert got["log_format"] == {
        "field": "log_format",
        "env": "CORRAL_LOG_FORMAT",
        "value": "json",
        "source": "default",
    }
    done = run([*CORRAL, "config", "--check", "--worker", "--log-format", "xml"])
    assert done.returncode == 2 and "CORRAL_LOG_FORMAT must be json or logfmt, got 'xml'" in done.stderr


# ---- bad values stop start-up ----------------------------------------------------------------------
CONTROL_BAD: list[tuple[dict[str, str], list[str], str]] = [
    ({"CORRAL_GRPC_PORT": "70000"}, [], "CORRAL_GRPC_PORT must be 0..65535, got 70000"),
    ({"CORRAL_HTTP_PORT": "-1"}, [], "CORRAL_HTTP_PORT must be 0..65535, got -1"),
    ({}, ["--http-port", "65536"], "CORRAL_HTTP_PORT must be 0..65535, got 65536"),
    ({"CORRAL_WORKER_PORT": "99999"}, [], "CORRAL_WORKER_PORT must be 0..65535, got 99999"),
    ({"CORRAL_GRPC_PORT": "grpc"}, [], "CORRAL_GRPC_PORT must be an integer, got 'grpc'"),
    ({"CORRAL_HEARTBEAT_INTERVAL_SEC": "0"}, [], "CORRAL_HEARTBEAT_INTERVAL_SEC must be > 0, got 0.0"),
    ({"CORRAL_HEARTBEAT_INTERVAL_SEC": "nan"}, [], "CORRAL_HEARTBEAT_INTERVAL_SEC must be a finite number, got 'nan'"),
    (
        {"CORRAL_HEARTBEAT_INTERVAL_SEC": "2", "WORKER_HEARTBEAT_TIMEOUT_SEC": "1"},
        [],
        "WORKER_HEARTBEAT_TIMEOUT_SEC must be > CORRAL_HEARTBEAT_INTERVAL_SEC (2), got 1.0",
    ),
    ({"IDEMPOTENCY_TTL_SEC": "-5"}, [], "IDEMPOTENCY_TTL_SEC must be > 0, got -5.0"),
    ({"IDEMPOTENCY_TTL_SEC": "NaN"}, [], "IDEMPOTENCY_TTL_SEC must be a finite number, got 'NaN'"),
    ({}, ["--idempotency-ttl-sec", "0"], "IDEMPOTENCY_TTL_SEC must be > 0, got 0.0"),
    ({"CORRAL_LEASE_GRACE_SEC": "inf"}, [], "CORRAL_LEASE_GRACE_SEC must be a finite number, got 'inf'"),
    ({"CORRAL_DEFAULT_TIMEOUT_SEC": "0"}, [], "CORRAL_DEFAULT_TIMEOUT_SEC must be > 0, got 0.0"),
    ({"CORRAL_MAX_BATCH": "0"}, [], "CORRAL_MAX_BATCH must be >= 1, got 0"),
    ({"CORRAL_DEFAULT_MAX_ATTEMPTS": "1.5"}, [], "CORRAL_DEFAULT_MAX_ATTEMPTS must be an integer, got '1.5'"),
    ({"CORRAL_BACKOFF_BASE_SEC": "ten"}, [], "CORRAL_BACKOFF_BASE_SEC must be a number, got 'ten'"),
    ({"RATE_LIMIT_JOBS_PER_MIN": "-1"}, [], "RATE_LIMIT_JOBS_PER_MIN must be >= 0, got -1.0"),
    ({"CORRAL_DB_SYNC": "sometimes"}, [], "CORRAL_DB_SYNC must be normal or full, got 'sometimes'"),
    ({"CORRAL_SELECTION": "random"}, [], "CORRAL_SELECTION must be round_robin, lru or least_loaded, got 'random'"),
    ({"CORRAL_GATEWAY_MODE": "proxy"}, [], "CORRAL_GATEWAY_MODE must be inprocess or loopback, got 'proxy'"),
    ({"CORRAL_LOG_FORMAT": "xml"}, [], "CORRAL_LOG_FORMAT must be json or logfmt, got 'xml'"),
    ({"CORRAL_EVENT_LOOP": "trio"}, [], "CORRAL_EVENT_LOOP must be uvloop or asyncio, got 'trio'"),
    ({}, ["--log-level", "loud"], "CORRAL_LOG_LEVEL must be debug, info, warning or error, got 'loud'"),
    ({"AUTOSCALE_MODE": "maybe"}, [], "AUTOSCALE_MODE must be off, recommend or docker, got 'maybe'"),
    ({"MIN_WORKERS": "5", "MAX_WORKERS": "3"}, [], "MAX_WORKERS must be >= 1 and >= MIN_WORKERS (5), got 3"),
    (
        {"QUEUE_THRESHOLD_HIGH": "10", "QUEUE_THRESHOLD_LOW": "10"},
        [],
        "QUEUE_THRESHOLD_LOW must be >= 0 and < QUEUE_THRESHOLD_HIGH (10), got 10",
    ),
    (
        {"CORRAL_TLS_CERT": "/no/such/cert.pem", "CORRAL_TLS_KEY": "/no/such/key.pem"},
        [],
        "CORRAL_TLS_CERT must be a readable file, got '/no/such/cert.pem'",
    ),
]


@pytest.mark.parametrize(("env", "flags", "message"), CONTROL_BAD, ids=[m.split()[0] for _, _, m in CONTROL_BAD])
def test_a_bad_value_stops_the_control_plane_before_anything_is_written(
    tmp_path: Path, env: dict[str, str], flags: list[str], message: str
) -> None:
    db = tmp_path / "corral.db"
    argv = [sys.executable, "-m", "control", "--db", str(db), *flags]
    done = run(argv, {"CORRAL_GRPC_PORT": "0", "CORRAL_HTTP_PORT": "0", **env}, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"corral control: configuration error: {message}"), done.stderr
    assert list(tmp_path.iterdir()) == []  # no database, no WAL, nothing


WORKER_BAD: list[tuple[dict[str, str], list[str], str]] = [
    ({"CORRAL_CONTROL_ADDR": "127.0.0.1:0"}, [], "CORRAL_CONTROL_ADDR must be HOST:PORT with a port in 1..65535"),
    ({"CORRAL_WORKER_THREADS": "0"}, [], "CORRAL_WORKER_THREADS must be 1..1024, got 0"),
    ({"CORRAL_WORKER_SLOTS": "many"}, [], "CORRAL_WORKER_SLOTS must be an integer, got 'many'"),
    ({"CORRAL_KILL_GRACE_SEC": "nan"}, [], "CORRAL_KILL_GRACE_SEC must be a finite number, got 'nan'"),
    ({}, ["--reconnect-max-sec", "0"], "CORRAL_RECONNECT_MAX_SEC must be > 0, got 0.0"),
    ({"CORRAL_LOG_LEVEL": "chatty"}, [], "CORRAL_LOG_LEVEL must be debug, info, warning or error, got 'chatty'"),
    ({}, ["--log-format", "xml"], "CORRAL_LOG_FORMAT must be json or logfmt, got 'xml'"),
    ({}, ["--event-loop", "gevent"], "CORRAL_EVENT_LOOP must be uvloop or asyncio, got 'gevent'"),
]


@pytest.mark.parametrize(("env", "flags", "message"), WORKER_BAD, ids=[m.split()[0] for _, _, m in WORKER_BAD])
def test_a_bad_value_stops_the_worker(tmp_path: Path, env: dict[str, str], flags: list[str], message: str) -> None:
    done = run([sys.executable, "-m", "worker", *flags], env, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
