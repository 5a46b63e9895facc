"""float64 matrix product: the Python twin, and the loader of ``_matmul``.

Contract (both builds, any thread count, bit for bit): ``C = A @ B`` for an (m, k) and a (k, n) float64
matrix, where every element is the sequential sum ``c = 0.0; for t in range(k): c += a[i, t] * b[t, j]``
with each product and each sum rounded (no fused multiply-add). That fixes the rounding, so the
compiled build equals the twin exactly; BLAS (numpy's ``@``) sums in another order and differs in the
last bits.

The twin adds one outer product per ``t`` (``C += outer(A[:, t], B[t, :])``: k numpy passes, the same
order per element). The compiled build packs B into panels of 4 columns, splits the rows of C into
slabs of 64 that threads take in turn, and keeps a 4 x 4 block of C in registers across the whole
k loop (blocked for the L1 and L2 caches, never reordering a sum).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.kernels import check_threads, extension

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Matrix = npt.NDArray[np.float64]

__all__ = ["COMPILED", "matmul", "matmul_reference", "py_matmul"]

_ext = extension("_matmul")
COMPILED = _ext is not None
"""True when the compiled build runs."""


def matmul_reference(a: list[list[float]], b: list[list[float]], n: int) -> list[list[float]]:
    """The definition in plain Python lists, for a (k, n) ``b`` (slow; for tests)."""
    k = len(b)
    out = []
    for row in a:
        out_row = []
        for j in range(n):
            c = 0.0
            for t in range(k):
                c += row[t] * b[t][j]
            out_row.append(c)
        out.append(out_row)
    return out


def py_matmul(a: Matrix, b: Matrix, threads: int = 1) -> Matrix:
    """``A @ B`` by k outer products (numpy), bit-identical to the compiled build."""
    import numpy as np

    check_threads(threads)
    _check(a, b)
    out: Matrix = np.zeros((a.shape[0], b.shape[1]), dtype=np.float64)
    for t in range(a.shape[1]):
        out += np.multiply.outer(a[:, t], b[t, :])
    return out


def matmul(a: Matrix, b: Matrix, threads: int = 1) -> Matrix:
    """``A @ B`` (see the module docstring), over ``threads`` threads."""
    if _ext is not None:
        result: Matrix = _ext.matmul(a, b, threads)
        return result
    return py_matmul(a, b, threads)


def _check(a: object, b: object) -> None:
    for name, m in (("a", a), ("b", b)):
        if getattr(m, "ndim", None) != 2 or str(getattr(m, "dtype", "")) != "float64":
            raise ValueError(f"{name} must be a 2-D float64 array")
    shape_a = getattr(a, "shape", (0, 0))
    shape_b = getattr(b, "shape", (0, 0))
    if shape_a[1] != shape_b[0]:
        raise ValueError(f"shapes {tuple(shape_a)} and {tuple(shape_b)} do not multiply")
