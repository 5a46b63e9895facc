"""The worker agent: connects to the control plane, runs assigned jobs in a pool of runner processes.

Modules:
    config      WorkerConfig (every CORRAL_* setting, its default and rule) + ConfigError
    agent       Agent: the composition root; owns the pool and the connection; start/stop/drain
    connection  Connection: the Connect stream (register, heartbeats, assignments, results, acks, reconnect)
    reconnect   AddressRotation, reconnect_delay: which control-plane address next, and the wait before it
    attempt     JobSpec (what to run), Completion and Outcome (how it ended)
    pool        RunnerPool: pre-started runner processes, deadlines, kills, replacements
    process     RunnerProcess: one runner process and its two pipes
    strays      StrayReaper: ends what a killed runner's jobs left running outside its process group
    drain       Drainer: stop intake, finish up to a deadline, hand back the rest
    __main__    ``python -m worker``: flags + environment -> Agent; SIGTERM drains

Data flow: Assign -> Connection -> RunnerPool.submit -> RunnerProcess (pipe frames, :mod:`runner.wire`)
-> Completion -> Connection.report -> Results -> Ack.
"""

from __future__ import annotations

import corral.transport  # noqa: F401  (first: sets gRPC transport defaults before grpc loads)
from worker.agent import Agent
from worker.attempt import Completion, JobSpec, Outcome
from worker.config import ConfigError, WorkerConfig
from worker.connection import Connection
from worker.drain import Drainer
from worker.pool import PoolConfig, RunnerPool, RunnerStartError

__all__ = [  # noqa: RUF022  (grouped by concept)
    # the agent and its settings
    "Agent",
    "ConfigError",
    "WorkerConfig",
    # running jobs
    "Completion",
    "JobSpec",
    "Outcome",
    "PoolConfig",
    "RunnerPool",
    "RunnerStartError",
    # the control-plane side
    "Connection",
    "Drainer",
]
