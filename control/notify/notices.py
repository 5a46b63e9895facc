"""Announcing a job's end: the notification jobs its ends make.

When a job ends in a state one of its targets wants (:mod:`control.notify.targets`; none listed: every
end), :meth:`Notices.ended` submits one job for that target: an ``email`` job with a short account of
the end, or a ``webhook`` job that POSTs the ended job as GetJob's JSON. The scheduler calls it from
``moved``, before the end is persisted and with no ``await`` in between, so the notification job goes
into the same store transaction as the end: a crash loses both or keeps both, and no committed end goes
unannounced. It is an ordinary job of the same owner, with the same priority: retried with backoff,
listed, cancellable, under the owner's fair share. It has no targets of its own, so nothing announces it.

With ``CORRAL_NOTIFY_WEBHOOK_SECRET`` set, a webhook is signed (:func:`signature`): its headers carry
``X-Corral-Timestamp`` (when the notice was made, Unix seconds) and ``X-Corral-Signature:
sha256=<hex>``, the HMAC-SHA256 with the secret of ``<timestamp>.<body>``, the body being the exact
bytes sent. The timestamp is signed too, so an endpoint can refuse old notices replayed; it stays the
same over the webhook job's retries, so an endpoint's window must allow for them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from control.admission import Submission
from control.jobs import JobRecord
from control.notify.targets import NotifyTarget

if TYPE_CHECKING:
    from control.scheduler import Scheduler

__all__ = ["NOTIFY_LABEL", "Notices", "signature"]

NOTIFY_LABEL = "corral.notify"
"""The label a notification job carries: the id of the job whose end it announces."""
RESULT_CHARS = 2000
"""The most of a result, an error message or output an email quotes."""
_HEADER_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")
"""Control characters and whatever ``str.splitlines`` breaks at: a job's name may hold them, a mail
header may not (the email job type refuses such a subject, so each attempt of the notice would fail)."""


class Notices:
    """The notification jobs of one scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler

    def ended(self, job: JobRecord) -> None:
        """``job`` has just reached a terminal state, not yet persisted: submit a notification job for
        each of its targets that wants that end, into the same transaction."""
        wanted = [t for t in job.notify if t.wants(job.state)]
        if wanted:
            secret = self.s.config.notify_webhook_secret.encode()
            now = int(self.s.clock.now())
            self.s.intake.admit_internal([_submission(job, t, secret, now) for t in wanted], job.owner)


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``X-Corral-Signature`` of a webhook: ``sha256=`` and the hex HMAC-SHA256 of
    ``<timestamp>.<body>`` with ``secret``."""
    return "sha256=" + hmac.new(secret, b"%d." % timestamp + body, hashlib.sha256).hexdigest()


def _submission(job: JobRecord, target: NotifyTarget, secret: bytes, now: int) -> Submission:
    """The notification job announcing ``job``'s end to ``target`` (a webhook signed with ``secret``,
    if any, at ``now``)."""
    common: dict[str, Any] = {
        "name": f"notify {job.id}",
        "priority": job.priority,
        "labels": {NOTIFY_LABEL: job.id},
    }
    if target.email:
        subject = _HEADER_BREAKS.sub(" ", f"[corral] job {job.name or job.id} ({job.type}) {job.state.name}")
        mail = {"to": target.email, "subject": subject, "body": _account(job)}
        return Submission("email", mail, payload_json=_compact(mail), **common)
    # The body goes as a string, sent as it is: the bytes signed are the bytes sent.
    body = _compact(_job_json(job, target.webhook_url))
    headers = {"Content-Type": "application/json", "X-Corral-Event": "job.ended"}
    if secret:
        headers["X-Corral-Timestamp"] = str(now)
        headers["X-Corral-Signature"] = signature(secret, now, body.encode())
    payload = {"url": target.webhook_url, "method": "POST", "headers": headers, "body": body}
    return Submission("webhook", payload, payload_json=_compact(payload), **common)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _job_json(job: JobRecord, webhook_url: str) -> Any:
    """The job as GetJob's JSON (REST's answer to ``GET /v1/jobs/{id}``), whose ``notify`` lists only the
    target at ``webhook_url``: the others are not its to read (a webhook URL often holds a secret, as a
    chat service's incoming-hook URLs do, and an email address is a person's)."""
    # Here, not at the top: the API's conversions import the scheduler, which imports this module.
    from control.api.convert import job as job_proto
    from control.gateway.protojson import to_json

    data = to_json(job_proto(job))
    data["notify"] = [n for n in data.get("notify", []) if n.get("webhookUrl") == webhook_url]
    return data


def _account(job: JobRecord) -> str:
    """An email's body: what the job was, how it ended, and where to read more."""
    lines = [
        f"Job {job.id} ({job.type}{', ' + repr(job.name) if job.name else ''}) ended {job.state.name}"
        f" after {job.attempts} attempt{'s' if job.attempts != 1 else ''}.",
        "",
        f"Submitted: {_when(job.created_at)}",
    ]
    if job.started_at is not None:
        lines.append(f"Started:   {_when(job.started_at)}")
    if job.finished_at is not None:
        lines.append(f"Ended:     {_when(job.finished_at)}")
    lines.append(f"Queued {job.queue_seconds:.3f} s, ran {job.exec_seconds:.3f} s.")
    if job.error_code:
        lines += ["", f"Error {job.error_code}: {_cut(job.error_message)}"]
    if job.result_json:
        lines += ["", f"Result: {_cut(job.result_json)}"]
    if job.output:
        lines += ["", "What it printed last:", _cut(job.output.rstrip("\n"), tail=True)]
    lines += ["", f"More: corral get {job.id}"]
    return "\n".join(lines) + "\n"


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _cut(text: str, tail: bool = False) -> str:
    """``text``, or its first (``tail``: last) RESULT_CHARS characters and what was left out."""
    if len(text) <= RESULT_CHARS:
        return text
    left_out = f"[... {len(text) - RESULT_CHARS} characters left out]"
    return f"{left_out}\n{text[-RESULT_CHARS:]}" if tail else f"{text[:RESULT_CHARS]} {left_out}"
