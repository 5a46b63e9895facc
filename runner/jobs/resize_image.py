"""``resize_image``: resample a raw uint8 image with bilinear or area interpolation (numpy).

Payload: ``width``, ``height``, ``channels`` (1, 3 or 4; default 3), ``target_width``,
``target_height``, ``method`` ("bilinear" default, or "area"), ``pixels_b64`` (row-major
height x width x channels uint8, base64; absent -> :func:`test_pattern`), ``return_pixels``.
Result: ``{"width", "height", "channels", "checksum"}`` where checksum is the sha256 hex digest of
the output bytes, plus ``"pixels_b64"`` when ``return_pixels`` is true.

Conventions (so that any implementation can be checked against this one):

* bilinear uses pixel centres: output pixel ``x`` samples source ``(x + 0.5) * width / target_width
  - 0.5``, clamped to the image, and mixes the two neighbours on each axis;
* area averages the source over the output pixel's footprint, each source pixel weighted by the
  fraction of it the footprint covers (it is also correct when enlarging);
* values round half up and clip to 0..255.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import TYPE_CHECKING, Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.errors import JobFailed
from runner.payload import as_int
from runner.registry import JobContext, JobType, register

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
    ByteArray = npt.NDArray[np.uint8]


def test_pattern(width: int, height: int, channels: int) -> ByteArray:
    """The deterministic image used when no pixels are given: ``(7x + 13y + 85c) mod 256``."""
    import numpy as np

    y, x, c = np.ogrid[0:height, 0:width, 0:channels]
    image: ByteArray = ((7 * x + 13 * y + 85 * c) % 256).astype(np.uint8)
    return image


def resize_bilinear(image: ByteArray, target_width: int, target_height: int) -> ByteArray:
    """Bilinear resampling of an (h, w, c) uint8 image with pixel-centre alignment."""
    import numpy as np

    height, width = image.shape[:2]
    y0, y1, fy = _bilinear_axis(height, target_height)
    x0, x1, fx = _bilinear_axis(width, target_width)
    src = image.astype(np.float64)
    wx = fx[None, :, None]
    top = src[y0][:, x0] * (1.0 - wx) + src[y0][:, x1] * wx
    bottom = src[y1][:, x0] * (1.0 - wx) + src[y1][:, x1] * wx
    wy = fy[:, None, None]
    return _to_uint8(top * (1.0 - wy) + bottom * wy)


def resize_area(image: ByteArray, target_width: int, target_height: int) -> ByteArray:
    """Area (box) resampling of an (h, w, c) uint8 image: exact coverage-weighted means."""
    import numpy as np

    out = _area_axis(image.astype(np.float64), axis=1, target=target_width)
    out = _area_axis(out, axis=0, target=target_height)
    return _to_uint8(out)


def _bilinear_axis(size: int, target: int) -> tuple[Any, Any, FloatArray]:
    import numpy as np

    pos = (np.arange(target, dtype=np.float64) + 0.5) * (size / target) - 0.5
    pos = np.clip(pos, 0.0, size - 1)
    lo = np.floor(pos).astype(np.intp)
    hi = np.minimum(lo + 1, size - 1)
    return lo, hi, pos - lo


def _area_axis(src: FloatArray, axis: int, target: int) -> FloatArray:
    """Average ``src`` over ``target`` equal footprints along ``axis``.

    The source along the axis is a step function; its integral up to position t is
    ``C[floor(t)] + frac(t) * src[floor(t)]`` with ``C`` the cumulative sum, so each footprint's mean
    is a difference of two integrals divided by its length.
    """
    import numpy as np

    size = src.shape[axis]
    moved = np.moveaxis(src, axis, 0)
    cumulative = np.concatenate([np.zeros((1, *moved.shape[1:])), np.cumsum(moved, axis=0)])
    edges = np.arange(target + 1, dtype=np.float64) * (size / target)
    edges[-1] = size  # exact, whatever the rounding of the last product
    whole = np.minimum(np.floor(edges).astype(np.intp), size)
    frac = edges - whole
    nxt = np.minimum(whole, size - 1)
    integral = cumulative[whole] + frac.reshape(-1, *([1] * (moved.ndim - 1))) * moved[nxt]
    means = (integral[1:] - integral[:-1]) / (size / target)
    return np.moveaxis(means, 0, axis)


def _to_uint8(values: FloatArray) -> ByteArray:
    import numpy as np

    return np.clip(np.floor(values + 0.5), 0, 255).astype(np.uint8)


@register
class ResizeImage(JobType):
    """Resize a raw uint8 image (bilinear or area); returns its size and a sha256 checksum."""

    name = "resize_image"
    schema = BUILTIN_SCHEMAS["resize_image"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Resample the image and return its dimensions and checksum (and pixels when asked)."""
        import numpy as np

        width = as_int(payload["width"], "width")
        height = as_int(payload["height"], "height")
        channels = as_int(payload.get("channels", 3), "channels")
        target_width = as_int(payload["target_width"], "target_width")
        target_height = as_int(payload["target_height"], "target_height")
        method = payload.get("method", "bilinear")
        if channels not in (1, 3, 4):
            raise JobFailed("INVALID_PAYLOAD", f"channels: {channels} is not one of 1, 3, 4")
        if min(width, height, target_width, target_height) < 1:
            raise JobFailed("INVALID_PAYLOAD", "width, height, target_width, target_height: must be >= 1")
        if method not in ("bilinear", "area"):
            raise JobFailed("INVALID_PAYLOAD", f"method: {method!r} is not 'bilinear' or 'area'")
        if "pixels_b64" in payload:
            try:
                raw = base64.b64decode(payload["pixels_b64"], validate=True)
            except (binascii.Error, ValueError, TypeError) as exc:
                raise JobFailed("INVALID_PAYLOAD", f"pixels_b64: not base64 ({exc})") from None
            expected = width * height * channels
            if len(raw) != expected:
                raise JobFailed(
                    "INVALID_PAYLOAD",
                    f"pixels_b64: {len(raw)} bytes, expected width*height*channels = {expected}",
                )
            image = np.frombuffer(raw, dtype=np.uint8).reshape(height, width, channels)
        else:
            image = test_pattern(width, height, channels)
        resize = resize_area if method == "area" else resize_bilinear
        out = np.ascontiguousarray(resize(image, target_width, target_height))
        data = out.tobytes()
        result: dict[str, Any] = {
            "width": target_width,
            "height": target_height,
            "channels": channels,
            "checksum": hashlib.sha256(data).hexdigest(),
        }
        if payload.get("return_pixels"):
            result["pixels_b64"] = base64.b64encode(data).decode("ascii")
        return result
