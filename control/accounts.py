"""Accounts: people who log in with a name and a password, beside the configured client tokens.

``CORRAL_ACCOUNTS=admin`` (admins create accounts) or ``open`` (anyone may register, as on a
research cluster where each user signs up). An account's name is a principal like a token's name:
it owns the jobs it submits, and CORRAL_GROUPS, CORRAL_AUTH_ADMINS, CORRAL_JOB_VISIBILITY and fair
share go by it.

* Passwords are kept as bcrypt hashes (cost ``CORRAL_PASSWORD_ROUNDS``), never in clear. Hashing
  takes a quarter of a second on purpose, so it runs off the event loop on threads of its own, half
  the machine's cores at most: a flood of logins cannot take the CPU the scheduler needs. At most
  :data:`MAX_WAITING` hashings wait for those threads; past that a login, a registration or a new
  password is refused (RESOURCE_EXHAUSTED) rather than queued without end.
* Login answers a JWT (HS256) that expires after ``CORRAL_LOGIN_TTL_SEC``. The key that signs it is
  made once and kept in the store (:meth:`control.store.Store.login_key`): a login outlives a restart
  and a failover to a standby. Whoever can read the store can therefore make logins; it holds every
  job's payload and result too, and is kept as private.
* A login names the account's *session*, made anew with each password: a new password, or deleting
  the account, ends every login made before, also one of a later account of the same name.
  :meth:`Accounts.end_all_logins` replaces the key, which ends every login of every account.
* Jobs are owned by name, and stay when their account is deleted or their token leaves the token
  file. So while the store holds a job of a name, open registration may not take it (ALREADY_EXISTS):
  the newcomer would get the jobs, their payloads and idempotency keys. One who manages accounts may
  create it, handing the jobs over on purpose (logged at warning level); once retention has purged
  every job of the name, it is free again.
* A wrong name and a wrong password get the same answer, after the same work (a name without an
  account is checked against a hash of nothing), so a login does not tell which names exist. After
  :data:`MAX_FAILURES` failures for one name within :data:`FAILURE_WINDOW_SEC`, that name is refused
  (RESOURCE_EXHAUSTED, with the time to wait) until the oldest failure leaves the window. An attempt
  counts as a failure from its start until it succeeds, so a burst of guesses sent at once is held to
  the same number; but one whose password was never checked (refused because the hashing queue is
  full, or given up by its caller before its hash ran) counts for nothing once it ends, so that
  attempts costing no hash cannot lock a name, nor fill the table. The table holds
  :data:`MAX_TRACKED` names at most: when full, it drops the names whose failures have all left the
  window, then names not locked, never a locked one; when every name in it is locked, a new name goes
  untracked (not locked) until a lock lapses. A name that breaks the name rule (:func:`check_name`)
  cannot be an account's: it is refused at once (INVALID_ARGUMENT, the rule being public) and kept
  nowhere, so that names of megabytes cannot fill memory. A login whose password was checked while
  the account's password changed is refused: it was checked against a password that is no longer the
  account's.
* A change (a registration, a new password, a deletion, new keys) counts from the moment it is
  durable: memory follows the store only once the store has committed it, so that what a caller saw
  (a new password accepted, old logins refused) is never undone by a crash before that commit. The
  changes of accounts are made one at a time, so that a deletion and a new password of one account,
  or two registrations of one name, cannot cross between their check and their commit.

A login's signature is checked at the first call that sends it (about 40 µs); the decoded login is
then kept (4,096 at most, until it expires), so later calls cost a dict probe. A login is accepted in
the one spelling it was issued in: three base64url parts without padding, each the canonical encoding
of its bytes (the JWT library would also take padding, or other values of the spare bits of a part's
last character).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import re
import secrets
from collections import OrderedDict, deque
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

import bcrypt
import jwt

from control.auth import LOGIN_EXPIRES, PRINCIPAL_NAME
from control.clock import Clock, SystemClock
from control.store import AccountEntry, Store
from corral import logs
from corral.errors import AlreadyExists, InvalidArgument, NotFound, RateLimited, Unauthenticated

__all__ = [
    "FAILURE_WINDOW_SEC",
    "MAX_FAILURES",
    "MAX_TRACKED",
    "MAX_WAITING",
    "Accounts",
    "LoginGrant",
    "check_name",
    "check_password_rule",
]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

MIN_PASSWORD_BYTES = 8
MAX_PASSWORD_BYTES = 72
"""bcrypt reads no further: a longer password would be cut without a word, so it is refused."""
MAX_FAILURES = 5
FAILURE_WINDOW_SEC = 60.0
MAX_WAITING = 64
"""Hashings that may wait for the hashing threads at once."""
MAX_TRACKED = 100_000
"""Names whose failures are tracked at once (see :meth:`Accounts._fail`)."""
_TOKEN_FORM = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_ISSUER = "corral"
_ALGORITHM = "HS256"
_KEY_BYTES = 32
_CACHE_SIZE = 4096


def check_name(name: str) -> None:
    """Raises InvalidArgument unless ``name`` is 1 to 64 of ``[A-Za-z0-9._@-]``: the rule of every call that
    names an account, checked before the account is looked up (no account has a name that breaks it)."""
    if not name:
        raise InvalidArgument("name", "is required: 1 to 64 of [A-Za-z0-9._@-]")
    if not PRINCIPAL_NAME.fullmatch(name):
        raise InvalidArgument("name", f"must be 1 to 64 of [A-Za-z0-9._@-], got {name[:80]!r}")


def check_password_rule(password: str, field: str = "password") -> bytes:
    """The password's UTF-8 bytes; InvalidArgument naming ``field`` unless they are 8 to 72."""
    raw = password.encode("utf-8", "surrogatepass")
    if not MIN_PASSWORD_BYTES <= len(raw) <= MAX_PASSWORD_BYTES:
        raise InvalidArgument(
            field,
            f"must be {MIN_PASSWORD_BYTES} to {MAX_PASSWORD_BYTES} bytes of UTF-8 (what bcrypt hashes), got {len(raw)}",
        )
    return raw


@dataclass(frozen=True, slots=True)
class LoginGrant:
    """What a successful login answers."""

    token: str
    expires_at: float
    account: AccountEntry


@dataclass(frozen=True, slots=True)
class _Verified:
    name: str
    session: str
    expires_at: float


class Accounts:
    """The accounts of one control plane, in memory and in the store (see the module docstring).

    Args:
        store: Where accounts live; read once here.
        mode: CORRAL_ACCOUNTS (``admin`` or ``open``).
        ttl_sec: How long a login lasts.
        rounds: bcrypt's cost (2**rounds).
        reserved: Names that accounts may not take (the configured client tokens' names), asked at
            each registration, so that a reloaded token file counts.
        clock: Wall-clock time for logins, monotonic time for the failure window (tests move both).
    """

    def __init__(
        self,
        store: Store,
        mode: str,
        ttl_sec: float,
        rounds: int,
        reserved: Callable[[], Collection[str]] = frozenset,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.mode = mode
        self.ttl_sec = ttl_sec
        self.rounds = rounds
        self.reserved = reserved
        """Names accounts may not take: the configured client tokens' (the app points it at the
        authenticator's, which a token file reload changes)."""
        self._clock = clock or SystemClock()
        self._key = store.login_key(os.urandom(_KEY_BYTES))
        self._accounts = {a.name: a for a in store.load_accounts()}
        self._verified: OrderedDict[str, _Verified] = OrderedDict()
        self._failures: dict[str, deque[float]] = {}
        self.max_tracked = MAX_TRACKED
        """Names the failure table holds at most (tests make it small)."""
        self._no_room_until = float("-inf")
        """Until when (monotonic) every name in a full table is locked: new names go untracked without a sweep."""
        self._hasher = ThreadPoolExecutor(
            max_workers=max(1, (os.cpu_count() or 2) // 2), thread_name_prefix="password-hash"
        )
        self._hashing = 0
        self.max_waiting = MAX_WAITING
        self._changing: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        """Held by each change from its last check to its commit and the memory after (see the module),
        with the loop it belongs to."""
        # Checked when a name has no account, so that such a login costs what a real one does. Made on the
        # hashing threads: start-up does not wait the quarter of a second it takes.
        self._decoy = self._hasher.submit(bcrypt.hashpw, secrets.token_bytes(16), bcrypt.gensalt(rounds))
        self.on_login: Callable[[str], None] | None = None
        """Called with each login's outcome (ok, refused, throttled): the metrics count them."""

    @property
    def open(self) -> bool:
        """Whether anyone may register (CORRAL_ACCOUNTS=open)."""
        return self.mode == "open"

    def get(self, name: str) -> AccountEntry | None:
        """The account ``name``, or None when there is none (from memory: no store read)."""
        return self._accounts.get(name)

    def all(self) -> list[AccountEntry]:
        """Every account, by name."""
        return sorted(self._accounts.values(), key=lambda a: a.name)

    # ---- changes ------------------------------------------------------------------------------
    async def register(self, name: str, password: str, *, by_admin: bool = False) -> AccountEntry:
        """Create the account ``name``; returns it once stored.

        Args:
            by_admin: Whether one who manages accounts creates it (always so with ``mode`` admin): only
                then may it take a name that still owns jobs (see the module docstring).

        Raises:
            InvalidArgument: the name or the password breaks its rule.
            AlreadyExists: the name is an account's or a configured client token's, or it owns jobs and
                ``by_admin`` is false with open registration.
        """
        check_name(name)
        raw = check_password_rule(password)
        self._check_free(name)
        await self._former_jobs(name, by_admin)
        hashed = await self._hash(raw)
        async with self._changes():
            self._check_free(name)  # another registration of the name may have finished while we hashed
            former_jobs = await self._former_jobs(name, by_admin)  # or a token left the file, or a purge ran
            now = self._clock.now()
            entry = AccountEntry(name, hashed, secrets.token_hex(16), now, now)
            self.store.put_account(entry)
            await self.store.commit()
            self._accounts[name] = entry
        if former_jobs:
            logger.warning(logs.ACCOUNT_REGISTERED, extra={"account": name, "former_jobs": True})
        else:
            logger.info(logs.ACCOUNT_REGISTERED, extra={"account": name})
        return entry

    async def set_password(self, name: str, password: str) -> AccountEntry:
        """Give ``name`` a new password, which ends its earlier logins; returns the account once stored.

        Raises:
            InvalidArgument: the name or the password breaks its rule.
            NotFound: there is no such account.
        """
        check_name(name)
        raw = check_password_rule(password)
        self._existing(name)
        hashed = await self._hash(raw)
        async with self._changes():
            entry = replace(
                self._existing(name),  # deleted while we hashed: NotFound, and nothing stored
                password_hash=hashed,
                session=secrets.token_hex(16),
                password_changed_at=self._clock.now(),
            )
            self.store.put_account(entry)
            await self.store.commit()
            self._accounts[name] = entry
        logger.info(logs.ACCOUNT_PASSWORD_CHANGED, extra={"account": name})
        return entry

    async def delete(self, name: str) -> None:
        """Delete the account ``name`` (its logins end with it; its jobs stay).

        Raises:
            InvalidArgument: the name breaks its rule.
            NotFound: there is no such account.
        """
        check_name(name)
        self._existing(name)
        async with self._changes():
            self._existing(name)  # deleted by another call while this one waited its turn
            self.store.delete_account(name)
            await self.store.commit()
            del self._accounts[name]
        logger.info(logs.ACCOUNT_DELETED, extra={"account": name})

    async def end_all_logins(self) -> None:
        """End every login of every account: a new key signs logins from now on (passwords stay)."""
        key = os.urandom(_KEY_BYTES)
        async with self._changes():
            self.store.replace_login_key(key)
            await self.store.commit()
            self._key = key
            self._verified.clear()
        logger.warning(logs.LOGINS_ENDED, extra={"accounts": len(self._accounts)})

    # ---- logging in ---------------------------------------------------------------------------
    async def check_password(self, name: str, password: str) -> AccountEntry:
        """The account when ``password`` is its password.

        Raises:
            InvalidArgument: ``name`` breaks the name rule (no account has such a name, and the rule is
                public, so saying so tells nothing; it costs no hash, and counting its failures would keep
                the name: megabytes each, for any caller without credentials).
            Unauthenticated: no such account, or another password (the same words for both).
            RateLimited: too many failures for ``name`` lately, or the hashing queue is full.
        """
        check_name(name)
        self._check_throttle(name)
        self._check_room()  # refused before it counts: an attempt that checks nothing is no failure
        # Until it succeeds: guesses sent together count before any of them is checked.
        stamp = self._fail(name)
        raw = password.encode("utf-8", "surrogatepass")
        entry = self._accounts.get(name)
        try:
            hashed = entry.password_hash.encode() if entry is not None else await asyncio.wrap_future(self._decoy)
            # bcrypt reads 72 bytes at most; a longer attempt cannot be any stored password.
            matches = await self._run(bcrypt.checkpw, raw[:MAX_PASSWORD_BYTES], hashed)
        except BaseException:
            # Refused by a full queue, or its caller went away (a hash not yet started is then dropped):
            # either way the caller learns nothing of the password, so the attempt counts for nothing.
            self._unfail(name, stamp)
            raise
        matches = matches and len(raw) <= MAX_PASSWORD_BYTES
        # Deleted, or given a new password, while we checked: the password checked is not the account's
        # now, and a login signed for the account as it is now would outlive the change it raced.
        current = self._accounts.get(name)
        if not matches or entry is None or current is None or current.session != entry.session:
            raise Unauthenticated("wrong name or password")
        entry = current
        self._failures.pop(name, None)
        return entry

    async def login(self, name: str, password: str) -> LoginGrant:
        """A signed login for ``name`` when ``password`` is its password (see :meth:`check_password`)."""
        try:
            entry = await self.check_password(name, password)
        except InvalidArgument:
            self._count("refused")  # not logged: it cost nothing, so a flood of them would cost the log only
            raise
        except RateLimited:
            self._count("throttled")
            raise
        except Unauthenticated:
            self._count("refused")
            logger.info(logs.LOGIN_REFUSED, extra={"account": name[:64]})
            raise
        now = self._clock.now()
        expires = now + self.ttl_sec
        claims = {"sub": name, "sid": entry.session, "iat": int(now), "exp": expires, "iss": _ISSUER}
        token = jwt.encode(claims, self._key, algorithm=_ALGORITHM)
        self._count("ok")
        logger.info(logs.LOGIN, extra={"account": name})
        return LoginGrant(token, expires, entry)

    def verify(self, token: str) -> str:
        """The account name a login token stands for; sets :data:`LOGIN_EXPIRES` for the call.

        Raises:
            Unauthenticated: the token is not a login of this store's key, it expired, or its account
                was deleted or given a new password since.
        """
        now = self._clock.now()
        seen = self._verified.get(token)
        if seen is None:
            seen = self._decode(token)
            self._verified[token] = seen
            if len(self._verified) > _CACHE_SIZE:
                self._verified.popitem(last=False)
        if seen.expires_at <= now:
            self._verified.pop(token, None)
            raise Unauthenticated("the login has expired: log in again")
        entry = self._accounts.get(seen.name)
        if entry is None or entry.session != seen.session:
            raise Unauthenticated(
                "the login has ended (the account's password changed, or it was deleted): log in again"
            )
        LOGIN_EXPIRES.set(seen.expires_at)
        return seen.name

    def _decode(self, token: str) -> _Verified:
        if not _canonical(token):
            raise Unauthenticated("invalid token")
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=[_ALGORITHM],
                issuer=_ISSUER,
                options={"require": ["sub", "sid", "exp", "iat", "iss"], "verify_exp": False},
            )
        except jwt.InvalidTokenError:
            raise Unauthenticated("invalid token") from None
        name, session, expires = claims["sub"], claims["sid"], claims["exp"]
        if not isinstance(name, str) or not isinstance(session, str) or not isinstance(expires, int | float):
            raise Unauthenticated("invalid token")
        return _Verified(name, session, float(expires))

    # ---- helpers ------------------------------------------------------------------------------
    def _existing(self, name: str) -> AccountEntry:
        entry = self._accounts.get(name)
        if entry is None:
            raise NotFound(f"account {name[:80]!r} not found")
        return entry

    def _check_free(self, name: str) -> None:
        if name in self._accounts:
            raise AlreadyExists(f"account {name!r} already exists")
        reserved = self.reserved()
        if name in reserved:
            raise AlreadyExists(f"{name!r} is the name of a configured client token: choose another name")
        # A name that differs from another only in case (OPS beside the admin ops) would pass for it where
        # people read names: the audit log, the dashboard, an owner column.
        folded = name.lower()
        for other in (*self._accounts, *reserved):
            if other.lower() == folded:
                raise AlreadyExists(
                    f"{name!r} differs from the name {other!r} only in case, and would pass for it: choose another name"
                )

    async def _former_jobs(self, name: str, by_admin: bool) -> bool:
        """Whether the store holds a job of ``name`` (committed: a read sees no other).

        Raises:
            AlreadyExists: it does, and open registration would take it (not ``by_admin``).
        """
        if (await self.store.list_jobs((), "", 1, 0, owners=(name,))).total == 0:
            return False
        if self.open and not by_admin:
            raise AlreadyExists(
                f"{name!r} still owns jobs of a former account or token: choose another name "
                "(an admin may create it, and so hand those jobs over)"
            )
        return True

    def _changes(self) -> asyncio.Lock:
        """The lock that makes changes one at a time (made on the running loop: tests run several)."""
        loop = asyncio.get_running_loop()
        if self._changing is None or self._changing[0] is not loop:
            self._changing = (loop, asyncio.Lock())
        return self._changing[1]

    def _check_throttle(self, name: str) -> None:
        failures = self._failures.get(name)
        if failures is None:
            return
        now = self._clock.monotonic()
        while failures and failures[0] <= now - FAILURE_WINDOW_SEC:
            failures.popleft()
        if not failures:
            del self._failures[name]
        elif len(failures) >= MAX_FAILURES:
            wait = failures[0] + FAILURE_WINDOW_SEC - now
            raise RateLimited(
                f"{len(failures)} logins for {name[:64]!r} failed (or have not finished) in the last "
                f"{FAILURE_WINDOW_SEC:g} s: try again in {max(1.0, wait):.0f} s",
                wait,
            )

    def _fail(self, name: str) -> float | None:
        """Count a failure of ``name`` now; returns its time, or None when the table had no room for a new
        name (every name in it is locked: see the module docstring)."""
        now = self._clock.monotonic()
        failures = self._failures.get(name)
        if failures is None:
            if len(self._failures) >= self.max_tracked and not self._make_room(now):
                return None
            failures = self._failures[name] = deque(maxlen=MAX_FAILURES)
        failures.append(now)
        return now

    def _make_room(self, now: float) -> bool:
        """Drop names from the full table, the ones whose failures have all left the window first, then the
        ones not locked (oldest first), down to nine tenths, so that the sweep is paid once for many new
        names; never a locked one. Whether there is room for a new name now."""
        if now < self._no_room_until:
            return False
        horizon = now - FAILURE_WINDOW_SEC
        for name, failures in list(self._failures.items()):
            while failures and failures[0] <= horizon:
                failures.popleft()
            if not failures:
                del self._failures[name]
        target = min(self.max_tracked - 1, self.max_tracked * 9 // 10)
        if len(self._failures) > target:
            unlocked = [name for name, failures in self._failures.items() if len(failures) < MAX_FAILURES]
            for name in unlocked[: len(self._failures) - target]:
                del self._failures[name]
        if len(self._failures) < self.max_tracked:
            return True
        # Every name is locked: none may go, and none is droppable before the first of them lapses.
        self._no_room_until = min(failures[0] for failures in self._failures.values()) + FAILURE_WINDOW_SEC
        return False

    def _unfail(self, name: str, stamp: float | None) -> None:
        """Take back the failure :meth:`_fail` counted at ``stamp`` (an attempt that checked nothing)."""
        failures = self._failures.get(name)
        if stamp is None or failures is None:
            return
        try:
            failures.remove(stamp)
        except ValueError:  # it left the window meanwhile, or a success cleared the name
            return
        if not failures:
            del self._failures[name]
        self._no_room_until = float("-inf")  # a name may have come unlocked: the next sweep may find room

    def _count(self, outcome: str) -> None:
        if self.on_login is not None:
            self.on_login(outcome)

    async def _hash(self, raw: bytes) -> str:
        return (await self._run(bcrypt.hashpw, raw, bcrypt.gensalt(self.rounds))).decode()

    def _check_room(self) -> None:
        if self._hashing >= self.max_waiting:
            raise RateLimited("too many logins and password changes at once: try again in 1 s", 1.0)

    async def _run(self, fn: Callable[..., _T], *args: object) -> _T:
        self._check_room()
        self._hashing += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._hasher, fn, *args)
        finally:
            self._hashing -= 1

    def close(self) -> None:
        """Stop the hashing threads without waiting: hashings not yet started are cancelled."""
        self._hasher.shutdown(wait=False, cancel_futures=True)


def _canonical(token: str) -> bool:
    """Whether ``token`` is three base64url parts without padding, each the one encoding of its bytes."""
    if not _TOKEN_FORM.fullmatch(token):
        return False
    for part in token.split("."):
        try:
            raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        except (binascii.Error, ValueError):
            return False
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != part:
            return False
    return True
