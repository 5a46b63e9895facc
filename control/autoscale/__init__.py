"""The autoscaler: worker containers follow the queue.

Modules:
    policy          ScalePolicy: pure (snapshot, now) -> Decision; thresholds, bounds, stable period,
                    cooldown; choose_victims (idle workers first)
    docker_backend  DockerBackend: start, list and remove labelled worker containers (docker SDK, blocking)
    fleet           ContainerFleet: adopt, replace, start and retire (drain, then remove) containers
    autoscaler      Autoscaler: the loop every AUTOSCALE_INTERVAL; modes off | recommend | docker
"""

from control.autoscale.autoscaler import Autoscaler, AutoscalerState
from control.autoscale.docker_backend import BackendError, ContainerSpec, DockerBackend, WorkerContainer
from control.autoscale.fleet import ContainerFleet
from control.autoscale.policy import Action, Decision, ScalePolicy, ScaleSettings, Snapshot, WorkerLoad, choose_victims

__all__ = [
    "Action",
    "Autoscaler",
    "AutoscalerState",
    "BackendError",
    "ContainerFleet",
    "ContainerSpec",
    "Decision",
    "DockerBackend",
    "ScalePolicy",
    "ScaleSettings",
    "Snapshot",
    "WorkerContainer",
    "WorkerLoad",
    "choose_victims",
]
