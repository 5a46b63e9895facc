"""The `corral` command line: arguments, usage errors (exit 2), pass-through, and exit statuses."""

from __future__ import annotations

import io
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from corral.account import Account, Identity, Login
from corral.cli import account_commands, commands, demo, login_file, main, up
from corral.cli.exitcode import ExitCode
from corral.cli.parser import CONTROL_ADDR_ENV, TOKEN_ENV, build_parser
from corral.cli.supervisor import ClusterConfig
from corral.errors import Unauthenticated
from corral.job import Job, JobState
from tests.support.ports import dead_address


@pytest.fixture(autouse=True)
def saved_login_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the commands here keep their saved login: never the user's own (client commands read it)."""
    file = tmp_path / "config" / "login"
    monkeypatch.setenv(login_file.LOGIN_FILE_ENV, str(file))
    return file


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
        # These exited 1 (a client-side INVALID_ARGUMENT), or, for the token, INTERNAL after gRPC's own lines
        (["submit", "noop", "--notify-on", "failed"], "corral submit: error: argument --notify-on: says which ends"),
        (["submit", "noop", "--priority", "99999999999"], "argument --priority: invalid value '99999999999'"),
        (["submit", "noop", "--threads", "2147483648"], "argument --threads: invalid value '2147483648'"),
        (["submit", "noop", "--max-attempts", "-2147483649"], "argument --max-attempts: invalid value"),
        (["list", "--offset", "99999999999"], "corral list: error: argument --offset: invalid value '99999999999'"),
        (["queue", "--limit", "99999999999"], "argument --limit: invalid value '99999999999': must be an integer 1.."),
        (["audit", "--offset", "1e3"], "argument --offset: invalid value '1e3'"),
        (["stats", "--token", "t\u00f6k"], "argument --token: invalid token: must be printable ASCII without spaces"),
    ],
)
def test_usage_errors_exit_2_and_say_what_is_wrong(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == ExitCode.USAGE
    assert needle in capsys.readouterr().err


def test_a_token_from_the_environment_that_grpc_cannot_send_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "secret-token\n")  # $(cat file) keeps no newline, but "$(cat file)\n" does
    with pytest.raises(SystemExit) as info:
        main(["stats", "--control", dead_address()])
    err = capsys.readouterr().err
    assert info.value.code == ExitCode.USAGE and "argument --token: invalid token" in err
    assert "secret-token" not in err


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
    address = dead_address()
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
            self.workers: list[object] = []  # none started: up() says it stops only the control plane

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


# -- accounts ------------------------------------------------------------------------------------------


def test_the_account_commands_and_their_arguments() -> None:
    parse = build_parser().parse_args
    args = parse(["login", "alice", "--password-stdin", "--print", "--json", "--control", "127.0.0.1:6000"])
    assert args.handler is account_commands.login and args.name == "alice"
    assert args.password_stdin and args.print and args.json and args.control == "127.0.0.1:6000"
    assert not hasattr(args, "token")  # login sends none
    bare = parse(["login", "alice"])
    assert not bare.password_stdin and not bare.print and not bare.json
    assert parse(["logout"]).handler is account_commands.logout
    assert parse(["whoami", "--json"]).handler is account_commands.whoami
    args = parse(["register", "bob", "--password-stdin"])
    assert args.handler is account_commands.register and args.name == "bob" and args.password_stdin


def test_accounts_lists_without_an_action_and_passwd_and_delete_take_a_name() -> None:
    parse = build_parser().parse_args
    assert parse(["accounts"]).handler is account_commands.list_accounts
    assert parse(["accounts", "--json"]).json
    assert parse(["accounts", "list", "--json"]).handler is account_commands.list_accounts
    args = parse(["accounts", "passwd"])
    assert args.handler is account_commands.passwd and args.name is None and not args.password_stdin
    args = parse(["accounts", "passwd", "bob", "--password-stdin"])
    assert (args.name, args.password_stdin) == ("bob", True)
    args = parse(["accounts", "delete", "bob"])
    assert args.handler is account_commands.delete_account and args.name == "bob"


def test_accounts_options_count_before_and_after_the_action(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONTROL_ADDR_ENV, raising=False)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    parse = build_parser().parse_args
    # given before the action: the action's parser must not put its defaults back over them
    args = parse(["accounts", "--json", "--control", "10.0.0.1:1", "--token", "t", "delete", "bob"])
    assert (args.json, args.control, args.token, args.name) == (True, "10.0.0.1:1", "t", "bob")
    args = parse(["accounts", "passwd", "bob", "--json", "--control", "10.0.0.2:2", "--rpc-timeout", "5"])
    assert (args.json, args.control, args.rpc_timeout) == (True, "10.0.0.2:2", 5.0)
    # and the defaults are there when nothing is given
    args = parse(["accounts", "delete", "bob"])
    assert (args.json, args.control, args.token, args.tls_ca, args.rpc_timeout) == (
        False,
        "127.0.0.1:50051",
        None,
        None,
        30.0,
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["login"], "the following arguments are required: NAME"),
        (["login", "alice", "--token", "t"], "unrecognized arguments: --token"),
        (["register"], "the following arguments are required: NAME"),
        (["accounts", "delete"], "the following arguments are required: NAME"),
        (["accounts", "bob"], "invalid choice: 'bob'"),
        (["accounts", "delete", "bob", "--password-stdin"], "unrecognized arguments: --password-stdin"),
        (["logout", "--json"], "unrecognized arguments: --json"),
    ],
)
def test_account_usage_errors_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == ExitCode.USAGE
    assert needle in capsys.readouterr().err


EXPIRES = datetime(2026, 11, 27, 11, 2, 3, tzinfo=UTC)
ALICE = Account("alice", "ml", False, datetime(2026, 1, 1, tzinfo=UTC), None)


class FakeAccounts:
    """A Client whose account methods record their calls; ``identity`` is what whoami answers."""

    calls: list[tuple[str, tuple[object, ...], dict[str, object]]] = []
    built: list[dict[str, object]] = []
    identity = Identity("alice", False, ALICE, EXPIRES)

    def __init__(self, address: str, **kwargs: object) -> None:
        FakeAccounts.built.append({"address": address, **kwargs})

    def __enter__(self) -> FakeAccounts:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _call(self, method: str, *args: object, **kwargs: object) -> None:
        FakeAccounts.calls.append((method, args, kwargs))

    def login(self, name: str, password: str) -> Login:
        self._call("login", name, password)
        if password == "wrong":
            raise Unauthenticated("wrong name or password")
        return Login(token="fresh-token", expires_at=EXPIRES, account=Account(name))

    def whoami(self) -> Identity:
        self._call("whoami")
        return FakeAccounts.identity

    def register(self, name: str, password: str) -> Account:
        self._call("register", name, password)
        return Account(name)

    def accounts(self) -> list[Account]:
        self._call("accounts")
        return [ALICE, Account("bob", admin=True)]

    def set_password(self, name: str, password: str, *, current_password: str = "") -> Account:
        self._call("set_password", name, password, current_password=current_password)
        return Account(name)

    def delete_account(self, name: str) -> None:
        self._call("delete_account", name)


@pytest.fixture
def accounts(monkeypatch: pytest.MonkeyPatch) -> type[FakeAccounts]:
    FakeAccounts.calls = []
    FakeAccounts.built = []
    FakeAccounts.identity = Identity("alice", False, ALICE, EXPIRES)
    monkeypatch.setattr(commands, "Client", FakeAccounts)  # what client_for builds
    monkeypatch.setattr(account_commands, "Client", FakeAccounts)  # what login builds, without a token
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(CONTROL_ADDR_ENV, raising=False)
    return FakeAccounts


def typed(monkeypatch: pytest.MonkeyPatch, *answers: str) -> list[str]:
    """Make getpass answer ``answers`` in turn; returns the prompts it was asked."""
    prompts: list[str] = []
    left = list(answers)

    def fake_getpass(prompt: str = "Password: ") -> str:
        prompts.append(prompt)
        return left.pop(0)

    monkeypatch.setattr(account_commands, "getpass", fake_getpass)
    return prompts


def stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))


def test_login_asks_the_password_saves_the_login_for_this_control_and_says_so(
    accounts: type[FakeAccounts],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    saved_login_file: Path,
) -> None:
    prompts = typed(monkeypatch, "pw-typed")
    assert main(["login", "alice", "--control", "127.0.0.1:6000"]) == ExitCode.OK
    assert prompts == ["Password: "] and accounts.calls == [("login", ("alice", "pw-typed"), {})]
    assert accounts.built[0]["address"] == "127.0.0.1:6000" and accounts.built[0].get("token") is None
    out = capsys.readouterr().out
    assert out == f"logged in as alice until 2026-11-27 11:02:03 UTC (saved to {saved_login_file})\n"
    saved = login_file.load()
    assert saved is not None
    assert (saved.control, saved.name, saved.token, saved.expires_at) == (
        "127.0.0.1:6000",
        "alice",
        "fresh-token",
        EXPIRES,
    )


def test_login_reads_the_first_line_of_stdin_keeping_all_but_its_newline(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin(monkeypatch, "  spaced pw \t\nsecond line\n")
    assert main(["login", "alice", "--password-stdin", "--json"]) == ExitCode.OK
    assert accounts.calls == [("login", ("alice", "  spaced pw \t"), {})]
    out = json.loads(capsys.readouterr().out)
    assert out == {"name": "alice", "expires_at": "2026-11-27T11:02:03+00:00", "saved_to": str(login_file.path())}
    assert "token" not in out


def test_login_print_prints_only_the_token_and_saves_nothing(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin(monkeypatch, "pw")  # no newline at the end: still the line
    assert main(["login", "alice", "--print", "--password-stdin"]) == ExitCode.OK
    assert capsys.readouterr().out == "fresh-token\n"
    assert accounts.calls == [("login", ("alice", "pw"), {})]
    assert login_file.load() is None
    stdin(monkeypatch, "pw\n")
    assert main(["login", "alice", "--print", "--password-stdin", "--json"]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["token"] == "fresh-token"
    assert login_file.load() is None


def test_login_notes_a_token_variable_that_would_win_over_the_saved_login(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "env-token")
    stdin(monkeypatch, "pw\n")
    assert main(["login", "alice", "--password-stdin"]) == ExitCode.OK
    assert accounts.built[0].get("token") is None  # not sent to Login either
    assert f"${TOKEN_ENV} is set" in capsys.readouterr().err


def test_a_refused_login_is_one_error_line_and_saves_nothing(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin(monkeypatch, "wrong\n")
    assert main(["login", "alice", "--password-stdin"]) == ExitCode.FAILED
    assert capsys.readouterr().err == "corral: error: UNAUTHENTICATED: wrong name or password\n"
    assert login_file.load() is None


def test_empty_stdin_is_an_error_before_anything_is_sent(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin(monkeypatch, "")
    assert main(["login", "alice", "--password-stdin"]) == ExitCode.USAGE  # bad input (it was FAILED)
    assert capsys.readouterr().err == "corral: error: --password-stdin: stdin ended before line 1 of 1\n"
    assert accounts.calls == []


def test_logout_removes_the_saved_login_and_says_whether_there_was_one(
    accounts: type[FakeAccounts], capsys: pytest.CaptureFixture[str], saved_login_file: Path
) -> None:
    login_file.save(login_file.SavedLogin("127.0.0.1:50051", "alice", "t", EXPIRES))
    assert main(["logout"]) == ExitCode.OK
    assert capsys.readouterr().out == f"logged out: removed {saved_login_file}\n"
    assert not saved_login_file.exists()
    assert main(["logout"]) == ExitCode.OK
    assert capsys.readouterr().out == f"not logged in: there is no {saved_login_file}\n"


def test_whoami_shows_the_identity_as_json(accounts: type[FakeAccounts], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whoami", "--json"]) == ExitCode.OK
    out = json.loads(capsys.readouterr().out)
    assert (out["name"], out["admin"], out["account"]["group"], out["expires_at"]) == (
        "alice",
        False,
        "ml",
        "2026-11-27T11:02:03+00:00",
    )
    assert main(["whoami"]) == ExitCode.OK
    assert "alice" in capsys.readouterr().out


def test_register_asks_the_password_twice(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = typed(monkeypatch, "new-pw-1", "new-pw-1")
    assert main(["register", "bob"]) == ExitCode.OK
    assert prompts == ["New password: ", "New password again: "]
    assert accounts.calls == [("register", ("bob", "new-pw-1"), {})]
    assert "Registered account bob" in capsys.readouterr().out


def test_register_refuses_passwords_that_differ_with_one_line_and_sends_nothing(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    typed(monkeypatch, "new-pw-1", "new-pw-2")
    assert main(["register", "bob"]) == ExitCode.USAGE  # bad input (it was FAILED)
    assert capsys.readouterr().err == "corral: error: the two passwords typed differ\n"
    assert accounts.calls == []


def test_register_reads_one_line_of_stdin(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin(monkeypatch, "new-pw-1\r\n")
    assert main(["register", "bob", "--password-stdin", "--json"]) == ExitCode.OK
    assert accounts.calls == [("register", ("bob", "new-pw-1"), {})]
    assert json.loads(capsys.readouterr().out)["name"] == "bob"


def test_accounts_lists_them_as_json(accounts: type[FakeAccounts], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["accounts", "--json"]) == ExitCode.OK
    assert [(a["name"], a["admin"]) for a in json.loads(capsys.readouterr().out)] == [("alice", False), ("bob", True)]


def test_passwd_of_ones_own_account_sends_the_current_password_too(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # asked at the terminal: current, then new twice
    prompts = typed(monkeypatch, "old-pw", "new-pw", "new-pw")
    assert main(["accounts", "passwd"]) == ExitCode.OK
    assert prompts == ["Current password: ", "New password: ", "New password again: "]
    assert accounts.calls == [
        ("whoami", (), {}),
        ("set_password", ("alice", "new-pw"), {"current_password": "old-pw"}),
    ]
    assert "corral login alice" in capsys.readouterr().out
    # from stdin: two lines, current then new; naming oneself is the same
    accounts.calls.clear()
    stdin(monkeypatch, "old-pw\nnew-pw\n")
    assert main(["accounts", "passwd", "alice", "--password-stdin"]) == ExitCode.OK
    assert accounts.calls[-1] == ("set_password", ("alice", "new-pw"), {"current_password": "old-pw"})


def test_passwd_of_another_account_asks_only_the_new_password(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    accounts.identity = Identity("root", True, Account("root", admin=True), EXPIRES)
    stdin(monkeypatch, "reset-pw\nnot read\n")
    assert main(["accounts", "passwd", "bob", "--password-stdin"]) == ExitCode.OK
    assert accounts.calls[-1] == ("set_password", ("bob", "reset-pw"), {"current_password": ""})
    prompts = typed(monkeypatch, "reset-pw", "reset-pw")
    assert main(["accounts", "passwd", "bob"]) == ExitCode.OK
    assert prompts == ["New password: ", "New password again: "]
    assert "Reset the password of bob" in capsys.readouterr().out


def test_passwd_without_a_name_needs_an_account_login(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    accounts.identity = Identity("ci-token", True, None, None)
    assert main(["accounts", "passwd"]) == ExitCode.USAGE  # bad input (it was FAILED)
    err = capsys.readouterr().err
    assert err.startswith("corral: error: you are not logged in to an account") and err.count("\n") == 1
    assert accounts.calls == [("whoami", (), {})]


def test_passwd_with_own_stdin_short_of_the_second_line_sends_nothing(
    accounts: type[FakeAccounts], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin(monkeypatch, "old-pw\n")
    assert main(["accounts", "passwd", "--password-stdin"]) == ExitCode.USAGE  # bad input (it was FAILED)
    assert capsys.readouterr().err == "corral: error: --password-stdin: stdin ended before line 2 of 2\n"
    assert [method for method, _, _ in accounts.calls] == ["whoami"]


def test_accounts_delete_deletes_the_named_account(
    accounts: type[FakeAccounts], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["accounts", "delete", "bob"]) == ExitCode.OK
    assert accounts.calls == [("delete_account", ("bob",), {})]
    assert "Deleted account bob" in capsys.readouterr().out


def test_the_account_commands_send_the_saved_login(
    accounts: type[FakeAccounts], capsys: pytest.CaptureFixture[str]
) -> None:
    login_file.save(
        login_file.SavedLogin("127.0.0.1:50051", "alice", "saved-token", datetime.now(UTC) + timedelta(hours=1))
    )
    assert main(["whoami", "--json"]) == ExitCode.OK
    assert main(["accounts", "delete", "bob"]) == ExitCode.OK
    assert [built["token"] for built in accounts.built] == ["saved-token", "saved-token"]
