"""The built-in job types, one module each; importing this package registers them all.

Modules: ``noop``, ``sleep``, ``add_numbers``, ``reverse_string``, ``failing`` (plain Python);
``large_array_sum``, ``resize_image``, ``cpu_intensive``, ``matmul``, ``monte_carlo_pi`` (compiled
kernels, over the job's threads); ``io_intensive``, ``network_intensive``, ``webhook``, ``email``
(I/O). Each takes its payload schema from :data:`corral.jobtypes.BUILTIN_SCHEMAS`, the contract the
control plane validates against.
"""

from __future__ import annotations

from runner.jobs import (
    add_numbers,
    cpu_intensive,
    email,
    failing,
    io_intensive,
    large_array_sum,
    matmul,
    monte_carlo_pi,
    network_intensive,
    noop,
    resize_image,
    reverse_string,
    sleep,
    webhook,
)

__all__ = [
    "add_numbers",
    "cpu_intensive",
    "email",
    "failing",
    "io_intensive",
    "large_array_sum",
    "matmul",
    "monte_carlo_pi",
    "network_intensive",
    "noop",
    "resize_image",
    "reverse_string",
    "sleep",
    "webhook",
]
