"""Where a job's end is announced: the ``notify`` targets a job is submitted with, their rules, and
their stored form. :mod:`control.notify.notices` makes the notification jobs."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from control.jobs import JobState
from corral.errors import InvalidArgument
from corral.jobtypes import BUILTIN_SCHEMAS

__all__ = ["ENDS", "MAX_TARGETS", "NotifyTarget", "check_targets", "dumps", "end_state", "loads"]

MAX_TARGETS = 8
"""Targets one job may have."""
ENDS = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
"""The states a target may ask for."""
_END_VALUES = frozenset(int(s) for s in ENDS)

_EMAIL = re.compile(BUILTIN_SCHEMAS["email"]["properties"]["from"]["pattern"])
_URL = re.compile(BUILTIN_SCHEMAS["webhook"]["properties"]["url"]["pattern"])
_EMAIL_MAX = BUILTIN_SCHEMAS["email"]["properties"]["from"]["maxLength"]
_URL_MAX = BUILTIN_SCHEMAS["webhook"]["properties"]["url"]["maxLength"]


@dataclass(frozen=True, slots=True)
class NotifyTarget:
    """Where one job's end is announced: an email address or a webhook URL (exactly one)."""

    email: str = ""
    webhook_url: str = ""
    on: tuple[JobState, ...] = ()
    """The ends that send it (empty: every end)."""

    def wants(self, state: JobState) -> bool:
        """Whether an end in ``state`` is announced here."""
        return not self.on or state in self.on


def check_targets(targets: Sequence[NotifyTarget], field: str = "notify") -> None:
    """How many, exactly one of email and webhook_url each, each well formed, and known ends, none
    twice. Raises InvalidArgument naming the entry (``notify[1].email``)."""
    if len(targets) > MAX_TARGETS:
        raise InvalidArgument(field, f"at most {MAX_TARGETS} targets, got {len(targets)}")
    for i, target in enumerate(targets):
        at = f"{field}[{i}]"
        if bool(target.email) == bool(target.webhook_url):
            raise InvalidArgument(at, "set exactly one of email and webhook_url")
        if target.email and not _well_formed(target.email, _EMAIL, _EMAIL_MAX):
            raise InvalidArgument(f"{at}.email", f"must be an email address (name@domain), got {target.email!r}")
        if target.webhook_url and not _well_formed(target.webhook_url, _URL, _URL_MAX):
            raise InvalidArgument(
                f"{at}.webhook_url",
                f"must be an http:// or https:// URL of at most {_URL_MAX} characters, got {target.webhook_url[:200]!r}",
            )
        seen: set[JobState] = set()
        for n, state in enumerate(target.on):
            end_state(state, f"{at}.on[{n}]")
            if state in seen:
                raise InvalidArgument(f"{at}.on[{n}]", f"repeats {state.name}")
            seen.add(state)


def _well_formed(text: str, pattern: re.Pattern[str], limit: int) -> bool:
    """Whole of ``text`` matches (a ``$`` alone lets a final newline through), within ``limit``
    characters, and no control characters (which would end up in a mail header or a request line)."""
    return (
        len(text) <= limit and pattern.fullmatch(text) is not None and not any(ord(c) < 32 or c == "\x7f" for c in text)
    )


def end_state(value: int, field: str) -> JobState:
    """``value`` as one of :data:`ENDS`; InvalidArgument on ``field`` naming it (or its number) otherwise."""
    if value not in _END_VALUES:
        try:
            got = JobState(value).name
        except ValueError:
            got = str(int(value))
        raise InvalidArgument(field, f"must be one of {', '.join(s.name for s in ENDS)}, got {got}")
    return JobState(value)


def dumps(targets: Sequence[NotifyTarget]) -> str:
    """The stored form of a job's targets ("" for none: the common case costs nothing)."""
    if not targets:
        return ""
    return json.dumps(
        [
            ({"email": t.email} if t.email else {"webhook_url": t.webhook_url})
            | ({"on": [s.name for s in t.on]} if t.on else {})
            for t in targets
        ],
        separators=(",", ":"),
    )


def loads(text: str) -> tuple[NotifyTarget, ...]:
    """The targets :func:`dumps` stored."""
    if not text:
        return ()
    return tuple(
        NotifyTarget(
            email=t.get("email", ""),
            webhook_url=t.get("webhook_url", ""),
            on=tuple(JobState[name] for name in t.get("on", ())),
        )
        for t in json.loads(text)
    )
