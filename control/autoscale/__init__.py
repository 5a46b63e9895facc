"""The autoscaler: worker containers follow the queue.

Modules:
    policy          ScalePolicy: pure (snapshot, now) -> Decision; thresholds, bounds, stable period,
                    cooldown; choose_victims (idle workers first); CrashBackoff (restarts of crashing containers)
    docker_backend  DockerBackend: start, list and remove labelled worker containers (docker SDK, blocking)
    fleet           ContainerFleet: adopt, replace (with a backoff), start and retire (drain, then remove)
                    containers; remove those never started or never registered
    autoscaler      Autoscaler: the loop every AUTOSCALE_INTERVAL; modes off | recommend | docker
"""

from control.autoscale.autoscaler import Autoscaler, AutoscalerState
from control.autoscale.docker_backend import BackendError, ContainerSpec, DockerBackend, WorkerContainer
from control.autoscale.fleet import ContainerFleet
from control.autoscale.policy import (
    Action,
    CrashBackoff,
    Decision,
    ScalePolicy,
    ScaleSettings,
    Snapshot,
    WorkerLoad,
    choose_victims,
)

__all__ = [
    "Action",
    "Autoscaler",
    "AutoscalerState",
    "BackendError",
    "ContainerFleet",
    "ContainerSpec",
    "CrashBackoff",
    "Decision",
    "DockerBackend",
    "ScalePolicy",
    "ScaleSettings",
    "Snapshot",
    "WorkerContainer",
    "WorkerLoad",
    "choose_victims",
]
