"""Who may call what: bearer tokens for clients, a separate token (and optionally a certificate) for workers.

Roles, by service (:func:`role_of`)::

    grpc.health.v1.Health      OPEN    liveness/readiness probes answer without credentials
    corral.v1.WorkerService    WORKER  the worker token (CORRAL_WORKER_TOKEN); with CORRAL_TLS_CLIENT_CA
                                       also a client certificate verified by that CA (mutual TLS)
    AccountService Login,      ANYONE  no credentials needed; credentials sent anyway are checked
      Register                         (the servicer asks for an admin where registration is closed)
    anything else              CLIENT  a client token (CORRAL_AUTH_TOKENS, CORRAL_AUTH_TOKEN_FILE) or
                                       a login (control.accounts): JobService, AdminService, the rest
                                       of AccountService, server reflection, and any service added
                                       later (deny by default)

A client token never passes as the worker token and the worker token never passes as a client token.
A role whose credentials are not configured is open: no client tokens, no client auth (the default).

Tokens are compared in constant time: each configured token is stored under a keyed BLAKE2b MAC of
itself (the key is random per process), and a presented token is looked up by its MAC. The lookup is
one hash and one dict probe whatever the number of tokens, and since nobody outside knows the key, the
timing of the probe says nothing about any token (the same argument as ``hmac.compare_digest``, which
compares the worker token's MAC).

This module imports nothing from grpc; the gRPC interceptor (``control.api.interceptors``) and the
REST bridge (``control.gateway.server``) apply it.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.errors import Unauthenticated

if TYPE_CHECKING:
    from control.accounts import Accounts
    from control.config import ControlConfig

__all__ = [
    "LOGIN_EXPIRES",
    "MIN_TOKEN_CHARS",
    "PRINCIPAL_NAME",
    "WORKER_PRINCIPAL",
    "Authenticator",
    "Role",
    "TokenError",
    "bearer_token",
    "client_tokens",
    "parse_tokens",
    "read_token_file",
    "role_of",
    "token_problem",
]

MIN_TOKEN_CHARS = 16
"""Shortest token accepted: a guessable token is no protection."""
WORKER_PRINCIPAL = "worker"
"""The principal of a worker authenticated by the worker token alone (``worker:<CN>`` with a certificate)."""

_TOKEN = re.compile(r"[!-~]+")
"""Printable ASCII without spaces (what fits an HTTP header and gRPC metadata unchanged)."""
PRINCIPAL_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")
"""What a principal's name may be (a token's, an account's, a group's): no ':' or ',', which separate
names in settings, and nothing a log line or a header would need to escape."""
_BEARER = "bearer "

LOGIN_EXPIRES: ContextVar[float | None] = ContextVar("corral_login_expires", default=None)
"""When the current call's login (control.accounts) expires; None when it came with a configured
token, or with none. Set by every client credentials check."""


class Role(enum.Enum):
    """What a call needs."""

    OPEN = "open"
    ANYONE = "anyone"
    """No credentials needed, but credentials sent are checked (a wrong token is still refused)."""
    CLIENT = "client"
    WORKER = "worker"


OPEN_SERVICES = frozenset({"grpc.health.v1.Health"})
"""Services every caller may use: Kubernetes probes carry no credentials."""
WORKER_SERVICES = frozenset({"corral.v1.WorkerService"})
"""Services only workers use."""
ANYONE_METHODS = frozenset({"corral.v1.AccountService/Login", "corral.v1.AccountService/Register"})
"""Methods a caller without credentials may call: how one gets credentials."""


def role_of(service: str, method: str = "") -> Role:
    """The role a call to ``method`` of ``service`` (full name, ``corral.v1.JobService``) needs; deny by
    default."""
    if service in OPEN_SERVICES:
        return Role.OPEN
    if service in WORKER_SERVICES:
        return Role.WORKER
    if f"{service}/{method}" in ANYONE_METHODS:
        return Role.ANYONE
    return Role.CLIENT


class TokenError(ValueError):
    """Raised when a configured token or token-file line breaks a rule; the message says which and why."""


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a token (printable ASCII without spaces, ',' or ':', >= 16 characters), or None."""
    if not _TOKEN.fullmatch(token) or "," in token or ":" in token:
        return "a token must be printable ASCII without spaces, ',' or ':'"
    if len(token) < MIN_TOKEN_CHARS:
        return f"a token must be at least {MIN_TOKEN_CHARS} characters, got {len(token)}"
    return None


def parse_tokens(entries: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``(where, "token" | "name:token")`` entries -> {token: principal}.

    ``where`` says where the entry came from (``"entry 2"``, ``"line 7"``) for the error message. A token
    without a name gets the principal ``token-<first 12 hex of its SHA-256>``: stable, and not the secret.

    Raises:
        TokenError: a name or token breaks its rule, or a token repeats.
    """
    tokens: dict[str, str] = {}
    for where, entry in entries:
        name, sep, token = entry.partition(":")
        if not sep:
            name, token = "", entry
        elif not PRINCIPAL_NAME.fullmatch(name):
            raise TokenError(f"{where}: the name before ':' must match [A-Za-z0-9._@-]{{1,64}}")
        problem = token_problem(token)
        if problem is not None:
            raise TokenError(f"{where}: {problem}")
        if token in tokens:
            raise TokenError(f"{where}: the token repeats an earlier one")
        tokens[token] = name or f"token-{hashlib.sha256(token.encode()).hexdigest()[:12]}"
    return tokens


def read_token_file(path: str) -> list[tuple[str, str]]:
    """The entries of a token file: one ``token`` or ``name:token`` a line; blank lines and ``#`` comments skipped.

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return [(f"line {n}", s) for n, line in enumerate(lines, 1) if (s := line.strip()) and not s.startswith("#")]


def client_tokens(tokens: Sequence[str], token_file: str) -> dict[str, str]:
    """Client token -> principal from the CORRAL_AUTH_TOKENS entries and the lines of CORRAL_AUTH_TOKEN_FILE.

    Start-up and every reload of the file read the tokens through here, so both apply the same rules.

    Raises:
        TokenError: the message starts with the variable at fault and says which entry or line breaks
            which rule (or why the file cannot be read).
    """
    entries = [(f"entry {n}", token) for n, token in enumerate(tokens, 1)]
    try:
        clients = parse_tokens(entries)
    except TokenError as exc:
        raise TokenError(f"CORRAL_AUTH_TOKENS {exc}") from None
    if not token_file:
        return clients
    try:
        lines = read_token_file(token_file)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise TokenError(
            f"CORRAL_AUTH_TOKEN_FILE must be a readable file of tokens, got {token_file!r} ({reason})"
        ) from None
    if not lines:
        raise TokenError(f"CORRAL_AUTH_TOKEN_FILE must hold at least one token, got {token_file!r}")
    try:
        return parse_tokens(entries + lines)
    except TokenError as exc:
        raise TokenError(f"CORRAL_AUTH_TOKEN_FILE {token_file!r} {exc}") from None


def bearer_token(authorization: str | bytes | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (scheme case-insensitive), else None."""
    if authorization is None:
        return None
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    if authorization[:7].lower() != _BEARER:
        return None
    return authorization[7:].strip() or None


@dataclass(frozen=True, slots=True)
class _Keyed:
    key: bytes

    def mac(self, token: str) -> bytes:
        return hashlib.blake2b(token.encode("utf-8", "surrogatepass"), key=self.key, digest_size=32).digest()


class Authenticator:
    """Checks the credentials of one call for a :class:`Role`; see the module docstring.

    Args:
        clients: Client token -> principal. Empty: client calls need no token (unless ``accounts``).
        worker_token: The token workers must present. Empty: none needed.
        worker_cert: Whether workers must also present a client certificate verified by the
            server's client CA (checked by the gRPC layer, which sees the TLS session).
        accounts: Logins accepted as client credentials too (CORRAL_ACCOUNTS); client calls then
            always need credentials.
    """

    def __init__(
        self,
        clients: Mapping[str, str],
        worker_token: str = "",
        worker_cert: bool = False,
        accounts: Accounts | None = None,
    ) -> None:
        keyed = self._keyed = _Keyed(os.urandom(32))
        self._clients = {keyed.mac(token): principal for token, principal in clients.items()}
        self._names = frozenset(clients.values())
        self._worker = keyed.mac(worker_token) if worker_token else None
        self.accounts = accounts
        self.client_auth = bool(clients) or accounts is not None
        """Whether client calls need a client token."""
        self.worker_cert = worker_cert
        """Whether workers need a verified client certificate."""
        self.worker_auth = self._worker is not None or worker_cert
        """Whether worker calls need credentials (the token, a certificate, or both)."""
        self.on_refused: Callable[[Role], None] | None = None
        """Called with the role a call needed each time its token is refused (the metrics count them)."""

    @classmethod
    def from_config(cls, config: ControlConfig, accounts: Accounts | None = None) -> Authenticator | None:
        """The authenticator the settings ask for, or None when nothing needs credentials.

        The settings were checked by ``ControlConfig.check``, so the token file reads and parses here.
        """
        clients = client_tokens(config.auth_tokens, config.auth_token_file)
        auth = cls(clients, config.worker_token, worker_cert=bool(config.tls_client_ca), accounts=accounts)
        return auth if auth.client_auth or auth.worker_auth else None

    @property
    def token_names(self) -> frozenset[str]:
        """The principals of the configured client tokens (names an account may not take)."""
        return self._names

    def replace_clients(self, clients: Mapping[str, str]) -> None:
        """Accept exactly ``clients`` (token -> principal) from now on: a reloaded token file.

        Calls already past their check are not affected, and a reload cannot switch client auth off.

        Raises:
            TokenError: ``clients`` is empty while client auth is on, or it holds the worker token.
        """
        if self.client_auth and not clients and self.accounts is None:
            raise TokenError("no client token left: client auth stays on, so every client would be refused")
        keyed = self._keyed
        macs = {keyed.mac(token): principal for token, principal in clients.items()}
        if self._worker is not None and self._worker in macs:
            raise TokenError("a client token equals CORRAL_WORKER_TOKEN")
        self._clients = macs  # one assignment: a call sees the old set or the new one, never a mix
        self._names = frozenset(clients.values())

    def authenticate(self, role: Role, authorization: str | bytes | None) -> str | None:
        """The principal of a call presenting ``authorization`` for ``role``; None when the role is open.

        For WORKER this checks the token only; the certificate is the gRPC layer's part.

        Raises:
            Unauthenticated: the credentials are missing, malformed, wrong, or of the other role.
        """
        try:
            return self._check(role, authorization)
        except Unauthenticated:
            if self.on_refused is not None:
                self.on_refused(role)
            raise

    def _check(self, role: Role, authorization: str | bytes | None) -> str | None:
        LOGIN_EXPIRES.set(None)  # a connection's next call must not inherit this one's login
        if role is Role.ANYONE:
            return None if authorization is None else self._check(Role.CLIENT, authorization)
        if role is Role.CLIENT:
            if not self.client_auth:
                return None
            token = self._token(authorization)
            principal = self._clients.get(self._keyed.mac(token))
            if principal is not None:
                return principal
            # A login is a JWT: three parts joined by dots (a configured token may look so too, and was
            # looked up first).
            if self.accounts is not None and token.count(".") == 2:
                return self.accounts.verify(token)
            if self._worker is not None and hmac.compare_digest(self._keyed.mac(token), self._worker):
                raise Unauthenticated("the worker token cannot call the client API: use a client token")
            raise Unauthenticated("invalid token")
        if role is Role.WORKER:
            if self._worker is None:
                return WORKER_PRINCIPAL if self.worker_cert else None
            token = self._token(authorization)
            mac = self._keyed.mac(token)
            if hmac.compare_digest(mac, self._worker):
                return WORKER_PRINCIPAL
            if mac in self._clients:
                raise Unauthenticated("a client token cannot connect a worker: use the worker token")
            raise Unauthenticated("invalid worker token")
        return None

    @staticmethod
    def _token(authorization: str | bytes | None) -> str:
        if not authorization:
            raise Unauthenticated("missing credentials: send 'authorization: Bearer <token>'")
        token = bearer_token(authorization)
        if token is None:
            raise Unauthenticated("the authorization is not a bearer token: send 'Bearer <token>'")
        return token
