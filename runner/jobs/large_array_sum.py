"""``large_array_sum``: the exact sum of an int64 or float64 array, from JSON or a binary ``.npy``.

Payload: exactly one of ``numbers`` (a JSON list; ``dtype`` says how to read it, default ``int64``)
and ``array_b64`` (the base64 of a 1-D int64 or float64 ``.npy`` file, see :mod:`runner.arrays`);
``on_overflow`` (``"exact"`` default, or ``"error"``).

Result:

* from ``numbers``: ``{"sum": s}``, plus ``"sum_text": str(s)`` when an int64 sum is beyond ±2**53;
* from ``array_b64``: ``{"sum": s, "sum_text": str(s), "count": n, "dtype": "int64" | "float64"}``, where
  ``sum_text`` is the exact value as text (a Struct carries numbers as doubles, exact only to 2**53)
  and, for int64, ``"fits_int64": bool``.

An int64 sum is exact, never wrapped: a sum outside the int64 range is returned whole with
``on_overflow: "exact"`` and fails with code ``OVERFLOW`` with ``on_overflow: "error"``. A float64 sum
is correctly rounded; one beyond the float64 range fails with ``OVERFLOW``. Threads: ``thread_demand``.
"""

from __future__ import annotations

from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.arrays import decode_npy, numbers_to_array
from runner.errors import JobFailed
from runner.kernels.array_sum import fits_int64, sum_float64, sum_int64
from runner.payload import exact_int
from runner.registry import JobContext, JobType, register


@register
class LargeArraySum(JobType):
    """Sum an int64 or float64 array exactly (JSON list or base64 .npy)."""

    name = "large_array_sum"
    schema = BUILTIN_SCHEMAS["large_array_sum"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Sum the array over ``ctx.threads`` threads; see the module docstring for the result."""
        dtype = payload.get("dtype")
        if dtype not in (None, "int64", "float64"):
            raise JobFailed("INVALID_PAYLOAD", f"dtype: {dtype!r} is not 'int64' or 'float64'")
        binary = "array_b64" in payload
        if binary:
            array = decode_npy(payload["array_b64"], "array_b64", ("int64", "float64"), ndim=1)
            if dtype is not None and array.dtype.name != dtype:
                raise JobFailed("INVALID_PAYLOAD", f"dtype: {dtype!r} does not match the array's {array.dtype.name}")
        else:
            array = numbers_to_array(payload["numbers"], "numbers", dtype or "int64")
        total: int | float
        if array.dtype.name == "int64":
            total = sum_int64(array, ctx.threads)
            if not fits_int64(total) and payload.get("on_overflow") == "error":
                raise JobFailed("OVERFLOW", f"the sum {total} is outside the int64 range")
        else:
            try:
                total = sum_float64(array, ctx.threads)
            except OverflowError as exc:
                raise JobFailed("OVERFLOW", f"the float64 sum overflows: {exc}") from None
            except ValueError as exc:
                raise JobFailed("INVALID_PAYLOAD", f"{'array_b64' if binary else 'numbers'}: {exc}") from None
        if not binary:
            return exact_int("sum", total) if isinstance(total, int) else {"sum": total}
        result: dict[str, Any] = {"sum": total, "sum_text": repr(total), "count": int(array.size)}
        result["dtype"] = array.dtype.name
        if isinstance(total, int):
            result["fits_int64"] = fits_int64(total)
        return result
