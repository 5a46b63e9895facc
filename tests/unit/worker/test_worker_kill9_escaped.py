"""``kill -9`` of a worker (``python -m worker``) ends the processes its jobs started that left their
runner's process group (``setsid``, a double-forked daemon), as it ends those that stayed in it.

A real worker process with :mod:`tests.support.escaping_jobtypes`, against a scripted control plane;
the job writes the escaped pids to a file the test reads. Waits are on conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

from tests.support.fake_control import job, worker_with_fake_control
from tests.support.processes import alive, children
from tests.support.waiting import until

ESCAPING = ("--threads", "1", "--import", "tests.support.escaping_jobtypes")
"""One slot, and the escaping job types."""


def test_kill_9_of_the_worker_ends_the_processes_that_left_the_group(tmp_path: Path) -> None:
    escaped: list[int] = []

    async def main() -> None:
        async with worker_with_fake_control(*ESCAPING) as (control, proc):
            s = await control.session(within=30)
            await s.next("register")
            s.registered()
            # Given a job running with a setsid child and a double-forked daemon, both out of its group
            pid_path = tmp_path / "pids"
            s.assign(job("escape", "escape", {"pid_path": str(pid_path), "seconds": 300}))
            await until(pid_path.exists, 30, "the job to write the escaped pids")
            pids = json.loads(pid_path.read_text())
            escaped.extend((pids["setsid"], pids["daemon"]))
            assert pids["runner"] in children(proc.pid)
            assert all(pids["runner"] not in ids for ids in pids["groups"]), pids  # out of its group and session
            assert all(alive(pid) for pid in escaped)
            # When the worker is killed with SIGKILL (no chance to clean up)
            proc.kill()
            await proc.wait()
            # Then they die with its runner, instead of running on for ever
            await until(lambda: not any(alive(pid) for pid in escaped), 10, f"the escaped processes {escaped} to end")
            await until(lambda: not alive(pids["runner"]), 10, "the runner to end")

    try:
        asyncio.run(main())
    finally:
        for pid in escaped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
