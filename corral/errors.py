"""The error tree every Corral component and client shares.

Domain code raises these; the gRPC layer maps them to status codes in one table
(``control/api/status.py``) and the client maps status codes back in one wrapper
(``corral/client.py``), so the same failure is the same exception on both sides::

    CorralError
     +-- InvalidArgument      (field, rule)     -> INVALID_ARGUMENT / 400
     +-- NotFound                               -> NOT_FOUND / 404
     +-- AlreadyExists                          -> ALREADY_EXISTS / 409
     +-- FailedPrecondition                     -> FAILED_PRECONDITION / 400
     |    +-- StaleAttempt   (job_id, attempt)  a result or heartbeat from an attempt that lost its lease
     +-- RateLimited          (retry_after)     -> RESOURCE_EXHAUSTED / 429 + retry-after
     +-- MessageTooLarge      (which, size, limit) <- RESOURCE_EXHAUSTED from gRPC itself, not to be retried
     +-- Unauthenticated                        -> UNAUTHENTICATED / 401
     +-- PermissionDenied                       -> PERMISSION_DENIED / 403
     +-- Unavailable                            -> UNAVAILABLE / 503
     +-- DeadlineExceeded                       -> DEADLINE_EXCEEDED / 504
     +-- Internal                               -> INTERNAL / 500
     +-- ClientClosed                           a call in flight when its client was closed (no server code)

This module imports nothing from grpc: ``code`` is the name of the status code.
"""

from __future__ import annotations


class CorralError(Exception):
    """Base of every error Corral raises on purpose."""

    code: str = "UNKNOWN"
    answered: bool = False
    """True when a client got it from the control plane itself (not from the network on the way)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(CorralError):
    """Raised when a request breaks a rule; ``field`` names the offending field (dotted path)."""

    code = "INVALID_ARGUMENT"

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}" if field else rule)
        self.field = field
        self.rule = rule


class NotFound(CorralError):
    """Raised when the job or worker named by a request does not exist."""

    code = "NOT_FOUND"


class AlreadyExists(CorralError):
    """Raised when an idempotency key is reused with a different request."""

    code = "ALREADY_EXISTS"


class FailedPrecondition(CorralError):
    """Raised when the target is in a state that does not allow the operation (retry a running job)."""

    code = "FAILED_PRECONDITION"


class StaleAttempt(FailedPrecondition):
    """Raised when a result or heartbeat comes from an attempt that no longer holds the job's lease."""

    def __init__(self, job_id: str, attempt: int, reason: str) -> None:
        super().__init__(f"stale attempt {job_id}#{attempt}: {reason}")
        self.job_id = job_id
        self.attempt = attempt


class RateLimited(CorralError):
    """Raised when a caller is over its rate limit; ``retry_after`` is in seconds."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class MessageTooLarge(CorralError):
    """Raised when a request or its answer is larger than a gRPC message may be (64 MiB on the control
    plane and in its clients).

    gRPC itself refuses such a message with RESOURCE_EXHAUSTED, the code of a rate limit too, but sending
    the same request again meets the same refusal, and a request that was carried out (a batch whose
    answer was too large) would be carried out again: this is not a :class:`RateLimited`.
    ``which`` is ``"request"``, ``"answer"`` or, when gRPC did not say, ``"request or answer"``;
    ``size`` and ``limit`` are in bytes, ``None`` when gRPC did not say.
    """

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, which: str, size: int | None = None, limit: int | None = None) -> None:
        over = f": {size:,} bytes, over the {limit:,}-byte limit" if size is not None and limit is not None else ""
        # An answer exists only once the request was carried out: a caller must not take it as refused.
        done = "; the request itself was carried out" if which == "answer" else ""
        super().__init__(f"the {which} was too large for one gRPC message{over}{done}")
        self.which = which
        self.size = size
        self.limit = limit


class Unauthenticated(CorralError):
    """Raised when a call carries no valid credentials."""

    code = "UNAUTHENTICATED"


class PermissionDenied(CorralError):
    """Raised when the caller may not do what it asked."""

    code = "PERMISSION_DENIED"


class Unavailable(CorralError):
    """Raised when the service cannot take the call now (shutting down, store not writable, a standby)."""

    code = "UNAVAILABLE"


STANDBY_PREFIX = "standby: "
"""How the message of a standby control plane's UNAVAILABLE begins: it did nothing with the call, so a
client may send it to another control plane at once (see control.standby)."""


class DeadlineExceeded(CorralError):
    """Raised when a call ran out of time."""

    code = "DEADLINE_EXCEEDED"


class Internal(CorralError):
    """Raised for a bug or an unexpected failure; the message says what was being done."""

    code = "INTERNAL"


class ClientClosed(CorralError):
    """Raised when a call in flight (``wait``, ``watch``, ``run``, a unary call) ends because its client
    was closed (:meth:`corral.Client.close`, :meth:`corral.AsyncClient.close`) meanwhile.

    The client made it, not a control plane (``code`` is ``CANCELLED``, as gRPC's for a cancelled call):
    a job being followed goes on; a call that was sent may or may not have been carried out.
    """

    code = "CANCELLED"

    def __init__(self, message: str = "the client was closed while the call was in flight") -> None:
        super().__init__(message)


ERRORS_BY_CODE: dict[str, type[CorralError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        RateLimited,
        Unauthenticated,
        PermissionDenied,
        Unavailable,
        DeadlineExceeded,
        Internal,
    )
}
"""Status-code name -> the exception a client raises for it."""
