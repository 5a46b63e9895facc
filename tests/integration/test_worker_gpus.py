"""What a job that holds GPUs sees, through the real control plane and a real worker, on 127.0.0.1.

No GPU is needed: the worker hands out the device ids it is given (CORRAL_WORKER_GPUS) and a job sees
its own in ``CUDA_VISIBLE_DEVICES`` (the ``visible_devices`` probe reports it, with its runner's pid).
Placement itself (which worker, how many at once) is tests/integration/test_resources.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, WorkerProc, wait_until
from tests.support.calls import result, submit, wait_all_done, wait_done

S = jobs_pb2.Job
PROBE = "tests.unit.runner.devices_probe"


def gpu_worker(spawn_worker: Any, cp: ControlProc, gpus: str, slots: int = 2, **env: str) -> WorkerProc:
    worker: WorkerProc = spawn_worker(
        cp,
        threads=slots,
        slots=slots,
        imports=("tests.support.jobtypes", PROBE),
        env={"CORRAL_WORKER_GPUS": gpus, **env},
    )
    return worker


def seen(job: jobs_pb2.Job) -> tuple[str, int]:
    """The devices the job saw, and the pid of the runner it ran in."""
    assert job.state == S.SUCCEEDED, job.error
    out = result(job)
    return out["devices"], int(out["pid"])


def test_jobs_see_only_their_own_gpus_and_a_gpu_job_s_runner_is_replaced(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given a worker with two GPUs and two slots
    worker = gpu_worker(spawn_worker, control_plane, "2")
    gate = tmp_path / "gate"
    # When two one-GPU jobs run at once
    ids = [submit(control_plane, "visible_devices", {"gate": str(gate)}, gpu_count=1).id for _ in range(2)]
    wait_until(lambda: all(control_plane.get(i).state == S.RUNNING for i in ids), 30, what="both GPU jobs running")
    gate.touch()
    first = [seen(job) for job in wait_all_done(control_plane, ids, timeout=30)]
    # Then each saw one device, not the other's
    assert sorted(devices for devices, _ in first) == ["0", "1"]
    # And a job without GPUs sees no device at all
    plain = seen(wait_done(control_plane, submit(control_plane, "visible_devices").id))
    assert plain[0] == ""
    # And the runners that ran the GPU jobs ran nothing else: the next GPU job gets a fresh process
    again = seen(wait_done(control_plane, submit(control_plane, "visible_devices", gpu_count=2).id))
    assert again[0] == "0,1"
    assert again[1] not in {pid for _, pid in first} and plain[1] not in {pid for _, pid in first}
    assert "gpus_unavailable" not in worker.log.read_text()


def test_gpu_jobs_one_after_another_on_one_gpu_are_never_handed_back(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given a worker with one GPU (by its id) and two slots, and six one-GPU jobs queued at once
    worker = gpu_worker(spawn_worker, control_plane, "GPU-only")
    ids = [submit(control_plane, "visible_devices", gpu_count=1).id for _ in range(6)]
    done = [seen(job) for job in wait_all_done(control_plane, ids, timeout=60)]
    # Then each ran with the device, each in a process of its own
    assert [devices for devices, _ in done] == ["GPU-only"] * 6
    assert len({pid for _, pid in done}) == 6
    # and none was handed back: the device was free again before the control plane heard a job was done
    assert "gpus_unavailable" not in worker.log.read_text()


def test_a_command_job_shows_its_gpus_in_its_environment(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a worker with two GPUs that lets command jobs run /usr/bin/env
    spawn_worker(
        control_plane,
        threads=2,
        imports=("runner.extra.command",),
        env={"CORRAL_WORKER_GPUS": "GPU-a,GPU-b", "CORRAL_COMMAND_ALLOW": "/usr/bin/env"},
    )

    def visible(gpu_count: int) -> list[str]:
        job = wait_done(
            control_plane, submit(control_plane, "command", {"argv": ["/usr/bin/env"]}, gpu_count=gpu_count).id
        )
        assert job.state == S.SUCCEEDED, job.error
        return [line for line in result(job)["stdout"].splitlines() if line.startswith("CUDA_VISIBLE_DEVICES=")]

    # When env runs holding both GPUs, then holding none
    # Then it lists both devices, then none
    assert visible(2) == ["CUDA_VISIBLE_DEVICES=GPU-a,GPU-b"]
    assert visible(0) == ["CUDA_VISIBLE_DEVICES="]
