"""The Store protocol: the only API to durable state.

Writes are queued in order and committed in groups (one transaction, one sync for everything
queued meanwhile); :meth:`Store.commit` returns once everything queued before it is durable. A
caller that must not acknowledge or announce a change before it is durable awaits ``commit()``.
Updates are compare-and-set on the fencing token: a row is never overwritten by a record whose
``attempts`` is older than the stored one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from control.jobs import JobRecord, JobState

StandingBy = Callable[[str], Awaitable[None]]
"""Called by :meth:`Store.lead`, once, when it has to wait: with the name of the control plane that leads."""


@dataclass(frozen=True, slots=True)
class IdempotencyEntry:
    """A durable idempotency key: the request it first came with and the job it made."""

    key: str
    request_hash: str
    job_id: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class JobTypeEntry:
    """A job type a worker advertised, with its payload schema (JSON text)."""

    name: str
    schema_json: str
    description: str


@dataclass(frozen=True, slots=True)
class AccountEntry:
    """An account that logs in with a password (see :mod:`control.accounts`)."""

    name: str
    password_hash: str
    """bcrypt's ``$2b$...`` text: the salt and the cost are inside it."""
    session: str
    """Random, made anew with each password: a login carries it, so a new password (or a deleted and
    re-created account) ends every login made before."""
    created_at: float
    password_changed_at: float


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One event of the audit log (see :mod:`control.audit`); ``seq`` is the store's (0 before stored)."""

    time: float
    actor: str
    action: str
    target: str
    outcome: str
    request_id: str
    seq: int = 0


@dataclass(frozen=True, slots=True)
class AuditPage:
    """One page of the audit log, newest first, and the number of matches ignoring limit and offset."""

    events: list[AuditEntry]
    total: int


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of a listing and the number of matches ignoring limit and offset."""

    jobs: list[JobRecord]
    total: int


@dataclass(frozen=True, slots=True)
class PurgeStep:
    """What one step of a purge of finished jobs did (:meth:`Store.purge_finished`)."""

    ids: list[str]
    """The jobs it deleted."""
    next_seq: int | None
    """Where the next step starts (the last ``seq`` this one looked at), or None: no job it could delete
    is left past it."""


JobRows = list[tuple[Any, ...]]
"""New jobs' rows as a store writes them (:meth:`Store.job_rows`)."""


class Store(Protocol):
    """Durable job state."""

    # writes: queued now, durable after commit()
    def job_rows(self, jobs: Iterable[JobRecord]) -> JobRows:
        """The rows :meth:`insert` writes for ``jobs``, made ahead of it: a large batch makes them a
        chunk per loop turn. The records must not change until they are inserted."""
        ...

    def insert(self, jobs: Iterable[JobRecord], rows: JobRows | None = None) -> None:
        """Queue new jobs, with ``rows`` if :meth:`job_rows` made them already."""
        ...

    def update(self, jobs: Iterable[JobRecord]) -> None:
        """Queue the new state of stored ``jobs``, each by its ``seq``: the columns a job's life changes
        (state, attempts, times, worker, lease, result, error, output), not those fixed at submission.
        Compare-and-set: a job stored with newer ``attempts``, or not stored (purged), is left as it is."""
        ...

    def put_idempotency(self, entries: Iterable[IdempotencyEntry]) -> None:
        """Queue ``entries``, each in place of any stored entry of its key."""
        ...

    async def delete_expired_idempotency(self, now: float, limit: int) -> int:
        """Delete at most ``limit`` idempotency keys that expired by ``now`` (earliest first), after
        the writes queued before the call; returns how many were deleted."""
        ...

    async def purge_finished(
        self,
        state: JobState,
        before: float,
        limit: int,
        after_seq: int = 0,
        *,
        dependency_failed_before: float | None = None,
    ) -> PurgeStep:
        """Delete the jobs in the terminal ``state`` that finished by ``before``, among the ``limit``
        after ``after_seq`` in submission order, in a transaction of its own after the writes queued
        before the call. A CANCELLED job whose error is DEPENDENCY_FAILED goes only once it finished by
        ``dependency_failed_before`` (when given): RetryJob of the job whose failure cancelled it brings
        it back, for as long as that one is kept.

        A purge walks the state step by step from ``after_seq`` 0, each step where the last ended, until
        ``next_seq`` is None: when a step reaches jobs submitted after both cut-offs (none of them can
        have finished by then). So a job that finished late (re-driven, long, scheduled far ahead) holds
        back none of those after it."""
        ...

    def put_job_type(self, entry: JobTypeEntry, now: float) -> None:
        """Queue ``entry`` in place of any stored type of its name; ``now`` is kept as its update time."""
        ...

    def put_account(self, entry: AccountEntry) -> None:
        """Create or replace the account ``entry.name``."""
        ...

    def delete_account(self, name: str) -> None:
        """Queue the deletion of the account ``name`` (none: nothing happens); the jobs it owns stay."""
        ...

    def put_audit(self, entry: AuditEntry) -> None:
        """Append ``entry`` to the audit log (the store numbers it)."""
        ...

    async def list_audit(self, match: Mapping[str, str], limit: int, offset: int) -> AuditPage:
        """Newest first; ``match``: column (actor, action, target, outcome) -> the value it must have."""
        ...

    async def purge_audit(self, before: float, limit: int) -> int:
        """Delete at most ``limit`` of the events recorded at or before ``before``, first recorded first,
        after the writes queued before the call; returns how many."""
        ...

    async def lead(self, standing_by: StandingBy | None = None) -> None:
        """Return once this process may write the store: at once for a store that one process opens at
        a time (SQLite); for a shared one, once no other control plane leads it (a standby waits here,
        after calling ``standing_by`` once with the name of the one that leads)."""
        ...

    async def commit(self) -> None:
        """Return once every write queued before the call is durable: all queued since the last commit go
        in one transaction, after the transactions before it.

        Raises:
            Unavailable: the store cannot be written (a write failed, or a shared store's lock was lost);
                from then on nothing more is written and every commit raises it.
        """
        ...

    def commit_now(self) -> bool:
        """Commit queued writes without waiting, when this store can (no fsync to wait for): True
        when they are durable on return, False when the caller must ``await commit()``."""
        ...

    # reads
    async def get(self, job_id: str) -> JobRecord | None:
        """The stored job ``job_id``, or None when no job has that id (never stored, or purged). Reads
        see committed writes only, not those still queued."""
        ...

    async def get_many(self, job_ids: Sequence[str]) -> list[JobRecord]:
        """The stored jobs among ``job_ids``, in no particular order; ids that name no job are left out."""
        ...

    async def cancelled_chain(self, job_id: str) -> list[JobRecord]:
        """The jobs CANCELLED with DEPENDENCY_FAILED down the chain from ``job_id``: those whose
        ``depends_on`` names it, those whose ``depends_on`` names one of those, and so on (one read of
        the cancelled jobs' ids and dependencies, whatever the chain's length: for RetryJob, not for a
        hot path)."""
        ...

    async def list_jobs(
        self,
        states: Sequence[JobState],
        job_type: str,
        limit: int,
        offset: int,
        owners: Sequence[str] = (),
        labels: Mapping[str, str] | None = None,
        *,
        error_code: str = "",
    ) -> JobPage:
        """Newest first, at most ``limit`` jobs, and fewer when their payloads and results are large (a
        page must fit in one answer); ``total`` counts every match. ``owners``: only those owners' jobs
        (empty: everyone's); ``labels``: only jobs whose labels include every one of these;
        ``error_code``: only jobs whose latest attempt ended with that error (empty: any)."""
        ...

    def load_active(self) -> Iterator[JobRecord]:
        """Every job not finished yet, in submission order, one at a time (a backlog can be millions)."""
        ...

    def count_by_state(self) -> dict[JobState, int]:
        """Stored jobs per state; a state without any is left out. Synchronous, for start-up."""
        ...

    def states(self, job_ids: Iterable[str]) -> dict[str, JobState]:
        """The committed states of those of ``job_ids`` that are stored. Synchronous: called at start-up,
        and on the event loop while SubmitJobs settles a batch's links with no ``await`` in between
        (reads by id, on the connection :meth:`get_idempotency` reads by, which nothing else holds).

        Raises:
            Unavailable: a shared store's server cannot be read.
        """
        ...

    async def read_states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """The committed states of those of ``job_ids`` that are stored, as :meth:`states` reads them,
        without holding the event loop while a shared store's server answers.

        Raises:
            Unavailable: a shared store's server cannot be read.
        """
        ...

    def max_seq(self) -> int:
        """The highest ``seq`` stored, 0 when there is no job: the next job's is one more (control.intake)."""
        ...

    def load_idempotency(self, now: float, limit: int | None = None) -> list[IdempotencyEntry]:
        """Keys live at ``now``, the ``limit`` newest (all with None), soonest to expire first."""
        ...

    def get_idempotency(self, key: str) -> IdempotencyEntry | None:
        """The committed entry of ``key``, expired or not, or None. Synchronous: called on the event
        loop between a key's lookup and its reservation (a primary-key read)."""
        ...

    async def read_idempotency(self, keys: Sequence[str]) -> dict[str, IdempotencyEntry]:
        """The committed entries of those of ``keys`` that are stored, expired or not, without holding the
        event loop while a shared store's server answers (read ahead of a call's resolution of its keys).

        Raises:
            Unavailable: a shared store's server cannot be read.
        """
        ...

    def load_job_types(self) -> list[JobTypeEntry]:
        """Every job type workers have advertised, in no particular order. Synchronous, for start-up."""
        ...

    def load_accounts(self) -> list[AccountEntry]:
        """Every account, in no particular order. Synchronous, for start-up (after :meth:`lead`)."""
        ...

    def replace_login_key(self, key: bytes) -> None:
        """Make ``key`` the key that signs logins (durable after commit)."""
        ...

    def put_setting(self, name: str, value: str) -> None:
        """Keep ``value`` under ``name`` (durable after commit), in place of what was there."""
        ...

    def load_setting(self, name: str) -> str | None:
        """The value kept under ``name``, or None. Synchronous, for start-up (after :meth:`lead`)."""
        ...

    def login_key(self, candidate: bytes) -> bytes:
        """The key that signs logins: the stored one, else ``candidate``, stored now. Every control plane
        of a shared store gets the same key, so a login outlives a restart and a failover. Synchronous,
        for start-up (after :meth:`lead`)."""
        ...

    @property
    def healthy(self) -> bool:
        """Whether the store can still be written: False for good once it cannot (see :attr:`failure`),
        and the control plane then stops."""
        ...

    @property
    def failure(self) -> str:
        """Why the store cannot be written ("" while it can)."""
        ...

    def close(self) -> None:
        """Write what is still queued (a failure is logged, not raised), then close the connections and
        let the database go to another control plane. Idempotent."""
        ...
