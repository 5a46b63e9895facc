"""``monte_carlo_pi``: estimate pi from seeded random points (reproducible for any thread count).

Payload ``{"samples": int, "seed"?: int}`` (seed default 0). Result ``{"pi": 4 * inside / samples,
"inside": int, "samples": int, "seed": int}``; the points are defined in :mod:`runner.kernels.monte_carlo`.
"""

from __future__ import annotations

from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.kernels.monte_carlo import count_inside
from runner.payload import as_int
from runner.registry import JobContext, JobType, register


@register
class MonteCarloPi(JobType):
    """Estimate pi from seeded random points in the unit square."""

    name = "monte_carlo_pi"
    schema = BUILTIN_SCHEMAS["monte_carlo_pi"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Count the samples inside the quarter circle over ``ctx.threads`` threads."""
        samples = as_int(payload["samples"], "samples")
        seed = as_int(payload.get("seed", 0), "seed")
        inside = count_inside(seed, samples, ctx.threads)
        return {"pi": 4 * inside / samples, "inside": inside, "samples": samples, "seed": seed}
