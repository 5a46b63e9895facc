"""Who may see and manage which jobs: one team's jobs kept from another's on a shared control plane.

Every job records its owner: the name of the client token it was submitted with (``""`` when the
control plane asks for no token). Owners may be put in groups: ``CORRAL_GROUPS=physics=alice,bob;
bio=carol`` (an owner is in one group at most). ``CORRAL_JOB_VISIBILITY`` says what that means:

* ``all`` (the default): every client sees and manages every job, and may call AdminService;
* ``owner``: a client sees and manages only its own jobs;
* ``group``: a client sees and manages the jobs of every owner in its group (its own only when it is
  in none).

With ``owner`` or ``group``, a job the caller may not see is answered as a job that does not exist
(NOT_FOUND: its existence is not given away), and ListJobs lists only what it may see. Idempotency
keys are always each client's own (two clients may both use ``order-42``), whatever the visibility: a
key is kept with its owner, so it keeps finding its job when the visibility changes, and never finds
another client's. The principals named in
``CORRAL_AUTH_ADMINS`` see and manage every job, and only they may call AdminService (ListWorkers,
DrainWorker, GetAutoscaler, ListAuditEvents, ListShares); anyone else gets PERMISSION_DENIED there.
GetStats stays whole-cluster for everyone: queue depth and worker counts are what a client needs to
know how long it will wait, and hold nothing of another client's jobs.

This module decides; the gRPC servicers (``control.api``) ask it, so the REST bridge, which calls the
same servicers, follows the same rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from control.auth import PRINCIPAL_NAME
from control.jobs import JobRecord
from corral.errors import NotFound, PermissionDenied, Unauthenticated

__all__ = ["VISIBILITIES", "Access", "not_found", "parse_groups"]

VISIBILITIES = ("all", "group", "owner")
"""The values of CORRAL_JOB_VISIBILITY."""


def parse_groups(raw: str) -> dict[str, str]:
    """``physics=alice,bob; bio=carol`` -> {owner: group}; ValueError names the entry and the rule."""
    group_of: dict[str, str] = {}
    for entry in raw.split(";"):
        entry = entry.strip()
        if not entry:
            continue
        group, sep, members = entry.partition("=")
        group = group.strip()
        if not sep or not PRINCIPAL_NAME.fullmatch(group):
            raise ValueError(f"{entry!r}: each group is NAME=MEMBER,MEMBER with a name of [A-Za-z0-9._@-]{{1,64}}")
        for member in (m.strip() for m in members.split(",")):
            if not member:
                continue
            if member in group_of and group_of[member] != group:
                raise ValueError(f"{member!r} is in both {group_of[member]!r} and {group!r}: one group each")
            group_of[member] = group
    return group_of


def not_found(job_id: str) -> NotFound:
    """The error for a job that does not exist, and for one the caller may not see: the same words."""
    return NotFound(f"job {job_id!r} not found")


@dataclass(frozen=True)
class Access:
    """The visibility rule of one control plane (see the module docstring)."""

    visibility: str = "all"
    """CORRAL_JOB_VISIBILITY: all | group | owner."""
    admins: frozenset[str] = frozenset()
    """CORRAL_AUTH_ADMINS: principals that see every job (only meaningful when clients are kept apart)."""
    group_of: Mapping[str, str] = field(default_factory=dict)
    """CORRAL_GROUPS: owner -> its group."""

    @classmethod
    def of(cls, visibility: str, admins: Iterable[str], group_of: Mapping[str, str] | None = None) -> Access:
        """The rule for a CORRAL_JOB_VISIBILITY value, the CORRAL_AUTH_ADMINS names and the groups."""
        return cls(visibility, frozenset(admins), dict(group_of or {}))

    @property
    def isolated(self) -> bool:
        """Whether clients are kept apart (``owner`` or ``group``)."""
        return self.visibility != "all"

    @cached_property
    def _members(self) -> dict[str, frozenset[str]]:
        members: dict[str, set[str]] = {}
        for owner, group in self.group_of.items():
            members.setdefault(group, set()).add(owner)
        return {group: frozenset(owners) for group, owners in members.items()}

    def scope(self, caller: str | None) -> frozenset[str] | None:
        """The owners whose jobs ``caller`` may see, or None when it may see every job.

        Raises:
            Unauthenticated: clients are kept apart and the call has no principal (such a control
                plane always asks for a token, so this is a guard, not a path).
        """
        if not self.isolated:
            return None
        if not caller:
            raise Unauthenticated("this control plane keeps clients' jobs apart: a client token is required")
        if caller in self.admins:
            return None
        group = self.group_of.get(caller) if self.visibility == "group" else None
        return self._members[group] if group is not None else frozenset((caller,))

    def check_visible(self, job: JobRecord, caller: str | None) -> JobRecord:
        """``job`` when ``caller`` may see it, else the NOT_FOUND a missing job gets."""
        owners = self.scope(caller)
        if owners is not None and job.owner not in owners:
            raise not_found(job.id)
        return job

    def listed_owners(self, caller: str | None, asked: str) -> list[str] | None:
        """The owners a ListJobs of ``caller`` filtering on ``asked`` ("" : none) covers: ``[]`` for
        everyone's jobs, None when it may see none of what it asked for."""
        owners = self.scope(caller)
        if owners is None:
            return [asked] if asked else []
        if asked:
            return [asked] if asked in owners else None
        return sorted(owners)

    def check_admin(self, caller: str | None) -> None:
        """Refuse AdminService to a client that is not an admin while isolation is on."""
        if self.scope(caller) is not None:
            raise PermissionDenied(
                f"{caller!r} is not an admin: AdminService is for the principals in CORRAL_AUTH_ADMINS "
                f"(CORRAL_JOB_VISIBILITY={self.visibility})"
            )

    @staticmethod
    def idempotency_key(key: str, owner: str) -> str:
        """The key under which ``owner``'s ``key`` is kept ("" for none): the owner's own, so that one
        client's key neither collides with nor finds another client's job. It does not depend on the
        visibility: a key made while clients were not kept apart still finds its job once they are
        (and back), and a key another client made then cannot name this client's (see
        ``control.store.keys``, which moved the keys of older releases to this form)."""
        if not key:
            return key
        return f"{owner}:{key}"  # a principal has no ':' (control.auth), so no two owners' keys meet
