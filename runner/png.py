"""PNG in and out of ``resize_image``: decoding to a (height, width, channels) uint8 array and back.

Decoding uses Pillow. Modes map to the channel counts the resamplers take: ``L`` -> 1, ``RGB`` -> 3,
``RGBA`` -> 4; ``1`` (bilevel) becomes ``L``; ``LA`` and palette images with transparency become
``RGBA``, other palette images ``RGB``. 16-bit and floating-point images are refused (the kernels
are 8-bit), and so is anything larger than :data:`MAX_SIDE` pixels a side, checked from the header
before any pixel is decoded.
"""

from __future__ import annotations

import io
import warnings
from typing import TYPE_CHECKING

from runner.errors import JobFailed

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["MAX_SIDE", "decode_png", "encode_png"]

MAX_SIDE = 16384
"""The largest width or height accepted (the resize_image schema's limit)."""

_CONVERT = {"1": "L", "L": "L", "RGB": "RGB", "RGBA": "RGBA", "LA": "RGBA"}


def decode_png(data: bytes, field: str = "png_b64") -> npt.NDArray[np.uint8]:
    """The pixels of a PNG file as a C-contiguous (height, width, channels) uint8 array.

    Raises:
        JobFailed: ``INVALID_PAYLOAD`` naming ``field``: not a PNG, truncated or corrupt, too large,
            or a mode with no 8-bit channels.
    """
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit applies
            image = Image.open(io.BytesIO(data), formats=["PNG"])
            width, height = image.size
            if width > MAX_SIDE or height > MAX_SIDE:
                raise JobFailed("INVALID_PAYLOAD", f"{field}: {width}x{height} is larger than {MAX_SIDE} a side")
            mode = image.mode
            if mode == "P":
                target = "RGBA" if "transparency" in image.info else "RGB"
            elif mode in _CONVERT:
                target = _CONVERT[mode]
            else:
                raise JobFailed("INVALID_PAYLOAD", f"{field}: PNG mode {mode!r} is not 8-bit gray, RGB or RGBA")
            image.load()
            converted: Image.Image = image if image.mode == target else image.convert(target)
            pixels = np.asarray(converted, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise JobFailed("INVALID_PAYLOAD", f"{field}: not a readable PNG ({exc})") from None
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return np.ascontiguousarray(pixels)


def encode_png(pixels: npt.NDArray[np.uint8]) -> bytes:
    """A PNG file of a (height, width, channels) uint8 array with 1, 3 or 4 channels."""
    from PIL import Image

    # fromarray infers the mode: L for 2-D uint8, RGB / RGBA for 3 / 4 channels
    image = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
