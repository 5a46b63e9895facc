"""Exact sums of 1-D int64 and float64 arrays: the Python twin, and the loader of ``_array_sum``.

Contract (both builds, any thread count, bit for bit):

* :func:`sum_int64` is the exact integer sum, a Python ``int`` of any size: it never wraps. Whether it
  fits in int64 is the caller's question (:func:`fits_int64`); ``large_array_sum`` reports it.
* :func:`sum_float64` is the exact sum *correctly rounded* to a float64 (as :func:`math.fsum`; a zero
  sum is ``+0.0``). The order of the terms and the number of threads cannot change it.

Raises (both): ``ValueError`` for NaN or infinity in the input or ``threads < 1``; ``OverflowError``
(float64) when the correctly rounded sum is beyond the float64 range.

The compiled build splits the array into one contiguous chunk per thread (more for arrays beyond 2**30
elements). An int64 chunk keeps three unsigned 64-bit accumulators, the sums of the low 32-bit halves,
of the high halves and of the sign bits, so that ``sum = hi * 2**32 + lo - neg * 2**64`` exactly and the
loop stays a plain vectorisable add. A float64 chunk adds every term as an integer multiple of 2**-1074
into 68 limbs of 32 bits (a "superaccumulator"); the chunks' limbs are combined as Python ints and
divided by 2**1074 once, which Python rounds correctly. On x86-64-v3 CPUs the loader takes
``_array_sum_v3``, the same source compiled for AVX2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from runner.kernels import check_threads, cpu_has_x86_64_v3, extension

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "BUILD",
    "COMPILED",
    "INT64_MAX",
    "INT64_MIN",
    "array_sum",
    "fits_int64",
    "py_sum_float64",
    "py_sum_int64",
    "sum_float64",
    "sum_int64",
]

INT64_MIN = -(2**63)
"""The smallest int64."""
INT64_MAX = 2**63 - 1
"""The largest int64."""

_ext = (extension("_array_sum_v3") if cpu_has_x86_64_v3() else None) or extension("_array_sum")
COMPILED = _ext is not None
"""True when the compiled build runs."""
BUILD = _ext.__name__.rsplit(".", 1)[1] if _ext is not None else "python"
"""Which build runs: ``_array_sum_v3`` (x86-64-v3 CPUs), ``_array_sum`` or ``python``."""


def py_sum_int64(values: npt.NDArray[np.int64], threads: int = 1) -> int:
    """The exact sum of a 1-D int64 array, in Python ints (``threads`` is checked, then ignored)."""
    check_threads(threads)
    _check_1d(values, "int64")
    return sum(values.tolist())


def py_sum_float64(values: npt.NDArray[np.float64], threads: int = 1) -> float:
    """The correctly rounded sum of a 1-D float64 array (``threads`` is checked, then ignored)."""
    check_threads(threads)
    _check_1d(values, "float64")
    items = values.tolist()
    if not all(map(math.isfinite, items)):
        raise ValueError("values must be finite (no NaN or infinity)")
    try:
        total = math.fsum(items)
    except OverflowError:  # fsum gives up when a partial sum overflows; the exact sum may still fit
        total = float(sum(map(Fraction, items)))  # raises OverflowError when it does not
    if math.isinf(total):
        raise OverflowError("the sum is beyond the float64 range")
    return total


def sum_int64(values: npt.NDArray[np.int64], threads: int = 1) -> int:
    """The exact sum of a 1-D int64 array over ``threads`` threads (see the module docstring)."""
    if _ext is not None:
        return int(_ext.sum_int64(values, threads))
    return py_sum_int64(values, threads)


def sum_float64(values: npt.NDArray[np.float64], threads: int = 1) -> float:
    """The correctly rounded sum of a 1-D float64 array over ``threads`` threads."""
    if _ext is not None:
        return float(_ext.sum_float64(values, threads))
    return py_sum_float64(values, threads)


def fits_int64(value: int) -> bool:
    """Whether ``value`` is in the int64 range (an int64 accumulator would not have overflowed)."""
    return INT64_MIN <= value <= INT64_MAX


def array_sum(values: Sequence[int], threads: int = 1) -> int:
    """The exact sum of a sequence of Python ints (any size); int64 ranges go through the kernel."""
    import numpy as np

    check_threads(threads)
    try:
        array = np.fromiter(values, dtype=np.int64, count=len(values))
    except OverflowError:  # an element beyond int64: Python ints are exact anyway
        return sum(values)
    return sum_int64(array, threads)


def _check_1d(values: object, dtype: str) -> None:
    shape = getattr(values, "shape", None)
    kind = str(getattr(values, "dtype", ""))
    if shape is None or len(shape) != 1 or kind != dtype:
        raise ValueError(f"values must be a 1-D {dtype} array, got {kind or type(values).__name__} {shape}")
