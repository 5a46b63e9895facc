"""``python -m runner`` for every built-in job type, and job types from ``corral.job_types`` entry points.

Each run is a real subprocess; the network types talk to servers on 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import runner
from corral.jobtypes import BUILTIN_SCHEMAS
from runner.arrays import encode_npy
from runner.errors import EXIT_FAILED, EXIT_INVALID_PAYLOAD, EXIT_OK
from runner.plugins import load_entry_points
from tests.unit.runner.local_servers import local_http, local_smtp
from tests.unit.runner.plugin_dist import make_plugin_distribution

ROOT = Path(__file__).resolve().parents[3]


def run_cli(
    job_type: str, payload: dict[str, Any], *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    args = [
        sys.executable,
        "-m",
        "runner",
        "--job-id",
        "j1",
        "--type",
        job_type,
        "--payload",
        json.dumps(payload),
        *extra,
    ]
    environ = {**os.environ, **(env or {})}
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False, env=environ)


PIXELS = base64.b64encode(bytes(range(48))).decode()
LOCAL: dict[str, tuple[dict[str, Any], Any]] = {
    "noop": ({}, {}),
    "sleep": ({"seconds": 0.01}, {"slept": 0.01}),
    "add_numbers": ({"a": 2**60, "b": 1}, {"sum": 2**60 + 1, "sum_text": str(2**60 + 1)}),
    "reverse_string": ({"text": "a😀b"}, {"reversed": "b😀a"}),
    "large_array_sum": ({"array_b64": encode_npy(np.array([2**63 - 1, 2**63 - 1]))}, None),
    "resize_image": ({"width": 4, "height": 4, "target_width": 2, "target_height": 2, "pixels_b64": PIXELS}, None),
    "cpu_intensive": ({"n": 10**6}, {"primes": 78498}),
    "matmul": ({"n": 64, "seed": 1}, None),
    "monte_carlo_pi": ({"samples": 100_000, "seed": 1}, None),
    "io_intensive": ({"size_bytes": 100_000, "fsync": False}, None),
    "failing": ({"fail_attempts": 0}, {"attempt": 1}),
}


@pytest.mark.parametrize("job_type", sorted(LOCAL))
def test_every_local_type_runs_from_the_command_line(job_type: str) -> None:
    payload, expected = LOCAL[job_type]
    done = run_cli(job_type, payload, "--threads", "2")
    assert done.returncode == EXIT_OK, done.stderr
    result = json.loads(done.stdout)
    if expected is not None:
        assert result == expected
    if job_type == "large_array_sum":
        assert result["sum_text"] == str(2 * (2**63 - 1)) and result["fits_int64"] is False


def test_network_types_run_from_the_command_line() -> None:
    with local_http() as server:
        got = run_cli("network_intensive", {"url": f"{server.url}/bytes/1000"})
        assert got.returncode == EXIT_OK, got.stderr
        assert json.loads(got.stdout)["bytes"] == 1000
        hook = run_cli("webhook", {"url": f"{server.url}/echo", "body": {"x": 1}})
        assert hook.returncode == EXIT_OK, hook.stderr
        assert json.loads(hook.stdout)["status"] == 200
        failed = run_cli("webhook", {"url": f"{server.url}/status/502"})
        assert failed.returncode == EXIT_FAILED
        assert json.loads(failed.stderr)["code"] == "HTTP_ERROR"
    with local_smtp() as smtp:
        env = {"CORRAL_SMTP_HOST": smtp.host, "CORRAL_SMTP_PORT": str(smtp.port)}
        mail = run_cli("email", {"to": "ops@example.test", "subject": "hi", "body": "there"}, env=env)
        assert mail.returncode == EXIT_OK, mail.stderr
        assert json.loads(mail.stdout)["accepted"] == ["ops@example.test"]
        assert len(smtp.messages) == 1


def test_every_builtin_type_is_covered_here() -> None:
    assert set(LOCAL) | {"network_intensive", "webhook", "email"} == set(BUILTIN_SCHEMAS)


@pytest.mark.parametrize(
    ("job_type", "payload", "field"),
    [
        ("large_array_sum", {"numbers": [1], "array_b64": encode_npy(np.zeros(1, dtype=np.int64))}, "payload"),
        ("large_array_sum", {"numbers": [1.5]}, "payload.numbers.0"),
        ("matmul", {"n": 0}, "payload.n"),
        ("webhook", {"url": "ftp://example.test/x"}, "payload.url"),
        ("email", {"to": "not-an-address", "subject": "s", "body": "b"}, "payload.to"),
    ],
)
def test_the_command_line_validates_against_the_schema(job_type: str, payload: dict[str, Any], field: str) -> None:
    done = run_cli(job_type, payload)
    assert done.returncode == EXIT_INVALID_PAYLOAD
    assert json.loads(done.stderr)["message"].startswith(f"{field}:")


# -- plug-ins from entry points ---------------------------------------------------------------------------


def test_an_entry_point_adds_a_job_type_to_the_command_line(tmp_path: Path) -> None:
    site = make_plugin_distribution(tmp_path)
    env = {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    done = run_cli("demo_shout", {"text": "hey"}, "--threads", "3", env=env)
    assert done.returncode == EXIT_OK, done.stderr
    assert json.loads(done.stdout) == {"shout": "HEY", "threads": 3}
    invalid = run_cli("demo_shout", {}, env=env)
    assert invalid.returncode == EXIT_INVALID_PAYLOAD  # its own schema applies


def test_entry_points_are_loaded_once_and_registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(make_plugin_distribution(tmp_path)))
    assert "demo_shout" in load_entry_points(reload=True)
    assert runner.execute("demo_shout", {"text": "a"}, runner.JobContext("j", 1)) == {"shout": "A", "threads": 1}
    assert "demo_shout" in [t.name for t in runner.all_types()]


def test_a_broken_entry_point_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(make_plugin_distribution(tmp_path, "corral_demo_plugin:Missing")))
    try:
        with pytest.raises(ImportError, match="demo_shout"):
            load_entry_points(reload=True)
    finally:
        monkeypatch.undo()
        load_entry_points(reload=True)
