"""The built-in job types, one module each; importing this package registers them all.

Modules: ``noop``, ``sleep``, ``add_numbers``, ``reverse_string``, ``large_array_sum``,
``resize_image``, ``cpu_intensive``, ``failing``. Each takes its payload schema from
:data:`corral.jobtypes.BUILTIN_SCHEMAS`, the contract the control plane validates against.
"""

from __future__ import annotations

from runner.jobs import (
    add_numbers,
    cpu_intensive,
    failing,
    large_array_sum,
    noop,
    resize_image,
    reverse_string,
    sleep,
)

__all__ = [
    "add_numbers",
    "cpu_intensive",
    "failing",
    "large_array_sum",
    "noop",
    "resize_image",
    "reverse_string",
    "sleep",
]
