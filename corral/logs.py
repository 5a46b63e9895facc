"""Structured logging: the JSON formatter and the event names every component emits.

Library code logs with ``logger.info(JOB_DISPATCHED, extra={"job_id": ..., ...})``; the message is
the event name and the extras become fields. Only a ``__main__`` calls :func:`configure`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# Jobs
JOB_SUBMITTED = "job_submitted"
JOB_DISPATCHED = "job_dispatched"
JOB_COMPLETED = "job_completed"
JOB_FAILED = "job_failed"
JOB_RETRY_SCHEDULED = "job_retry_scheduled"
JOB_CANCELLED = "job_cancelled"
JOB_REQUEUED = "job_requeued"
JOB_ADOPTED = "job_adopted"
JOB_TIMED_OUT = "job_timed_out"
LEASE_EXPIRED = "lease_expired"
STALE_RESULT = "stale_result"
# Workers
WORKER_REGISTERED = "worker_registered"
WORKER_HEARTBEAT = "worker_heartbeat"
WORKER_DISCONNECTED = "worker_disconnected"
WORKER_STALE = "worker_stale"
WORKER_DRAINING = "worker_draining"
WORKER_LEFT = "worker_left"
# Processes
CONTROL_STARTED = "control_started"
CONTROL_STOPPING = "control_stopping"
CONTROL_STOPPED = "control_stopped"
WORKER_STARTED = "worker_started"
WORKER_CONNECTING = "worker_connecting"
WORKER_STOPPED = "worker_stopped"
RUNNER_RESTARTED = "runner_restarted"
# Autoscaler
SCALE_UP = "scale_up"
SCALE_DOWN = "scale_down"

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, then the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class LogfmtFormatter(logging.Formatter):
    """``key=value`` pairs, for people reading a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"level={record.levelname.lower()}", f"event={record.getMessage()}"]
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                text = str(value)
                parts.append(f"{key}={json.dumps(text) if (' ' in text or not text) else text}")
        if record.exc_info:
            parts.append(f"exc={json.dumps(self.formatException(record.exc_info))}")
        return " ".join(parts)


def configure(level: str = "info", fmt: str = "json", stream: Any = None) -> None:
    """Route the root logger to ``stream`` (stderr) in ``fmt`` ("json" or "logfmt")."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("asyncio").setLevel(logging.WARNING)
