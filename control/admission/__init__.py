"""Admission: what a submission passes before anything is stored.

The steps, in order: auth (the edge issue) -> rate limit (the edge issue) -> validation
(``validation``: field rules and the job type's payload schema) -> idempotency (``idempotency``).
"""

from control.admission.idempotency import IdempotencyKeys
from control.admission.validation import JobTypeCatalog, Limits, Submission, validate, validate_batch

__all__ = ["IdempotencyKeys", "JobTypeCatalog", "Limits", "Submission", "validate", "validate_batch"]
