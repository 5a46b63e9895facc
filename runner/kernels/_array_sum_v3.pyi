"""Typed surface of ``runner.kernels._array_sum_v3``, the x86-64-v3 build of ``_array_sum``."""

import numpy as np
import numpy.typing as npt

def sum_int64(values: npt.NDArray[np.int64], threads: int = 1) -> int: ...
def sum_float64(values: npt.NDArray[np.float64], threads: int = 1) -> float: ...
