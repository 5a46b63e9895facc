"""The CLI's argument value types: --payload JSON, --at times, labels, addresses, states."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from corral.cli import values
from corral.job import JobState

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "delta"),
    [
        ("+30s", timedelta(seconds=30)),
        ("+30", timedelta(seconds=30)),
        ("+5m", timedelta(minutes=5)),
        ("+1h30m", timedelta(hours=1, minutes=30)),
        ("+2d", timedelta(days=2)),
        ("+1.5s", timedelta(seconds=1.5)),
        ("+250ms", timedelta(milliseconds=250)),
        ("+0s", timedelta(0)),
    ],
)
def test_relative_times_count_from_now(text: str, delta: timedelta) -> None:
    assert values.when(text, now=NOW) == NOW + delta


@pytest.mark.parametrize("text", ["+", "+5x", "+m", "+-5s", "+5 s", "+1h-3m"])
def test_bad_relative_times_say_how_to_write_one(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"relative time .*\+30s"):
        values.when(text, now=NOW)


@pytest.mark.parametrize("text", ["+99999999d", "+9999999999999999999999h"])
def test_a_relative_time_past_the_year_9999_is_a_usage_error(text: str) -> None:
    # It was an OverflowError traceback
    with pytest.raises(argparse.ArgumentTypeError, match="past the year 9999"):
        values.when(text, now=NOW)


def test_iso_times_keep_their_offset_and_default_to_local_time() -> None:
    assert values.when("2030-01-02T03:04:05Z") == NOW
    assert values.when("2030-01-02T05:04:05+02:00") == NOW
    local = values.when("2030-01-02T03:04:05")
    assert local.tzinfo is not None
    assert local.replace(tzinfo=None) == datetime(2030, 1, 2, 3, 4, 5)
    assert isinstance(local.tzinfo, timezone)


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00", "9999-12-31T23:59:59"])
def test_a_local_time_at_the_ends_of_the_years_a_datetime_holds_is_a_usage_error(
    zone: Callable[[str], None], text: str
) -> None:
    # Python finds no local offset there (ValueError "year 0 is out of range", or OverflowError): a traceback
    zone("America/New_York")
    with pytest.raises(argparse.ArgumentTypeError, match=r"give it an offset \(0001-01-01T00:00:00Z\)"):
        values.when(text)
    assert values.when(text + "Z").tzinfo is not None


def test_a_bad_time_names_both_forms() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="ISO 8601"):
        values.when("tomorrow")


def test_payload_parses_a_json_object() -> None:
    assert values.payload('{"a": 1, "b": [true, null]}') == {"a": 1, "b": [True, None]}


def test_payload_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"text": "héllo"}', encoding="utf-8")
    assert values.payload(f"@{path}") == {"text": "héllo"}
    with pytest.raises(argparse.ArgumentTypeError, match="cannot read"):
        values.payload(f"@{tmp_path / 'missing.json'}")


def test_invalid_json_says_what_and_where() -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        values.payload('{"a": 1,\n "b": }')
    message = str(info.value)
    assert "invalid JSON" in message
    assert "line 2 column 7" in message
    assert "Expecting value" in message
    assert "<here>" in message and "\n" not in message


@pytest.mark.parametrize(
    ("text", "kind"), [("[1]", "an array"), ('"s"', "a string"), ("3", "a number"), ("null", "null")]
)
def test_payload_must_be_an_object(text: str, kind: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be a JSON object.*got {kind}"):
        values.payload(text)


def test_labels() -> None:
    assert values.label("team=ml") == ("team", "ml")
    assert values.label("expr=a=b") == ("expr", "a=b")
    assert values.label("empty=") == ("empty", "")
    for bad in ("novalue", "=v"):
        with pytest.raises(argparse.ArgumentTypeError):
            values.label(bad)


def test_addresses_and_ports() -> None:
    assert values.address("127.0.0.1:50051") == "127.0.0.1:50051"
    assert values.address("[::1]:50051") == "[::1]:50051"
    assert values.address("unix:/tmp/corral.sock") == "unix:/tmp/corral.sock"
    for bad in ("127.0.0.1", ":50051", "host:port", "127.0.0.1:0", "127.0.0.1:70000", "::1:5", "[::1", "a b:1"):
        with pytest.raises(argparse.ArgumentTypeError):
            values.address(bad)
    assert values.port("0") == 0
    with pytest.raises(argparse.ArgumentTypeError):
        values.port("65536")


def test_job_states_by_name_and_comma_separated() -> None:
    assert values.job_state("pending,RUNNING") == [JobState.PENDING, JobState.RUNNING]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown state 'done'"):
        values.job_state("done")


def test_positive_int() -> None:
    assert values.positive_int("3") == 3
    for bad in ("0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            values.positive_int(bad)


def test_positive_seconds() -> None:
    # --rpc-timeout 0 (or -1, nan) made every call fail with DEADLINE_EXCEEDED instead of a usage error
    assert values.positive_seconds("0.5") == 0.5 and values.positive_seconds("30") == 30.0
    for bad in ("0", "-1", "nan", "inf", "soon", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a number of seconds > 0"):
            values.positive_seconds(bad)


def test_gpu_count_and_memory_mb() -> None:
    assert (values.gpu_count("0"), values.gpu_count("64")) == (0, 64)
    assert (values.memory_mb("0"), values.memory_mb("4096"), values.memory_mb(str(2**30))) == (0, 4096, 2**30)
    for bad in ("-1", "65", "2.5", "two", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=r"must be an integer 0\.\.64"):
            values.gpu_count(bad)
    for bad in ("-1", str(2**30 + 1), "4G", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=r"must be an integer 0\.\.1073741824"):
            values.memory_mb(bad)
    # A worker refuses 0 MiB (without the setting it gives the machine's memory)
    assert (values.worker_memory_mb("1"), values.worker_memory_mb(str(2**30))) == (1, 2**30)
    for bad in ("0", "-1", str(2**30 + 1), "lots"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"must be an integer 1\.\.1073741824"):
            values.worker_memory_mb(bad)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", ("0", "1")),
        ("0", ()),
        ("+2", ("0", "1")),
        ("64", tuple(str(i) for i in range(64))),
        ("0,1", ("0", "1")),
        (" 0 , 3 ", ("0", "3")),
        ("3,", ("3",)),  # one device by its index (a bare number is a count)
        ("GPU-8f6d1e3a", ("GPU-8f6d1e3a",)),
    ],
)
def test_worker_gpus_are_a_count_or_a_list_of_device_ids(text: str, value: tuple[str, ...]) -> None:
    assert values.gpus(text) == value


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("65", r"--gpus must be a count 0\.\.64 or a list of device ids, got '65'"),
        ("", "without an empty one"),
        ("0,,1", "without an empty one"),
        ("0,1,", "without an empty one"),
        ("0,1,0", "must list each device once"),
        (",".join(str(i) for i in range(65)), "may list at most 64 devices, got 65"),
        ("GPU-" + "x" * 61, "must be 1..64 printable ASCII characters"),
        ("GPU 1", "without space or comma"),
        ("GPU-ü", "printable ASCII"),
        ("GPU-\t1", "printable ASCII"),
        ("-1", r"must be a count 0\.\.64"),
    ],
)
def test_bad_worker_gpus_say_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        values.gpus(text)
