"""Typed surface of the compiled ``runner.kernels._resize`` (contract in resize.py)."""

import numpy as np
import numpy.typing as npt

def resize_bilinear(
    image: npt.NDArray[np.uint8], target_width: int, target_height: int, threads: int = 1
) -> npt.NDArray[np.uint8]: ...
def resize_area(
    image: npt.NDArray[np.uint8], target_width: int, target_height: int, threads: int = 1
) -> npt.NDArray[np.uint8]: ...
