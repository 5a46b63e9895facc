"""The `corral` command line: arguments, usage errors (exit 2), pass-through, and exit statuses."""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import datetime

import pytest

from corral.cli import commands, demo, main, up
from corral.cli.exitcode import ExitCode
from corral.cli.parser import CONTROL_ADDR_ENV, build_parser
from corral.cli.supervisor import ClusterConfig
from corral.job import Job, JobState


def test_submit_takes_every_option() -> None:
    args = build_parser().parse_args(
        [
            "submit",
            "add_numbers",
            "--payload",
            '{"a": 1, "b": 2}',
            "--name",
            "n",
            "--priority",
            "9",
            "--threads",
            "2",
            "--timeout",
            "1.5",
            "--max-attempts",
            "4",
            "--at",
            "+30s",
            "--idempotency-key",
            "k",
            "--label",
            "a=1",
            "--label",
            "b=2",
            "--wait",
            "--json",
            "--control",
            "127.0.0.1:6000",
        ]
    )
    assert args.handler is commands.submit
    assert args.type == "add_numbers" and args.payload == {"a": 1, "b": 2}
    assert (args.name, args.priority, args.threads, args.timeout, args.max_attempts) == ("n", 9, 2, 1.5, 4)
    assert isinstance(args.at, datetime) and args.at.tzinfo is not None
    assert args.idempotency_key == "k" and dict(args.label) == {"a": "1", "b": "2"}
    assert args.wait and args.json and args.control == "127.0.0.1:6000"


def test_submit_defaults_leave_the_server_defaults() -> None:
    args = build_parser().parse_args(["submit", "noop"])
    assert args.payload == {} and args.threads is None and args.timeout is None and args.max_attempts is None
    assert args.at is None and args.label == [] and not args.wait and not args.json


def test_the_control_address_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONTROL_ADDR_ENV, raising=False)
    assert build_parser().parse_args(["stats"]).control == "127.0.0.1:50051"
    monkeypatch.setenv(CONTROL_ADDR_ENV, "127.0.0.1:7000")
    assert build_parser().parse_args(["stats"]).control == "127.0.0.1:7000"


def test_list_collects_repeated_and_comma_separated_states() -> None:
    args = build_parser().parse_args(["list", "--status", "pending,running", "--status", "failed", "--limit", "5"])
    assert [s for group in args.status for s in group] == [JobState.PENDING, JobState.RUNNING, JobState.FAILED]
    assert args.limit == 5 and args.handler is commands.list_jobs


def test_up_and_demo_defaults() -> None:
    args = build_parser().parse_args(["up"])
    assert (args.host, args.grpc_port, args.http_port, args.workers, args.threads, args.db) == (
        "127.0.0.1",
        50051,
        8080,
        2,
        4,
        "corral.db",
    )
    assert args.handler is up.up
    args = build_parser().parse_args(["demo"])
    assert args.control is None and args.jobs == 48 and args.handler is demo.demo


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["submit", "noop", "--payload", "{bad"], "argument --payload: invalid JSON in --payload at line 1 column 2"),
        (["submit", "noop", "--payload", "[1, 2]"], "must be a JSON object"),
        (["submit", "noop", "--at", "soon"], "argument --at: invalid time"),
        (["submit", "noop", "--label", "x"], "argument --label: invalid label"),
        (["get"], "the following arguments are required: ID"),
        (["list", "--status", "done"], "unknown state 'done'"),
        (["get", "x", "--control", "nowhere"], "invalid address"),
        (["frobnicate"], "invalid choice"),
        ([], "required: COMMAND"),
    ],
)
def test_usage_errors_exit_2_and_say_what_is_wrong(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == ExitCode.USAGE
    assert needle in capsys.readouterr().err


def test_control_and_worker_exec_their_module(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str]]] = []

    def fake_execv(path: str, argv: list[str]) -> None:
        calls.append((path, argv))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", fake_execv)
    for command in ("control", "worker"):
        with pytest.raises(SystemExit):
            main([command, "--help", "--threads", "2"])
    assert calls == [
        (sys.executable, [sys.executable, "-m", "control", "--help", "--threads", "2"]),
        (sys.executable, [sys.executable, "-m", "worker", "--help", "--threads", "2"]),
    ]


def test_an_unreachable_control_plane_exits_3_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    assert main(["get", "some-id", "--control", address]) == ExitCode.UNREACHABLE
    err = capsys.readouterr().err
    assert err.startswith(f"corral: error: UNAVAILABLE: cannot reach the control plane at {address}")
    assert err.count("\n") == 1


def test_submit_takes_gpus_and_memory_and_defaults_to_none() -> None:
    args = build_parser().parse_args(["submit", "train", "--gpus", "2", "--memory-mb", "4096"])
    assert (args.gpu_count, args.memory_mb) == (2, 4096)
    bare = build_parser().parse_args(["submit", "train"])
    assert (bare.gpu_count, bare.memory_mb) == (0, 0)


def test_up_passes_gpus_and_memory_to_its_workers_only_when_given() -> None:
    args = build_parser().parse_args(["up", "--gpus", "0, 1", "--memory-mb", "8192"])
    assert (args.gpus, args.memory_mb) == (("0", "1"), 8192)
    assert build_parser().parse_args(["up", "--gpus", "4"]).gpus == ("0", "1", "2", "3")
    bare = build_parser().parse_args(["up"])
    assert (bare.gpus, bare.memory_mb) == (None, None)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["submit", "t", "--gpus", "65"], "argument --gpus: invalid value '65': must be an integer 0..64"),
        (["submit", "t", "--gpus", "-1"], "argument --gpus: invalid value '-1': must be an integer 0..64"),
        (["submit", "t", "--gpus", "two"], "argument --gpus: invalid value 'two'"),
        (["submit", "t", "--memory-mb", "-1"], "argument --memory-mb: invalid value '-1': must be an integer 0.."),
        (["submit", "t", "--memory-mb", str(2**30 + 1)], "argument --memory-mb: invalid value '1073741825'"),
        (["submit", "t", "--memory-mb", "4G"], "argument --memory-mb: invalid value '4G'"),
        (["up", "--gpus", "65"], "argument --gpus: --gpus must be a count 0..64 or a list of device ids, got '65'"),
        (["up", "--gpus", "0,0"], "argument --gpus: --gpus must list each device once, got '0,0'"),
        (["up", "--gpus", "0,,1"], "argument --gpus: --gpus must list device ids without an empty one"),
        (["up", "--memory-mb", "-5"], "argument --memory-mb: invalid value '-5'"),
        (["up", "--memory-mb", "0"], "argument --memory-mb: invalid value '0': must be an integer 1..1073741824"),
    ],
)
def test_bad_gpus_and_memory_are_usage_errors_naming_the_flag(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert needle in err
    assert err.splitlines()[-1].startswith("corral ")  # the reason is one line, after argparse's usage


def test_submit_sends_gpus_and_memory(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Given a client that records what submit is asked for
    seen: dict[str, object] = {}

    class FakeClient:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def __enter__(self) -> FakeClient:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def submit(self, type: str, payload: object, **kwargs: object) -> Job:
            seen.update(kwargs)
            return Job(id="j1", type=type, state=JobState.PENDING, gpu_count=2, memory_mb=4096)

    monkeypatch.setattr(commands, "Client", FakeClient)
    # When `corral submit --gpus 2 --memory-mb 4096 --json` runs
    assert main(["submit", "train", "--gpus", "2", "--memory-mb", "4096", "--json"]) == ExitCode.OK
    # Then the client got both, and the JSON shows what the job holds
    assert (seen["gpu_count"], seen["memory_mb"]) == (2, 4096)
    out = json.loads(capsys.readouterr().out)
    assert (out["gpu_count"], out["memory_mb"]) == (2, 4096)


def test_up_gives_gpus_and_memory_to_the_cluster(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a supervisor that records its configuration and starts nothing
    configs: list[ClusterConfig] = []

    class FakeSupervisor:
        grpc_port = 0  # as after a stop requested during the start: up() returns without waiting

        def __init__(self, config: ClusterConfig, report: object = None) -> None:
            configs.append(config)

        def request_stop(self) -> None:
            pass

        def start(self) -> None:
            pass

        def stop(self) -> None:
            pass

    monkeypatch.setattr(up, "Supervisor", FakeSupervisor)
    # When `corral up` runs with GPUs and memory for two workers, then with neither
    assert main(["up", "--workers", "2", "--gpus", "0,1", "--memory-mb", "8192"]) == ExitCode.OK
    assert main(["up", "--workers", "2"]) == ExitCode.OK
    # Then the cluster gets them (it shares the devices out: see the supervisor's tests), or leaves them unset
    assert (configs[0].gpus, configs[0].memory_mb) == (("0", "1"), 8192)
    assert (configs[1].gpus, configs[1].memory_mb) == (None, None)
