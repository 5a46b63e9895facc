"""The CLI's saved login: ``corral login`` writes it, the client commands send its token, ``corral logout``
removes it.

The file is ``$CORRAL_LOGIN_FILE``, else ``$XDG_CONFIG_HOME/corral/login``, else ``~/.config/corral/login``
(:func:`path`), and holds one JSON object::

    {"control": "HOST:PORT", "name": "alice", "token": "...", "expires_at": "2026-11-27T11:02:03+00:00"}

``control`` is the ``--control`` address the login was made with: a client command uses the token only
when it talks to that same address (or list), and only until ``expires_at``. The token is a credential,
so the file is written only by its owner's process and readable only by its owner (mode 0600, in a
directory made 0700), and it is replaced whole, so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from corral.errors import FailedPrecondition

__all__ = ["LOGIN_FILE_ENV", "LoginFileError", "SavedLogin", "load", "path", "remove", "save"]

LOGIN_FILE_ENV = "CORRAL_LOGIN_FILE"
"""Environment variable naming the saved login's file (instead of the one in the configuration directory)."""


class LoginFileError(FailedPrecondition):
    """Raised when the saved login cannot be read or is not one; the message names the file."""


@dataclass(frozen=True, slots=True)
class SavedLogin:
    """What ``corral login`` saved: the token of ``name`` for the control plane at ``control``."""

    control: str
    """The ``--control`` address (or list) the login was made with."""
    name: str
    token: str = field(repr=False)  # a bearer credential: kept out of anything that prints the value
    expires_at: datetime
    """When the token stops working (aware)."""

    def usable(self, control: str, now: datetime) -> bool:
        """True when the token is for ``control`` (the address as given) and has not expired at ``now``."""
        return self.control == control and now < self.expires_at

    def to_json(self) -> dict[str, str]:
        """The file's JSON object."""
        return {
            "control": self.control,
            "name": self.name,
            "token": self.token,
            "expires_at": self.expires_at.isoformat(),
        }


def path() -> Path:
    """Where the saved login lives (the file need not exist)."""
    explicit = os.environ.get(LOGIN_FILE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME")
    # The XDG spec says a relative value is invalid and to be ignored: it would move with the working directory.
    base = Path(config) if config and os.path.isabs(config) else Path.home() / ".config"
    return base / "corral" / "login"


def save(login: SavedLogin, file: Path | None = None) -> Path:
    """Write ``login`` to ``file`` (default :func:`path`), replacing any saved before, and return the path.

    The directory is made (mode 0700) when missing; the file is written under a temporary name in the
    same directory, created 0600, and renamed over the old one, so the file is never readable by others
    and never half-written.

    Raises:
        LoginFileError: the file cannot be written (a read-only home, a directory in its place); the message
            names it. Any login saved before is left as it was.
    """
    target = path() if file is None else file
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)  # mkstemp: mode 0600
    except OSError as exc:
        raise _unsaved(target, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(login.to_json(), f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())  # so a crash after the rename cannot leave an empty file in its place
        os.replace(temporary, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise _unsaved(target, exc) from None
        raise
    return target


def load(file: Path | None = None) -> SavedLogin | None:
    """The login saved in ``file`` (default :func:`path`), or None when there is no file.

    An ``expires_at`` without a UTC offset is taken as UTC.

    Raises:
        LoginFileError: the file cannot be read, or does not hold a saved login; the message names it.
    """
    source = path() if file is None else file
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise _broken(source, f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _broken(source, f"is not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    if not isinstance(value, dict):
        raise _broken(source, "does not hold a JSON object")
    for key in ("control", "name", "token", "expires_at"):
        if not isinstance(value.get(key), str) or not value[key]:
            raise _broken(source, f"has no {key!r} string")
    try:
        expires_at = datetime.fromisoformat(value["expires_at"])
    except ValueError:
        raise _broken(source, f"has an 'expires_at' that is not an ISO 8601 time: {value['expires_at']!r}") from None
    if expires_at.tzinfo is None:
        expires_at = expires_at.replace(tzinfo=UTC)
    return SavedLogin(control=value["control"], name=value["name"], token=value["token"], expires_at=expires_at)


def remove(file: Path | None = None) -> bool:
    """Delete the saved login in ``file`` (default :func:`path`); False when there was none.

    Raises:
        LoginFileError: it is there and cannot be deleted (a directory, no permission); the message names it.
    """
    target = path() if file is None else file
    try:
        target.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise LoginFileError(f"the saved login {target} cannot be removed: {exc.strerror or exc}") from None
    return True


def _unsaved(target: Path, exc: OSError) -> LoginFileError:
    return LoginFileError(
        f"the login cannot be saved to {target}: {exc.strerror or exc}; set ${LOGIN_FILE_ENV} to a file that "
        "can be written, or print the token with `corral login --print`"
    )


def _broken(source: Path, problem: str) -> LoginFileError:
    return LoginFileError(f"the saved login {source} {problem}; log in again, or remove it with `corral logout`")
