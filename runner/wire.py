"""The frames on the two pipes between a worker's RunnerPool and one runner process.

Every frame is a fixed little-endian header followed by raw bytes; nothing is parsed twice and
the payload and the result stay as the JSON text they already are.

Request (pool -> runner)::

    REQUEST header: payload_len u32, job_id_len u16, type_len u16, attempt i32, threads i32,
                    deadline f64 (time.time(); 0 = none), devices_len u16
    then job_id, type, devices (ASCII, comma-separated), payload (UTF-8 JSON object)

``devices`` is what the job's ``CUDA_VISIBLE_DEVICES`` is while it runs: the GPUs the worker gave it,
empty for none on a worker that has GPUs (so that it sees no device). On a worker without GPUs
``devices_len`` is :data:`INHERIT_DEVICES`, no devices follow, and the runner leaves the variable as
it inherited it.

Response (runner -> pool)::

    RESPONSE header: kind u8, flags u8, code_len u16, body_len u32
    then code (error code, empty unless FAILED), body (result JSON if OK, error message if FAILED;
    flagged OUTPUT, the body starts with what the job printed: u32 length, then the text)

A runner process writes one ``READY`` response once it has imported its plug-ins (its body: the JSON
list of the job types it runs, ``runner.serve.catalog``), then one ``OK`` or ``FAILED`` response per
request, in order. A ``FAILED`` response instead of ``READY``, code ``PLUGIN_IMPORT``, says why it
could not start. End of file on its request pipe tells it to exit. An
answer flagged ``LAST`` is the runner's last: it exits right after it, and the pool must not hand it
another job (the flag travels in the answer itself, so no job can be sent in between).

While a job runs, its runner may write any number of ``PRINTED`` responses for it, all before that
job's ``OK`` or ``FAILED`` answer: what the job printed lately, sent live (see :mod:`runner.output`)::

    PRINTED body: offset u64 (characters the job printed before the text), then the text (UTF-8)

The offset lets a reader tell what was left out between two of them: a job that prints faster than
they go sends only the latest of what it printed in each window.
"""

from __future__ import annotations

import struct

from corral.limits import MAX_ERROR_CODE, MAX_ERROR_MESSAGE_BYTES, MAX_RESULT_BYTES

__all__ = [
    "DEVICES_ENV",
    "FAILED",
    "INHERIT_DEVICES",
    "LAST",
    "OK",
    "OUTPUT",
    "PLUGIN_IMPORT",
    "PRINTED",
    "PRINTED_OFFSET",
    "READY",
    "REQUEST",
    "RESPONSE",
    "decode_printed",
    "encode_failure",
    "encode_printed",
    "encode_request",
    "encode_response",
    "encode_result",
    "last",
    "split_output",
    "with_output",
]

REQUEST = struct.Struct("<IHHiidH")
"""Request header: payload_len, job_id_len, type_len, attempt, threads, deadline, devices_len."""
DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
"""The variable a request's ``devices`` set for the duration of its job (CUDA, and the libraries on it,
see only the devices it lists)."""
INHERIT_DEVICES = 0xFFFF
"""``devices_len`` of a request from a worker without GPUs: the runner leaves ``CUDA_VISIBLE_DEVICES``
alone (a device list is far shorter: ``corral.limits.MAX_GPUS`` ids of ``MAX_GPU_ID`` characters)."""
RESPONSE = struct.Struct("<BBHI")
"""Response header: kind, flags, code_len, body_len."""

READY = 0
"""Response kind: the process is up and waits for requests."""
OK = 1
"""Response kind: the job succeeded; body is the result JSON."""
FAILED = 2
"""Response kind: the job failed; code is the error code, body the message."""
PRINTED = 3
"""Response kind: what the running job printed lately (sent while it runs, before its answer); body:
:data:`PRINTED_OFFSET`, then the text (see :func:`encode_printed`)."""
PRINTED_OFFSET = struct.Struct("<Q")
"""The start of a ``PRINTED`` body: characters (code points) the job printed before the text."""
LAST = 1
"""Response flag: the runner exits after this answer."""
OUTPUT = 2
"""Response flag: the body starts with what the job printed (u32 length, then UTF-8 text), before the
result or the message (see :func:`with_output`). Absent when it printed nothing: a quiet job's frame
is unchanged."""
OUTPUT_LEN = struct.Struct("<I")
PLUGIN_IMPORT = "PLUGIN_IMPORT"
"""The code of a ``FAILED`` response sent instead of ``READY``: a plug-in module did not import."""


def encode_request(
    job_id: bytes,
    job_type: bytes,
    payload: bytes,
    attempt: int,
    threads: int,
    deadline: float,
    devices: bytes | None = None,
) -> bytes:
    """One request frame; ``devices``: the job's CUDA_VISIBLE_DEVICES (None: leave it as inherited)."""
    if devices is None:
        header = REQUEST.pack(len(payload), len(job_id), len(job_type), attempt, threads, deadline, INHERIT_DEVICES)
        return header + job_id + job_type + payload
    header = REQUEST.pack(len(payload), len(job_id), len(job_type), attempt, threads, deadline, len(devices))
    return header + job_id + job_type + devices + payload


def encode_response(kind: int, code: bytes = b"", body: bytes = b"") -> bytes:
    """One response frame."""
    return RESPONSE.pack(kind, 0, len(code), len(body)) + code + body


def last(frame: bytes) -> bytes:
    """``frame`` (a response) flagged ``LAST``."""
    return frame[:1] + bytes((frame[1] | LAST,)) + frame[2:]


def with_output(frame: bytes, output: bytes) -> bytes:
    """``frame`` (an OK or FAILED response) carrying ``output``, what the job printed, flagged ``OUTPUT``."""
    if not output:
        return frame
    kind, flags, code_len, body_len = RESPONSE.unpack_from(frame)
    head = RESPONSE.size + code_len
    extra = OUTPUT_LEN.pack(len(output)) + output
    return (
        RESPONSE.pack(kind, flags | OUTPUT, code_len, body_len + len(extra))
        + frame[RESPONSE.size : head]
        + extra
        + frame[head:]
    )


def split_output(flags: int, body: bytes) -> tuple[bytes, bytes]:
    """``(output, rest)`` of a response body: what the job printed, and the result or message."""
    if not flags & OUTPUT or len(body) < OUTPUT_LEN.size:
        return b"", body
    (size,) = OUTPUT_LEN.unpack_from(body)
    end = OUTPUT_LEN.size + size
    return body[OUTPUT_LEN.size : end], body[end:]


def encode_printed(offset: int, text: str) -> bytes:
    """A ``PRINTED`` frame: ``text``, which the job printed after ``offset`` characters (a character
    UTF-8 cannot carry, a lone surrogate, becomes ``?``: one for one, so the offsets still hold)."""
    return encode_response(PRINTED, b"", PRINTED_OFFSET.pack(offset) + text.encode("utf-8", "replace"))


def decode_printed(body: bytes) -> tuple[int, str]:
    """``(offset, text)`` of a ``PRINTED`` frame's body (see :func:`encode_printed`)."""
    (offset,) = PRINTED_OFFSET.unpack_from(body)
    return offset, body[PRINTED_OFFSET.size :].decode("utf-8", "replace")


def encode_result(result_json: bytes) -> bytes:
    """The response for a result; ``RESULT_TOO_LARGE`` when it is over ``MAX_RESULT_BYTES``."""
    if len(result_json) > MAX_RESULT_BYTES:
        return encode_failure("RESULT_TOO_LARGE", _too_large(len(result_json)))
    return encode_response(OK, b"", result_json)


def _too_large(size: int) -> str:
    """The error message of a result of ``size`` bytes over the limit."""
    return (
        f"result: {size} bytes of JSON, over the limit of {MAX_RESULT_BYTES} bytes; "
        "store large outputs elsewhere and return where they are"
    )


def encode_failure(code: str, message: str) -> bytes:
    """The response for a failure, the code and the message cut to their limits (the cut says so)."""
    body = message.encode("utf-8", "replace")
    if len(body) > MAX_ERROR_MESSAGE_BYTES:
        note = f" ... (cut: {len(body)} bytes in all)".encode()
        kept = body[: MAX_ERROR_MESSAGE_BYTES - len(note)].decode("utf-8", "ignore").encode()
        body = kept + note
    return encode_response(FAILED, code[:MAX_ERROR_CODE].encode("utf-8", "replace"), body)
