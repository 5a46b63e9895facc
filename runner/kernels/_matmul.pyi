"""Typed surface of the compiled ``runner.kernels._matmul`` (contract in matmul.py)."""

import numpy as np
import numpy.typing as npt

def matmul(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64], threads: int = 1) -> npt.NDArray[np.float64]: ...
