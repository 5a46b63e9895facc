"""Autoscale: from a backlog over QUEUE_THRESHOLD_HIGH to a new worker container running its first job,
with the container's own start shown apart, and how long a scale-down takes (drain, stop, remove).

Each run: one 1-thread worker container is running (MIN_WORKERS 1); 4 one-second jobs arrive, so 3
wait (> QUEUE_THRESHOLD_HIGH 2) and the autoscaler starts a second container; once the queue has been
low for SCALE_DOWN_STABLE_SEC it drains one and removes its container. Columns:

* ``detect_s``: backlog over the threshold (the jobs' created_at) -> the scale-up decision;
* ``start_s``: the container's own start: decision -> its worker registered (Docker create + start,
  Python and the worker agent booting, connecting); ``docker_s`` is Docker's part of it (the
  container's Created -> StartedAt);
* ``job_s``: registered -> its first job started;
* ``total_s``: backlog over the threshold -> the new worker's first job started;
* ``excl_s`` = detect + job: total without the container's start (floor: <= 2 s median);
* ``down_s``: scale-down decision -> container removed (drain, stop, remove); ``intr``: jobs that
  needed more than one attempt (floor: 0 in every run).

Needs Docker and the worker image (``--image``, default $WORKER_IMAGE or corral-worker:latest).
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from datetime import datetime
from typing import Any

import docker
import docker.errors

from bench.cluster import Cluster
from bench.report import table
from corral.v1 import admin_pb2, jobs_pb2

HIGH = 2


def _ts(stamp: Any) -> float:
    return float(stamp.ToNanoseconds()) / 1e9


def _docker_time(text: str) -> float:
    """Docker's RFC 3339 with nanoseconds -> Unix seconds."""
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))


def _poll(what: str, fn: Any, timeout: float = 60.0, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(interval)


def run_once(c: Cluster, client: Any, group: str) -> dict[str, float]:
    def containers() -> list[Any]:
        return list(client.containers.list(filters={"label": f"io.corral.group={group}"}, ignore_removed=True))

    def workers() -> dict[str, admin_pb2.Worker]:
        return {w.id: w for w in c.admin.ListWorkers(admin_pb2.ListWorkersRequest()).workers}

    def status() -> admin_pb2.AutoscalerStatus:
        st: admin_pb2.AutoscalerStatus = c.admin.GetAutoscaler(admin_pb2.GetAutoscalerRequest())
        return st

    _poll("one registered worker container", lambda: len(containers()) == 1 and len(workers()) == 1)
    before = set(workers())
    reqs = [jobs_pb2.SubmitJobRequest(type="sleep") for _ in range(HIGH + 2)]
    for r in reqs:
        r.payload.update({"seconds": 1})
    jobs = list(c.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=reqs)).jobs)
    over_at = max(_ts(j.created_at) for j in jobs)

    up = _poll("the scale-up", lambda: (s := status()).last_action == "up" and _ts(s.last_action_at) >= over_at and s)
    decided_at = _ts(up.last_action_at)
    new = _poll("the new worker", lambda: [w for wid, w in workers().items() if wid not in before])[0]
    registered_at = _ts(new.registered_at)

    def finished() -> list[jobs_pb2.Job]:
        got = [c.jobs.GetJob(jobs_pb2.GetJobRequest(id=j.id)) for j in jobs]
        return got if all(x.state == jobs_pb2.Job.SUCCEEDED for x in got) else []

    done = _poll("the jobs", finished)
    first_job_at = min(_ts(j.started_at) for j in done if j.worker_id == new.id)
    created = client.containers.get(new.id).attrs
    docker_start = _docker_time(created["State"]["StartedAt"]) - _docker_time(created["Created"])

    down = _poll(
        "the scale-down",
        lambda: (s := status()).last_action == "down" and _ts(s.last_action_at) > first_job_at and s,
        60,
    )
    _poll("the container to go", lambda: len(containers()) == 1, 60, 0.01)
    removed_at = time.time()
    return {
        "detect_s": decided_at - over_at,
        "start_s": registered_at - decided_at,
        "docker_s": docker_start,
        "job_s": first_job_at - registered_at,
        "total_s": first_job_at - over_at,
        "excl_s": (decided_at - over_at) + (first_job_at - registered_at),
        "down_s": removed_at - _ts(down.last_action_at),
        "intr": float(sum(1 for j in done if j.attempts != 1)),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--image", default=os.environ.get("WORKER_IMAGE", "corral-worker:latest"))
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    try:
        client = docker.from_env()
        client.images.get(a.image)
    except docker.errors.DockerException as exc:
        print(f"autoscale: skipped, needs Docker and the worker image {a.image!r}: {exc}")
        return
    group = f"bench-{uuid.uuid4().hex[:8]}"
    env = {
        "AUTOSCALE_MODE": "docker",
        "AUTOSCALE_INTERVAL": "0.25",
        "WORKER_IMAGE": a.image,
        "CORRAL_AUTOSCALE_GROUP": group,
        "CORRAL_WORKER_THREADS": "1",
        "MIN_WORKERS": "1",
        "MAX_WORKERS": "2",
        "QUEUE_THRESHOLD_HIGH": str(HIGH),
        "QUEUE_THRESHOLD_LOW": "1",
        "SCALE_DOWN_STABLE_SEC": "1",
        "CORRAL_SCALE_COOLDOWN_SEC": "0.5",
    }
    try:
        with Cluster(workers=0, env=env) as c:
            rows = [run_once(c, client, group) for _ in range(a.runs)]
    finally:
        for container in client.containers.list(all=True, filters={"label": f"io.corral.group={group}"}):
            container.remove(force=True)
    medians = table(f"autoscale: backlog > {HIGH} -> a new 1-thread worker container runs its first job", rows)
    print(f"interrupted jobs in all runs: {sum(r['intr'] for r in rows):.0f} (floor 0); "
          f"median excl. container start: {medians['excl_s']:.2f} s (floor <= 2 s)")  # fmt: skip


if __name__ == "__main__":
    main()
