"""``matmul``: a float64 matrix product (blocked, compiled, over ``thread_demand`` threads).

Payload, exactly one form:

* generated: ``{"n": int, "m"?: int, "k"?: int, "seed"?: int}``: an (m x k) A times a (k x n) B, m and k
  defaulting to n, filled by :func:`generate` with seeded uniform values in [-1, 1);
* given: ``{"a_b64": npy, "b_b64": npy}``: two 2-D float64 ``.npy`` files (base64) whose shapes multiply.

``"return_matrix": true`` adds the product as ``"c_b64"`` (a base64 ``.npy``). Result:
``{"rows", "cols", "inner", "checksum", "sum"}``: checksum is the sha256 of C's bytes (float64,
little-endian, row-major) and sum the correctly rounded sum of its elements. The summation order is
fixed (see :mod:`runner.kernels.matmul`), so the checksum is the same for any thread count.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.arrays import decode_npy, encode_npy
from runner.errors import JobFailed
from runner.kernels.array_sum import sum_float64
from runner.kernels.hash_rounds import GOLDEN
from runner.kernels.matmul import matmul
from runner.payload import as_int
from runner.registry import JobContext, JobType, register

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


def generate(rows: int, cols: int, seed: int, first: int = 1) -> npt.NDArray[np.float64]:
    """A (rows x cols) matrix of SplitMix64 outputs ``first, first + 1, ...`` of ``seed``, as ``2u - 1``.

    ``u = (r >> 11) * 2**-53`` is uniform in [0, 1); A takes outputs 1 .. m*k and B the ones after.
    """
    import numpy as np

    k = np.arange(first, first + rows * cols, dtype=np.uint64)
    z = np.uint64(seed) + k * np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    values = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53 * 2.0 - 1.0
    return values.reshape(rows, cols)


@register
class Matmul(JobType):
    """Multiply two float64 matrices (generated from a seed, or given as .npy)."""

    name = "matmul"
    schema = BUILTIN_SCHEMAS["matmul"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Compute C = A @ B over ``ctx.threads`` threads and describe it."""
        import numpy as np

        if "a_b64" in payload:
            a = decode_npy(payload["a_b64"], "a_b64", ("float64",), ndim=2)
            b = decode_npy(payload.get("b_b64"), "b_b64", ("float64",), ndim=2)
            if a.shape[1] != b.shape[0]:
                raise JobFailed("INVALID_PAYLOAD", f"b_b64: shape {b.shape} does not follow a_b64's {a.shape}")
            for field, matrix in (("a_b64", a), ("b_b64", b)):
                if not np.isfinite(matrix).all():
                    raise JobFailed("INVALID_PAYLOAD", f"{field}: holds NaN or infinity")
        else:
            n = as_int(payload["n"], "n")
            m = as_int(payload.get("m", n), "m")
            k = as_int(payload.get("k", n), "k")
            seed = as_int(payload.get("seed", 0), "seed")
            a = generate(m, k, seed)
            b = generate(k, n, seed, first=1 + m * k)
        c = matmul(a, b, ctx.threads)
        try:
            total = sum_float64(c.reshape(-1), ctx.threads)
        except (ValueError, OverflowError):
            raise JobFailed("OVERFLOW", "the product has elements beyond the float64 range") from None
        result: dict[str, Any] = {
            "rows": int(c.shape[0]),
            "cols": int(c.shape[1]),
            "inner": int(a.shape[1]),
            "checksum": hashlib.sha256(c.astype("<f8").tobytes()).hexdigest(),
            "sum": total,
        }
        if payload.get("return_matrix"):
            result["c_b64"] = encode_npy(c)
        return result
