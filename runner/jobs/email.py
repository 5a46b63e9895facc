"""``email``: send a plain-text message through the SMTP server the worker is configured with.

Payload ``{"to": address | [address, ...], "subject": str, "body": str, "from"?: address}``. The server
comes from the worker's environment (runner processes inherit it), read by :meth:`SmtpSettings.from_env`:

=========================  ==============================  ====================================
variable                   default                         meaning
=========================  ==============================  ====================================
CORRAL_SMTP_HOST           (none: email jobs fail)         SMTP server host
CORRAL_SMTP_PORT           25                              its port (1..65535)
CORRAL_SMTP_FROM           corral@<hostname>               sender when the payload has no "from"
CORRAL_SMTP_TIMEOUT_SEC    30                              connect/command timeout (> 0)
CORRAL_SMTP_STARTTLS       0                               1: upgrade the connection with STARTTLS
CORRAL_SMTP_USER           (none)                          log in with this user ...
CORRAL_SMTP_PASSWORD       (none)                          ... and this password
=========================  ==============================  ====================================

Result ``{"accepted": [addresses], "refused": {address: "code message"}, "message_id": str}``.
Failures (retried while attempts remain): ``SMTP_NOT_CONFIGURED`` (no host, or a bad setting),
``SMTP_ERROR`` (connection refused, every recipient refused, the server said no, a timeout).
"""

from __future__ import annotations

import os
import smtplib
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.errors import JobFailed
from runner.registry import JobContext, JobType, register


@dataclass(frozen=True, slots=True)
class SmtpSettings:
    """Where and how email jobs send (see the module docstring for the variables)."""

    host: str
    """CORRAL_SMTP_HOST: the server."""
    port: int = 25
    """CORRAL_SMTP_PORT: 1..65535."""
    sender: str = ""
    """CORRAL_SMTP_FROM: the default sender (empty: corral@<hostname>)."""
    timeout_sec: float = 30.0
    """CORRAL_SMTP_TIMEOUT_SEC: > 0."""
    starttls: bool = False
    """CORRAL_SMTP_STARTTLS: 1 to use STARTTLS."""
    user: str = ""
    """CORRAL_SMTP_USER: log in when set."""
    password: str = ""
    """CORRAL_SMTP_PASSWORD: the password for CORRAL_SMTP_USER."""

    def __post_init__(self) -> None:
        """Check the rules; a break is ``SMTP_NOT_CONFIGURED`` naming the variable."""
        if not self.host:
            raise JobFailed("SMTP_NOT_CONFIGURED", "CORRAL_SMTP_HOST is not set on the worker")
        if not 1 <= self.port <= 65535:
            raise JobFailed("SMTP_NOT_CONFIGURED", f"CORRAL_SMTP_PORT must be in 1..65535, got {self.port}")
        if not self.timeout_sec > 0:
            raise JobFailed("SMTP_NOT_CONFIGURED", f"CORRAL_SMTP_TIMEOUT_SEC must be > 0, got {self.timeout_sec}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SmtpSettings:
        """Read the settings from ``environ`` (default ``os.environ``).

        Raises:
            JobFailed: ``SMTP_NOT_CONFIGURED`` naming the variable that is missing or malformed.
        """
        env = os.environ if environ is None else environ

        def number(name: str, default: str, kind: type[int] | type[float]) -> Any:
            raw = env.get(name, "").strip() or default
            try:
                return kind(raw)
            except ValueError:
                raise JobFailed("SMTP_NOT_CONFIGURED", f"{name} must be a number, got {raw!r}") from None

        return cls(
            host=env.get("CORRAL_SMTP_HOST", "").strip(),
            port=number("CORRAL_SMTP_PORT", "25", int),
            sender=env.get("CORRAL_SMTP_FROM", "").strip(),
            timeout_sec=number("CORRAL_SMTP_TIMEOUT_SEC", "30", float),
            starttls=env.get("CORRAL_SMTP_STARTTLS", "").strip() == "1",
            user=env.get("CORRAL_SMTP_USER", ""),
            password=env.get("CORRAL_SMTP_PASSWORD", ""),
        )


def build_message(payload: dict[str, Any], default_sender: str) -> EmailMessage:
    """The message for a payload: From, To, Subject, Message-ID and a UTF-8 text body."""
    recipients = payload["to"] if isinstance(payload["to"], list) else [payload["to"]]
    message = EmailMessage()
    message["From"] = str(payload.get("from") or default_sender)
    message["To"] = ", ".join(str(r) for r in recipients)
    message["Subject"] = str(payload["subject"])
    message["Message-ID"] = make_msgid(domain="corral.local")
    message.set_content(str(payload["body"]))
    return message


@register
class Email(JobType):
    """Send a plain-text email through the worker's SMTP server."""

    name = "email"
    schema = BUILTIN_SCHEMAS["email"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Send the message; fail (retryably) when the server cannot be reached or refuses it."""
        settings = SmtpSettings.from_env()
        message = build_message(payload, settings.sender or f"corral@{socket.gethostname()}")
        recipients = payload["to"] if isinstance(payload["to"], list) else [payload["to"]]
        try:
            with smtplib.SMTP(settings.host, settings.port, timeout=settings.timeout_sec) as smtp:
                if settings.starttls:
                    smtp.starttls()
                if settings.user:
                    smtp.login(settings.user, settings.password)
                refused = smtp.send_message(message, to_addrs=[str(r) for r in recipients])
        except smtplib.SMTPRecipientsRefused as exc:
            raise JobFailed("SMTP_ERROR", f"every recipient was refused: {_describe(exc.recipients)}") from None
        except (smtplib.SMTPException, OSError) as exc:
            where = f"{settings.host}:{settings.port}"
            raise JobFailed("SMTP_ERROR", f"sending through {where}: {type(exc).__name__}: {exc}") from None
        return {
            "accepted": [str(r) for r in recipients if str(r) not in refused],
            "refused": _describe(refused),
            "message_id": str(message["Message-ID"]),
        }


def _describe(refused: Mapping[str, tuple[int, bytes]]) -> dict[str, str]:
    return {address: f"{code} {text.decode('utf-8', 'replace')}" for address, (code, text) in refused.items()}
