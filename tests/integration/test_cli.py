"""The `corral` command against real processes on 127.0.0.1: `up`, the client commands, `demo`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import corral as corral_client
from tests.conftest import ROOT, ControlProc, base_env, wait_until
from tests.support.cli import CORRAL, corral
from tests.support.ports import dead_address
from tests.support.processes import alive


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class Up:
    """A `corral up` process with its output in files."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.out = tmp_path / "up.out"
        self.err = tmp_path / "up.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [*CORRAL, "up", *args],
                cwd=ROOT,
                env={**base_env(), **(env or {})},
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )

    def text(self) -> str:
        return self.out.read_text()

    def kill_all(self) -> None:
        """SIGKILL whatever of it is left: its children first, then itself."""
        for pid in _descendants(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def wait_up(self) -> str:
        """Wait for "Corral is up" and return the gRPC address it printed."""

        def up() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"corral up exited with {self.proc.returncode}:\n{self.text()}\n{self.err.read_text()}")
            return "Corral is up" in self.text()

        wait_until(up, 60, what="corral up")
        match = re.search(r"gRPC\s+(127\.0\.0\.1:\d+|\[::1\]:\d+)", self.text())
        assert match, self.text()
        return match.group(1)


@pytest.fixture
def make_up(tmp_path: Path) -> Iterator[Any]:
    made: list[Up] = []

    def make(*args: str, env: dict[str, str] | None = None) -> Up:
        up = Up(tmp_path, *args, env=env)
        made.append(up)
        return up

    yield make
    for up in made:
        up.kill_all()


def test_up_serves_jobs_and_stops_cleanly_on_sigint(tmp_path: Path, make_up: Any) -> None:
    # Given `corral up` on ephemeral ports with one worker
    db = tmp_path / "corral.db"
    up = make_up("--grpc-port", "0", "--http-port", "0", "--db", str(db), "--workers", "1", "--threads", "2")
    address = up.wait_up()
    assert f"database  {db}" in up.text()
    children = _descendants(up.proc.pid)
    assert len(children) >= 2  # the control plane and the worker (and the worker's runners)

    # When a job is submitted through the CLI and waited for
    done = corral("submit", "add_numbers", "--payload", '{"a":1,"b":2}', "--wait", "--json", "--control", address)

    # Then the JSON carries the result
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert (job["state"], job["result"]) == ("SUCCEEDED", {"sum": 3})
    # and the dashboard it printed is there
    dashboard = re.search(r"web UI\s+(http://127\.0\.0\.1:\d+/ui)", up.text())
    assert dashboard, up.text()
    with urllib.request.urlopen(dashboard.group(1), timeout=30) as page:
        assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")

    # And Ctrl-C stops everything, exit 0, and no process is left behind
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0, up.err.read_text()
    assert "Stopped." in up.text()
    wait_until(lambda: not any(alive(pid) for pid in children), 10, what="every child to be gone")


def test_up_stops_in_order_on_sighup_so_a_running_job_finishes_once(tmp_path: Path, make_up: Any) -> None:
    # Given `corral up` with one worker running a job
    db = tmp_path / "corral.db"
    flags = ("--grpc-port", "0", "--http-port", "0", "--db", str(db), "--workers", "1", "--threads", "1")
    up = make_up(*flags)
    address = up.wait_up()
    submitted = corral("submit", "sleep", "--payload", '{"seconds": 1.5}', "--json", "--control", address)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]

    # (watched through the Python client: a CLI process per look takes a good part of the job's 1.5 s)
    with corral_client.Client(address) as client:
        wait_until(lambda: client.get(job_id).state is corral_client.JobState.RUNNING, what="the job to start")

    # When its terminal closes (SIGHUP)
    up.proc.send_signal(signal.SIGHUP)

    # Then it stops as on Ctrl-C, workers first: the job finishes and its result is stored
    assert up.proc.wait(60) == 0, up.err.read_text()
    assert "Stopped." in up.text()
    again = make_up(*flags)
    address = again.wait_up()
    shown = corral("get", job_id, "--json", "--control", address)
    assert shown.returncode == 0, shown.stderr
    job = json.loads(shown.stdout)
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 1)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1) to bind")
def test_up_on_the_ipv6_loopback_serves_grpc_rest_and_its_workers(tmp_path: Path, make_up: Any) -> None:
    # Given `corral up --host ::1`
    up = make_up("--host", "::1", "--grpc-port", "0", "--http-port", "0", "--db", str(tmp_path / "c.db"))
    address = up.wait_up()
    assert address.startswith("[::1]:")
    match = re.search(r"HTTP\s+(http://\[::1\]:\d+)", up.text())
    assert match, up.text()

    # When a job is submitted over gRPC and another over REST
    done = corral("submit", "add_numbers", "--payload", '{"a":1,"b":2}', "--wait", "--json", "--control", address)
    request = urllib.request.Request(f"{match.group(1)}/v1/jobs", data=b'{"type": "noop"}', method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        rest_job = json.loads(answer.read())["job"]

    # Then its workers reached the control plane at [::1] and ran both
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == {"sum": 3}
    waited = corral("watch", rest_job["id"], "--json", "--control", address)
    assert waited.returncode == 0, waited.stderr
    assert '"SUCCEEDED"' in waited.stdout


def test_up_killed_with_sigkill_leaves_no_process_behind(tmp_path: Path, make_up: Any) -> None:
    # Given `corral up` with its control plane, a worker and the worker's runners
    up = make_up("--grpc-port", "0", "--http-port", "0", "--db", str(tmp_path / "c.db"), "--workers", "1")
    up.wait_up()
    children = _descendants(up.proc.pid)
    assert len(children) >= 3

    # When the supervisor itself is killed, with no chance to stop anything
    up.proc.kill()
    up.proc.wait(10)

    # Then its children get SIGTERM from the kernel, shut down, and none runs on unsupervised
    wait_until(lambda: not any(alive(pid) for pid in children), 30, what="every child of corral up to exit")


def test_up_exits_1_with_the_reason_when_the_control_plane_cannot_start(tmp_path: Path, make_up: Any) -> None:
    up = make_up("--grpc-port", "0", "--http-port", "0", "--db", str(tmp_path / "no" / "such" / "dir" / "c.db"))
    assert up.proc.wait(60) == 1
    err = up.err.read_text()
    assert re.search(r"corral: error: control plane \(pid \d+\) exited with code \d+ while starting", err), err
    # And it says what it stops: no worker was started, so none drains
    assert "Stopping the control plane..." in up.text() and "workers first" not in up.text(), up.text()


@pytest.mark.parametrize(
    ("env", "said"),
    [
        # a worker setting every worker refuses
        ({"CORRAL_WORKER_LABELS": "bad"}, "CORRAL_WORKER_LABELS must be k=v pairs"),
        # a plug-in that does not import: every restart of the worker would fail the same way
        (
            {"CORRAL_WORKER_IMPORTS": "tests.support.plugin_raising"},
            "cannot import job-type plug-in 'tests.support.plugin_raising'",
        ),
    ],
    ids=["setting", "plugin"],
)
def test_up_stops_with_the_reason_when_its_workers_refuse_what_they_are_given(
    tmp_path: Path, make_up: Any, env: dict[str, str], said: str
) -> None:
    args = ("--grpc-port", "0", "--http-port", "0", "--workers", "1", "--db", str(tmp_path / "c.db"))
    up = make_up(*args, env=env)
    # Then corral up stops with the worker's own message instead of restarting it for ever
    assert up.proc.wait(60) == 1
    err = up.err.read_text()
    assert re.search(r"corral: error: worker 1 \(pid \d+\) exited with code 2", err), err
    assert said in err and "restarting it in" not in err, err
    assert "Corral is up" not in up.text()


@pytest.fixture
def served(control_plane: ControlProc, spawn_worker: Any) -> ControlProc:
    spawn_worker(control_plane, threads=2, imports=())  # the built-in job types only
    return control_plane


def test_submit_wait_json_prints_the_result(served: ControlProc) -> None:
    done = corral(
        "submit", "add_numbers", "--payload", '{"a":1,"b":2}', "--wait", "--json", "--control", served.address
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == {"sum": 3}


def test_submit_wait_exits_1_when_the_job_fails(served: ControlProc) -> None:
    done = corral("submit", "failing", "--max-attempts", "1", "--wait", "--control", served.address)
    assert done.returncode == 1
    # the job's id once it was accepted (as --follow says it), then the one error line
    submitted, error = done.stderr.splitlines()
    assert submitted.startswith("Submitted job ") and submitted.endswith(" (failing)")
    assert error.startswith("corral: error: job ") and "ended FAILED: ERROR" in error


def test_get_of_an_unknown_job_exits_1_with_one_line(control_plane: ControlProc) -> None:
    done = corral("get", "no-such-job", "--control", control_plane.address)
    assert done.returncode == 1
    assert done.stderr.startswith("corral: error: NOT_FOUND: ")
    assert "no-such-job" in done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_a_payload_the_server_refuses_names_the_field(control_plane: ControlProc) -> None:
    done = corral("submit", "add_numbers", "--payload", '{"a":"x","b":2}', "--control", control_plane.address)
    assert done.returncode == 2  # bad input, though the control plane found it (it was 1)
    assert done.stderr.startswith("corral: error: INVALID_ARGUMENT: field 'payload.a'")
    assert done.stderr.endswith("; given as --payload\n") and done.stderr.count("\n") == 1


def test_bad_payload_json_is_a_usage_error(control_plane: ControlProc) -> None:
    done = corral("submit", "noop", "--payload", "{oops", "--control", control_plane.address)
    assert done.returncode == 2
    assert "argument --payload: invalid JSON" in done.stderr and "line 1 column 2" in done.stderr


def test_job_type_names_print_as_they_are_never_as_markup(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a worker with a job type whose name holds what Rich reads as a closing tag
    spawn_worker(control_plane, threads=1, imports=("tests.support.jobtypes",))
    address = control_plane.address
    # When jobs of it are submitted, then each command prints the name (before, a MarkupError traceback,
    # once the job had been accepted)
    submitted = corral("submit", "markup[/v2]", "--control", address)
    assert submitted.returncode == 0, submitted.stderr
    assert re.fullmatch(r"Submitted job \S+ \(markup\[/v2\], (PENDING|RUNNING|SUCCEEDED)\)\n", submitted.stdout)
    waited = corral("submit", "markup[/v2]", "--wait", "--control", address)
    assert waited.returncode == 0, waited.stderr
    assert re.search(r"type\s+markup\[/v2\]", waited.stdout) and "Traceback" not in waited.stderr
    # and an unknown one is refused in one line
    unknown = corral("submit", "resize[v2]", "--wait", "--control", address)
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("corral: error: INVALID_ARGUMENT: field 'type': unknown job type 'resize[v2]'")


def test_times_at_the_ends_of_the_years_are_refused_or_shown_not_a_traceback(control_plane: ControlProc) -> None:
    address = control_plane.address
    # A time before 0001-01-01 in UTC is refused naming the field, before anything is sent
    refused = corral("submit", "noop", "--at", "0001-01-01T00:00:00+05:00", "--control", address)
    assert refused.returncode == 2
    assert refused.stderr.startswith("corral: error: INVALID_ARGUMENT: field 'scheduled_at': must be between")
    assert refused.stderr.count("\n") == 1
    # A job scheduled at the first second there is, shown west of Greenwich (in the year 0 locally),
    # is shown in UTC
    submitted = corral("submit", "noop", "--at", "0001-01-01T00:00:00Z", "--json", "--control", address)
    assert submitted.returncode == 0, submitted.stderr
    shown = corral("get", json.loads(submitted.stdout)["id"], "--control", address, env={"TZ": "America/New_York"})
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"scheduled\s+0001-01-01 00:00:00 UTC", shown.stdout), shown.stdout


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (("stats", "--token", "t\u00f6k"), {}, "corral stats: error: argument --token: invalid token"),
        (("stats",), {"CORRAL_TOKEN": "a-token\n"}, "corral stats: error: argument --token: invalid token"),
        (("submit", "noop", "--priority", "99999999999"), {}, "corral submit: error: argument --priority"),
        (("list", "--offset", "99999999999"), {}, "corral list: error: argument --offset"),
    ],
)
def test_values_a_request_cannot_carry_are_usage_errors(args: tuple[str, ...], env: dict[str, str], said: str) -> None:
    # They exited 1, and a token gRPC cannot send printed gRPC core's error lines, then INTERNAL
    done = corral(*args, "--control", dead_address(), env=env)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith(said) and done.stderr.startswith("usage: ")
    assert "INTERNAL" not in done.stderr and "a-token" not in done.stderr


def test_client_commands_read_and_change_jobs(served: ControlProc) -> None:
    address = served.address
    # A scheduled job can be listed, cancelled once, and not twice
    submitted = corral("submit", "noop", "--at", "+10m", "--label", "who=cli", "--json", "--control", address)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]
    listed = json.loads(corral("list", "--status", "scheduled", "--json", "--control", address).stdout)
    assert [j["id"] for j in listed["jobs"]] == [job_id] and listed["total"] == 1
    assert corral("cancel", job_id, "--control", address).returncode == 0
    again = corral("cancel", job_id, "--control", address)
    assert again.returncode == 1 and again.stderr.startswith("corral: error: FAILED_PRECONDITION")
    # A failed job is re-driven by retry, and watch follows it to its end
    failed = json.loads(
        corral("submit", "failing", "--max-attempts", "1", "--wait", "--json", "--control", address).stdout
    )
    assert failed["state"] == "FAILED"
    assert corral("retry", failed["id"], "--control", address).returncode == 0
    watched = corral("watch", failed["id"], "--json", "--control", address)
    assert watched.returncode == 1
    assert json.loads(watched.stdout.splitlines()[-1])["state"] == "FAILED"
    # Stats and workers answer, as tables and as JSON
    stats = json.loads(corral("stats", "--json", "--control", address).stdout)
    assert stats["workers"] == 1 and stats["jobs_by_status"]["CANCELLED"] == 1
    workers = json.loads(corral("workers", "--json", "--control", address).stdout)
    assert len(workers) == 1 and workers[0]["threads"] == 2
    table = corral("workers", "--control", address)
    assert table.returncode == 0 and workers[0]["id"] in table.stdout


def test_an_unreachable_control_plane_exits_3() -> None:
    address = dead_address()
    done = corral("stats", "--control", address)
    assert done.returncode == 3
    assert done.stderr.startswith(f"corral: error: UNAVAILABLE: cannot reach the control plane at {address}")
    assert done.stderr.count("\n") == 1


@pytest.mark.slow
def test_demo_runs_every_job_type_and_exits_0() -> None:
    done = corral("demo", "--jobs", "16", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "16 succeeded of 16 jobs" in done.stdout
    for job_type in ("noop", "sleep", "add_numbers", "reverse_string", "large_array_sum", "resize_image"):
        assert job_type in done.stdout
    assert "cpu_intensive" in done.stdout and "failing" in done.stdout
    for job_type in ("matmul", "monte_carlo_pi", "io_intensive"):
        assert job_type in done.stdout


def test_demo_against_a_control_plane_with_tokens_sends_its_token(make_control_plane: Any, spawn_worker: Any) -> None:
    # Given a control plane that needs a client token, and a worker
    worker_token, token = "w" * 24, "demo-client-token-0123456789"
    cp = make_control_plane(CORRAL_AUTH_TOKENS=f"ops:{token}", CORRAL_WORKER_TOKEN=worker_token)
    cp.token = token  # for the fixture's own calls
    spawn_worker(cp, threads=2, env={"CORRAL_WORKER_TOKEN": worker_token})
    # Then the demo runs there with --token (it had no such option: every call was UNAUTHENTICATED)
    done = corral("demo", "--control", cp.address, "--token", token, "--jobs", "11", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "11 succeeded of 11 jobs" in done.stdout
    # and without one it is refused in one line
    refused = corral("demo", "--control", cp.address, "--jobs", "1", timeout=60, env={"CORRAL_TOKEN": ""})
    assert refused.returncode == 1 and refused.stderr.startswith("corral: error: UNAUTHENTICATED")
