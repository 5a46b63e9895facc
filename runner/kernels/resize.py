"""Resampling uint8 images (bilinear and area): the numpy twin, and the loader of ``_resize``.

Images are ``(height, width, channels)`` C-contiguous uint8 arrays. Contract (both builds, any thread
count, bit for bit):

* **bilinear** uses pixel centres: output pixel ``x`` samples the source at ``(x + 0.5) * width /
  target_width) - 0.5`` (that grouping), clamped to ``[0, width - 1]``; ``x0 = floor``, ``x1 = min(x0 + 1, width - 1)``,
  ``fx = pos - x0`` (the weights come from :func:`bilinear_axis`, shared by both builds). Each value is
  ``top = p[y0, x0] * (1 - fx) + p[y0, x1] * fx``, ``bottom`` likewise on row y1, ``v = top * (1 - fy) +
  bottom * fy`` in float64, in that order, then ``floor(v + 0.5)`` clipped to 0..255.
* **area** averages the source over the output pixel's footprint, each source pixel weighted by the
  part of it the footprint covers, and rounds half up. Scaled by ``target`` per axis, every overlap is
  an integer (source pixel j spans ``[j*T, (j+1)*T)``, output pixel i spans ``[i*W, (i+1)*W)``), so the
  weighted sum ``S`` is an exact integer and the value is ``floor(S / (W*H) + 1/2) = (2S + W*H) //
  (2*W*H)``: exact, whatever the order of the sums. It is also right when enlarging.

The twin is vectorised numpy: bilinear gathers the two source rows and columns each output needs,
area integrates the step function of each axis with an integer cumulative sum. The compiled build
walks output rows in parallel (``prange``); area keeps one row of vertical sums per thread. On
x86-64-v3 CPUs the loader takes ``_resize_v3``, the same source compiled for AVX2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.kernels import check_threads, cpu_has_x86_64_v3, extension

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Image = npt.NDArray[np.uint8]
    IndexArray = npt.NDArray[np.intp]
    FloatArray = npt.NDArray[np.float64]

__all__ = [
    "BUILD",
    "COMPILED",
    "area_weights",
    "bilinear_axis",
    "py_resize_area",
    "py_resize_bilinear",
    "resize",
    "resize_area",
    "resize_bilinear",
]

_ext = (extension("_resize_v3") if cpu_has_x86_64_v3() else None) or extension("_resize")
COMPILED = _ext is not None
"""True when the compiled build runs."""
BUILD = _ext.__name__.rsplit(".", 1)[1] if _ext is not None else "python"
"""Which build runs: ``_resize_v3`` (x86-64-v3 CPUs), ``_resize`` or ``python``."""


def bilinear_axis(size: int, target: int) -> tuple[IndexArray, IndexArray, FloatArray]:
    """``(lo, hi, frac)`` per output position along an axis of ``size`` source pixels."""
    import numpy as np

    pos = (np.arange(target, dtype=np.float64) + 0.5) * (size / target) - 0.5
    pos = np.clip(pos, 0.0, size - 1)
    lo = np.floor(pos).astype(np.intp)
    hi = np.minimum(lo + 1, size - 1)
    return lo, hi, pos - lo


def area_weights(size: int, target: int) -> tuple[IndexArray, IndexArray, npt.NDArray[np.int64]]:
    """The integer overlaps of each output pixel with the source pixels (CSR form).

    Returns ``(start, offsets, weights)``: output i covers source pixels ``start[i] ..`` with weights
    ``weights[offsets[i]:offsets[i + 1]]`` (in units of 1/target of a pixel, summing to ``size``).
    """
    import numpy as np

    starts, offsets, weights = [], [0], []
    for i in range(target):
        lo, hi = i * size, (i + 1) * size
        first = lo // target
        starts.append(first)
        j = first
        while j * target < hi:
            weights.append(min(hi, (j + 1) * target) - max(lo, j * target))
            j += 1
        offsets.append(len(weights))
    return np.array(starts, dtype=np.intp), np.array(offsets, dtype=np.intp), np.array(weights, dtype=np.int64)


def py_resize_bilinear(image: Image, target_width: int, target_height: int, threads: int = 1) -> Image:
    """Bilinear resampling (numpy); see the module docstring for the exact arithmetic."""
    import numpy as np

    _check(image, target_width, target_height, threads)
    height, width = image.shape[:2]
    y0, y1, fy = bilinear_axis(height, target_height)
    x0, x1, fx = bilinear_axis(width, target_width)
    rows0, rows1 = image[y0], image[y1]  # only the source rows the output needs, still uint8
    wx = fx[None, :, None]
    top = rows0[:, x0].astype(np.float64) * (1.0 - wx) + rows0[:, x1].astype(np.float64) * wx
    bottom = rows1[:, x0].astype(np.float64) * (1.0 - wx) + rows1[:, x1].astype(np.float64) * wx
    wy = fy[:, None, None]
    out: Image = np.clip(np.floor(top * (1.0 - wy) + bottom * wy + 0.5), 0, 255).astype(np.uint8)
    return out


def py_resize_area(image: Image, target_width: int, target_height: int, threads: int = 1) -> Image:
    """Area resampling (numpy, exact integers); see the module docstring."""
    import numpy as np

    _check(image, target_width, target_height, threads)
    height, width = image.shape[:2]
    sums = _area_axis(image.astype(np.int64), axis=1, target=target_width)
    sums = _area_axis(sums, axis=0, target=target_height)
    scale = width * height
    out: Image = ((2 * sums + scale) // (2 * scale)).astype(np.uint8)
    return out


def _area_axis(src: npt.NDArray[np.int64], axis: int, target: int) -> npt.NDArray[np.int64]:
    """Footprint sums along ``axis``, in units of 1/target: ``F(e_{i+1}) - F(e_i)`` with ``e_i = i * size``.

    ``F(t) = target * C[t // target] + (t % target) * src[t // target]`` integrates the step function
    (``C`` the cumulative sum) up to ``t / target`` pixels, scaled by ``target``: all integers.
    """
    import numpy as np

    size = src.shape[axis]
    moved = np.moveaxis(src, axis, 0)
    cumulative = np.concatenate([np.zeros((1, *moved.shape[1:]), dtype=np.int64), np.cumsum(moved, axis=0)])
    edges = np.arange(target + 1, dtype=np.int64) * size
    whole, part = edges // target, edges % target
    shape = (-1, *([1] * (moved.ndim - 1)))
    integral = target * cumulative[whole] + part.reshape(shape) * moved[np.minimum(whole, size - 1)]
    return np.moveaxis(integral[1:] - integral[:-1], 0, axis)


def resize_bilinear(image: Image, target_width: int, target_height: int, threads: int = 1) -> Image:
    """Bilinear resampling over ``threads`` threads."""
    if _ext is not None:
        out: Image = _ext.resize_bilinear(image, target_width, target_height, threads)
        return out
    return py_resize_bilinear(image, target_width, target_height, threads)


def resize_area(image: Image, target_width: int, target_height: int, threads: int = 1) -> Image:
    """Area resampling over ``threads`` threads."""
    if _ext is not None:
        out: Image = _ext.resize_area(image, target_width, target_height, threads)
        return out
    return py_resize_area(image, target_width, target_height, threads)


def resize(image: Image, target_width: int, target_height: int, method: str, threads: int = 1) -> Image:
    """``resize_bilinear`` or ``resize_area`` by name.

    Raises:
        ValueError: an unknown method, a bad image or size.
    """
    impl: dict[str, Any] = {"bilinear": resize_bilinear, "area": resize_area}
    if method not in impl:
        raise ValueError(f"method must be 'bilinear' or 'area', got {method!r}")
    out: Image = impl[method](image, target_width, target_height, threads)
    return out


def _check(image: object, target_width: int, target_height: int, threads: int) -> None:
    check_threads(threads)
    shape = getattr(image, "shape", ())
    if len(shape) != 3 or str(getattr(image, "dtype", "")) != "uint8" or min(shape) < 1:
        raise ValueError(f"image must be a non-empty (height, width, channels) uint8 array, got {shape}")
    if target_width < 1 or target_height < 1:
        raise ValueError(f"target size must be >= 1 x 1, got {target_width} x {target_height}")
