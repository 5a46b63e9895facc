"""What a job prints (runner.output, runner.wire): kept to its end, cut where it says so, carried with
the answer without changing a quiet job's frame, and sent live while the job runs (PRINTED frames, the
last of them before the answer), from a real ``python -m runner.serve`` too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, cast

import pytest

from corral.printed import split_cut_note
from runner.output import WINDOW_CHARS, WINDOW_SEC, LiveFeed, PrintStream, PrintTail
from runner.wire import (
    FAILED,
    LAST,
    OK,
    OUTPUT,
    PRINTED,
    RESPONSE,
    decode_printed,
    encode_failure,
    encode_printed,
    encode_request,
    encode_result,
    last,
    split_output,
    with_output,
)
from tests.conftest import ROOT
from tests.support import runner_pipes
from tests.support.runner_pipes import WITHIN, Frame, RunnerPipes


def test_a_short_output_is_kept_whole_and_interleaved() -> None:
    tail = PrintTail(1024)
    out, err = PrintStream(tail, 1), PrintStream(tail, 2)
    print("one", file=out)
    print("two é", file=err)
    print("three", file=out)
    assert tail.data() == "one\ntwo é\nthree\n".encode()


def test_a_long_output_keeps_its_end_and_says_how_much_was_cut() -> None:
    tail = PrintTail(100)
    stream = PrintStream(tail, 1)
    for i in range(10_000):
        print(f"line {i}", file=stream)
    data = tail.data().decode()
    first, rest = data.split("\n", 1)
    assert first.startswith("[... ") and first.endswith(" characters before this were cut]")
    assert len(rest.encode()) <= 100 and rest.endswith("line 9999\n")
    assert int(first.split()[1]) + len(rest) == tail.chars


def test_a_cut_never_leaves_half_a_character() -> None:
    tail = PrintTail(7)
    PrintStream(tail, 1).write("ééééééééé")  # 2 bytes each: 7 bytes end inside one
    kept = tail.data().decode("utf-8").split("\n", 1)[1]  # decodes: no broken sequence
    assert kept == "ééé"


def test_the_stream_writes_text_only_and_names_the_real_descriptor() -> None:
    stream = PrintStream(PrintTail(10), 2)
    assert stream.fileno() == 2 and stream.writable() and not stream.isatty()
    try:
        stream.write(b"bytes")  # type: ignore[arg-type]
    except TypeError as exc:
        assert "must be str" in str(exc)
    else:
        raise AssertionError("bytes were accepted")
    # a child given the stream writes to the real descriptor
    as_stdout = cast(IO[str], PrintStream(PrintTail(10), 1))  # what a job passes: sys.stdout
    done = subprocess.run([sys.executable, "-c", "print('child')"], stdout=as_stdout, check=True)
    assert done.returncode == 0


def test_output_rides_on_an_answer_and_a_quiet_answer_is_unchanged() -> None:
    ok = encode_result(b'{"a":1}')
    assert with_output(ok, b"") == ok
    loud = last(with_output(ok, "hé\n".encode()))
    _, flags, code_len, _ = RESPONSE.unpack_from(loud)
    assert flags == OUTPUT | LAST
    printed, body = split_output(flags, loud[RESPONSE.size + code_len :])
    assert (printed, body) == ("hé\n".encode(), b'{"a":1}')
    failed = with_output(encode_failure("E", "boom"), b"x")
    _, flags, code_len, _ = RESPONSE.unpack_from(failed)
    code = failed[RESPONSE.size : RESPONSE.size + code_len]
    assert (code, split_output(flags, failed[RESPONSE.size + code_len :])) == (b"E", (b"x", b"boom"))


def test_a_cut_note_reads_back_as_the_offset_of_the_kept_text() -> None:
    tail = PrintTail(10)
    tail.add("0123456789abcdef")
    assert split_cut_note(tail.data().decode()) == (6, "6789abcdef")


# -- live output: frames, take, LiveFeed ------------------------------------------------------------


@pytest.mark.parametrize(("offset", "text"), [(0, "out 1\n"), (2**40 + 3, "hé 😀\n\u2028x")])
def test_a_printed_frame_carries_its_offset_and_text(offset: int, text: str) -> None:
    frame = encode_printed(offset, text)
    kind, flags, code_len, body_len = RESPONSE.unpack_from(frame)
    assert (kind, flags, code_len, len(frame)) == (PRINTED, 0, 0, RESPONSE.size + body_len)
    assert decode_printed(frame[RESPONSE.size :]) == (offset, text)


def test_a_lone_surrogate_comes_back_as_one_character_so_offsets_hold() -> None:
    offset, text = decode_printed(encode_printed(5, "a\udcffb")[RESPONSE.size :])
    assert (offset, text) == (5, "a?b")


def test_take_returns_what_came_since_the_last_take_with_cumulative_offsets() -> None:
    tail = PrintTail(5)
    tail.add("abc")
    assert tail.take() == (0, "abc")
    # More than the limit since: only its end, and the offset shows the 2 characters left out
    tail.add("defg")
    tail.add("hij")
    assert tail.take() == (5, "fghij")
    assert (tail.take(), tail.chars) == ((10, ""), 10)
    tail.clear()
    tail.add("k")
    assert tail.take() == (0, "k")


@dataclass
class Sent:
    """What a LiveFeed sent, and when (its flusher thread calls :meth:`send`)."""

    chunks: list[tuple[int, str]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def send(self, offset: int, text: str) -> None:
        self.chunks.append((offset, text))
        self.times.append(time.monotonic())

    def wait(self, count: int, within: float = 10.0) -> None:
        """Wait until ``count`` chunks were sent (a deadline, not a sleep)."""
        deadline = time.monotonic() + within
        while len(self.chunks) < count:
            assert time.monotonic() < deadline, f"{count} chunks not sent within {within} s: {self.chunks}"
            time.sleep(0.005)


def _ending(feed: LiveFeed) -> None:
    """What the runner does as a job ends: send what is left, under the lock its answer goes under."""
    with feed.lock:
        feed.flush()


def test_what_is_printed_within_a_window_goes_in_one_send_a_window_later() -> None:
    sent = Sent()
    feed = LiveFeed(PrintTail(100), sent.send)
    start = time.monotonic()
    for word in ("a", "b", "c"):
        feed.add(word)
    sent.wait(1)
    _ending(feed)  # nothing is left: no other send
    assert sent.chunks == [(0, "abc")]
    assert sent.times[0] - start >= WINDOW_SEC
    assert feed.tail.data() == b"abc"


def test_prints_far_apart_go_in_sends_of_their_own_with_running_offsets() -> None:
    sent = Sent()
    feed = LiveFeed(PrintTail(100), sent.send)
    feed.add("one\n")
    sent.wait(1)
    added = time.monotonic()
    feed.add("two\n")
    sent.wait(2)
    assert sent.chunks == [(0, "one\n"), (4, "two\n")]
    assert sent.times[1] - added >= WINDOW_SEC  # the second waited a window of its own


def test_a_burst_past_the_window_sends_its_latest_characters_and_the_offset_shows_the_gap() -> None:
    sent = Sent()
    feed = LiveFeed(PrintTail(1 << 20), sent.send)
    burst = "".join(f"{i:07d}\n" for i in range(3 * WINDOW_CHARS // 8))
    for i in range(0, len(burst), 1000):
        feed.add(burst[i : i + 1000])
    sent.wait(1)
    _ending(feed)
    [(offset, text)] = sent.chunks
    assert text == burst[-WINDOW_CHARS:]
    assert offset == len(burst) - WINDOW_CHARS > 0
    assert feed.tail.data() == burst.encode()  # the stored end keeps what live output left out


def test_the_ending_sends_what_is_left_at_once_and_nothing_comes_after_it() -> None:
    sent = Sent()
    feed = LiveFeed(PrintTail(100), sent.send)
    feed.add("early\n")
    sent.wait(1)
    feed.add("late\n")
    _ending(feed)
    assert sent.chunks == [(0, "early\n"), (6, "late\n")]  # at once: no window waited
    # The flusher, woken by "late", finds it sent: nothing more, however long one waits
    time.sleep(3 * WINDOW_SEC)
    assert len(sent.chunks) == 2
    # And the next job counts from 0
    feed.clear()
    feed.add("next\n")
    _ending(feed)
    assert sent.chunks[2:] == [(0, "next\n")]
    assert feed.tail.data() == b"next\n"


def test_threads_printing_at_once_lose_nothing_live_or_stored() -> None:
    sent = Sent()
    feed = LiveFeed(PrintTail(1 << 20), sent.send)
    stream = PrintStream(feed.tail, 1, feed)

    def chatter(name: str) -> None:
        for i in range(2000):
            stream.write(f"{name}{i}\n")

    threads = [threading.Thread(target=chatter, args=(n,)) for n in "xyz"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WITHIN)
    _ending(feed)
    whole = feed.tail.data().decode()
    assert sorted(whole.splitlines()) == sorted(f"{n}{i}" for n in "xyz" for i in range(2000))
    # Each chunk is the very text at its offset, in order (a window past WINDOW_CHARS leaves a gap)
    end = 0
    for offset, text in sent.chunks:
        assert offset >= end and whole[offset : offset + len(text)] == text
        end = offset + len(text)
    assert end == len(whole)


def test_a_forked_child_sends_nothing_on_its_parent_s_pipe() -> None:
    # Given a feed whose send writes to a pipe, when a child forked from its process prints (as with
    # multiprocessing), then only the parent's text reaches the pipe: frames of two processes would mix.
    script = f"""
import os, time
from runner.output import LiveFeed, PrintTail
r, w = os.pipe()
feed = LiveFeed(PrintTail(100), lambda offset, text: os.write(w, f"{{offset}}:{{text}}".encode()))
pid = os.fork()
if pid == 0:
    feed.add("child\\n")
    time.sleep({3 * WINDOW_SEC})  # time for a send, if the child could
    os._exit(0 if feed.tail.data() == b"child\\n" else 1)
assert os.waitpid(pid, 0)[1] == 0
feed.add("parent\\n")
with feed.lock:
    feed.flush()
os.close(w)
print(os.read(r, 1000).decode(), end="")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=WITHIN, check=True
    )
    assert done.stdout == "0:parent\n"


# -- a real runner process ------------------------------------------------------------------------


def _run(runner: RunnerPipes, job_type: str, payload: object) -> tuple[list[tuple[float, int, str]], Frame]:
    """Send one job; the PRINTED frames before its answer (when each came, offset, text), and the answer."""
    os.write(runner.requests, encode_request(b"job", job_type.encode(), json.dumps(payload).encode(), 1, 1, 0.0))
    printed: list[tuple[float, int, str]] = []
    while True:
        frame = runner.frame()
        if frame[0] != PRINTED:
            return printed, frame
        printed.append((time.monotonic(), *decode_printed(frame[3])))


@pytest.fixture
def start_runner() -> Iterator[Callable[..., RunnerPipes]]:
    """Starts runner processes as the pool does (importing the test job types); ends them after."""
    with runner_pipes.runners_importing("tests.support.jobtypes") as start:
        yield start


def _lines(n: int) -> str:
    return "".join(f"out {i}\n" for i in range(1, n + 1))


def test_a_runner_sends_what_a_job_prints_while_it_runs_then_its_answer(
    start_runner: Callable[..., RunnerPipes],
) -> None:
    runner = start_runner("--output-bytes", "4096")
    # Given a job that prints a line every 0.3 s
    printed, (kind, flags, code, body) = _run(runner, "chatty", {"lines": 5, "every": 0.3})
    answered = time.monotonic()
    # Then its lines came live, in order, counted from 0, the first well before the answer
    assert (kind, code) == (OK, b""), body
    assert len(printed) >= 2 and answered - printed[0][0] > 0.5
    end = 0
    for _, offset, text in printed:
        assert offset == end and text
        end += len(text)
    assert "".join(text for _, _, text in printed) == _lines(5)
    # And the answer carries the whole of it
    output, result = split_output(flags, body)
    assert (output.decode(), json.loads(result)) == (_lines(5), {"printed": 5})
    # And nothing of that job comes after its answer
    assert runner.next_frame(within=3 * WINDOW_SEC) is None
    # When a quick job follows, what it printed goes at its end, before its answer, counted from 0
    printed, (kind, flags, code, body) = _run(runner, "chatty", {"lines": 2, "fail": True})
    assert [(offset, text) for _, offset, text in printed] == [(0, _lines(2))]
    assert (kind, code, split_output(flags, body)[0]) == (FAILED, b"CHATTY", _lines(2).encode())
    # And a quiet job's answer is as it always was: no frame before it, nothing attached
    printed, (kind, flags, _, body) = _run(runner, "chatty", {"lines": 0})
    assert (printed, kind, flags & OUTPUT, body) == ([], OK, 0, b'{"printed":0}')


def test_a_runner_that_catches_nothing_sends_nothing_live(start_runner: Callable[..., RunnerPipes]) -> None:
    runner = start_runner()
    printed, (kind, flags, _, _) = _run(runner, "chatty", {"lines": 3, "every": 0.3})
    assert (printed, kind, flags & OUTPUT) == ([], OK, 0)


def test_live_output_fits_in_a_small_memory_limit(start_runner: Callable[..., RunnerPipes]) -> None:
    # The feed's thread is started before the limit, so that its stack (8 MiB) is not taken from the
    # job's budget: here smaller than that stack, so a thread started at the first print would fail it.
    runner = start_runner("--output-bytes", "4096", "--memory-limit-mb", "4")
    printed, (kind, _, code, body) = _run(runner, "chatty", {"lines": 3})
    assert (kind, code) == (OK, b""), body
    assert "".join(text for _, _, text in printed) == _lines(3)
