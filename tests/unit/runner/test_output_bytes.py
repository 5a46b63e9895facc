"""A job's ``sys.stdout`` as a file: bytes through ``.buffer`` join its caught text, and ``reconfigure()``
works, as on a real stream; in a real ``python -m runner.serve`` too, with output caught or not."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import IO, cast

import pytest

from runner.output import LiveFeed, PrintStream, PrintTail
from runner.wire import OK, OUTPUT, split_output
from tests.support import runner_pipes
from tests.support.runner_pipes import RunnerPipes


def test_bytes_join_the_text_in_order_decoded_as_utf8_with_replacement() -> None:
    tail = PrintTail(1024)
    out, err = PrintStream(tail, 1), PrintStream(tail, 2)
    print("one", file=out)
    assert out.buffer.write(b"two \xc3\xa9\n") == 7
    err.buffer.write(bytearray(b"three \xff\n"))  # any bytes-like object; a bad byte is replaced
    out.buffer.write(memoryview(b"four\n"))
    out.buffer.flush()
    print("five", file=err)
    assert tail.data() == "one\ntwo é\nthree \ufffd\nfour\nfive\n".encode()


def test_a_character_split_between_writes_comes_out_whole() -> None:
    tail = PrintTail(1024)
    stream = PrintStream(tail, 1)
    encoded = "😀 é\n".encode()
    for i in range(len(encoded)):  # one byte at a time
        stream.buffer.write(encoded[i : i + 1])
    stream.finish()
    assert tail.data() == encoded


def test_an_unfinished_character_ends_with_its_job_as_one_replacement() -> None:
    tail = PrintTail(1024)
    stream = PrintStream(tail, 1)
    stream.buffer.write(b"cut \xf0\x9f")  # the first two bytes of a four-byte character
    stream.finish()  # what the runner does as each job ends
    assert tail.data() == "cut \ufffd".encode()
    # And the next job's bytes start afresh
    tail.clear()
    stream.buffer.write(b"\x98\x80next")
    stream.finish()
    assert tail.data() == "\ufffd\ufffdnext".encode()  # stray continuation bytes, not the end of the last one


def test_bytes_go_live_through_the_feed_like_text() -> None:
    sent: list[tuple[int, str]] = []
    feed = LiveFeed(PrintTail(1024), lambda offset, text: sent.append((offset, text)))
    stream = PrintStream(feed.tail, 1, feed)
    stream.write("a ")
    stream.buffer.write("é\n".encode())
    with feed.lock:  # as the runner ends a job
        feed.flush()
    assert "".join(text for _, text in sent) == "a é\n"
    assert feed.tail.data() == "a é\n".encode()


def test_the_buffer_is_a_binary_stream_on_the_real_descriptor() -> None:
    stream = PrintStream(PrintTail(10), 2)
    buffer = stream.buffer
    assert buffer is stream.buffer
    assert buffer.fileno() == 2 and buffer.writable() and not buffer.readable() and not buffer.isatty()
    with pytest.raises(TypeError):
        buffer.write("text")  # type: ignore[arg-type]
    # a child given the buffer writes to the real descriptor
    as_stdout = cast(IO[bytes], PrintStream(PrintTail(10), 1).buffer)
    assert subprocess.run([sys.executable, "-c", "print('child')"], stdout=as_stdout, check=True).returncode == 0


def test_reconfigure_takes_what_a_real_stream_takes_and_changes_nothing() -> None:
    tail = PrintTail(1024)
    stream = PrintStream(tail, 1)
    stream.reconfigure(encoding="utf-8", errors="replace", newline="\n", line_buffering=True, write_through=True)
    stream.reconfigure(encoding="latin-1")
    stream.reconfigure()
    print("still é", file=stream)
    stream.buffer.write("and é\n".encode())
    assert tail.data() == "still é\nand é\n".encode()
    assert stream.encoding == "utf-8"
    # What a real stream refuses, this refuses too
    with pytest.raises(LookupError):
        stream.reconfigure(encoding="no-such-codec")
    with pytest.raises(ValueError, match="newline"):
        stream.reconfigure(newline="x")
    with pytest.raises(TypeError):
        stream.reconfigure("utf-8")  # type: ignore[misc]


# -- a real runner process ------------------------------------------------------------------------


@pytest.fixture
def start_runner() -> Iterator[Callable[..., RunnerPipes]]:
    """Starts runner processes as the pool does (importing the test job types); ends them after."""
    with runner_pipes.runners_importing("tests.unit.runner.untidy_plugin") as start:
        yield start


@pytest.mark.parametrize("caught", [True, False], ids=["output caught", "output not caught"])
def test_a_job_writing_bytes_and_reconfiguring_stdout_succeeds(
    caught: bool, start_runner: Callable[..., RunnerPipes]
) -> None:
    runner = start_runner(*(("--output-bytes", "4096") if caught else ()))
    for _ in range(2):
        # Given a job that reconfigures sys.stdout and writes bytes to sys.stdout.buffer, twice
        kind, flags, code, body = runner.answer_to("byte_writer")
        # Then it succeeds, and, when output is caught, its bytes are in its output with its text, the
        # character it left unfinished as U+FFFD, none of it carried into the next job's
        assert (kind, code) == (OK, b""), body
        output, result = split_output(flags, body)
        assert json.loads(result) == {}
        if caught:
            assert output.decode() == "text\nbytes é\nbad \ufffd\nmore text\nend \ufffd"
        else:
            assert flags & OUTPUT == 0
