"""The per-job memory limit of a runner process: ``RLIMIT_AS`` over its idle footprint.

A worker started with ``CORRAL_JOB_MEMORY_LIMIT_MB=N`` (N >= 1; unset or 0: no limit) gives each
runner process ``--memory-limit-mb N``; the worker checks N at start-up (``worker.config``), against
the address-space hard limit it and its runners have (:func:`hard_limit_bytes`, ``ulimit -Hv``) too.
Once the process has imported everything and started its compiled kernels' thread pool,
:func:`apply_memory_limit` sets its address-space limit to what it uses then plus N MiB: a job may
allocate up to N MiB more than an idle runner (the interpreter, numpy and the thread stacks are not
counted against the job, and do not vary with the payload), and never past the hard limit.

The limit is both the soft and the hard one. A soft limit alone binds only a job that leaves it be:
any process may raise its soft limit up to its hard one (``setrlimit(RLIMIT_AS, (hard, hard))``,
``ulimit -v unlimited`` in a shell it starts), and the hard limit is most often unlimited. A hard limit,
once lowered, is lowered for good (only a privileged process raises it), for the runner, its jobs and
the programs they start alike: those inherit it, and may lower their own (``runner.extra.command``'s
``memory_mb``) but not raise it. A job that lowers it further leaves its runner unable to put it back;
:mod:`runner.procstate` then has the runner replaced after the job's answer.

A job that needs more gets ``MemoryError`` (numpy and the kernels raise it when an allocation fails);
the runner reports the attempt FAILED with code ``MEMORY_LIMIT`` and exits, and the worker starts a
fresh process in its place, so the pool keeps its size and no job runs in a process whose heap was
left full.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping

__all__ = [
    "ENV",
    "MIB",
    "address_space_bytes",
    "apply_memory_limit",
    "hard_limit_bytes",
    "memory_limit_from_env",
    "warm_up_threads",
]

ENV = "CORRAL_JOB_MEMORY_LIMIT_MB"
"""The worker's environment variable."""
MIB = 1 << 20


def memory_limit_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The limit in MiB from ``CORRAL_JOB_MEMORY_LIMIT_MB`` (0: none).

    Raises:
        ValueError: the value is not an integer >= 0 (the message names the variable).
    """
    env = os.environ if environ is None else environ
    raw = env.get(ENV, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{ENV} must be an integer number of MiB >= 0, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{ENV} must be an integer number of MiB >= 0, got {value}")
    return value


def address_space_bytes() -> int:
    """This process's address space now (``VmSize`` of /proc/self/status), in bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def warm_up_threads(threads: int | None = None) -> None:
    """Start the compiled kernels' OpenMP threads now, so their stacks are part of the idle footprint."""
    from runner.kernels.hash_rounds import hash_rounds

    hash_rounds(0, 0, threads or max(2, os.cpu_count() or 1))


def hard_limit_bytes() -> int | None:
    """This process's ``RLIMIT_AS`` hard limit in bytes (``ulimit -Hv``), None when unlimited. Runner
    processes inherit the worker's, and none of them can set a limit above it."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if hard == resource.RLIM_INFINITY else hard


def apply_memory_limit(limit_mb: int) -> int:
    """Limit this process's address space, soft and hard limits alike, to its current size plus
    ``limit_mb`` MiB, or to the hard limit when that is lower; returns the limit. It cannot be undone:
    neither this process nor any it starts can raise it again (see the module docstring).

    Raises:
        ValueError: ``limit_mb`` < 1.
        OSError: the limit cannot be set.
    """
    if limit_mb < 1:
        raise ValueError(f"the memory limit must be >= 1 MiB, got {limit_mb}")
    limit = address_space_bytes() + limit_mb * MIB
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        # setrlimit refuses a soft limit above the hard one, and the runner would die before READY; the
        # hard limit binds the job anyway, so it is the limit then.
        limit = min(limit, hard)
    # The hard limit too: with the soft limit alone, a job would raise its own as far as the hard one.
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit
