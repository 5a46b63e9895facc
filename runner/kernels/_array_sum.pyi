"""Typed surface of the compiled ``runner.kernels._array_sum`` (contract in array_sum.py)."""

import numpy as np
import numpy.typing as npt

def sum_int64(values: npt.NDArray[np.int64], threads: int = 1) -> int: ...
def sum_float64(values: npt.NDArray[np.float64], threads: int = 1) -> float: ...
