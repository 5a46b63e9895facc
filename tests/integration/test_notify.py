"""Announcing a job's end (``notify``) on a real control plane and real workers, to a real SMTP server
and a real HTTP server on 127.0.0.1: each end a target wants sends exactly one email or webhook, as an
ordinary job of the same owner; the announcement is committed with the end, so it survives a ``kill -9``
of the control plane; every end sends again after RetryJob; bad targets are refused naming the field,
over gRPC, REST, the Python client and the CLI, and nothing is stored."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import time
from email.message import EmailMessage, Message
from typing import Any, cast

import grpc
from google.protobuf import json_format

from corral import Client, JobState, Notify
from corral.errors import InvalidArgument
from corral.v1 import jobs_pb2
from tests.conftest import ROOT, ControlProc, base_env, wait_until
from tests.integration.test_rest import Rest, http_port
from tests.support.calls import request, rpc_error, seconds_from_now, stored, submit, wait_all_done, wait_done
from tests.unit.runner.local_servers import LocalHttp, LocalSmtp, local_http, local_smtp

S = jobs_pb2.Job


def _smtp_env(smtp: LocalSmtp) -> dict[str, str]:
    return {"CORRAL_SMTP_HOST": smtp.host, "CORRAL_SMTP_PORT": str(smtp.port)}


def _notices(cp: ControlProc, job_id: str) -> list[jobs_pb2.Job]:
    """The notification jobs announcing ``job_id``'s ends, oldest first."""
    page = cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1000))
    return sorted(
        (j for j in page.jobs if j.labels.get("corral.notify") == job_id), key=lambda j: j.created_at.ToNanoseconds()
    )


def _text(message: Message) -> str:
    """An email's body (the server parsed it with the modern policy: an EmailMessage)."""
    return str(cast(EmailMessage, message).get_content())


def _posts(http: LocalHttp, path: str) -> list[dict[str, Any]]:
    return [json.loads(r.body) for r in http.requests if r.path == path]


def test_each_wanted_end_sends_one_email_or_webhook(control_plane: ControlProc, spawn_worker: Any) -> None:
    with local_smtp() as smtp, local_http() as http:
        spawn_worker(control_plane, threads=2, env=_smtp_env(smtp))
        with Client(control_plane.address) as client:
            # Given a job that succeeds, announced by email on every end and by webhook on success only,
            ok = client.submit(
                "add_numbers",
                {"a": 2, "b": 3},
                name="sum",
                priority=7,
                notify=[
                    Notify(email="ops@example.test"),
                    Notify(webhook_url=f"{http.url}/echo", on=(JobState.SUCCEEDED,)),
                ],
            )
            # and a job that fails, announced by email on failure and by webhook on success only
            bad = client.submit(
                "failing",
                {"message": "disk full"},
                max_attempts=1,
                notify=[
                    Notify(email="oncall@example.test", on=(JobState.FAILED,)),
                    Notify(webhook_url=f"{http.url}/echo/bad", on=(JobState.SUCCEEDED,)),
                ],
            )
            assert ok.notify[1] == Notify(webhook_url=f"{http.url}/echo", on=(JobState.SUCCEEDED,))
            assert client.wait(ok.id, timeout=30).state is JobState.SUCCEEDED
            assert client.wait(bad.id, timeout=30).state is JobState.FAILED
        # Then each wanted end made one notification job of the same owner and priority, which succeeded
        ok_notes = wait_all_done(control_plane, [j.id for j in _notices(control_plane, ok.id)], timeout=30)
        bad_notes = wait_all_done(control_plane, [j.id for j in _notices(control_plane, bad.id)], timeout=30)
        assert sorted(j.type for j in ok_notes) == ["email", "webhook"] and [j.type for j in bad_notes] == ["email"]
        for note in ok_notes:
            assert (note.state, note.name, note.priority, note.owner) == (S.SUCCEEDED, f"notify {ok.id}", 7, "")
        assert bad_notes[0].state == S.SUCCEEDED
        # The emails say which job, how it ended and why
        by_rcpt = {rcpt[0]: message for _, rcpt, message in smtp.messages}
        assert sorted(by_rcpt) == ["oncall@example.test", "ops@example.test"]
        assert by_rcpt["ops@example.test"]["Subject"] == "[corral] job sum (add_numbers) SUCCEEDED"
        body = _text(by_rcpt["ops@example.test"])
        assert f"Job {ok.id} (add_numbers, 'sum') ended SUCCEEDED after 1 attempt." in body
        assert 'Result: {"sum":5}' in body
        failed = by_rcpt["oncall@example.test"]
        assert failed["Subject"] == f"[corral] job {bad.id} (failing) FAILED"
        assert "Error ERROR: disk full" in _text(failed)
        # The webhook got the ended job as GET /v1/jobs/{id} gives it; the failed job sent none
        (job,) = _posts(http, "/echo")
        rest = Rest(http_port(control_plane)).get(f"/v1/jobs/{ok.id}").json()
        assert (job["id"], job["state"], job["result"]) == (ok.id, "SUCCEEDED", {"sum": 5})
        (seen,) = [r for r in http.requests if r.path == "/echo"]
        assert seen.headers["X-Corral-Event"] == "job.ended" and "X-Corral-Signature" not in seen.headers
        assert set(job) == set(rest)
        assert _posts(http, "/echo/bad") == []
        # except that its notify lists only this webhook: the job's other targets are not its to read (a
        # webhook URL often holds a secret; they all got every target before)
        assert len(rest["notify"]) == 2
        assert job["notify"] == [{"email": "", "webhookUrl": f"{http.url}/echo", "on": ["SUCCEEDED"]}]


def test_an_announcement_is_committed_with_the_end(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a job announced by email, cancelled while no worker is there to send the email
    later = request("noop", scheduled_at=seconds_from_now(3600), notify=[jobs_pb2.Notify(email="ops@example.test")])
    job = control_plane.jobs.SubmitJob(later).job
    control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=job.id))
    # When the control plane is killed as soon as the cancel is acknowledged
    control_plane.kill()
    control_plane.start()
    # Then the notification job is there, once, and a worker sends it
    (note,) = _notices(control_plane, job.id)
    assert (note.type, note.state) == ("email", S.PENDING)
    with local_smtp() as smtp:
        spawn_worker(control_plane, env=_smtp_env(smtp))
        assert wait_done(control_plane, note.id).state == S.SUCCEEDED
        (message,) = [m for _, _, m in smtp.messages]
        assert message["Subject"] == f"[corral] job {job.id} (noop) CANCELLED"
    assert len(_notices(control_plane, job.id)) == 1


def test_every_end_sends_again_after_a_retry(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=2)
    with local_http() as http:
        # Given a job that fails its one attempt and would succeed a second, announced by webhook
        target = jobs_pb2.Notify(webhook_url=f"{http.url}/echo")
        job = submit(control_plane, "failing", {"fail_attempts": 1}, max_attempts=1, notify=[target])
        assert wait_done(control_plane, job.id).state == S.FAILED
        wait_until(lambda: len(_posts(http, "/echo")) == 1, timeout=30, what="the first webhook")
        # When it is retried and succeeds
        control_plane.jobs.RetryJob(jobs_pb2.RetryJobRequest(id=job.id))
        assert wait_done(control_plane, job.id).state == S.SUCCEEDED
        # Then its second end is announced too, once
        wait_until(lambda: len(_posts(http, "/echo")) == 2, timeout=30, what="the second webhook")
        wait_all_done(control_plane, [n.id for n in _notices(control_plane, job.id)], timeout=30)
        states = [posted["state"] for posted in _posts(http, "/echo")]
        assert states == ["FAILED", "SUCCEEDED"] and len(_notices(control_plane, job.id)) == 2


def test_webhooks_are_signed_when_a_secret_is_set(make_control_plane: Any, spawn_worker: Any) -> None:
    secret = "s3cret-" + "x" * 20
    cp = make_control_plane(CORRAL_NOTIFY_WEBHOOK_SECRET=secret)
    spawn_worker(cp)
    with local_http() as http:
        job = submit(cp, "noop", notify=[jobs_pb2.Notify(webhook_url=f"{http.url}/echo")])
        wait_until(lambda: _posts(http, "/echo"), timeout=30, what="the webhook")
    (seen,) = [r for r in http.requests if r.path == "/echo"]
    stamp = int(seen.headers["X-Corral-Timestamp"])
    # Whoever holds the secret can check the body and the time came from this control plane, unchanged
    expected = "sha256=" + hmac.new(secret.encode(), f"{stamp}.".encode() + seen.body, hashlib.sha256).hexdigest()
    assert seen.headers["X-Corral-Signature"] == expected
    assert json.loads(seen.body)["id"] == job.id and abs(stamp - time.time()) < 60
    forged = hmac.new(b"another secret, 20+ chars", f"{stamp}.".encode() + seen.body, hashlib.sha256).hexdigest()
    assert seen.headers["X-Corral-Signature"] != "sha256=" + forged
    # and the secret shows nowhere: not in the notification job a client can read
    (note,) = _notices(cp, job.id)
    assert secret not in json.dumps(json_format.MessageToDict(note))


def test_bad_targets_are_refused_naming_the_field(control_plane: ControlProc) -> None:
    total = stored(control_plane)
    n = jobs_pb2.Notify
    for targets, field, rule in (
        ([n()], "notify[0]", "set exactly one of email and webhook_url"),
        ([n(email="a@b.test", webhook_url="http://127.0.0.1/x")], "notify[0]", "exactly one"),
        ([n(email="not an address")], "notify[0].email", "must be an email address"),
        ([n(webhook_url="ftp://127.0.0.1/x")], "notify[0].webhook_url", "http:// or https://"),
        ([n(email="a@b.test", on=[S.RUNNING])], "notify[0].on[0]", "one of SUCCEEDED, FAILED, CANCELLED, got RUNNING"),
        ([n(email="a@b.test", on=[42])], "notify[0].on[0]", "got 42"),  # type: ignore[list-item]
        ([n(email="a@b.test", on=[S.FAILED, S.FAILED])], "notify[0].on[1]", "repeats FAILED"),
        ([n(email=f"a{i}@b.test") for i in range(9)], "notify", "at most 8 targets, got 9"),
    ):
        err = rpc_error(control_plane.jobs.SubmitJob, request("noop", notify=targets))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert (err.details() or "").startswith(f"{field}: ") and rule in (err.details() or ""), err.details()
    err = rpc_error(
        control_plane.jobs.SubmitJobs,
        jobs_pb2.SubmitJobsRequest(jobs=[request("noop"), request("noop", notify=[n(email="x")])]),
    )
    assert (err.details() or "").startswith("jobs[1].notify[0].email: ")
    rest = Rest(http_port(control_plane))
    for body, field in (
        ({"type": "noop", "notify": [{"email": 5}]}, "notify[0].email"),
        ({"type": "noop", "notify": [{"email": "a@b.test", "on": ["DONE"]}]}, "notify[0].on[0]"),
        ({"type": "noop", "notify": {"email": "a@b.test"}}, "notify"),
    ):
        reply = rest.post("/v1/jobs", body)
        assert reply.status == 400 and (reply.violation() or "").startswith(field), reply.body
    with Client(control_plane.address) as client:
        try:
            client.submit("noop", notify=[Notify(email="a@b.test", on=("SOON",))])  # type: ignore[arg-type]
        except InvalidArgument as exc:
            assert exc.field == "notify[0].on[0]"
        else:
            raise AssertionError("a bad state was sent")
    assert stored(control_plane) == total


def test_the_cli_takes_targets_and_shows_them(control_plane: ControlProc) -> None:
    def corral(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "corral.cli", *args, "--control", control_plane.address]
        return subprocess.run(argv, cwd=ROOT, env=base_env(), capture_output=True, text=True, timeout=60)

    done = corral(
        "submit", "noop", "--at", "+1h", "--notify", "ops@example.test", "--notify", "http://127.0.0.1:9/hook",
        "--notify-on", "failed", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["notify"] == [
        {"email": "ops@example.test", "webhook_url": "", "on": ["FAILED"]},
        {"email": "", "webhook_url": "http://127.0.0.1:9/hook", "on": ["FAILED"]},
    ]
    shown = corral("get", job["id"])
    assert "ops@example.test (FAILED), http://127.0.0.1:9/hook (FAILED)" in shown.stdout
    total = stored(control_plane)
    for args, said in (
        (("--notify", "nobody"), "invalid target 'nobody'"),
        (("--notify", "a@b.test", "--notify-on", "RUNNING"), "invalid end 'RUNNING'"),
        (("--notify-on", "FAILED"), "--notify-on"),
    ):
        refused = corral("submit", "noop", *args)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr  # usage errors, all three
    assert stored(control_plane) == total
