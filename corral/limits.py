"""Limits that the control plane, workers and clients share."""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor

MAX_THREADS = 1024
"""The most threads a job may demand, and the most threads or slots (runner processes) one worker may
have: a worker's settings are checked against it before any process starts, so a mistyped
CORRAL_WORKER_THREADS cannot start millions of processes, and the control plane refuses a worker that
registers more."""

MAX_LABELS = 64
"""Labels on one job or one worker."""
MAX_LABEL_KEY = 63
"""Characters in a label key."""
MAX_LABEL_VALUE = 256
"""Characters in a label value."""

MAX_CANCELLED_PER_CALL = 10_000
"""Jobs one CancelJobs call may cancel (its default limit)."""
MAX_RETRIED_PER_CALL = 1_000
"""Jobs one RetryJobs call may re-drive (its default limit): each is a transaction of its own, with a read
of what its failure cancelled."""

PROTO_INT_RANGES = {
    FieldDescriptor.CPPTYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.CPPTYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.CPPTYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.CPPTYPE_UINT64: (0, 2**64 - 1),
}
"""The values each protobuf integer type holds, by ``FieldDescriptor.cpp_type``: what a request field can
carry at all, before the control plane's own rules."""

MAX_RESULT_BYTES = 8 << 20
"""A job's result, as UTF-8 JSON. A larger one fails the attempt with ``RESULT_TOO_LARGE``: a result
travels whole in one message of the worker's stream and in every GetJob and WatchJob answer (at most
64 MiB each), and there it is a ``google.protobuf.Struct``, which takes up to 5.5 times the bytes of
its JSON (``0,`` is 2 bytes of JSON and 11 of Struct). A result the stream cannot carry would block
every other result of its worker; one GetJob cannot answer would be unreadable. Large outputs belong
in storage, with the result saying where."""
MAX_ERROR_MESSAGE_BYTES = 64 << 10
"""An attempt's error message, as UTF-8; a longer one is cut, and its end says so."""
MAX_ERROR_CODE = 64
"""Characters of an attempt's error code; a longer one is cut."""
MAX_WORKER_ID = 128
"""Characters of a worker id (the worker's rule is ``[A-Za-z0-9._:-]{1,128}``; the control plane checks
the length and that there is no NUL, since the id is stored with every job it runs)."""
MAX_OUTPUT_BYTES = 1 << 20
"""The most of what a job prints that a worker may keep per attempt (CORRAL_JOB_OUTPUT_BYTES)."""
DEFAULT_OUTPUT_BYTES = 64 << 10
"""What a worker keeps of a job's printed output when CORRAL_JOB_OUTPUT_BYTES is not set: its end."""
MAX_GPUS = 64
"""The most GPUs a job may ask for (``gpu_count``), and the most devices one worker may give to jobs
(CORRAL_WORKER_GPUS); the control plane refuses a worker that registers more."""
MAX_GPU_ID = 64
"""Characters of one GPU device id a worker hands out (an index such as ``3``, or a ``GPU-…`` UUID)."""
MAX_MEMORY_MB = 1 << 30
"""The most memory, in MiB, a job may ask for (``memory_mb``) and a worker may give to jobs
(CORRAL_WORKER_MEMORY_MB): a pebibyte, within a proto int32 and within what ``setrlimit`` takes."""
