"""The dashboard at /ui in a real browser (headless Chromium, tests/support/browser.py) against a real
control plane and real workers on 127.0.0.1: what a person sees and does there.

Every test also checks that the page's script threw nothing and logged no error meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, WorkerProc, wait_until
from tests.integration.test_auth import token
from tests.integration.test_dashboard import kept_apart
from tests.integration.test_rest import Rest
from tests.support.browser import Browser, chromium


@pytest.fixture
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b
        assert b.script_errors() == [], "the page's script failed"


def ui(rest: Rest) -> str:
    return f"http://127.0.0.1:{rest.port}/ui"


def states_of(browser: Browser, name: str) -> list[str]:
    """The State column of the listed jobs called ``name``."""
    return [row[3] for row in browser.rows("jobs") if len(row) > 3 and row[1] == name]


def names(browser: Browser) -> list[str]:
    return [row[1] for row in browser.rows("jobs") if len(row) > 1]


def page_range(first: int, last: int, total: int) -> str:
    """What the page says above a page of jobs (an en dash between the first and the last)."""
    return f"{first}\u2013{last} of {total}"


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def open_live(browser: Browser, rest: Rest) -> None:
    browser.open(ui(rest))
    browser.wait(browser.live, "the live status")


def worker_row(browser: Browser, worker: WorkerProc) -> list[str] | None:
    return next((row for row in browser.rows("workers") if row[0] == worker.worker_id), None)


# ---- following jobs --------------------------------------------------------------------------------
def test_a_job_and_what_it_prints_are_followed_live_without_a_reload(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc], browser: Browser, tmp_path: Path
) -> None:
    # Given a worker and the page, live, showing the worker with its free slot
    worker = spawn_worker(control_plane)
    rest = Rest(control_plane.http_port)
    open_live(browser, rest)
    browser.wait(lambda: (worker_row(browser, worker) or [])[2:3] == ["1/1"], "the worker with its free slot")
    browser.driver.execute_script("window.corralTestMark = 1")  # gone if the page reloads
    assert browser.cards()["Success rate"] == "—", "a rate over no finished job"

    # When a job that prints three lines, then waits for a file, is submitted by another client
    hold = tmp_path / "hold"
    job = rest.submit({"type": "chatty", "name": "follow me", "payload": {"lines": 3, "hold": str(hold)}})

    # Then the list shows it running, and its detail shows what it printed while it still runs
    browser.wait(lambda: states_of(browser, "follow me") == ["RUNNING"], "the job running")
    browser.open_job(job["id"])
    browser.wait(lambda: "out 3" in browser.text("detail-output"), "the printed lines")
    assert browser.text("detail-output").split() == ["out", "1", "out", "2", "out", "3"]
    assert browser.detail()["State"] == "RUNNING" and not browser.hidden("detail-cancel")
    assert browser.detail()["Exec time"].endswith(" so far")

    # And how long it has run goes on counting in its row, while nothing else about it changes
    def running_for() -> str:
        return next(row[10] for row in browser.rows("jobs") if row[1] == "follow me")

    first = running_for()
    browser.wait(lambda: running_for() != first, "the running time move on")
    browser.wait(lambda: (worker_row(browser, worker) or [])[2:3] == ["0/1"], "the worker's slot taken")
    # and its owner's share is the whole of the one thread connected
    browser.wait(lambda: [row[6] for row in browser.rows("shares")] == ["100.0%"], "the share of the thread")
    assert browser.text("shares-capacity") == "1 thread connected"

    # When the job is let finish
    hold.touch()

    # Then the detail, the list, the counts and the worker's slot follow, in the same page
    browser.wait(lambda: browser.detail().get("State") == "SUCCEEDED", "the job succeeded")
    assert json.loads(browser.text("detail-outcome")) == {"printed": 3}
    assert browser.hidden("detail-cancel") and browser.hidden("detail-retry")
    browser.wait(lambda: states_of(browser, "follow me") == ["SUCCEEDED"], "the list's row succeeded")
    browser.wait(lambda: browser.cards().get("succeeded") == "1", "the succeeded count")
    assert browser.cards()["Success rate"] == "100.0 %"
    browser.wait(lambda: (worker_row(browser, worker) or [])[2:3] == ["1/1"], "the worker's slot free again")
    assert browser.driver.execute_script("return window.corralTestMark") == 1, "the page was reloaded"


def test_a_job_submitted_from_the_form_runs_and_bad_input_is_refused_by_name(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc], browser: Browser
) -> None:
    # Given a worker and the page
    spawn_worker(control_plane)
    rest = Rest(control_plane.http_port)
    open_live(browser, rest)

    def send(job_type: str, payload: str, **fields: str) -> None:
        browser.fill("#submit [name=type]", job_type)
        browser.fill("#submit [name=payload]", payload)
        for name, value in fields.items():
            browser.fill(f"#submit [name={name}]", value)
        browser.click("#submit button[type=submit]")

    def refused(rule: str) -> str:
        return browser.wait_text("submit-error", lambda text: rule in text, rule)

    # When the payload is not JSON, breaks its type's schema, or names a type nobody runs
    send("add_numbers", '{"a": 2,')
    assert refused("payload: not valid JSON").startswith("payload: not valid JSON")
    send("add_numbers", "[1, 2]")
    refused("payload: must be a JSON object")
    send("add_numbers", '{"a": 2, "b": "three"}')
    assert "payload.b" in refused("payload.b")
    send("no_such_type", "{}")
    assert "no_such_type" in refused("type")

    # Then each is said in the form, and nothing was created
    assert rest.total() == 0

    # When the form is filled in right
    send("add_numbers", '{"a": 2, "b": 3}', name="from the page", priority="7")

    # Then the one job it made runs to its result, and the error line is gone
    said = browser.wait_text("submit-result", lambda text: text.startswith("Submitted "), "the new job's id")
    job_id = said.removeprefix("Submitted ")
    assert browser.text("submit-error") == ""
    job = wait_until(lambda: (j := rest.get(f"/v1/jobs/{job_id}").json())["state"] == "SUCCEEDED" and j, what="the job")
    assert (job["name"], job["priority"], job["result"]) == ("from the page", 7, {"sum": 5})
    assert rest.total() == 1

    # And the id it shows opens the job's detail, with the result
    browser.click("#submit-result button")
    browser.wait(lambda: browser.detail().get("State") == "SUCCEEDED", "the job's detail")
    assert json.loads(browser.text("detail-outcome")) == {"sum": 5}
    assert browser.detail()["Name"] == "from the page"


# ---- acting on jobs and workers --------------------------------------------------------------------
def test_cancel_asks_first_and_then_stops_a_running_job(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc], browser: Browser
) -> None:
    # Given a job running on the only worker, open in the page
    worker = spawn_worker(control_plane)
    rest = Rest(control_plane.http_port)
    job = rest.submit({"type": "sleep", "payload": {"seconds": 60}, "timeoutSec": 120})
    wait_until(lambda: rest.get(f"/v1/jobs/{job['id']}").json()["state"] == "RUNNING", what="the job running")
    open_live(browser, rest)
    browser.open_job(job["id"])
    browser.wait(lambda: not browser.hidden("detail-cancel"), "the Cancel button")

    # When Cancel is clicked and the question is answered no
    browser.click("#detail-cancel")
    question = browser.confirm(accept=False)

    # Then nothing was asked of the control plane: after the page's next refresh the job still runs
    assert job["id"] in question
    shown = browser.status()
    browser.wait(lambda: browser.live() and browser.status() != shown, "the next refresh")
    assert rest.get(f"/v1/jobs/{job['id']}").json()["state"] == "RUNNING"
    assert browser.detail()["State"] == "RUNNING"

    # When it is clicked again and answered yes
    browser.click("#detail-cancel")
    browser.confirm(accept=True)

    # Then the job is cancelled, the page says so, and the worker's slot is free again
    browser.wait(lambda: browser.detail().get("State") == "CANCELLED", "the job cancelled")
    assert rest.get(f"/v1/jobs/{job['id']}").json()["state"] == "CANCELLED"
    assert browser.hidden("detail-cancel") and browser.hidden("detail-retry")
    browser.wait(lambda: (worker_row(browser, worker) or [])[2:3] == ["1/1"], "the worker's slot free again")


def test_retry_re_drives_a_failed_job_from_its_detail(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc], browser: Browser
) -> None:
    # Given a job that failed its only attempt (its next one succeeds)
    spawn_worker(control_plane)
    rest = Rest(control_plane.http_port)
    payload = {"message": "the first try fails", "fail_attempts": 1}
    job = rest.submit({"type": "failing", "payload": payload, "maxAttempts": 1})
    wait_until(lambda: rest.get(f"/v1/jobs/{job['id']}").json()["state"] == "FAILED", what="the job failed")

    # When its detail is opened
    open_live(browser, rest)
    browser.open_job(job["id"])

    # Then it shows the error where a result would be, and offers Retry, not Cancel
    browser.wait(lambda: browser.text("detail-outcome-title") == "Error", "the error")
    assert browser.text("detail-outcome") == "ERROR: the first try fails"
    assert not browser.hidden("detail-retry") and browser.hidden("detail-cancel")

    # When Retry is clicked
    browser.click("#detail-retry")

    # Then the job runs again and the detail follows it to its result
    browser.wait(lambda: browser.detail().get("State") == "SUCCEEDED", "the retried job succeeded")
    assert json.loads(browser.text("detail-outcome")) == {"attempt": 2}
    assert browser.text("detail-outcome-title") == "Result"
    assert rest.get(f"/v1/jobs/{job['id']}").json()["attempts"] == 2


def test_drain_asks_first_and_then_the_worker_finishes_and_leaves(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc], browser: Browser
) -> None:
    # Given a worker, listed on the page
    worker = spawn_worker(control_plane)
    rest = Rest(control_plane.http_port)
    open_live(browser, rest)
    browser.wait(lambda: worker_row(browser, worker), "the worker")

    # When its Drain button is clicked and the question answered yes
    drain = browser.driver.find_element(By.CSS_SELECTOR, "#workers tr:first-child button")
    drain.click()
    question = browser.confirm(accept=True)

    # Then the worker leaves, and the page shows that no worker is left
    assert worker.worker_id in question
    assert worker.wait(timeout=30) == 0
    browser.wait(lambda: browser.rows("workers") == [["No workers registered."]], "no worker left")
    browser.wait(lambda: browser.cards().get("Workers") == "0", "the worker count")


# ---- what the page shows and how -------------------------------------------------------------------
def test_server_text_is_shown_as_text_never_as_markup(control_plane: ControlProc, browser: Browser) -> None:
    # Given a queued job whose name and payload are markup
    rest = Rest(control_plane.http_port)
    name = '<img src=x onerror="window.corralPwned=1"><b>bold</b>'
    text = "<script>window.corralPwned=2</script>"
    job = rest.submit({"type": "reverse_string", "name": name, "payload": {"text": text}})

    # When the page lists it and its detail is opened
    open_live(browser, rest)
    browser.wait(lambda: name in names(browser), "the job's name")
    browser.open_job(job["id"])

    # Then the name and the payload are shown as the characters they are, and none of it became markup
    assert browser.detail()["Name"] == name
    assert json.loads(browser.text("detail-payload")) == {"text": text}
    for where in ("#jobs", "#detail"):
        made = browser.driver.execute_script(
            f"return document.querySelectorAll('{where} img, {where} b, {where} script').length"
        )
        assert made == 0, f"{where} holds elements made from server text"
    assert browser.driver.execute_script("return window.corralPwned") is None


def test_a_large_list_is_held_one_page_at_a_time_and_pages_and_filters(
    control_plane: ControlProc, browser: Browser
) -> None:
    # Given 5,000 queued jobs (no worker), named in the order they were submitted
    total = 5000
    for start in range(0, total, 1000):
        batch = [jobs_pb2.SubmitJobRequest(type="noop", name=f"job-{i:04d}") for i in range(start, start + 1000)]
        control_plane.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=batch), timeout=60)
    rest = Rest(control_plane.http_port)

    # When the page opens
    open_live(browser, rest)

    # Then it holds one page of 50 rows, newest first, and says where it is in the whole
    browser.wait(lambda: browser.text("page-range") == page_range(1, 50, total), "the first page's range")
    assert names(browser) == [f"job-{i:04d}" for i in range(total - 1, total - 51, -1)]
    assert browser.element("page-prev").get_attribute("disabled") is not None

    # When the next page is asked for
    browser.click("#page-next")

    # Then the next 50 are shown instead
    browser.wait(lambda: browser.text("page-range") == page_range(51, 100, total), "the second page's range")
    browser.wait(lambda: names(browser)[:1] == [f"job-{total - 51:04d}"], "the second page's rows")
    assert len(browser.rows("jobs")) == 50

    # When the queue order is chosen
    Select(browser.element("filter-state")).select_by_value("QUEUE")

    # Then the list starts again at the oldest, each with its place in the queue
    browser.wait(lambda: names(browser)[:1] == ["job-0000"], "the head of the queue")
    first = browser.rows("jobs")[0]
    assert first[9].startswith("#1"), first
    assert browser.text("page-range") == page_range(1, 50, total)

    # When a type no job has is typed
    browser.fill("#filter-type", "no_such_type")

    # Then the page says that nothing matches
    browser.wait(lambda: browser.rows("jobs") == [["No jobs match."]], "the empty list")
    assert browser.text("page-range") == "0 of 0"


def test_the_page_says_when_the_control_plane_is_gone_and_recovers_when_it_is_back(
    control_plane: ControlProc, browser: Browser
) -> None:
    # Given the page, live, listing a job
    rest = Rest(control_plane.http_port)
    rest.submit({"type": "noop", "name": "kept"})
    open_live(browser, rest)
    browser.wait(lambda: "kept" in names(browser), "the job")

    # When the control plane stops
    control_plane.stop()

    # Then the page says it is unreachable, and keeps what it showed
    browser.wait(lambda: not browser.hidden("banner"), "the unreachable banner")
    assert browser.text("banner").startswith("Control plane unreachable")
    assert browser.status() == "unreachable"
    assert "kept" in names(browser)

    # When it is back, and Retry now is clicked
    control_plane.start()
    browser.click("#banner button")

    # Then the page is live again, and the banner gone
    browser.wait(browser.live, "the live status")
    assert browser.hidden("banner")
    assert "kept" in names(browser)


# ---- tokens and accounts ---------------------------------------------------------------------------
def test_a_token_is_asked_for_kept_for_the_tab_and_shows_only_what_it_may_see(
    make_control_plane: Callable[..., ControlProc], browser: Browser
) -> None:
    # Given clients kept apart (ops the admin), and a queued job of each
    rest, ops, alice = kept_apart(make_control_plane)
    rest.submit({"type": "noop", "name": "ops's job"}, headers=bearer(ops))
    rest.submit({"type": "noop", "name": "alice's job"}, headers=bearer(alice))

    def token_asked() -> bool:
        return not browser.hidden("auth") and browser.status() == "needs a token"

    def use(secret: str) -> None:
        browser.fill("#auth-token", secret)
        browser.click("#auth button[type=submit]")

    # When the page opens without a token
    browser.open(ui(rest))

    # Then it asks for one, and shows no job
    browser.wait(token_asked, "the token form")
    assert browser.rows("jobs") == []

    # When a token with a character no header can carry is given, and then one the control plane refuses
    use("tökén")
    browser.wait_text("auth-error", lambda text: text == "A token is printable ASCII without spaces.", "the rule")
    use(token())

    # Then it asks again, saying why
    browser.wait(
        lambda: token_asked() and browser.text("auth-error") not in ("", "A token is printable ASCII without spaces."),
        "the refusal",
    )

    # When alice's token is given
    use(alice)

    # Then the page is live with alice's jobs only, and the admins' sections are hidden from her
    browser.wait(lambda: names(browser) == ["alice's job"], "alice's jobs")
    browser.wait(
        lambda: browser.hidden("audit-section") and browser.hidden("shares-section"), "the admin sections hidden"
    )
    assert browser.hidden("auth") and not browser.hidden("forget-token")

    # When the page is reloaded in the same tab
    browser.driver.refresh()

    # Then the token is kept: no question, the same jobs
    browser.wait(lambda: names(browser) == ["alice's job"], "alice's jobs after a reload")
    assert browser.hidden("auth")

    # When the token is forgotten and ops's is given
    browser.click("#forget-token")
    browser.wait(token_asked, "the token form again")
    use(ops)

    # Then the admin sees both jobs, the audit log and the shares
    browser.wait(lambda: sorted(names(browser)) == ["alice's job", "ops's job"], "every job")
    browser.wait(
        lambda: not browser.hidden("audit-section") and not browser.hidden("shares-section"), "the admin sections"
    )
    browser.wait(lambda: {row[0] for row in browser.rows("shares")} == {"alice", "ops"}, "each owner's share")
    # and, with no worker connected, no dominant share claims a part of nothing
    assert browser.text("shares-capacity") == "No worker connected: dominant shares are not known."
    assert [row[6] for row in browser.rows("shares")] == ["—", "—"]


def test_a_person_logs_in_with_an_account_and_submits_as_themself(
    make_control_plane: Callable[..., ControlProc], browser: Browser
) -> None:
    # Given a control plane with accounts, and alice's account
    cp = make_control_plane(CORRAL_ACCOUNTS="open", CORRAL_WORKER_TOKEN=token(), CORRAL_PASSWORD_ROUNDS="10")
    rest = Rest(cp.http_port)
    assert rest.post("/v1/accounts", {"name": "alice", "password": "correct horse"}).status == 200
    browser.open(ui(rest))
    browser.wait(lambda: not browser.hidden("login"), "the login form")

    def log_in(password: str) -> None:
        browser.fill("#login-name", "alice")
        browser.fill("#login-password", password)
        browser.click("#login button[type=submit]")

    # When a wrong password is given
    asked = browser.text("auth-error")  # why the page asks: the call it made without a login
    log_in("wrong horse")

    # Then the form says so, and the password field is emptied
    refusal = browser.wait_text("auth-error", lambda text: text != asked, "the refusal")
    assert "password" in refusal, refusal
    assert browser.element("login-password").get_attribute("value") == ""

    # When the right one is given, and a job submitted from the form
    log_in("correct horse")
    browser.wait(browser.live, "the live status")
    browser.fill("#submit [name=type]", "noop")
    browser.click("#submit button[type=submit]")

    # Then the job is alice's, and the page lists it
    said = browser.wait_text("submit-result", lambda text: text.startswith("Submitted "), "the new job")
    job_id = said.removeprefix("Submitted ")
    login = rest.post("/v1/login", {"name": "alice", "password": "correct horse"}).json()["token"]
    job: dict[str, Any] = rest.get(f"/v1/jobs/{job_id}", headers=bearer(login)).json()
    assert job["owner"] == "alice"
    browser.wait(lambda: [row[7] for row in browser.rows("jobs")] == ["alice"], "alice's job in the list")
