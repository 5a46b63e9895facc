"""A job that closes its standard streams, drops a wrapper over one (which closes it) or detaches one
leaves them working for the next jobs of its runner, with output caught or not; in a real
``python -m runner.serve``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from runner.output import PrintStream, PrintTail
from runner.wire import OK, split_output
from tests.support import runner_pipes
from tests.support.runner_pipes import RunnerPipes


def test_closing_a_caught_stream_leaves_it_open_and_detach_gives_its_buffer() -> None:
    tail = PrintTail(1024)
    stream = PrintStream(tail, 1)
    stream.buffer.close()
    stream.close()
    assert not stream.closed and not stream.buffer.closed
    print("still", file=stream, flush=True)
    assert stream.detach() is stream.buffer
    stream.buffer.write(b"bytes\n")
    assert tail.data() == b"still\nbytes\n"


@pytest.fixture
def start_runner() -> Iterator[Callable[..., RunnerPipes]]:
    """Starts runner processes as the pool does (importing the test job types); ends them after."""
    with runner_pipes.runners_importing("tests.unit.runner.stream_plugin") as start:
        yield start


@pytest.mark.parametrize("caught", [True, False], ids=["output caught", "output not caught"])
def test_jobs_that_close_wrap_or_detach_their_streams_leave_them_working_for_the_next_jobs(
    caught: bool, start_runner: Callable[..., RunnerPipes]
) -> None:
    runner = start_runner(*(("--output-bytes", "4096") if caught else ()))
    expected = {"stream_wrapper": "wrapped é\nafter\n", "stream_detacher": "detached\n"}
    # Given jobs, one after another in one runner, that close a stream or the buffer under it, or detach it
    for job_type in ["stream_wrapper", "stream_wrapper", "stream_detacher", "stream_wrapper", "stream_detacher"]:
        kind, flags, code, body = runner.answer_to(job_type)
        # Then each succeeds, the later ones too, and what it printed is caught when output is
        assert (kind, code) == (OK, b""), (job_type, body)
        output, _ = split_output(flags, body)
        assert output.decode() == (expected[job_type] if caught else "")
