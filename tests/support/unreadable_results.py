"""A job type whose results a ``google.protobuf.Struct`` cannot carry (load with ``--import
tests.support.unreadable_results``).

* ``unreadable`` {"kind"}: returns the value :data:`RESULTS` names; ``"fine"`` is a result near the
  limits that a Struct still carries (an integer beyond 2**53 but within a double's range, an emoji,
  which JSON writes as a surrogate pair).
"""

from __future__ import annotations

from typing import Any

from runner.registry import JobContext, JobType, register

RESULTS: dict[str, dict[str, Any]] = {
    "big_int": {"x": 10**400},
    "big_negative_in_list": {"xs": [1, 2, -(10**309)]},
    "surrogate": {"s": "\ud800x"},
    "surrogate_key": {"ok": {"\udcff": 1}},
    "fine": {"big": 2**60, "emoji": "\U0001f600", "near": 10**308},
}
"""kind -> the result returned."""

FIELDS = {
    "big_int": "result.x",
    "big_negative_in_list": "result.xs[2]",
    "surrogate": "result.s",
    "surrogate_key": "result.ok (key '\\udcff')",
}
"""kind -> the path its error names."""


@register
class Unreadable(JobType):
    """Return the result its payload's ``kind`` names."""

    name = "unreadable"
    schema = {"type": "object", "properties": {"kind": {"enum": sorted(RESULTS)}}, "required": ["kind"]}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        return RESULTS[payload["kind"]]
