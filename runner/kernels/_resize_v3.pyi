"""Typed surface of ``runner.kernels._resize_v3``, the x86-64-v3 build of ``_resize`` (contract in resize.py)."""

import numpy as np
import numpy.typing as npt

def resize_bilinear(
    image: npt.NDArray[np.uint8], target_width: int, target_height: int, threads: int = 1
) -> npt.NDArray[np.uint8]: ...
def resize_area(
    image: npt.NDArray[np.uint8], target_width: int, target_height: int, threads: int = 1
) -> npt.NDArray[np.uint8]: ...
