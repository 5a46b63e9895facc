"""The `corral` command on 127.0.0.1 when it is stopped or cannot reach anyone: a Ctrl-C during `submit
--wait` names the job that goes on; a deadline before any contact exits 3 naming the address; a signal
during `corral demo`'s stop leaves no process behind; an address that is not HOST:PORT is a usage error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

import corral
from tests.conftest import ROOT, ControlProc, base_env, interruptible, wait_until
from tests.support.cli import CORRAL
from tests.support.cli import corral as run_corral
from tests.support.ports import dead_address
from tests.support.processes import alive, children


def _accepted(cp: ControlProc, label: str) -> str:
    """The id of the job labelled ``run=label``, once the control plane has it ('' before)."""
    with corral.Client(cp.address, timeout=10) as client:
        jobs = client.list(labels={"run": label}).jobs
    return jobs[0].id if jobs else ""


# -- item: Ctrl-C during submit --wait ------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_during_submit_wait_names_the_job_that_goes_on(
    as_json: bool, control_plane: ControlProc, tmp_path: Path
) -> None:
    # Given `corral submit --wait` of a job that no worker will run (none is connected)
    label = uuid.uuid4().hex
    args = ["submit", "sleep", "--payload", '{"seconds": 30}', "--label", f"run={label}", "--wait"]
    args += ["--json"] if as_json else []
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            interruptible([*CORRAL, *args, "--control", control_plane.address]),
            cwd=ROOT,
            env=base_env(),
            stdout=stdout,
            stderr=stderr,
        )
    try:
        job_id = wait_until(lambda: _accepted(control_plane, label), what="the job to be accepted")
        # When it is interrupted once the job was accepted (and the command has heard so: it says the id)
        if not as_json:
            wait_until(lambda: job_id in err.read_text() or proc.poll() is not None, what="the job's id on stderr")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Then it exits 130, naming the job and how to follow it (before: only "corral: error: interrupted",
    # and the id had been shown only in the spinner, which was erased)
    said = err.read_text()
    assert code == 130, said
    assert f"corral watch {job_id}" in said.splitlines()[-1], said
    if not as_json:
        assert f"Submitted job {job_id} (sleep)" in said
    # stdout: nothing (the job did not end), and so nothing that a JSON reader would choke on
    assert out.read_text() == ""
    with corral.Client(control_plane.address, timeout=10) as client:
        assert client.get(job_id).state.name == "PENDING"  # it goes on
        client.cancel(job_id)


def test_submit_wait_json_prints_only_the_job_on_stdout(control_plane: ControlProc, spawn_worker: object) -> None:
    spawn_worker(control_plane)  # type: ignore[operator]
    done = run_corral("submit", "add_numbers", "--payload", '{"a": 1, "b": 2}', "--wait", "--json",
                      "--control", control_plane.address)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == {"sum": 3}


# -- item: a deadline before any contact exits 3 naming the address -------------------------------------


def test_wait_on_an_address_that_refuses_exits_3_naming_it() -> None:
    address = dead_address()
    done = run_corral("wait", "some-job", "--timeout", "2", "--control", address)
    # before: exit 1, "DEADLINE_EXCEEDED: 1 of 1 jobs not finished after 2 s", as if the job had been seen
    assert done.returncode == 3, done.stderr
    assert address in done.stderr and "UNAVAILABLE" in done.stderr and "DEADLINE" not in done.stderr


def test_stats_on_an_address_that_never_answers_exits_3_naming_it(silent_address: str) -> None:
    done = run_corral("stats", "--rpc-timeout", "1", "--control", silent_address)
    # before: exit 1, "DEADLINE_EXCEEDED: Deadline Exceeded", naming no address
    assert done.returncode == 3, done.stderr
    assert silent_address in done.stderr and done.stderr.count(silent_address) == 1, done.stderr


# -- item: addresses that are not HOST:PORT -------------------------------------------------------------


# Not "::1:5" here: the command it fixes dialled [::0.1.0.5]:443, which is not loopback (unit-tested
# instead, in tests/unit/corral/test_failover.py, where nothing is dialled either way).
@pytest.mark.parametrize("bad", ["[::1", "http://127.0.0.1:5", "a b:1", "127.0.0.1", ""])
def test_an_address_that_is_not_host_port_is_a_usage_error(bad: str) -> None:
    # before: resolver errors, or a dial of port 443, and exit 3
    done = run_corral("stats", "--control", bad, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "HOST:PORT" in done.stderr and "brackets" in done.stderr


# -- item: a signal while `corral demo` stops ------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def _signal_pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits, undelivered, for process ``pid`` (it is stopped: SIGSTOP)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    masks = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask & (1 << (signum - 1)) for mask in masks)


def _is_worker(pid: int) -> bool:
    try:
        return b"worker" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[2]
    except (OSError, IndexError):
        return False


def test_a_signal_while_demo_stops_leaves_no_process_behind(tmp_path: Path) -> None:
    # Given `corral demo` whose embedded workers are stopped (SIGSTOP) once it is up, so that its jobs
    # never all end (24 of them: one sleeps 3 s), its time runs out, and its stop waits on workers that
    # cannot take its SIGTERM yet
    out, err = tmp_path / "out", tmp_path / "err"
    temp = tmp_path / "tmp"
    temp.mkdir()
    with out.open("w") as stdout, err.open("w") as stderr:
        demo = subprocess.Popen(
            [*CORRAL, "demo", "--jobs", "24", "--timeout", "6"],
            cwd=ROOT,
            env=base_env({"TMPDIR": str(temp)}),
            stdout=stdout,
            stderr=stderr,
        )
    tree: list[int] = []
    try:
        wait_until(lambda: "Corral is up" in out.read_text() or demo.poll() is not None, 60, what="the demo's Corral")
        assert demo.poll() is None, err.read_text()
        tree = _descendants(demo.pid)
        workers = [pid for pid in children(demo.pid) if _is_worker(pid)]
        assert len(workers) == 2, tree
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        # When SIGINT comes while it stops: it has sent the workers SIGTERM (pending: they are stopped)
        wait_until(lambda: all(_signal_pending(pid, signal.SIGTERM) for pid in workers), 60, what="the demo's stop")
        tree = sorted(set(tree) | set(_descendants(demo.pid)))
        demo.send_signal(signal.SIGINT)
        code = demo.wait(60)
        # Then it exits 130, and only after every process it started is gone (before: at once, leaving
        # the control plane running with parent 1, while its temporary directory was removed under it)
        left = [pid for pid in tree if alive(pid)]
        assert left == [], f"still running after the demo exited: {left}; stderr: {err.read_text()[-2000:]}"
        assert code == 130, err.read_text()
        assert list(temp.iterdir()) == []  # the temporary directory went, after its users
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        for pid in tree:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
