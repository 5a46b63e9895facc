"""The CLI's saved login: where it lives, how it is written (0600, atomically) and read, and which token a
client command sends (--token, else $CORRAL_TOKEN, else the saved login for this --control until it expires)."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from corral.cli import commands, login_file, main
from corral.cli.exitcode import ExitCode
from corral.cli.login_file import LoginFileError, SavedLogin
from corral.cli.parser import CONTROL_ADDR_ENV, TOKEN_ENV
from corral.cluster import Stats

LATER = datetime.now(UTC) + timedelta(hours=1)
EARLIER = datetime.now(UTC) - timedelta(seconds=1)
CONTROL = "127.0.0.1:50051"


@pytest.fixture
def login_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$CORRAL_LOGIN_FILE in a fresh directory, with no token and the default --control in the environment."""
    file = tmp_path / "conf" / "login"
    monkeypatch.setenv(login_file.LOGIN_FILE_ENV, str(file))
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(CONTROL_ADDR_ENV, raising=False)
    return file


def saved(control: str = CONTROL, expires_at: datetime = LATER, token: str = "saved-token") -> SavedLogin:
    return SavedLogin(control=control, name="alice", token=token, expires_at=expires_at)


# -- where it lives ------------------------------------------------------------------------------------


def test_the_file_is_the_variable_else_xdg_config_home_else_dot_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(login_file.LOGIN_FILE_ENV, str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert login_file.path() == tmp_path / "explicit"
    monkeypatch.setenv(login_file.LOGIN_FILE_ENV, "")  # set but empty: as if unset
    assert login_file.path() == tmp_path / "xdg" / "corral" / "login"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert login_file.path() == tmp_path / "home" / ".config" / "corral" / "login"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # the XDG spec: ignore a relative one
    assert login_file.path() == tmp_path / "home" / ".config" / "corral" / "login"


# -- save, load, remove --------------------------------------------------------------------------------


def test_a_saved_login_loads_back_and_the_file_is_the_documented_json(login_path: Path) -> None:
    assert login_file.load() is None
    assert login_file.save(saved()) == login_path
    assert login_file.load() == saved()
    assert json.loads(login_path.read_text()) == {
        "control": CONTROL,
        "name": "alice",
        "token": "saved-token",
        "expires_at": LATER.isoformat(),
    }


def test_the_file_is_0600_in_a_0700_directory_whatever_the_umask(login_path: Path) -> None:
    old = os.umask(0)  # the widest umask: the modes must not come from it
    try:
        login_file.save(saved())
    finally:
        os.umask(old)
    assert stat.S_IMODE(login_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(login_path.parent.stat().st_mode) == 0o700


def test_saving_replaces_the_file_whole_and_leaves_no_temporary_file(login_path: Path) -> None:
    login_path.parent.mkdir()
    login_path.write_text("old")
    login_path.chmod(0o644)
    old_inode = login_path.stat().st_ino
    login_file.save(saved(token="new-token"))
    # a new file renamed over the old one (a reader sees the old or the new, never a mix), with its own mode
    assert login_path.stat().st_ino != old_inode
    assert stat.S_IMODE(login_path.stat().st_mode) == 0o600
    assert login_file.load() == saved(token="new-token")
    assert os.listdir(login_path.parent) == ["login"]


def test_a_failed_save_keeps_the_old_login_and_removes_its_temporary_file(
    login_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    login_file.save(saved(token="old-token"))

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(LoginFileError, match=f"cannot be saved to {login_path}: No space left on device"):
        login_file.save(saved(token="new-token"))
    assert login_file.load() == saved(token="old-token")
    assert os.listdir(login_path.parent) == ["login"]


@pytest.mark.parametrize("obstacle", ["directory", "file above"])
def test_a_login_file_that_cannot_be_written_is_an_error_naming_it(login_path: Path, obstacle: str) -> None:
    # (Not a read-only directory: the tests may run as root, who writes there anyway.)
    if obstacle == "directory":
        login_path.mkdir(parents=True)  # $CORRAL_LOGIN_FILE names a directory
        target, why = login_path, "Is a directory"
    else:
        login_path.parent.parent.joinpath("conf").write_text("")  # a file where its directory should be
        target, why = login_path, "File exists"
    with pytest.raises(LoginFileError) as info:
        login_file.save(saved())
    assert info.value.message.startswith(f"the login cannot be saved to {target}: {why}; set $CORRAL_LOGIN_FILE")


def test_remove_says_whether_there_was_a_login(login_path: Path) -> None:
    login_file.save(saved())
    assert login_file.remove() is True
    assert not login_path.exists()
    assert login_file.remove() is False
    assert login_file.load() is None


def test_a_login_file_that_cannot_be_removed_is_an_error_naming_it(login_path: Path) -> None:
    login_path.mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(LoginFileError, match=f"the saved login {login_path} cannot be removed"):
        login_file.remove()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "is not JSON (line 1 column 2"),
        ("[1, 2]", "does not hold a JSON object"),
        ('{"control": "a:1", "name": "alice", "expires_at": "2026-01-01T00:00:00+00:00"}', "has no 'token' string"),
        ('{"control": "a:1", "name": "alice", "token": 5, "expires_at": "2026"}', "has no 'token' string"),
        ('{"control": "a:1", "name": "", "token": "t", "expires_at": "2026"}', "has no 'name' string"),
        (
            '{"control": "a:1", "name": "a", "token": "t", "expires_at": "soon"}',
            "has an 'expires_at' that is not an ISO",
        ),
    ],
)
def test_a_malformed_file_is_an_error_naming_the_file_and_the_way_out(
    login_path: Path, text: str, problem: str
) -> None:
    login_path.parent.mkdir()
    login_path.write_text(text)
    with pytest.raises(LoginFileError) as info:
        login_file.load()
    assert str(info.value).startswith(f"the saved login {login_path} {problem}")
    assert "corral logout" in str(info.value)
    assert info.value.code == "FAILED_PRECONDITION"


def test_an_expiry_without_an_offset_is_utc(login_path: Path) -> None:
    login_path.parent.mkdir()
    login_path.write_text('{"control": "a:1", "name": "a", "token": "t", "expires_at": "2030-01-02T03:04:05"}')
    loaded = login_file.load()
    assert loaded is not None and loaded.expires_at == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_a_saved_login_s_repr_keeps_the_token_out() -> None:
    assert "saved-token" not in repr(saved()) and "alice" in repr(saved())


def test_a_saved_login_is_usable_only_for_its_control_and_before_it_expires() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    login = saved(expires_at=now + timedelta(seconds=1))
    assert login.usable(CONTROL, now)
    assert not login.usable("127.0.0.1:50052", now)
    assert not login.usable(CONTROL, now + timedelta(seconds=1))


# -- the token a client command sends ------------------------------------------------------------------


class TokenRecorder:
    """A Client that keeps the token each command built it with, and answers stats."""

    tokens: list[str | None] = []

    def __init__(self, address: str, *, token: str | None = None, **kwargs: object) -> None:
        TokenRecorder.tokens.append(token)

    def __enter__(self) -> TokenRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def stats(self) -> Stats:
        return Stats(queue_depth=0, scheduled=0, running=0, workers=0)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> list[str | None]:
    """The tokens `corral stats` sent, one per run."""
    TokenRecorder.tokens = []
    monkeypatch.setattr(commands, "Client", TokenRecorder)
    return TokenRecorder.tokens


def test_token_explicit_beats_the_variable_which_beats_the_saved_login(
    login_path: Path, sent: list[str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    login_file.save(saved())
    assert main(["stats", "--json"]) == ExitCode.OK
    monkeypatch.setenv(TOKEN_ENV, "env-token")
    assert main(["stats", "--json"]) == ExitCode.OK
    assert main(["stats", "--json", "--token", "flag-token"]) == ExitCode.OK
    assert sent == ["saved-token", "env-token", "flag-token"]


@pytest.mark.parametrize(
    ("login", "argv"),
    [
        (saved(expires_at=EARLIER), []),
        (saved(control="10.0.0.9:50051"), []),
        (saved(), ["--control", "127.0.0.1:50052"]),
        (saved(control=f"{CONTROL},127.0.0.1:50052"), []),  # made with a list; this is one of its addresses only
    ],
)
def test_an_expired_login_or_one_for_another_control_is_not_sent(
    login_path: Path, sent: list[str | None], login: SavedLogin, argv: list[str]
) -> None:
    login_file.save(login)
    assert main(["stats", "--json", *argv]) == ExitCode.OK
    assert sent == [None]


def test_the_saved_login_follows_the_control_address_from_the_environment(
    login_path: Path, sent: list[str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    login_file.save(saved(control="10.0.0.9:50051"))
    monkeypatch.setenv(CONTROL_ADDR_ENV, "10.0.0.9:50051")
    assert main(["stats", "--json"]) == ExitCode.OK
    assert sent == ["saved-token"]


def test_a_broken_login_file_is_one_error_line_but_leaves_help_and_given_tokens_alone(
    login_path: Path, sent: list[str | None], capsys: pytest.CaptureFixture[str]
) -> None:
    login_path.parent.mkdir()
    login_path.write_text("{broken")
    # a command that would send the saved login stops with one line naming the file (exit 1) ...
    assert main(["stats"]) == ExitCode.FAILED
    err = capsys.readouterr().err
    assert err.startswith(f"corral: error: FAILED_PRECONDITION: the saved login {login_path} is not JSON")
    assert err.count("\n") == 1 and sent == []
    # ... one given a token does not read it, and --help never does
    assert main(["stats", "--json", "--token", "flag-token"]) == ExitCode.OK
    with pytest.raises(SystemExit) as info:
        main(["stats", "--help"])
    assert info.value.code == 0 and sent == ["flag-token"]
