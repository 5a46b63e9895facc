"""The `corral` command as tests run it: a subprocess from the repository root, output captured."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, base_env

CORRAL = [sys.executable, "-m", "corral.cli"]


def corral(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None, input: str | bytes | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the `corral` command to completion and capture its output; ``env`` adds to the environment,
    ``input`` is its standard input (bytes: sent as they are, for input that is not UTF-8)."""
    done = subprocess.run(
        [*CORRAL, *args],
        cwd=ROOT,
        env=base_env(env),
        capture_output=True,
        timeout=timeout,
        check=False,
        input=input.encode() if isinstance(input, str) else input,
    )
    return subprocess.CompletedProcess(done.args, done.returncode, _text(done.stdout), _text(done.stderr))


def _text(data: bytes) -> str:
    """Output as text mode reads it: UTF-8, with universal newlines (a progress bar's \r becomes \n)."""
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


def into_a_closed_pipe(*args: str) -> tuple[int, str]:
    """Run `corral ARGS` with its stdout a pipe that nobody reads any more; its exit status and stderr."""
    proc = subprocess.Popen(
        [*CORRAL, *args],
        cwd=ROOT,
        env=base_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader left before the first line (as `head` does after its lines)
    err = proc.stderr.read().decode()
    return proc.wait(60), err
