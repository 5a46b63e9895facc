"""Following a job across control-plane restarts: when :meth:`Client.watch` / :meth:`Client.wait` (and
their asyncio twins, and the ``WatchJobs`` ones: ``watch_many``, ``wait_all``) watch again, and when
they give up.

A job outlives a restart of the control plane (it is durable, and a running one keeps running on its
worker), so a client following it should too. When the stream breaks (``UNAVAILABLE``: the server
stopped or cannot be reached yet; or ``CANCELLED`` by a server that stops, which grpc sends for some
calls cut at the end of the shutdown grace) or ends before a terminal state, the job is watched again after
a pause that doubles from :data:`REWATCH_PAUSE_SEC` to :data:`REWATCH_PAUSE_MAX_SEC`. The new stream
starts with the job as it is now; :meth:`Follow.is_new` drops it when nothing changed meanwhile, so
a watcher sees each state once. An outage longer than :data:`OUTAGE_LIMIT_SEC` (counted from the
first failure after the last contact) raises the ``Unavailable`` error, and the wait's own timeout
still raises ``DeadlineExceeded``, unless no control plane was ever reached: then it is the
``Unavailable`` naming the address(es) and the last connection error, as at the outage limit (a wrong
address is not a job that did not finish). Any other error is raised at once, and a
:class:`~corral.errors.ClientClosed` (the client closed under the follow) ends it: it is never
followed on a new channel. Before the first contact the
limit is :data:`FIRST_CONTACT_LIMIT_SEC`, so that a wrong address is an error within seconds.

Contact is an event, or a stream that was taken by a control plane and broke: its request was sent
on a connection (not refused before it left, :data:`corral.failover.NEVER_SENT`; not passed on by
every address of a list, nor refused by a standby). That matters for ``wait_all``: with ``ends_only``
the control plane sends nothing until a job ends, so a stream may be open for minutes without an
event. A stream that broke after :data:`SERVED_SEC` open was served that long: the outage starts
again at its break, so that a second restart much later gets the whole limit again. A shorter one
(a control plane that fails the call at once, over and over) leaves the outage counting, so that it
is still given up on.

``timeout=0`` checks once: the first stream of a follow whose time is already up still reads the
job(s) as they are now (within :data:`CHECK_LIMIT_SEC`), returns what has ended, and raises
``DeadlineExceeded`` for the rest, rather than giving up before it looked.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

from corral.errors import ClientClosed, CorralError, DeadlineExceeded, InvalidArgument, Unavailable
from corral.failover import UNREACHED_PREFIX, moves_on
from corral.job import Job
from corral.job_ids import watched_ids
from corral.v1 import jobs_pb2

__all__ = [
    "CHECK_LIMIT_SEC",
    "FIRST_CONTACT_LIMIT_SEC",
    "OUTAGE_LIMIT_SEC",
    "REWATCH_PAUSE_MAX_SEC",
    "REWATCH_PAUSE_SEC",
    "SERVED_SEC",
    "Follow",
    "FollowMany",
    "broken_stream",
]

REWATCH_PAUSE_SEC = 0.2
"""First pause before watching again after a stream broke or ended early."""
REWATCH_PAUSE_MAX_SEC = 2.0
"""The pause doubles up to this while the control plane stays away."""
OUTAGE_LIMIT_SEC = 60.0
"""How long watching rides through an unreachable control plane before it raises ``Unavailable``."""
FIRST_CONTACT_LIMIT_SEC = 5.0
"""The same before the first contact: a control plane that was never reached (a wrong address, one that
is down) is reported within seconds, while a restart that a watch starts into is still ridden out."""
SERVED_SEC = 5.0
"""A stream taken by a control plane that broke after it was open this long ends the outage, as an event
does. Shorter ones do not, so that a server that takes every call and fails it (a proxy in front of no
control plane) is still given up on after :data:`OUTAGE_LIMIT_SEC`."""
CHECK_LIMIT_SEC = 5.0
"""The deadline of the one look that ``timeout=0`` takes (a deadline of 0 would fail before the look)."""


def broken_stream(error: CorralError) -> bool:
    """Whether ``error`` ended a watch because of the control plane (watch again), not because of the
    request (raise it). A cancellation by the client itself (a closed client: :class:`ClientClosed`)
    ends the follow."""
    if isinstance(error, ClientClosed):
        return False
    return isinstance(error, Unavailable) or error.code == "CANCELLED"


def _taken(error: CorralError) -> bool:
    """Whether the stream that broke with ``error`` had been taken by a control plane that serves: its
    request was sent on a connection, to no standby (the proof that the address is right)."""
    if isinstance(error.__cause__, CorralError):  # Attempts.exhausted: every address passed it on
        return False
    if error.message.startswith(UNREACHED_PREFIX):  # a deadline with no connection (failover.unreached)
        return False
    return not moves_on(error)


class Follow:
    """The state of one watch-until-done: the deadline, the last job seen and the current outage."""

    def __init__(
        self,
        job_id: str,
        timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        address: str = "",
    ) -> None:
        """``timeout``: seconds for the whole follow (None: no limit but the outage limit; 0: look once);
        ``address``: the client's address(es), for the error when none was ever reached.

        Raises:
            InvalidArgument: on ``timeout`` unless it is a finite number >= 0 (None waits without a limit).
        """
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout < math.inf
        ):
            raise InvalidArgument("timeout", f"must be a finite number of seconds >= 0, or None, got {timeout!r}")
        self.job_id = job_id
        self._clock = clock
        self._timeout = timeout
        self._deadline = None if timeout is None else clock() + timeout
        self._last: Job | None = None
        self._reached = False
        self._outage_since: float | None = None
        self._pause = REWATCH_PAUSE_SEC
        self._opened_at: float | None = None
        self._looked = False
        self._check: int | None = None  # while the stream is a check: the events it has still to read
        self._address = address
        self._failure: CorralError | None = None  # the last broken stream's error

    def opening(self) -> float | None:
        """A stream (WatchJob, WatchJobs) opens now: the seconds it may take (None: no limit), as
        :meth:`remaining`. The first one of a follow whose time is already up (``timeout=0``) is a check
        instead: it may take :data:`CHECK_LIMIT_SEC` to read the state now, then :attr:`checked` says
        to end it. Call it before :meth:`FollowMany.request`, and once per stream.

        Raises:
            DeadlineExceeded: the timeout has passed, and the job was looked at already.
        """
        now = self._clock()
        self._opened_at = now
        looked, self._looked = self._looked, True
        if not looked and self._deadline is not None and self._deadline <= now:
            self._check = self._to_check()
            return CHECK_LIMIT_SEC
        return self.remaining()

    @property
    def checked(self) -> bool:
        """Whether the stream is a check (``timeout=0``) that has read the state now: end it, and
        :meth:`pause` raises ``DeadlineExceeded`` unless it has ended."""
        return self._check == 0

    def _to_check(self) -> int:
        """How many events a check reads: the job now."""
        return 1

    def remaining(self) -> float | None:
        """Seconds left for the next stream (None: no limit).

        Raises:
            DeadlineExceeded: the timeout has passed.
        """
        if self._deadline is None:
            return None
        left = self._deadline - self._clock()
        if left <= 0:
            raise self.timed_out()
        return left

    def timed_out(self) -> CorralError:
        """The error for a follow that ran out of time: :class:`Unavailable` when no control plane was
        ever reached (naming the address(es) and the last failure), else ``DeadlineExceeded``."""
        if not self._reached and self._failure is not None:
            return self._unreached()
        return self._late()

    def _unreached(self) -> Unavailable:
        """The error for a follow whose time ran out before any control plane was reached."""
        at = f" at {self._address}" if self._address else ""
        within = "" if self._timeout is None else f" within {self._timeout:g} s"
        failure = self._failure
        assert failure is not None
        error = Unavailable(f"{UNREACHED_PREFIX}{at}{within}: {failure.message}")
        error.answered = failure.answered  # a standby that refused: it was reached, yet serves nothing
        return error

    def _late(self) -> DeadlineExceeded:
        """The error for a follow that reached a control plane and ran out of time."""
        limit = "" if self._timeout is None else f" after {self._timeout:g} s"
        job = f"job {self.job_id!r}" if self.job_id else "the job"  # RunJob: not known to be accepted yet
        return DeadlineExceeded(f"{job} not finished{limit}")

    def is_new(self, job: Job) -> bool:
        """Whether ``job`` differs from the last one yielded (a re-watch repeats the current state)."""
        self._heard()
        if job == self._last:
            return False
        self._last = job
        return True

    def _heard(self) -> None:
        """An event came: contact, the job was looked at, and a check has one event less to read."""
        self.reached()
        self._looked = True
        if self._check:
            self._check -= 1

    def reached(self) -> None:
        """A stream answered: any outage is over, and the control plane was reached."""
        self._reached = True
        self._outage_since = None
        self._pause = REWATCH_PAUSE_SEC

    def after_run(self, error: CorralError | None) -> float:
        """Seconds to wait before watching the job that a ``RunJob`` stream submitted, after the stream
        broke with ``error`` (None: it ended before a terminal state); as :meth:`pause`.

        Raises:
            CorralError: ``error`` when no event said the job was accepted: the submission may or may
                not have been committed, and is never sent again unasked (as a failed submit is not).
            Unavailable: the stream ended with no event and no error.
        """
        if not self.job_id:
            if error is not None:
                raise error
            raise Unavailable("the control plane ended RunJob before it accepted the job")
        return self.pause(error)

    def pause(self, error: CorralError | None) -> float:
        """Seconds to wait before watching again after the stream broke with ``error`` (None: it ended
        early, or it was a check that has read the state), never past the deadline.

        Raises:
            CorralError: ``error``, when it is not a broken stream (:func:`broken_stream`), or once the
                control plane has been away longer than OUTAGE_LIMIT_SEC (FIRST_CONTACT_LIMIT_SEC before
                the first contact).
            DeadlineExceeded: the timeout has passed.
        """
        now = self._clock()
        opened_at, self._opened_at = self._opened_at, None
        self._check = None
        if error is not None:
            if not broken_stream(error):
                raise error
            self._failure = error
            if _taken(error):
                # A stream open with no event (WatchJobs with ends_only is silent until a job ends) was
                # still the control plane's: contact, though only one open a while shows it served.
                self._reached = True
                if opened_at is not None and now - opened_at >= SERVED_SEC:
                    self._outage_since = None
                    self._pause = REWATCH_PAUSE_SEC
            # Before the first contact the plane may never have been reached (a wrong address): shorter.
            limit = OUTAGE_LIMIT_SEC if self._reached else FIRST_CONTACT_LIMIT_SEC
            if self._outage_since is None:
                self._outage_since = now
            elif now - self._outage_since > limit:
                raise error
        pause = self._pause
        self._pause = min(self._pause * 2, REWATCH_PAUSE_MAX_SEC)
        left = self.remaining()
        return pause if left is None else min(pause, left)


class FollowMany(Follow):
    """The state of one watch over many jobs (``WatchJobs``) until each has ended: as :class:`Follow`,
    with the last state seen of each job. A new stream after a break names only the jobs not yet ended,
    and starts with each as it is now; :meth:`is_new` drops those that did not change meanwhile."""

    def __init__(
        self,
        ids: Iterable[str],
        timeout: float | None = None,
        ends_only: bool = False,
        clock: Callable[[], float] = time.monotonic,
        address: str = "",
    ) -> None:
        """Follow the jobs ``ids`` names (only their ends with ``ends_only``) for ``timeout`` seconds;
        ``address`` as :class:`Follow`'s.

        Raises:
            InvalidArgument: on ``ids`` as the control plane would (:func:`corral.job_ids.watched_ids`),
                and on ``timeout`` as :class:`Follow` does; before anything is sent.
        """
        super().__init__("", timeout, clock, address)
        self.ids = watched_ids(ids)
        self.ends_only = ends_only
        self._seen: dict[str, Job] = {}
        self._open = dict.fromkeys(self.ids)  # an ordered set: the jobs not ended yet

    @property
    def done(self) -> bool:
        """Whether every job has ended."""
        return not self._open

    def request(self) -> jobs_pb2.WatchJobsRequest:
        """The request for the next stream (after :meth:`opening`): the jobs not ended yet, in the order
        they were given. A check asks for every state, even with ``ends_only``: it reads one event a job,
        and then knows that it has read them all, where the ends alone would leave it waiting for more."""
        ends_only = self.ends_only and self._check is None
        return jobs_pb2.WatchJobsRequest(ids=list(self._open), ends_only=ends_only)

    def _to_check(self) -> int:
        """How many events a check reads: each job not ended yet, as it is now."""
        return len(self._open)

    def is_new(self, job: Job) -> bool:
        """Whether ``job`` differs from the last state seen of it (a new stream repeats the current ones);
        with ``ends_only``, only a job's end is new (a check reads the others too)."""
        self._heard()
        if job.is_terminal:
            self._open.pop(job.id, None)
        elif self.ends_only:
            return False
        if self._seen.get(job.id) == job:
            return False
        self._seen[job.id] = job
        return True

    def ends(self) -> list[Job]:
        """Each job as it ended, in the order they were given (once :attr:`done`)."""
        return [self._seen[job_id] for job_id in self.ids]

    def _late(self) -> DeadlineExceeded:
        """The error for a watch that ran out of time: how many jobs had not ended, and the first of them."""
        limit = "" if self._timeout is None else f" after {self._timeout:g} s"
        left = list(self._open)
        first = f" (the first: {left[0]!r})" if left else ""
        return DeadlineExceeded(f"{len(left):,} of {len(self.ids):,} jobs not finished{limit}{first}")
