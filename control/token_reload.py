"""TokenFileWatcher: CORRAL_AUTH_TOKEN_FILE is read again when it changes or on SIGHUP, without a restart.

Rotating a client token is then: add the new token to the file, move the clients over, remove the old
one. The file is checked every ``interval_sec`` by its size, modification time and inode (an edit in
place, a rename over it, or a Kubernetes secret update, which swaps a symlink, all change one of them);
SIGHUP asks for a reload at once.

A reload applies the start-up rules (:func:`control.auth.client_tokens`). A file that breaks one, cannot
be read or holds no token changes nothing: the tokens in force stay, and the error is logged with the
line at fault and counted (``corral_auth_token_reloads_total{result="error"}``), so a typo never locks
every client out nor lets anyone in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from control.auth import Authenticator, TokenError, client_tokens
from control.metrics import Metrics
from corral import logs

logger = logging.getLogger(__name__)

CHECK_INTERVAL_SEC = 2.0
"""How often the file's size, modification time and inode are compared with the last ones read."""

_Stamp = tuple[int, int, int] | None


def _stamp(path: str) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


class TokenFileWatcher:
    """Reloads the client tokens of ``auth`` from ``token_file`` (plus the fixed ``tokens``); see the module docstring."""

    def __init__(
        self,
        auth: Authenticator,
        tokens: tuple[str, ...],
        token_file: str,
        metrics: Metrics,
        interval_sec: float = CHECK_INTERVAL_SEC,
    ) -> None:
        self._auth = auth
        self._tokens = tokens
        self._file = token_file
        self._metrics = metrics
        self._interval = interval_sec
        self._stamp = _stamp(token_file)
        """The file as it was when its tokens were last read (at start-up, before this watcher)."""
        self._now = asyncio.Event()

    def reload_soon(self) -> None:
        """Reload at once (the SIGHUP handler), whether or not the file looks changed."""
        self._now.set()

    async def run(self) -> None:
        """Check the file every interval, reload when it changed or when asked; runs until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._now.wait(), self._interval)
            asked = self._now.is_set()
            self._now.clear()
            stamp = _stamp(self._file)
            if asked or stamp != self._stamp:
                self._stamp = stamp
                self.reload("signal" if asked else "file changed")

    def reload(self, why: str) -> None:
        """Read the file and put its tokens in force; a file that breaks a rule changes nothing."""
        try:
            clients = client_tokens(self._tokens, self._file)
            self._auth.replace_clients(clients)
        except TokenError as exc:
            self._metrics.auth_token_reloads.labels("error").inc()
            logger.error(logs.AUTH_TOKENS_RELOAD_FAILED, extra={"why": why, "reason": str(exc)})
            return
        self._metrics.auth_token_reloads.labels("ok").inc()
        logger.info(logs.AUTH_TOKENS_RELOADED, extra={"why": why, "tokens": len(clients)})
