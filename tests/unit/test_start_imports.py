"""What a process imports as it starts: runner processes (one per slot, restarted after every kill)
and control planes should not pay for modules they never use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def loaded_after(statement: str) -> list[str]:
    """The modules a fresh interpreter holds after ``statement``, in the order their imports began."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(list(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    modules: list[str] = json.loads(out.stdout.splitlines()[-1])
    return modules


def top_level(modules: list[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_a_runner_process_loads_no_grpc_no_clients_and_no_http() -> None:
    modules = loaded_after("import runner.serve")
    assert not top_level(modules) & {"grpc", "aiohttp", "requests", "docker", "rich"}
    assert not {"corral.client", "corral.aio", "corral.v1"} & set(modules)


def test_a_worker_agent_loads_no_job_code() -> None:
    # It speaks the pipe format (runner.wire) and reads the memory limit (runner.limits); the job
    # types, numpy and the compiled kernels live in its runner processes only.
    modules = loaded_after("import worker.__main__")
    assert "numpy" not in top_level(modules)
    assert "runner.jobs" not in modules


def test_the_built_in_types_load_before_a_runner_says_ready_and_before_any_plug_in() -> None:
    modules = loaded_after("import runner.serve\nrunner.serve.catalog()")
    assert "runner.jobs" in modules and "numpy" in top_level(modules)
    refused = subprocess.run(
        [
            sys.executable,
            "-c",
            "from runner.registry import JobType, register\n"
            "class Mine(JobType):\n"
            "    name = 'noop'\n"
            "    def run(self, payload, ctx):\n"
            "        return {}\n"
            "register(Mine)",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert "ValueError: job type 'noop' is already registered by runner.jobs.noop" in refused.stderr


def test_a_control_plane_loads_the_docker_sdk_only_when_its_docker_mode_needs_it() -> None:
    # control.app imports the autoscaler and its docker backend; the SDK waits for the first Docker call
    assert "docker" not in top_level(loaded_after("import control.__main__"))


def test_a_control_plane_loads_bcrypt_and_jwt_only_when_accounts_are_on() -> None:
    assert not top_level(loaded_after("import control.__main__")) & {"bcrypt", "jwt"}


def test_control_planes_and_workers_load_the_setting_checks_but_not_the_cli_commands() -> None:
    for entry in ("control.__main__", "worker.__main__"):
        modules = loaded_after(f"import {entry}")
        assert "corral.cli.config_check" in modules
        assert "rich" not in top_level(modules)
        assert "corral.cli.main" not in modules


def test_the_public_names_load_on_first_use_with_the_grpc_defaults_set_before_grpc() -> None:
    modules = loaded_after("import corral")
    assert "grpc" not in top_level(modules)
    assert "corral.transport" in modules
    modules = loaded_after("import corral\ncorral.Client")
    assert modules.index("corral.transport") < modules.index("grpc")
    modules = loaded_after("from corral import AsyncClient")
    assert modules.index("corral.transport") < modules.index("grpc")


def test_built_ins_that_fail_to_load_fail_every_use_until_they_load() -> None:
    code = (
        "import sys\n"
        "from runner import registry\n"
        "sys.modules['runner.jobs'] = None  # its import now fails\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        registry.get('noop')\n"
        "    except ImportError:\n"
        "        print('refused')\n"
        "del sys.modules['runner.jobs']\n"
        "print(registry.get('noop').name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["refused", "refused", "noop"], out.stderr
