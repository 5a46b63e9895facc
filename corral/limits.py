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

PROTO_INT_RANGES = {
    FieldDescriptor.CPPTYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.CPPTYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.CPPTYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.CPPTYPE_UINT64: (0, 2**64 - 1),
}
"""The values each protobuf integer type holds, by ``FieldDescriptor.cpp_type``: what a request field can
carry at all, before the control plane's own rules."""
