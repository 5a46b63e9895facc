"""``webhook``: call an HTTP endpoint (url, method, headers, body) and return its answer.

Payload ``{"url", "method"?: "POST", "headers"?: {name: value}, "body"?: str | JSON, "timeout_sec"?: 30}``.
A string body is sent as UTF-8 as it is; any other JSON value is sent as JSON with
``Content-Type: application/json`` (unless the headers set one).

Result ``{"status": int, "body": str, "body_truncated": bool, "content_type": str}``: the body is the
first :data:`MAX_BODY_BYTES` bytes, decoded as UTF-8 (bad bytes replaced). A status >= 400 or no
response at all fails the attempt with ``HTTP_ERROR`` (status and the start of the body in the
message) or ``NETWORK_ERROR``; both are retried while the job has attempts left.
"""

from __future__ import annotations

import json
from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.registry import JobContext, JobType, register
from runner.web import http_request

MAX_BODY_BYTES = 64 * 1024
"""The most of a response body a result carries."""


@register
class Webhook(JobType):
    """Send an HTTP request to a URL and report the response status and (bounded) body."""

    name = "webhook"
    schema = BUILTIN_SCHEMAS["webhook"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Send the request; fail (retryably) on status >= 400 or a connection error."""
        headers = {str(k): str(v) for k, v in (payload.get("headers") or {}).items()}
        data: bytes | None = None
        if "body" in payload:
            body = payload["body"]
            if isinstance(body, str):
                data = body.encode("utf-8")
            else:
                data = json.dumps(body, separators=(",", ":")).encode("utf-8")
                if not any(name.lower() == "content-type" for name in headers):
                    headers["Content-Type"] = "application/json"
        kept = bytearray()
        response = http_request(
            str(payload["url"]),
            method=str(payload.get("method", "POST")),
            headers=headers,
            body=data,
            timeout=float(payload.get("timeout_sec", 30.0)),
            read_limit=MAX_BODY_BYTES + 1,  # one byte more tells whether the body was cut
            on_chunk=kept.extend,
        )
        return {
            "status": response.status,
            "body": bytes(kept[:MAX_BODY_BYTES]).decode("utf-8", "replace"),
            "body_truncated": len(kept) > MAX_BODY_BYTES,
            "content_type": response.headers.get("Content-Type", ""),
        }
