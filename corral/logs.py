"""Structured logging: the JSON formatter and the event names every component emits.

Library code logs with ``logger.info(JOB_DISPATCHED, extra={"job_id": ..., ...})``; the message is
the event name and the extras become fields. Only a ``__main__`` calls :func:`configure`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

# Jobs
JOB_SUBMITTED = "job_submitted"
JOB_DISPATCHED = "job_dispatched"
JOB_COMPLETED = "job_completed"
JOB_FAILED = "job_failed"
JOB_RETRY_SCHEDULED = "job_retry_scheduled"
JOB_RETRIED = "job_retried"
JOB_CANCELLED = "job_cancelled"
JOB_REQUEUED = "job_requeued"
JOB_ADOPTED = "job_adopted"
JOB_TYPE_UNSERVED = "job_type_unserved"
IDEMPOTENCY_KEY_OUTLIVED_JOB = "idempotency_key_outlived_job"
JOBS_PURGED = "jobs_purged"
JOB_TIMED_OUT = "job_timed_out"
LEASE_EXPIRED = "lease_expired"
STORE_FAILED = "store_failed"
STORE_STANDBY = "store_standby"
STORE_LEADING = "store_leading"
STORE_UNREACHABLE = "store_unreachable"
CLOCK_STEPPED = "clock_stepped"
STALE_RESULT = "stale_result"
# Workers
WORKER_REGISTERED = "worker_registered"
WORKER_REFUSED = "worker_refused"
WORKER_MESSAGE_REFUSED = "worker_message_refused"
WORKER_HEARTBEAT = "worker_heartbeat"
WORKER_DISCONNECTED = "worker_disconnected"
WORKER_STALE = "worker_stale"
WORKER_STALLED = "worker_stalled"
WORKER_DRAINING = "worker_draining"
WORKER_LEFT = "worker_left"
# Processes
CONTROL_STARTED = "control_started"
CONTROL_STOPPING = "control_stopping"
CONTROL_STOPPED = "control_stopped"
CONTROL_PAUSED = "control_paused"
HTTP_CONNECTIONS_LOWERED = "http_connections_lowered"
WORKER_STARTED = "worker_started"
WORKER_CONNECTING = "worker_connecting"
WORKER_FILES_SHORT = "worker_files_short"
WORKER_STOPPED = "worker_stopped"
RUNNER_RESTARTED = "runner_restarted"
STRAY_NOT_KILLED = "stray_not_killed"
GPUS_UNAVAILABLE = "gpus_unavailable"
# Auth
AUTH_REFUSED = "auth_refused"
AUTH_TOKENS_RELOADED = "auth_tokens_reloaded"
AUTH_TOKENS_RELOAD_FAILED = "auth_tokens_reload_failed"
ACCOUNT_REGISTERED = "account_registered"
ACCOUNT_PASSWORD_CHANGED = "account_password_changed"
ACCOUNT_DELETED = "account_deleted"
LOGIN = "login"
LOGIN_REFUSED = "login_refused"
LOGINS_ENDED = "logins_ended"

# Autoscaler
SCALE_UP = "scale_up"
SCALE_DOWN = "scale_down"
SCALE_RECOMMENDATION = "scale_recommendation"
SCALE_DECISION = "scale_decision"
AUTOSCALER_STARTED = "autoscaler_started"
AUTOSCALER_ERROR = "autoscaler_error"
AUTOSCALER_RECOVERED = "autoscaler_recovered"
WORKER_CONTAINER_STARTED = "worker_container_started"
WORKER_CONTAINER_ADOPTED = "worker_container_adopted"
WORKER_CONTAINER_REPLACED = "worker_container_replaced"
WORKER_CONTAINER_REMOVED = "worker_container_removed"

LEVELS = ("debug", "info", "warning", "error")
"""Accepted ``--log-level`` / CORRAL_LOG_LEVEL values."""
FORMATS = ("json", "logfmt")
"""Accepted ``--log-format`` / CORRAL_LOG_FORMAT values."""

REQUEST_ID = "request_id"
"""The field that carries a request id (see :data:`current_request`)."""
current_request: ContextVar[str | None] = ContextVar("corral_request_id", default=None)
"""The request id of the call being served (set by the server for the call's task). Every line
logged meanwhile carries it as ``request_id``, unless the line names one itself: a line about a job
gives the id of the request that created the job, and ``None`` (no such request known) leaves it out."""

PRINCIPAL = "principal"
"""The field that carries the caller's identity (see :data:`current_principal`)."""
current_principal: ContextVar[str | None] = ContextVar("corral_principal", default=None)
"""Who makes the call being served when the control plane asks for tokens: a client token's name,
or ``worker``/``worker:<CN>`` (set by the auth check). Every line logged meanwhile carries it as
``principal``, so that the log says who submitted, cancelled or retried a job and who drained a worker."""

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _extras(record: logging.LogRecord) -> Iterator[tuple[str, Any]]:
    """The record's own fields (``extra=``), without those set to None."""
    for key, value in record.__dict__.items():
        if value is not None and key not in _RESERVED and key[0] != "_":
            yield key, value


class RequestIdFilter(logging.Filter):
    """Adds :data:`current_request` to records that do not name a request id themselves, and
    :data:`current_principal` when a caller is known."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Stamp ``record`` with the call's request id and principal (see the class); always True."""
        if REQUEST_ID not in record.__dict__:
            rid = current_request.get()
            if rid is not None:
                record.request_id = rid
        principal = current_principal.get()
        if principal is not None and PRINCIPAL not in record.__dict__:
            record.principal = principal
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, then the record's extra fields."""

    _second = -1
    _stamp = ""

    def _ts(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:  # strftime costs more than the rest of a line; once a second is enough
            self._second, self._stamp = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        """One line of JSON (non-ASCII kept as it is; a value JSON cannot hold written as its ``str``)."""
        out: dict[str, Any] = {
            "ts": self._ts(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class LogfmtFormatter(logging.Formatter):
    """``key=value`` pairs, for people reading a terminal; values with spaces, quotes or ``=`` are quoted."""

    def format(self, record: logging.LogRecord) -> str:
        """One line: the level, the event, then the extra fields and any traceback (no time, no logger name)."""
        parts = [f"level={record.levelname.lower()}", f"event={_logfmt_value(record.getMessage())}"]
        for key, value in _extras(record):
            parts.append(f"{key}={_logfmt_value(str(value))}")
        if record.exc_info:
            parts.append(f"exc={json.dumps(self.formatException(record.exc_info))}")
        return " ".join(parts)


def _logfmt_value(text: str) -> str:
    """``text`` as it is, or quoted when it is empty or has a space, quote, ``=`` or control character."""
    if text and text.isprintable() and not any(c in text for c in ' "=\\'):
        return text
    return json.dumps(text, ensure_ascii=False)


def configure(level: str = "info", fmt: str = "json", stream: Any = None) -> None:
    """Route the root logger to ``stream`` (stderr) in ``fmt`` ("json" or "logfmt"), one event a line.

    Raises:
        ValueError: ``level`` is not one of :data:`LEVELS` or ``fmt`` not one of :data:`FORMATS`.
    """
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    handler.addFilter(RequestIdFilter())
    # No formatter prints the caller's file and line: skip looking them up (the logging docs' own advice).
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("asyncio").setLevel(logging.WARNING)
