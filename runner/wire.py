"""The frames on the two pipes between a worker's RunnerPool and one runner process.

Every frame is a fixed little-endian header followed by raw bytes; nothing is parsed twice and
the payload and the result stay as the JSON text they already are.

Request (pool -> runner)::

    REQUEST header: payload_len u32, job_id_len u16, type_len u16, attempt i32, threads i32,
                    deadline f64 (time.time(); 0 = none)
    then job_id, type, payload (UTF-8 JSON object)

Response (runner -> pool)::

    RESPONSE header: kind u8, pad u8, code_len u16, body_len u32
    then code (error code, empty unless FAILED), body (result JSON if OK, error message if FAILED)

A runner process writes one ``READY`` response once it has imported its plug-ins, then one ``OK``
or ``FAILED`` response per request, in order. End of file on its request pipe tells it to exit.
"""

from __future__ import annotations

import struct

__all__ = [
    "FAILED",
    "OK",
    "READY",
    "REQUEST",
    "RESPONSE",
    "encode_request",
    "encode_response",
]

REQUEST = struct.Struct("<IHHiid")
"""Request header: payload_len, job_id_len, type_len, attempt, threads, deadline."""
RESPONSE = struct.Struct("<BBHI")
"""Response header: kind, pad, code_len, body_len."""

READY = 0
"""Response kind: the process is up and waits for requests."""
OK = 1
"""Response kind: the job succeeded; body is the result JSON."""
FAILED = 2
"""Response kind: the job failed; code is the error code, body the message."""


def encode_request(
    job_id: bytes, job_type: bytes, payload: bytes, attempt: int, threads: int, deadline: float
) -> bytes:
    """One request frame."""
    return (
        REQUEST.pack(len(payload), len(job_id), len(job_type), attempt, threads, deadline) + job_id + job_type + payload
    )


def encode_response(kind: int, code: bytes = b"", body: bytes = b"") -> bytes:
    """One response frame."""
    return RESPONSE.pack(kind, 0, len(code), len(body)) + code + body
