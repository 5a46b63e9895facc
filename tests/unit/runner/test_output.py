"""What a job prints (runner.output, runner.wire): kept to its end, cut where it says so, carried with
the answer without changing a quiet job's frame."""

from __future__ import annotations

import subprocess
import sys
from typing import IO, cast

from runner.output import PrintStream, PrintTail
from runner.wire import LAST, OUTPUT, RESPONSE, encode_failure, encode_result, last, split_output, with_output


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
