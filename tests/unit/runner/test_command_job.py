"""The opt-in ``command`` job type (``runner.extra.command``), run in this process with a JobContext.

The module reads ``CORRAL_COMMAND_ALLOW`` as it is imported, so the ``command`` fixture imports it once
under a patched environment and puts ``sys.modules`` back afterwards; each test builds its own
:class:`Command` with an explicit allow list.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import shutil
import signal
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from runner import JobContext, JobFailed, load_plugins
from tests.conftest import wait_until
from tests.support.processes import alive

MODULE = "runner.extra.command"
PYTHON = sys.executable
ALLOWED = f"echo,printf,sh,cat,{PYTHON}"
PR_SET_CHILD_SUBREAPER = 36


def ctx(threads: int = 1) -> JobContext:
    return JobContext(job_id="job-1", attempt=1, threads=threads)


class _Restored:
    """Puts ``sys.modules[MODULE]`` back as it was, so importing it here leaves no trace."""

    def __init__(self) -> None:
        self.before = sys.modules.get(MODULE)

    def restore(self) -> None:
        sys.modules.pop(MODULE, None)
        if self.before is not None:
            sys.modules[MODULE] = self.before


@pytest.fixture(scope="module")
def command() -> Iterator[ModuleType]:
    saved = _Restored()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CORRAL_COMMAND_ALLOW", ALLOWED)
        sys.modules.pop(MODULE, None)
        module = importlib.import_module(MODULE)
    yield module
    saved.restore()
    # The job made this process adopt orphans (as it does a runner); pytest's process should not stay so.
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def run(command: ModuleType, payload: dict[str, Any], threads: int = 1, allow: str = ALLOWED) -> dict[str, Any]:
    job = command.Command(command.Allowlist.parse(allow))
    result: dict[str, Any] = job.run(payload, ctx(threads))
    return result


def failure(command: ModuleType, payload: dict[str, Any], allow: str = ALLOWED) -> JobFailed:
    with pytest.raises(JobFailed) as caught:
        run(command, payload, allow=allow)
    return caught.value


# -- output and exit status ---------------------------------------------------------------------------


def test_echo_and_printf_output_comes_back_with_counts(command: ModuleType) -> None:
    # Given an allowed echo and printf
    # When each runs
    echoed = run(command, {"argv": ["echo", "hello", "world"]})
    printed = run(command, {"argv": ["printf", "%s|%s", "a b", "ü"]})
    # Then the output is there, with its byte counts, untruncated
    assert echoed["exit_code"] == 0 and echoed["stdout"] == "hello world\n" and echoed["stderr"] == ""
    assert (echoed["stdout_bytes"], echoed["stderr_bytes"], echoed["truncated"]) == (12, 0, False)
    assert printed["stdout"] == "a b|ü" and printed["stdout_bytes"] == len("a b|ü".encode())
    assert echoed["seconds"] >= 0


def test_a_non_zero_exit_fails_with_the_status_and_the_end_of_stderr(command: ModuleType) -> None:
    # Given a program that writes to stderr and exits 3
    script = "echo early >&2; echo noise >&2; echo middle >&2; echo one >&2; echo 'last words' >&2; exit 3"
    # When it runs
    err = failure(command, {"argv": ["sh", "-c", script]})
    # Then the job fails COMMAND_FAILED, with the status and only the last lines of stderr
    assert err.code == "COMMAND_FAILED"
    assert err.message.startswith("exit status 3: ")
    assert err.message.endswith("last words") and "early" not in err.message


def test_a_program_killed_by_a_signal_names_it(command: ModuleType) -> None:
    # Given a program that kills itself with SIGKILL, When it runs, Then the failure names the signal
    err = failure(command, {"argv": ["sh", "-c", "kill -KILL $$"]})
    assert (err.code, err.message) == ("COMMAND_KILLED", "killed by SIGKILL")


# -- which programs may run ----------------------------------------------------------------------------


def test_a_program_not_on_the_list_is_refused_naming_it(command: ModuleType, tmp_path: Path) -> None:
    # Given a list without cat, and a marker that cat would print
    marker = tmp_path / "marker"
    marker.write_text("ran")
    # When a job asks for cat, by name and by a ../ path to it
    by_name = failure(command, {"argv": ["cat", str(marker)]}, allow="echo")
    cat = Path(shutil.which("cat") or "/bin/cat")
    dotted = f"{cat.parent}/../{cat.parent.name}/cat"
    by_dots = failure(command, {"argv": [dotted, str(marker)]}, allow="echo")
    # Then both fail COMMAND_NOT_ALLOWED, naming the program and its real path
    for err, asked in ((by_name, "cat"), (by_dots, dotted)):
        assert err.code == "COMMAND_NOT_ALLOWED"
        assert repr(asked) in err.message and os.path.realpath(cat) in err.message


def test_a_symlink_named_like_an_allowed_program_is_judged_by_its_target(
    command: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given echo allowed, and a link called "echo" to cat, first on the worker's PATH
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "echo").symlink_to(shutil.which("cat") or "/bin/cat")
    job = command.Command(command.Allowlist.parse("echo"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # When jobs ask for "echo" (found on PATH) and for the link by its path
    for argv0 in ("echo", str(bin_dir / "echo")):
        with pytest.raises(JobFailed) as caught:
            job.run({"argv": [argv0, "hi"]}, ctx())
        # Then both are refused: the real path is cat's
        assert caught.value.code == "COMMAND_NOT_ALLOWED", argv0
        assert os.path.realpath(shutil.which("cat") or "/bin/cat") in caught.value.message


def test_a_missing_program_or_cwd_is_named(command: ModuleType, tmp_path: Path) -> None:
    # Given no such program and no such directory
    # When jobs ask for them, Then each fails COMMAND_NOT_FOUND naming what is missing
    missing = failure(command, {"argv": ["no-such-program-here"]}, allow="*")
    assert missing.code == "COMMAND_NOT_FOUND" and "'no-such-program-here'" in missing.message
    not_executable = tmp_path / "plain.txt"
    not_executable.write_text("echo hi\n")
    plain = failure(command, {"argv": [str(not_executable)]}, allow="*")
    assert plain.code == "COMMAND_NOT_FOUND" and str(not_executable) in plain.message
    nowhere = failure(command, {"argv": ["echo"], "cwd": str(tmp_path / "gone")}, allow="*")
    assert nowhere.code == "COMMAND_NOT_FOUND" and nowhere.message.startswith("cwd: ")


def test_star_allows_any_program_and_bad_entries_are_refused(command: ModuleType) -> None:
    # Given "*", When an unlisted program runs, Then it is allowed
    assert run(command, {"argv": ["sh", "-c", "echo any"]}, allow="*")["stdout"] == "any\n"
    # And a list that is empty, relative or names nothing is refused when it is read
    for text in ("", " , ", "bin/echo", "no-such-program-here", "/no/such/file"):
        with pytest.raises(ValueError):
            command.Allowlist.parse(text)


def test_the_loader_refuses_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = _Restored()
    try:
        for value in (None, "", "  "):
            # Given CORRAL_COMMAND_ALLOW unset or blank
            if value is None:
                monkeypatch.delenv("CORRAL_COMMAND_ALLOW", raising=False)
            else:
                monkeypatch.setenv("CORRAL_COMMAND_ALLOW", value)
            sys.modules.pop(MODULE, None)
            # When the plug-in is loaded, Then it refuses, naming the variable and the plug-in
            with pytest.raises(ImportError, match=r"'runner\.extra\.command': CORRAL_COMMAND_ALLOW must list"):
                load_plugins([MODULE])
    finally:
        saved.restore()


# -- what the program gets -----------------------------------------------------------------------------


def test_the_granted_threads_reach_the_program(command: ModuleType) -> None:
    # Given a job granted 3 threads, When its program prints the thread variables
    script = 'echo "$CORRAL_THREADS $OMP_NUM_THREADS $OPENBLAS_NUM_THREADS $MKL_NUM_THREADS"'
    out = run(command, {"argv": ["sh", "-c", script]}, threads=3)
    # Then each says 3
    assert out["stdout"] == "3 3 3 3\n"


def test_stdin_reaches_the_program_even_when_larger_than_a_pipe(command: ModuleType) -> None:
    # Given 1 MiB of input for cat, whose output fills its pipe long before its input is written
    text = ("line of input\n" * 80000)[: 1 << 20]
    # When it runs
    out = run(command, {"argv": ["cat"], "stdin": text, "max_output_bytes": 4 << 20})
    # Then all of it came back (input and output were pumped together)
    assert out["stdout"] == text and out["stdout_bytes"] == len(text)
    # And without stdin the program reads end of file at once
    assert run(command, {"argv": ["cat"]})["stdout"] == ""


def test_env_merges_over_a_minimal_environment(command: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a secret in the worker's environment, and a payload env that adds one variable and replaces LANG
    monkeypatch.setenv("CORRAL_TEST_SECRET", "hidden")
    monkeypatch.setenv("LANG", "C.UTF-8")
    env = {"GREETING": "hi there", "LANG": "POSIX", "OMP_NUM_THREADS": "1"}
    # When the program prints its environment
    out = run(command, {"argv": ["sh", "-c", "env"], "env": env}, threads=2)["stdout"]
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    # Then it has the payload's variables over the worker's PATH and HOME, and nothing else of the worker's
    assert seen["GREETING"] == "hi there" and seen["LANG"] == "POSIX" and seen["OMP_NUM_THREADS"] == "1"
    assert seen["PATH"] == os.environ["PATH"] and seen["CORRAL_THREADS"] == "2"
    assert "CORRAL_TEST_SECRET" not in seen
    assert set(seen) <= {*env, "PATH", "HOME", "LANG", "TMPDIR", "PWD", "SHLVL", "_", "CORRAL_THREADS",
                         "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}  # fmt: skip


def test_cwd_is_where_the_program_runs(command: ModuleType, tmp_path: Path) -> None:
    # Given a directory, When a job runs pwd-like code there, Then it ran there
    out = run(command, {"argv": ["sh", "-c", "pwd -P"], "cwd": str(tmp_path)})
    assert out["stdout"] == f"{tmp_path.resolve()}\n"


# -- limits ---------------------------------------------------------------------------------------------


def test_fifty_megabytes_of_output_keep_only_the_tail(command: ModuleType) -> None:
    # Given a program printing 50 MiB to stdout, then a last line; and some stderr
    size = 50 << 20
    script = f"head -c {size} /dev/zero; echo THE-END; echo to-stderr >&2"
    # When it runs with the default 64 KiB tail, counting what this process allocates meanwhile
    tracemalloc.start()
    try:
        out = run(command, {"argv": ["sh", "-c", script]})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Then only the end is kept, the total is counted, and memory stayed far below the output's size
    assert out["stdout_bytes"] == size + len("THE-END\n")
    assert out["truncated"] is True and out["stdout"].endswith("\x00THE-END\n")
    assert len(out["stdout"].encode()) == 64 << 10
    assert out["stderr"] == "to-stderr\n" and out["stderr_bytes"] == 10
    assert peak < 4 << 20, f"peak {peak} bytes"


def test_a_cut_keeps_whole_characters(command: ModuleType) -> None:
    # Given output of two-byte characters, When only an odd number of bytes is kept, Then no half is shown
    out = run(command, {"argv": ["printf", "ééééé"], "max_output_bytes": 5})
    assert out["stdout"] == "éé" and out["stdout_bytes"] == 10 and out["truncated"]


def test_memory_mb_limits_the_program(command: ModuleType) -> None:
    # Given a program that allocates and touches 1 GiB
    grab = "b = bytearray(1 << 30); b[::4096] = b'x' * len(b[::4096]); print(len(b))"
    # When it runs with a 256 MiB limit, Then it fails
    err = failure(command, {"argv": [PYTHON, "-c", grab], "memory_mb": 256})
    assert err.code in ("COMMAND_FAILED", "COMMAND_KILLED")
    assert "MemoryError" in err.message or err.code == "COMMAND_KILLED"
    # And with room enough, the same program runs (the limit was what stopped it)
    assert run(command, {"argv": [PYTHON, "-c", "print(len(bytearray(1 << 20)))"], "memory_mb": 256})["stdout"] == (
        "1048576\n"
    )


def test_a_background_process_the_program_leaves_becomes_this_process_child(command: ModuleType) -> None:
    # Given a program that starts a sleeper in the background and exits (the sleeper keeps its output open)
    out = run(command, {"argv": ["sh", "-c", "sleep 60 & echo $!"]})
    leftover = int(out["stdout"])
    try:
        # Then the job still ended, and the sleeper is our child: the runner sees it, and the worker ends it
        with open(f"/proc/{leftover}/stat") as stat:
            parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        assert parent == os.getpid()
    finally:
        os.kill(leftover, signal.SIGKILL)
        wait_until(lambda: _reaped(leftover), 5, what="the sleeper to go")


def _reaped(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:  # not ours (the behaviour under test is missing): gone is enough
        return not alive(pid)


def test_the_job_s_gpus_reach_the_program_and_its_env_cannot_change_them(
    command: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = 'printf "%s" "${CUDA_VISIBLE_DEVICES-unset}"'
    # Given the runner showing the job device 3 (runner.serve sets it for the job's duration)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    # Then the program sees the same device, even when the payload's env asks for others
    assert run(command, {"argv": ["sh", "-c", script]})["stdout"] == "3"
    assert run(command, {"argv": ["sh", "-c", script], "env": {"CUDA_VISIBLE_DEVICES": "0,1"}})["stdout"] == "3"
    # And "no device" (a job without GPUs on a GPU worker) stays an empty list
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert run(command, {"argv": ["sh", "-c", script], "env": {"CUDA_VISIBLE_DEVICES": "0"}})["stdout"] == ""
    # Without the variable (a worker without GPUs, nothing inherited) the payload's env may set it
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert run(command, {"argv": ["sh", "-c", script]})["stdout"] == "unset"
    assert command.program_env({"CUDA_VISIBLE_DEVICES": "1"}, 1, {})["CUDA_VISIBLE_DEVICES"] == "1"
