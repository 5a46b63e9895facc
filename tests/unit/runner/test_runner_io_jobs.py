"""The I/O job types against real local servers and a real temporary directory.

``network_intensive`` and ``webhook`` talk to an http.server on 127.0.0.1, ``email`` to an aiosmtpd
server on 127.0.0.1, ``io_intensive`` writes into ``CORRAL_IO_DIR`` (a tmp_path).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from runner import JobContext, JobFailed, execute
from runner.jobs.email import SmtpSettings
from runner.jobs.io_intensive import content_block
from runner.jobs.webhook import MAX_BODY_BYTES
from tests.support.ports import free_port
from tests.unit.runner.local_servers import local_http, local_smtp


def ctx() -> JobContext:
    return JobContext(job_id="job-1", attempt=1, threads=1)


def failure(job_type: str, payload: dict[str, Any]) -> JobFailed:
    with pytest.raises(JobFailed) as caught:
        execute(job_type, payload, ctx())
    return caught.value


# -- io_intensive ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "block"), [(0, 4096), (1, 4096), (5 * 4096 + 17, 4096), (3 << 20, 1 << 20)])
def test_io_intensive_writes_and_reads_back_the_expected_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, block: int
) -> None:
    monkeypatch.setenv("CORRAL_IO_DIR", str(tmp_path))
    result = execute("io_intensive", {"size_bytes": size, "block_bytes": block, "seed": 4}, ctx())
    data = (content_block(4, block) * (size // block + 1))[:size]
    assert result["bytes"] == size
    assert result["sha256"] == hashlib.sha256(data).hexdigest()
    assert result["write_seconds"] >= 0 and result["read_seconds"] >= 0
    assert list(tmp_path.iterdir()) == []  # the file never had a name: nothing is left behind


def test_io_intensive_reports_os_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CORRAL_IO_DIR", str(tmp_path / "missing"))
    assert failure("io_intensive", {"size_bytes": 10}).code == "IO_ERROR"


# -- network_intensive -----------------------------------------------------------------------------------------


def test_network_intensive_downloads_and_hashes_the_body() -> None:
    with local_http() as server:
        result = execute("network_intensive", {"url": f"{server.url}/bytes/300000?seed=7"}, ctx())
    expected = random.Random(7).randbytes(300_000)
    assert (result["status"], result["bytes"]) == (200, 300_000)
    assert result["sha256"] == hashlib.sha256(expected).hexdigest()
    assert result["content_type"] == "application/octet-stream" and result["mb_per_s"] > 0


def test_network_intensive_failures() -> None:
    with local_http() as server:
        err = failure("network_intensive", {"url": f"{server.url}/status/404"})
        assert err.code == "HTTP_ERROR" and "404" in err.message
        err = failure("network_intensive", {"url": f"{server.url}/bytes/5000", "max_bytes": 4999})
        assert err.code == "TOO_LARGE"
    err = failure("network_intensive", {"url": f"http://127.0.0.1:{free_port()}/", "timeout_sec": 2})
    assert err.code == "NETWORK_ERROR"


# -- webhook -----------------------------------------------------------------------------------------------------


def test_webhook_sends_method_headers_and_json_body() -> None:
    with local_http() as server:
        payload = {
            "url": f"{server.url}/echo",
            "method": "PUT",
            "headers": {"X-Corral-Test": "yes", "Authorization": "Bearer t0ken"},
            "body": {"event": "done", "n": 3},
        }
        result = execute("webhook", payload, ctx())
        seen = server.requests[-1]
    assert result["status"] == 200 and result["body_truncated"] is False
    assert result["content_type"] == "application/json"
    assert (seen.method, seen.path) == ("PUT", "/echo")
    assert seen.headers["X-Corral-Test"] == "yes" and seen.headers["Authorization"] == "Bearer t0ken"
    assert seen.headers["Content-Type"] == "application/json"
    assert json.loads(seen.body) == {"event": "done", "n": 3}
    assert json.loads(result["body"])["method"] == "PUT"


def test_webhook_string_body_default_method_and_bounded_response() -> None:
    with local_http() as server:
        result = execute("webhook", {"url": f"{server.url}/echo", "body": "plain text ✓"}, ctx())
        assert server.requests[-1].method == "POST" and server.requests[-1].body == "plain text ✓".encode()
        big = execute("webhook", {"url": f"{server.url}/big/{MAX_BODY_BYTES * 3}", "method": "GET"}, ctx())
    assert result["status"] == 200
    assert big["body_truncated"] is True and len(big["body"]) == MAX_BODY_BYTES


@pytest.mark.parametrize("status", [400, 404, 500, 503])
def test_webhook_status_at_least_400_is_a_retryable_failure_with_the_status(status: int) -> None:
    with local_http() as server:
        err = failure("webhook", {"url": f"{server.url}/status/{status}"})
    assert err.code == "HTTP_ERROR" and f"status {status}" in err.message and f"status {status}" in err.message


def test_webhook_connection_error_is_a_retryable_failure() -> None:
    err = failure("webhook", {"url": f"http://127.0.0.1:{free_port()}/hook", "timeout_sec": 2})
    assert err.code == "NETWORK_ERROR"


# -- email -----------------------------------------------------------------------------------------------------


def test_email_is_delivered_through_the_configured_server(monkeypatch: pytest.MonkeyPatch) -> None:
    with local_smtp() as smtp:
        monkeypatch.setenv("CORRAL_SMTP_HOST", smtp.host)
        monkeypatch.setenv("CORRAL_SMTP_PORT", str(smtp.port))
        monkeypatch.setenv("CORRAL_SMTP_FROM", "jobs@corral.test")
        result = execute(
            "email",
            {"to": ["a@example.test", "b@example.test"], "subject": "Report ✓", "body": "All 3 jobs done.\n"},
            ctx(),
        )
    assert result["accepted"] == ["a@example.test", "b@example.test"] and result["refused"] == {}
    [(sender, rcpts, message)] = smtp.messages
    assert sender == "jobs@corral.test" and rcpts == ["a@example.test", "b@example.test"]
    assert message["Subject"] == "Report ✓" and message["Message-ID"] == result["message_id"]
    body = message.get_payload(decode=True)
    assert isinstance(body, bytes) and body.decode().strip() == "All 3 jobs done."


def test_email_partly_and_wholly_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with local_smtp(refuse={"nobody@example.test"}) as smtp:
        monkeypatch.setenv("CORRAL_SMTP_HOST", smtp.host)
        monkeypatch.setenv("CORRAL_SMTP_PORT", str(smtp.port))
        partly = execute(
            "email", {"to": ["ok@example.test", "nobody@example.test"], "subject": "s", "body": "b"}, ctx()
        )
        assert partly["accepted"] == ["ok@example.test"] and "550" in partly["refused"]["nobody@example.test"]
        wholly = failure("email", {"to": "nobody@example.test", "subject": "s", "body": "b", "from": "x@y.test"})
    assert wholly.code == "SMTP_ERROR" and "refused" in wholly.message


def test_email_without_a_server_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_SMTP_HOST", raising=False)
    assert failure("email", {"to": "a@b.test", "subject": "s", "body": "b"}).code == "SMTP_NOT_CONFIGURED"
    monkeypatch.setenv("CORRAL_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("CORRAL_SMTP_PORT", str(free_port()))
    monkeypatch.setenv("CORRAL_SMTP_TIMEOUT_SEC", "2")
    assert failure("email", {"to": "a@b.test", "subject": "s", "body": "b"}).code == "SMTP_ERROR"


@pytest.mark.parametrize(
    ("env", "variable"),
    [({"CORRAL_SMTP_HOST": "h", "CORRAL_SMTP_PORT": "x"}, "CORRAL_SMTP_PORT"),
     ({"CORRAL_SMTP_HOST": "h", "CORRAL_SMTP_PORT": "70000"}, "CORRAL_SMTP_PORT"),
     ({"CORRAL_SMTP_HOST": "h", "CORRAL_SMTP_TIMEOUT_SEC": "0"}, "CORRAL_SMTP_TIMEOUT_SEC"),
     ({}, "CORRAL_SMTP_HOST")],
)  # fmt: skip
def test_smtp_settings_name_the_bad_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(JobFailed) as caught:
        SmtpSettings.from_env(env)
    assert caught.value.code == "SMTP_NOT_CONFIGURED" and variable in caught.value.message
    assert SmtpSettings.from_env({"CORRAL_SMTP_HOST": "mail", "CORRAL_SMTP_STARTTLS": "1"}).starttls


def test_no_proxy_from_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("HTTP_PROXY", os.environ["http_proxy"])
    with local_http() as server:
        assert execute("network_intensive", {"url": f"{server.url}/bytes/10"}, ctx())["bytes"] == 10
