"""The built-in dashboard at /ui against a real control plane on 127.0.0.1: it is served with its
security headers and without credentials, it loads nothing from another host, it never parses
server text as HTML, and every REST call its script makes is one the bridge serves.

The page's behaviour in a browser is tested in test_dashboard_browser.py; these are the promises the
page's files and the gateway make to it, read from the files the gateway actually serves.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import pytest

from control.api import SERVICES
from control.gateway import Router, http_routes
from tests.conftest import ControlProc
from tests.integration.test_auth import token
from tests.integration.test_rest import Reply, Rest, http_port

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
HTML_SINKS = ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function")
API_CALL = re.compile(r'(?:api|stream)\(\s*"(GET|POST)",\s*"(/v1/[^"]*)"')
"""How the script calls the bridge: ``api("METHOD", "/v1/route/{template}", ...)``, or ``stream(...)``
for a server stream."""


class PageParts(HTMLParser):
    """The parts of the page that make a browser load or run something."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        """``src`` of every ``<script>``."""
        self.styles: list[str] = []
        """``href`` of every stylesheet ``<link>``."""
        self.urls: list[str] = []
        """Every ``src``, ``href``, ``action`` and ``formaction`` value."""
        self.inline: list[str] = []
        """What the page's CSP would block: inline script, ``<style>``, ``style=`` and ``on*=`` attributes."""
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        self.urls += [v for k, v in values.items() if k in ("src", "href", "action", "formaction")]
        self.inline += [f"<{tag} {k}=...>" for k in values if k == "style" or k.startswith("on")]
        if tag == "script":
            self.scripts.append(values.get("src", ""))
            self._in_script = True
        if tag == "style":
            self.inline.append("<style>")
        if tag == "link" and values.get("rel") == "stylesheet":
            self.styles.append(values["href"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline.append("<script> with a body")


@dataclass
class Page:
    """The dashboard as the gateway serves it: the HTML, its parts and the files it loads."""

    html: Reply
    parts: PageParts
    files: dict[str, Reply]
    """URL path -> reply, for every script and stylesheet the page names."""

    @property
    def script(self) -> str:
        return "\n".join(self.files[src].body.decode() for src in self.parts.scripts)

    def texts(self) -> dict[str, str]:
        """The HTML and every file it loads, by URL path."""
        return {"/ui": self.html.body.decode(), **{p: r.body.decode() for p, r in self.files.items()}}


def load_page(rest: Rest, headers: dict[str, str] | None = None) -> Page:
    html = rest.get("/ui", headers=headers)
    assert html.status == 200, html.body
    parts = PageParts()
    parts.feed(html.body.decode())
    files = {path: rest.get(path, headers=headers) for path in parts.scripts + parts.styles}
    return Page(html, parts, files)


def check_headers(reply: Reply, content_type: str, where: str) -> None:
    assert reply.status == 200, f"{where}: {reply.status} {reply.body!r}"
    assert reply.headers.get_content_type() == content_type, f"{where}: {reply.headers['Content-Type']}"
    for name, value in SECURITY_HEADERS.items():
        assert reply.headers[name] == value, f"{where}: {name} is {reply.headers[name]!r}"
    csp = {d.split()[0]: d.split()[1:] for d in reply.headers["Content-Security-Policy"].split(";") if d.strip()}
    assert csp["default-src"] == ["'self'"], where
    assert csp["frame-ancestors"] == ["'none'"], where
    for directive, sources in csp.items():
        assert "'unsafe-inline'" not in sources and "'unsafe-eval'" not in sources, f"{where}: {directive}"
        assert all(s.startswith("'") for s in sources), f"{where}: {directive} names a host: {sources}"


@pytest.fixture
def rest(control_plane: ControlProc) -> Rest:
    return Rest(http_port(control_plane))


# ---- serving ---------------------------------------------------------------------------------------
def test_the_page_and_its_files_are_served_with_the_security_headers(rest: Rest) -> None:
    # When the dashboard is fetched, as a browser would, page first
    page = load_page(rest)

    # Then the page is HTML, and it loads one script and one stylesheet, both served the same way
    check_headers(page.html, "text/html", "/ui")
    assert page.parts.scripts and page.parts.styles, page.parts.__dict__
    for path, reply in page.files.items():
        check_headers(reply, "text/javascript" if path in page.parts.scripts else "text/css", path)
        assert reply.body.strip(), path

    # And a browser that has the page may keep it until it changes (an upgrade serves the new one)
    etag = page.html.headers["ETag"]
    assert rest.get("/ui", headers={"If-None-Match": etag}).status == 304
    assert rest.get("/ui", headers={"If-None-Match": '"something-else"'}).status == 200


def test_the_root_redirects_to_the_dashboard(rest: Rest) -> None:
    # When a browser opens the control plane's address
    reply = rest.get("/")

    # Then it is sent to /ui
    assert reply.status == 303, reply.status
    assert reply.headers["Location"] == "/ui"


def test_the_page_loads_nothing_from_another_host(rest: Rest) -> None:
    # Given the page and everything it loads
    page = load_page(rest)

    # Then each URL in the HTML is a path on this origin
    assert page.parts.urls, "the page names no files at all"
    for url in page.parts.urls:
        assert url.startswith("/") and not url.startswith("//"), f"/ui names {url!r}"

    # And no file names a URL with a scheme, a protocol-relative one, or a CSS import of another file
    for path, text in page.texts().items():
        assert not re.search(r"\b[a-z][a-z0-9+.-]*://", text, re.I), f"{path} names a URL with a scheme"
        assert not re.search(r"""["'`(]\s*//[^\s/]""", text), f"{path} names a protocol-relative URL"
        assert "@import" not in text and "@font-face" not in text, path


def test_the_page_never_parses_server_text_as_html_and_runs_under_its_own_csp(rest: Rest) -> None:
    # Given the page and its files
    page = load_page(rest)

    # Then no file has a way to turn a string into markup or code
    for path, text in page.texts().items():
        for sink in HTML_SINKS:
            assert sink not in text, f"{path} uses {sink}"

    # And nothing inline is left for the CSP (no 'unsafe-inline') to block: the script is all files
    assert page.parts.inline == []
    assert page.parts.scripts == [s for s in page.parts.scripts if s.startswith("/ui/")]


# ---- the calls the script makes --------------------------------------------------------------------
def test_every_call_the_script_makes_is_a_route_of_the_bridge(
    control_plane: ControlProc, spawn_worker: Callable[..., Any], rest: Rest
) -> None:
    # Given a worker and a job, whose ids fill the routes' {id}
    worker = spawn_worker(control_plane, imports=())
    job = rest.submit({"type": "add_numbers", "payload": {"a": 1, "b": 2}})

    # And every call of the script, with nothing calling /v1/ some other way
    script = load_page(rest).script
    calls = API_CALL.findall(script)
    assert len(calls) == script.count('"/v1/'), "a /v1/ path the script uses outside api(...) and stream(...)"
    assert {path for _, path in calls} >= {
        "/v1/stats",
        "/v1/jobs",
        "/v1/jobs/{id}",
        "/v1/jobs/{id}:cancel",
        "/v1/jobs/{id}:retry",
        "/v1/jobs/{id}:watchOutput",
        "/v1/workers",
        "/v1/workers/{id}:drain",
        "/v1/audit",
        "/v1/shares",
    }

    # When each is made against the control plane
    router = Router(http_routes(SERVICES))
    for method, template in calls:
        ident = worker.worker_id if template.startswith("/v1/workers/") else job["id"]
        path = template.replace("{id}", ident)
        assert router.match(method, path).route is not None, f"{method} {template} is no route of the annotations"
        reply = rest.call(method, path, {} if method == "POST" else None)

        # Then the bridge serves it: no 404 (ids exist, so none is right) and no 405
        assert reply.status not in (404, 405), f"{method} {path}: {reply.status} {reply.body!r}"
        assert reply.status < 500, f"{method} {path}: {reply.status} {reply.body!r}"


def test_the_job_list_the_script_asks_for_is_one_page_of_what_the_bridge_filters(rest: Rest) -> None:
    # Given the query parameters and page size of the script's job list
    script = load_page(rest).script
    keys = set(re.findall(r'listQuery\.set\("(\w+)"', script))
    (page_size,) = re.findall(r"const PAGE_SIZE = (\d+);", script)
    assert keys == {"status", "type", "limit", "offset", "order"}, keys
    assert 1 <= int(page_size) <= 100, "the page must not load the whole list"

    # And three jobs of a type of their own
    kind = "add_numbers"
    for i in range(3):
        rest.submit({"type": kind, "name": f"page-{i}", "payload": {"a": i, "b": 1}})

    # When the second page of two is asked for with every parameter the script sends
    reply = rest.get(f"/v1/jobs?status=SUCCEEDED&status=PENDING&status=RUNNING&type={kind}&limit=2&offset=2")

    # Then the bridge understands each of them and answers one page and the total
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert int(answer["total"]) == 3 and len(answer["jobs"]) == 1

    # And its queue view (order instead of status) is one the bridge understands too
    queued = rest.get(f"/v1/jobs?order=QUEUE&type={kind}&limit=2&offset=0")
    assert queued.status == 200, queued.body
    assert all(job["state"] == "PENDING" and job["queuePosition"] >= 1 for job in queued.json().get("jobs", []))


# ---- auth ------------------------------------------------------------------------------------------
def test_with_client_tokens_the_page_is_open_and_the_data_is_not(
    make_control_plane: Callable[..., ControlProc],
) -> None:
    # Given a control plane that wants a client token
    client = token()
    cp = make_control_plane(CORRAL_AUTH_TOKENS=f"ops:{client}", CORRAL_WORKER_TOKEN=token())
    rest = Rest(http_port(cp))

    # When the page and its files are fetched without one
    page = load_page(rest)

    # Then they are served, while the data the page shows is refused with the Bearer challenge
    for path, reply in page.files.items():
        assert reply.status == 200, f"{path}: {reply.status}"
    assert rest.get("/").status == 303
    refused = rest.get("/v1/jobs")
    assert refused.status == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer")
    assert rest.get("/v1/jobs", headers={"Authorization": f"Bearer {client}"}).status == 200

    # And the page can take a token: a password field, kept in sessionStorage, sent as a bearer token
    assert 'type="password"' in page.html.body.decode()
    assert "sessionStorage" in page.script and '"Bearer "' in page.script


def test_with_accounts_the_page_logs_in_and_uses_the_login_as_its_token(
    make_control_plane: Callable[..., ControlProc],
) -> None:
    # Given a control plane with accounts, and one account
    cp = make_control_plane(CORRAL_ACCOUNTS="open", CORRAL_WORKER_TOKEN=token(), CORRAL_PASSWORD_ROUNDS="10")
    rest = Rest(http_port(cp))
    assert rest.call("POST", "/v1/accounts", {"name": "alice", "password": "correct horse"}).status == 200

    # When the page's login form posts what the script sends: {name, password} to /v1/login
    page = load_page(rest)
    html = page.html.body.decode()
    assert 'id="login"' in html and 'autocomplete="current-password"' in html
    assert re.search(r'api\("POST", "/v1/login", \{\}, \{ body \}\)', page.script)
    assert re.search(r"const body = \{ name: .*, password: .* \};", page.script)
    login = rest.call("POST", "/v1/login", {"name": "alice", "password": "correct horse"})

    # Then the answer's token, which the script keeps, opens the data as alice
    assert login.status == 200 and "keepToken(data.token)" in page.script
    bearer = {"Authorization": f"Bearer {login.json()['token']}"}
    assert rest.get("/v1/jobs", headers=bearer).status == 200
    assert rest.get("/v1/whoami", headers=bearer).json()["name"] == "alice"


def kept_apart(make_control_plane: Callable[..., ControlProc], **env: str) -> tuple[Rest, str, str]:
    """A control plane whose clients are kept apart, ops its admin: its bridge, ops's token, alice's."""
    ops, alice = token(), token()
    cp = make_control_plane(
        CORRAL_AUTH_TOKENS=f"ops:{ops},alice:{alice}",
        CORRAL_WORKER_TOKEN=token(),
        CORRAL_JOB_VISIBILITY="owner",
        CORRAL_AUTH_ADMINS="ops",
        **env,
    )
    return Rest(http_port(cp)), ops, alice


def test_the_audit_section_shows_the_log_to_admins_and_hides_from_others(
    make_control_plane: Callable[..., ControlProc],
) -> None:
    # Given clients kept apart, with ops the admin, and one refused cancel on record
    rest, ops, alice = kept_apart(make_control_plane)
    assert rest.call("POST", "/v1/jobs/job-x:cancel", {}, headers={"Authorization": f"Bearer {alice}"}).status == 404

    # When the page asks for the log as the script does
    page = load_page(rest)
    asked = re.search(
        r'readAdmin\((\w+),\s+\(\) => api\("GET", "/v1/audit", \{\}, \{ query: new URLSearchParams\(\{ limit: String\((\w+)\) \}\) \}\)',
        page.script,
    )
    assert asked is not None and 'id="audit-section"' in page.html.body.decode()
    limit = re.search(rf"const {asked.group(2)} = (\d+);", page.script)
    assert f'const {asked.group(1)} = adminSection("audit", ' in page.script
    assert limit is not None
    path = f"/v1/audit?limit={limit.group(1)}"

    # Then an admin gets the event with the fields the script shows, and anyone else a 403, which hides it
    events = rest.get(path, headers={"Authorization": f"Bearer {ops}"}).json()["events"]
    assert [(e["actor"], e["action"], e["target"], e["outcome"]) for e in events] == [
        ("alice", "job.cancel", "job-x", "NOT_FOUND")
    ]
    for field in ("time", "actor", "action", "target", "outcome", "requestId"):
        assert f"e.{field}" in page.script and field in events[0]
    assert rest.get(path, headers={"Authorization": f"Bearer {alice}"}).status == 403
    assert "$(`${section.name}-section`).hidden = err.status === 403" in page.script


def test_the_shares_section_shows_who_holds_what_to_admins_and_hides_from_others(
    make_control_plane: Callable[..., ControlProc],
) -> None:
    # Given clients kept apart, with ops the admin, and a queued job of alice's (no worker)
    rest, ops, alice = kept_apart(make_control_plane, CORRAL_FAIR_SHARE="on", CORRAL_FAIR_SHARE_HALF_LIFE_SEC="600")
    assert rest.submit({"type": "noop"}, headers={"Authorization": f"Bearer {alice}"})["state"] == "PENDING"

    # When the page asks for the shares as the script does
    page = load_page(rest)
    asked = re.search(r'readAdmin\((\w+), \(\) => api\("GET", "/v1/shares"\)\)', page.script)
    assert asked is not None and 'id="shares-section"' in page.html.body.decode()
    assert f'const {asked.group(1)} = adminSection("shares", ' in page.script

    # Then an admin gets alice's share with the fields the script shows, and anyone else a 403, which hides it
    answer = rest.get("/v1/shares", headers={"Authorization": f"Bearer {ops}"}).json()
    assert [(s["name"], s["owners"], s["queuedJobs"]) for s in answer["shares"]] == [("alice", ["alice"], 1)]
    assert answer["halfLifeSec"] == 600 and "answer.halfLifeSec" in page.script
    for field in ("name", "owners", "weight", "runningJobs", "queuedJobs", "threads", "dominantShare",
                  "recentShare", "rank", "threadSeconds"):  # fmt: skip
        assert f"s.{field}" in page.script
    assert rest.get("/v1/shares", headers={"Authorization": f"Bearer {alice}"}).status == 403
    assert "$(`${section.name}-section`).hidden = err.status === 403" in page.script
