"""Who may see and manage which jobs: one team's jobs kept from another's on a shared control plane.

Every job records its owner: the name of the client token it was submitted with (``""`` when the
control plane asks for no token). ``CORRAL_JOB_VISIBILITY`` says what that means:

* ``all`` (the default): every client sees and manages every job, and may call AdminService;
* ``owner``: a client sees and manages only its own jobs. Someone else's job is answered as a job
  that does not exist (NOT_FOUND: its existence is not given away), ListJobs lists the caller's jobs
  only, and idempotency keys are the caller's own (two clients may both use ``order-42``). The
  principals named in ``CORRAL_AUTH_ADMINS`` see and manage every job, and only they may call
  AdminService (ListWorkers, DrainWorker, GetAutoscaler); anyone else gets PERMISSION_DENIED there.
  GetStats stays whole-cluster for everyone: queue depth and worker counts are what a client needs to
  know how long it will wait, and hold nothing of another client's jobs.

This module decides; the gRPC servicers (``control.api``) ask it, so the REST bridge, which calls the
same servicers, follows the same rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from control.jobs import JobRecord
from corral.errors import NotFound, PermissionDenied, Unauthenticated

__all__ = ["VISIBILITIES", "Access", "not_found"]

VISIBILITIES = ("all", "owner")
"""The values of CORRAL_JOB_VISIBILITY."""


def not_found(job_id: str) -> NotFound:
    """The error for a job that does not exist, and for one the caller may not see: the same words."""
    return NotFound(f"job {job_id!r} not found")


@dataclass(frozen=True)
class Access:
    """The visibility rule of one control plane (see the module docstring)."""

    isolated: bool = False
    """CORRAL_JOB_VISIBILITY=owner."""
    admins: frozenset[str] = frozenset()
    """CORRAL_AUTH_ADMINS: principals that see every job (only meaningful when isolated)."""

    @classmethod
    def of(cls, visibility: str, admins: Iterable[str]) -> Access:
        """The rule for a CORRAL_JOB_VISIBILITY value and the CORRAL_AUTH_ADMINS names."""
        return cls(isolated=visibility == "owner", admins=frozenset(admins))

    def scope(self, caller: str | None) -> str | None:
        """The only owner whose jobs ``caller`` may see, or None when it may see every job.

        Raises:
            Unauthenticated: isolation is on and the call has no principal (a control plane that
                isolates always asks for a token, so this is a guard, not a path).
        """
        if not self.isolated:
            return None
        if not caller:
            raise Unauthenticated("this control plane keeps each client's jobs apart: a client token is required")
        return None if caller in self.admins else caller

    def check_visible(self, job: JobRecord, caller: str | None) -> JobRecord:
        """``job`` when ``caller`` may see it, else the NOT_FOUND a missing job gets."""
        owner = self.scope(caller)
        if owner is not None and job.owner != owner:
            raise not_found(job.id)
        return job

    def check_admin(self, caller: str | None) -> None:
        """Refuse AdminService to a client that is not an admin while isolation is on."""
        if self.scope(caller) is not None:
            raise PermissionDenied(
                f"{caller!r} is not an admin: AdminService is for the principals in CORRAL_AUTH_ADMINS "
                "(CORRAL_JOB_VISIBILITY=owner)"
            )

    def idempotency_key(self, key: str, owner: str) -> str:
        """The key under which ``owner``'s ``key`` is kept: the owner's own when isolation is on, so
        that one client's key neither collides with nor finds another client's job."""
        if not key or not self.isolated:
            return key
        return f"{owner}:{key}"  # a principal has no ':' (control.auth), so no two owners' keys meet
