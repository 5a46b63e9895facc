"""`corral submit --payload @-` reads the payload JSON from stdin, as `--payload @FILE` reads it from a file;
stdin or a file that cannot be read, is not UTF-8 or is not a JSON object is bad input (exit 2), named.

Before, `@-` read a file called "-" ("cannot read -: No such file or directory"), and a file that was not
UTF-8 was argparse's generic "invalid payload value: '@FILE'", naming neither the problem nor the rule.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ControlProc
from tests.support.calls import stored
from tests.support.cli import corral


def _submit_with_stdin(address: str, data: bytes, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral submit noop --payload @- ARGS` with ``data`` (bytes, as they are) on its stdin."""
    return corral("submit", "noop", "--payload", "@-", "--json", *args, "--control", address, input=data)


def test_the_payload_is_read_from_stdin(control_plane: ControlProc) -> None:
    # Given a payload of several lines on stdin, with text no shell would pass as an argument with ease
    payload = {"text": 'it\'s "quoted"\nand on two lines', "n": [1, 2.5, None], "deep": {"ok": True}}
    done = _submit_with_stdin(control_plane.address, json.dumps(payload, indent=2).encode())
    # Then the job is stored with exactly that payload
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["id"]
    shown = corral("get", job_id, "--json", "--control", control_plane.address)
    assert json.loads(shown.stdout)["payload"] == payload


def test_a_file_payload_still_works_and_the_help_says_both(control_plane: ControlProc, tmp_path: Path) -> None:
    path = tmp_path / "payload.json"
    path.write_text('{"a": 1, "b": 2}')
    done = corral("submit", "noop", "--payload", f"@{path}", "--json", "--control", control_plane.address)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["payload"] == {"a": 1, "b": 2}
    helped = corral("submit", "--help")
    assert helped.returncode == 0
    text = " ".join(helped.stdout.split())
    assert "@FILE" in text and "@- " in text and "stdin" in text, text


@pytest.mark.parametrize(
    ("what", "data", "said"),
    [
        ("malformed JSON", b'{"a": 1,\n "b": }', "invalid JSON in stdin at line 2 column 7"),
        ("empty stdin", b"", "invalid JSON in stdin at line 1 column 1"),
        ("not an object", b"[1, 2]", "stdin must be a JSON object ({...}), got an array"),
        ("not UTF-8", b'{"a": "\xff"}', "cannot read stdin: not UTF-8 text (byte 7)"),
        ("a key twice", b'{"a": 1, "a": 2}', "invalid JSON in stdin: key 'a' is given twice"),
        ("NaN", b'{"a": NaN}', "field 'payload.a': must be a finite number"),
        ("an integer of 5000 digits", b'{"a": ' + b"9" * 5000 + b"}", "invalid JSON in stdin: "),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 30 else None,
)
def test_bad_stdin_is_bad_input_named(refusing_control_plane: ControlProc, what: str, data: bytes, said: str) -> None:
    before = stored(refusing_control_plane)
    done = _submit_with_stdin(refusing_control_plane.address, data)
    assert done.returncode == 2, (what, done.returncode, done.stderr[-500:])
    error = done.stderr.splitlines()[-1]
    assert said in error, (what, error[:500])
    assert "Traceback" not in done.stderr and done.stdout == "" and len(error) < 1000
    assert stored(refusing_control_plane) == before


def test_an_unreadable_or_bad_file_is_bad_input_named(refusing_control_plane: ControlProc, tmp_path: Path) -> None:
    before = stored(refusing_control_plane)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b'{"a": "\xfe\xff"}')
    cases = [
        (f"@{tmp_path / 'missing.json'}", f"cannot read {tmp_path / 'missing.json'}: No such file or directory"),
        (f"@{tmp_path}", f"cannot read {tmp_path}: Is a directory"),
        (f"@{binary}", f"cannot read {binary}: not UTF-8 text (byte 7)"),
        ("@", "give a file after @ (@FILE), or @- for stdin"),
    ]
    for argument, said in cases:
        done = corral("submit", "noop", "--payload", argument, "--control", refusing_control_plane.address)
        assert done.returncode == 2, (argument, done.stderr[-500:])
        error = done.stderr.splitlines()[-1]
        assert error.startswith("corral submit: error: argument --payload: ") and said in error, (argument, error)
    assert stored(refusing_control_plane) == before
