"""One HTTP request for the jobs that talk to the network (``network_intensive``, ``webhook``).

:func:`http_request` sends a request with :mod:`urllib.request` (redirects followed, no proxy from
the environment: jobs talk to the URL they were given) and streams the response body through a
callback, so a large download is never held in memory. Failures become
:class:`~runner.errors.JobFailed`, which the control plane retries while attempts remain:

    NETWORK_ERROR   no response: refused, unreachable, DNS, TLS, timeout, a connection cut short
    HTTP_ERROR      a response with status >= 400 (its status and the start of its body are in the
                    message)
    TOO_LARGE       the body went past the job's byte limit
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.client import HTTPException, HTTPResponse

from runner.errors import JobFailed

__all__ = ["CHUNK", "ERROR_BODY_BYTES", "HttpResponse", "http_request"]

CHUNK = 1 << 16
"""Bytes read from the response per call."""
ERROR_BODY_BYTES = 1024
"""How much of an error response's body goes into the failure message."""

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """What came back: status, headers, body size and the time it took."""

    status: int
    """The HTTP status code (< 400: failures raise)."""
    headers: Mapping[str, str]
    """Response headers (the last value of a repeated one)."""
    size: int
    """Body bytes read."""
    seconds: float
    """From sending the request to the end of the body."""


def http_request(
    url: str,
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    timeout: float = 30.0,
    max_bytes: int | None = None,
    read_limit: int | None = None,
    on_chunk: Callable[[bytes], None] | None = None,
) -> HttpResponse:
    """Send one request and stream the body to ``on_chunk``.

    ``max_bytes``: a longer body fails with ``TOO_LARGE``. ``read_limit``: stop reading (no error)
    once that many bytes arrived; the rest of the body is not read.

    Raises:
        JobFailed: ``NETWORK_ERROR``, ``HTTP_ERROR`` or ``TOO_LARGE`` (see the module docstring).
    """
    request = urllib.request.Request(url, data=body, headers=dict(headers or {}), method=method)
    started = time.perf_counter()
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            size = _drain(response, max_bytes, read_limit, on_chunk)
            return HttpResponse(response.status, dict(response.headers.items()), size, time.perf_counter() - started)
    except urllib.error.HTTPError as exc:
        with exc:
            snippet = exc.read(ERROR_BODY_BYTES).decode("utf-8", "replace")
        raise JobFailed("HTTP_ERROR", f"{method} {url}: status {exc.code} {exc.reason}: {snippet}") from None
    except urllib.error.URLError as exc:
        raise JobFailed("NETWORK_ERROR", f"{method} {url}: {exc.reason}") from None
    except (OSError, HTTPException) as exc:  # timeouts, resets, a malformed response
        raise JobFailed("NETWORK_ERROR", f"{method} {url}: {type(exc).__name__}: {exc}") from None


def _drain(
    response: HTTPResponse, max_bytes: int | None, read_limit: int | None, on_chunk: Callable[[bytes], None] | None
) -> int:
    size = 0
    while read_limit is None or size < read_limit:
        chunk = response.read(CHUNK if read_limit is None else min(CHUNK, read_limit - size))
        if not chunk:
            break
        size += len(chunk)
        if max_bytes is not None and size > max_bytes:
            raise JobFailed("TOO_LARGE", f"the response body is larger than max_bytes = {max_bytes}")
        if on_chunk is not None:
            on_chunk(chunk)
    return size
