"""``resize_image``: resample an image (bilinear or area) given as raw pixels or as a PNG file.

Payload: ``target_width``, ``target_height``, ``method`` ("bilinear" default, or "area"), and the image:

* raw: ``width``, ``height``, ``channels`` (1, 3 or 4; default 3) and ``pixels_b64`` (row-major
  height x width x channels uint8, base64); without ``pixels_b64`` the image is :func:`test_pattern`;
* PNG: ``png_b64`` (its header gives the size; gray, RGB, RGBA and palette images, 8-bit).

Result: ``{"width", "height", "channels", "checksum"}``, where checksum is the sha256 hex digest of the
output's raw pixel bytes (so it does not depend on the output format), plus the image when
``return_pixels`` is true: ``"pixels_b64"`` (raw) or ``"png_b64"`` (PNG), as ``output_format`` says
(default: the input's form). The resampling arithmetic is :mod:`runner.kernels.resize`'s (compiled,
over ``thread_demand`` threads).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import TYPE_CHECKING, Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.errors import JobFailed
from runner.kernels.resize import resize
from runner.payload import as_int
from runner.png import decode_png, encode_png
from runner.registry import JobContext, JobType, register

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    ByteArray = npt.NDArray[np.uint8]


def test_pattern(width: int, height: int, channels: int) -> ByteArray:
    """The deterministic image used when no pixels are given: ``(7x + 13y + 85c) mod 256``."""
    import numpy as np

    y, x, c = np.ogrid[0:height, 0:width, 0:channels]
    image: ByteArray = ((7 * x + 13 * y + 85 * c) % 256).astype(np.uint8)
    return image


def _b64(payload: dict[str, Any], field: str) -> bytes:
    try:
        return base64.b64decode(payload[field], validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise JobFailed("INVALID_PAYLOAD", f"{field}: not base64 ({exc})") from None


def read_image(payload: dict[str, Any]) -> ByteArray:
    """The input image as a (height, width, channels) uint8 array.

    Raises:
        JobFailed: ``INVALID_PAYLOAD`` naming the field (sizes, channels, base64, PNG, pixel count).
    """
    import numpy as np

    if "png_b64" in payload:
        return decode_png(_b64(payload, "png_b64"))
    width = as_int(payload["width"], "width")
    height = as_int(payload["height"], "height")
    channels = as_int(payload.get("channels", 3), "channels")
    if channels not in (1, 3, 4):
        raise JobFailed("INVALID_PAYLOAD", f"channels: {channels} is not one of 1, 3, 4")
    if min(width, height) < 1:
        raise JobFailed("INVALID_PAYLOAD", "width, height: must be >= 1")
    if "pixels_b64" not in payload:
        return test_pattern(width, height, channels)
    raw = _b64(payload, "pixels_b64")
    expected = width * height * channels
    if len(raw) != expected:
        raise JobFailed("INVALID_PAYLOAD", f"pixels_b64: {len(raw)} bytes, expected width*height*channels = {expected}")
    return np.frombuffer(raw, dtype=np.uint8).reshape(height, width, channels)


@register
class ResizeImage(JobType):
    """Resize an image (raw pixels or PNG; bilinear or area); returns its size, checksum and pixels."""

    name = "resize_image"
    schema = BUILTIN_SCHEMAS["resize_image"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Resample the image and return its dimensions and checksum (and the image when asked)."""
        target_width = as_int(payload["target_width"], "target_width")
        target_height = as_int(payload["target_height"], "target_height")
        method = payload.get("method", "bilinear")
        if method not in ("bilinear", "area"):
            raise JobFailed("INVALID_PAYLOAD", f"method: {method!r} is not 'bilinear' or 'area'")
        if min(target_width, target_height) < 1:
            raise JobFailed("INVALID_PAYLOAD", "target_width, target_height: must be >= 1")
        image = read_image(payload)
        out = resize(image, target_width, target_height, method, ctx.threads)
        data = out.tobytes()
        result: dict[str, Any] = {
            "width": target_width,
            "height": target_height,
            "channels": int(out.shape[2]),
            "checksum": hashlib.sha256(data).hexdigest(),
        }
        if payload.get("return_pixels"):
            form = payload.get("output_format", "png" if "png_b64" in payload else "raw")
            if form == "png":
                result["png_b64"] = base64.b64encode(encode_png(out)).decode("ascii")
            else:
                result["pixels_b64"] = base64.b64encode(data).decode("ascii")
        return result
