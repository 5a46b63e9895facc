"""``network_intensive``: download a URL (HTTP GET) and report its size, digest and speed.

Payload ``{"url": "http(s)://...", "timeout_sec"?: 30, "max_bytes"?: 1 GiB}``. The body is streamed
through sha256, never held whole. Result ``{"status", "bytes", "sha256", "seconds", "mb_per_s",
"content_type"}``. A connection error or a status >= 400 fails the attempt (``NETWORK_ERROR`` /
``HTTP_ERROR``, retried while attempts remain); a body past ``max_bytes`` fails with ``TOO_LARGE``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.payload import as_int
from runner.registry import JobContext, JobType, register
from runner.web import http_request

DEFAULT_MAX_BYTES = 1 << 30
"""The body limit when the payload sets none."""


@register
class NetworkIntensive(JobType):
    """Download a URL with HTTP GET and report its size, sha256 and throughput."""

    name = "network_intensive"
    schema = BUILTIN_SCHEMAS["network_intensive"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """GET the URL, hashing the body as it streams."""
        digest = hashlib.sha256()
        response = http_request(
            str(payload["url"]),
            timeout=float(payload.get("timeout_sec", 30.0)),
            max_bytes=as_int(payload.get("max_bytes", DEFAULT_MAX_BYTES), "max_bytes"),
            on_chunk=digest.update,
        )
        seconds = max(response.seconds, 1e-9)
        return {
            "status": response.status,
            "bytes": response.size,
            "sha256": digest.hexdigest(),
            "seconds": round(seconds, 6),
            "mb_per_s": round(response.size / seconds / 1e6, 3),
            "content_type": response.headers.get("Content-Type", ""),
        }
