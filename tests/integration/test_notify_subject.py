"""An email announcing a job's end is sent whatever the job's name holds: a name may carry line breaks
(nothing forbids them), but a mail header may not, and the notification job that put one in its
subject failed every attempt, so the announcement was lost (real control plane, worker and SMTP
server on 127.0.0.1)."""

from __future__ import annotations

from typing import Any

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc
from tests.integration.test_notify import _notices, _smtp_env
from tests.support.calls import submit, wait_all_done, wait_done
from tests.unit.runner.local_servers import local_smtp

S = jobs_pb2.Job


def test_a_name_with_line_breaks_still_makes_a_sendable_email(control_plane: ControlProc, spawn_worker: Any) -> None:
    with local_smtp() as smtp:
        spawn_worker(control_plane, env=_smtp_env(smtp))
        # Given a job whose name has a line break, a carriage return and a line separator in it
        name = "nightly\r\nbuild\u2028eu\x0bwest"
        job = submit(control_plane, "noop", name=name, notify=[jobs_pb2.Notify(email="ops@example.test")])
        assert wait_done(control_plane, job.id).state == S.SUCCEEDED
        # When its end is announced by email
        (note,) = wait_all_done(control_plane, [n.id for n in _notices(control_plane, job.id)], timeout=30)
        # Then the email goes out at the first attempt, its subject on one line, the name's words kept
        assert (note.state, note.attempts) == (S.SUCCEEDED, 1), note.error
        (message,) = [m for _, _, m in smtp.messages]
        assert message["Subject"] == "[corral] job nightly build eu west (noop) SUCCEEDED"
