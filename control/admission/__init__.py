"""Admission: what a submission passes before anything is stored.

The steps, in order: auth (the edge issue) -> validation (``validation``: field rules and the job
type's payload schema) -> idempotency lookup (``idempotency``) -> rate limit (``ratelimit``: token
buckets, global and per client) -> idempotency reservation and the store. The rate limit comes after
the lookup so that it charges only the jobs a call would create: a replay (a client re-sending after
a lost answer) is never refused for the rate, and a refused call has reserved nothing.
"""

from control.admission.idempotency import IdempotencyKeys, IdempotencySweeper
from control.admission.ratelimit import SubmitRateLimiter, TokenBucket
from control.admission.validation import (
    JobTypeCatalog,
    Limits,
    Submission,
    check_batch_size,
    check_labels,
    validate,
    validate_batch,
    validate_part,
)

__all__ = [
    "IdempotencyKeys",
    "IdempotencySweeper",
    "JobTypeCatalog",
    "Limits",
    "Submission",
    "SubmitRateLimiter",
    "TokenBucket",
    "check_batch_size",
    "check_labels",
    "validate",
    "validate_batch",
    "validate_part",
]
