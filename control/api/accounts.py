"""AccountServicer: registering, logging in, and managing accounts (control.accounts).

Who manages accounts (registers them where registration is closed, and the accounts of the names in
CORRAL_AUTH_ADMINS or CORRAL_GROUPS where it is open, lists them, resets another's password, deletes another's
account): the principals in CORRAL_AUTH_ADMINS, and, with
CORRAL_JOB_VISIBILITY=all (no admins there), the holders of configured client tokens, who run the
control plane. A logged-in account manages only itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from control.access import Access
from control.api import convert
from control.api.audited import audited
from control.api.status import grpc_errors
from control.audit import AuditLog
from control.auth import LOGIN_EXPIRES
from control.identity import PRINCIPAL
from control.store import AccountEntry
from corral.errors import FailedPrecondition, PermissionDenied, Unauthenticated
from corral.v1 import accounts_pb2

if TYPE_CHECKING:  # bcrypt and the JWT library load only where accounts are on (control.app)
    from control.accounts import Accounts


def _name(request: Any) -> str:
    """The account a request names: the target of its audit event."""
    return str(request.name)


class AccountServicer:
    """corral.v1.AccountService.

    Args:
        accounts: The accounts, or None when CORRAL_ACCOUNTS=off (every call then fails).
        access: The visibility rule, whose admins and groups accounts share.
    """

    def __init__(self, accounts: Accounts | None, access: Access, audit: AuditLog | None = None) -> None:
        self.accounts = accounts
        self.access = access
        self.audit = audit
        """Where every call but WhoAmI and ListAccounts is recorded (None: nowhere)."""

    def _on(self) -> Accounts:
        if self.accounts is None:
            raise FailedPrecondition("this control plane has no accounts (CORRAL_ACCOUNTS=off): use a client token")
        return self.accounts

    def _manages(self, caller: str | None) -> bool:
        """Whether ``caller`` manages accounts (see the module docstring)."""
        if not caller:
            return False
        if caller in self.access.admins:
            return True
        return not self.access.isolated and LOGIN_EXPIRES.get() is None

    def _check_manages(self, caller: str | None, what: str) -> None:
        if not caller:
            raise Unauthenticated(f"{what} needs an admin's credentials: send 'authorization: Bearer <token>'")
        if not self._manages(caller):
            raise PermissionDenied(
                f"{caller!r} may not {what}: that is for the principals in CORRAL_AUTH_ADMINS"
                + ("" if self.access.isolated else " and the holders of configured client tokens")
            )

    @staticmethod
    def _is_taken(accounts: Accounts, name: str) -> bool:
        """Whether ``name`` is an account's or a configured client token's already."""
        return accounts.get(name) is not None or name in accounts.reserved()

    def _check_not_privileged(self, name: str) -> None:
        """PERMISSION_DENIED for a name that open registration may not take: an admin's or a group member's."""
        how = "an admin's client token or login"
        if name in self.access.admins:
            raise PermissionDenied(
                f"{name!r} is named in CORRAL_AUTH_ADMINS: an admin's account is created by one who manages "
                f"accounts ({how}), not by registering"
            )
        group = self.access.group_of.get(name)
        if group is not None:
            raise PermissionDenied(
                f"{name!r} is a member of the group {group!r} in CORRAL_GROUPS: a group member's account is "
                f"created by one who manages accounts ({how}), not by registering"
            )

    def _account(self, entry: AccountEntry) -> accounts_pb2.Account:
        name = entry.name
        return convert.account(entry, self.access.group_of.get(name, ""), name in self.access.admins)

    @grpc_errors
    @audited("account.register", _name, anonymous={"OK"})
    async def Register(
        self, request: accounts_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> accounts_pb2.Account:
        """Create an account; answers it once stored. With CORRAL_ACCOUNTS=open anyone may, else only those who manage
        accounts; ALREADY_EXISTS for a name an account or a client token has, and, unless the caller manages accounts,
        for one that still owns jobs. A name in CORRAL_AUTH_ADMINS is an admin's, and one CORRAL_GROUPS lists is its
        group's member's: only those who manage accounts may create them, even with open registration."""
        accounts = self._on()
        caller = PRINCIPAL.get()
        if not accounts.open:
            self._check_manages(caller, "register accounts (CORRAL_ACCOUNTS=admin)")
        elif not self._is_taken(accounts, request.name) and not self._manages(caller):
            # Whoever came first would be an admin (see every job, reset everyone's password), or a member of the
            # group (see and cancel its jobs, share its fair share). That includes such a name whose account was
            # deleted, and one that the operator has not registered yet. (A name taken already, by a token or an
            # account, gets the ALREADY_EXISTS of any taken name.)
            self._check_not_privileged(request.name)
        # One who manages accounts may take a name that still owns jobs (a hand-over); open registration may not.
        by_admin = not accounts.open or self._manages(caller)
        return self._account(await accounts.register(request.name, request.password, by_admin=by_admin))

    @grpc_errors
    @audited("account.login", _name, anonymous={"OK", "UNAUTHENTICATED"})
    async def Login(
        self, request: accounts_pb2.LoginRequest, context: grpc.aio.ServicerContext
    ) -> accounts_pb2.LoginResponse:
        """A signed login token for a name and password, with when it expires and the account. A wrong name and a wrong
        password get the same UNAUTHENTICATED; repeated failures for one name, RESOURCE_EXHAUSTED. A name that breaks
        the name rule gets INVALID_ARGUMENT naming the field: no account can have it, and its refusal costs no hash,
        so for a caller without credentials it is not recorded (only the outcomes that took a hash are)."""
        grant = await self._on().login(request.name, request.password)
        out = accounts_pb2.LoginResponse(token=grant.token, account=self._account(grant.account))
        convert.set_time(out.expire_time, grant.expires_at)
        return out

    @grpc_errors
    async def WhoAmI(
        self, request: accounts_pb2.WhoAmIRequest, context: grpc.aio.ServicerContext
    ) -> accounts_pb2.WhoAmIResponse:
        """The caller's principal and whether it manages accounts (everyone does without auth); for a login, also its
        account and when the login expires."""
        caller = PRINCIPAL.get() or ""
        out = accounts_pb2.WhoAmIResponse(name=caller, admin=self._manages(caller) or not caller)
        entry = self.accounts.get(caller) if self.accounts is not None and caller else None
        expires = LOGIN_EXPIRES.get()
        if entry is not None and expires is not None:
            out.account.CopyFrom(self._account(entry))
            convert.set_time(out.expire_time, expires)
        return out

    @grpc_errors
    async def ListAccounts(
        self, request: accounts_pb2.ListAccountsRequest, context: grpc.aio.ServicerContext
    ) -> accounts_pb2.ListAccountsResponse:
        """Every account, by name, for those who manage accounts (UNAUTHENTICATED without credentials, PERMISSION_DENIED
        for anyone else)."""
        accounts = self._on()
        self._check_manages(PRINCIPAL.get(), "list accounts")
        return accounts_pb2.ListAccountsResponse(accounts=[self._account(a) for a in accounts.all()])

    @grpc_errors
    @audited("account.set_password", _name)
    async def SetPassword(
        self, request: accounts_pb2.SetPasswordRequest, context: grpc.aio.ServicerContext
    ) -> accounts_pb2.Account:
        """Give an account a new password, which ends its earlier logins. An account logged in as itself needs
        ``current_password`` (PERMISSION_DENIED when wrong); anyone else must manage accounts."""
        accounts = self._on()
        caller = PRINCIPAL.get()
        if caller == request.name and LOGIN_EXPIRES.get() is not None:
            try:
                await accounts.check_password(request.name, request.current_password)
            except Unauthenticated:
                raise PermissionDenied("current_password: is not the account's password") from None
        else:
            self._check_manages(caller, f"set the password of {request.name[:80]!r}")
        return self._account(await accounts.set_password(request.name, request.password))

    @grpc_errors
    @audited("account.end_all_logins", lambda request: "")
    async def EndAllLogins(
        self, request: accounts_pb2.EndAllLoginsRequest, context: grpc.aio.ServicerContext
    ) -> accounts_pb2.EndAllLoginsResponse:
        """End every login of every account (a new signing key; passwords stay); for those who manage accounts."""
        accounts = self._on()
        self._check_manages(PRINCIPAL.get(), "end every login")
        await accounts.end_all_logins()
        return accounts_pb2.EndAllLoginsResponse()

    @grpc_errors
    @audited("account.delete", _name)
    async def DeleteAccount(
        self, request: accounts_pb2.DeleteAccountRequest, context: grpc.aio.ServicerContext
    ) -> accounts_pb2.DeleteAccountResponse:
        """Delete an account (its logins end; its jobs stay): by itself, logged in, or by one who manages accounts."""
        accounts = self._on()
        caller = PRINCIPAL.get()
        if not (caller == request.name and LOGIN_EXPIRES.get() is not None):
            self._check_manages(caller, f"delete the account {request.name[:80]!r}")
        await accounts.delete(request.name)
        return accounts_pb2.DeleteAccountResponse()
