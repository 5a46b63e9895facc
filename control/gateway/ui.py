"""The built-in dashboard: one page at ``/ui`` that watches and drives the control plane.

The page shows the job counts by state and the queue depth (``GET /v1/stats``), one page of jobs at
a time with state and type filters (``GET /v1/jobs`` with ``limit``/``offset``), a job's detail with
Cancel and Retry, the workers with Drain, and a submit form that shows the server's error message as
it is. It refreshes every 1.5 s while the tab is visible, one refresh at a time, and backs off with
a "control plane unreachable" banner when calls fail. It reads everything through the REST bridge,
so it can do nothing a REST client cannot.

Serving: ``GET /ui`` is the HTML, ``/ui/dashboard.js`` and ``/ui/dashboard.css`` are its script and
style (files of ``static/``, read once at start), and ``GET /`` redirects to ``/ui``. They hold no
data, so they are served without credentials, like ``/healthz``. When a bridge call answers 401 the
page asks for a client token, keeps it in ``sessionStorage`` and sends it as
``Authorization: Bearer`` on every call.

Every response carries :data:`SECURITY_HEADERS`: a Content-Security-Policy that allows only this
origin (no inline script or style, so the page's own files are all that can run), no framing, no
MIME sniffing, no referrer, and ``Cache-Control: no-cache`` so an upgraded control plane serves its
own page. The script puts server values in the DOM as text only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

PATH = "/ui"
"""Where the dashboard is served; ``/`` redirects here."""

SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
"""Sent with the page and its files."""

_FILES: dict[str, tuple[str, str]] = {
    PATH: ("dashboard.html", "text/html"),
    f"{PATH}/dashboard.js": ("dashboard.js", "text/javascript"),
    f"{PATH}/dashboard.css": ("dashboard.css", "text/css"),
}
"""URL path -> (file in ``static/``, content type)."""


@dataclass(frozen=True)
class Asset:
    """One static file as served: its bytes, content type and entity tag."""

    body: bytes
    content_type: str
    etag: str


class Dashboard:
    """The dashboard's routes over its static files; ``Dashboard.load()`` reads them once."""

    def __init__(self, assets: dict[str, Asset]) -> None:
        self.assets = assets
        """URL path -> what is served there."""
        self._label: web.RequestKey[str] | None = None

    @classmethod
    def load(cls) -> Dashboard:
        """Read the page and its files from the package (a missing file fails start-up, not a request)."""
        static = resources.files("control.gateway").joinpath("static")
        assets = {}
        for path, (name, content_type) in _FILES.items():
            body = static.joinpath(name).read_bytes()
            assets[path] = Asset(body, content_type, f'"{hashlib.sha256(body).hexdigest()[:32]}"')
        return cls(assets)

    def add_routes(self, router: web.UrlDispatcher, label: web.RequestKey[str] | None = None) -> None:
        """Register ``/``, ``/ui`` and the page's files, before any catch-all route (which would shadow them).

        Args:
            router: the application's router.
            label: where the server reads a request's route name (its metrics label); set to ``ui``.
        """
        self._label = label
        router.add_get("/", self._root)
        for path in self.assets:
            router.add_get(path, self._asset)

    async def _root(self, request: web.Request) -> web.Response:
        self._name(request)
        # 303: whatever the method, the browser GETs the page.
        raise web.HTTPSeeOther(PATH, headers=SECURITY_HEADERS)

    async def _asset(self, request: web.Request) -> web.Response:
        self._name(request)
        asset = self.assets[request.path]
        headers = {**SECURITY_HEADERS, "ETag": asset.etag}
        if asset.etag in _etags(request.headers.get("If-None-Match", "")):
            return web.Response(status=304, headers=headers)
        return web.Response(body=asset.body, content_type=asset.content_type, charset="utf-8", headers=headers)

    def _name(self, request: web.Request) -> None:
        if self._label is not None:
            request[self._label] = "ui"


def _etags(header: str) -> set[str]:
    """The entity tags of an ``If-None-Match`` header (weak ones compare equal, as RFC 9110 says for GET)."""
    return {tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()}
