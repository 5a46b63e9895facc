"""Numeric arrays in payloads and results: JSON lists, and base64 ``.npy`` files for large ones.

A payload is a JSON object (a ``google.protobuf.Struct`` on the wire), so a large array travels as
one string field holding the base64 of an ``.npy`` file: ``{"array_b64": "k05VTVBZ..."}`` (every
``.npy`` file starts with ``\\x93NUMPY``, which is ``k05VTVBZ`` in base64). The ``.npy`` header declares
the dtype and shape; :func:`decode_npy` accepts only the dtypes and the number of dimensions a job
asks for, either byte order, and never unpickles anything. A 1,000,000-element int64 array is 8 MB
as ``.npy`` and 10.7 MB in base64, against ~20 MB as JSON numbers that would also lose exactness past
2**53 (a Struct number is a double).

Errors are :class:`~runner.errors.JobFailed` with code ``INVALID_PAYLOAD`` and the field named.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from typing import TYPE_CHECKING, Any

from runner.errors import JobFailed
from runner.payload import as_int

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["NPY_B64_PREFIX", "decode_npy", "encode_npy", "numbers_to_array"]

NPY_B64_PREFIX = "k05VTVBZ"
"""How the base64 of every ``.npy`` file begins (the magic string ``\\x93NUMPY``)."""


def decode_npy(text: object, field: str, dtypes: tuple[str, ...], ndim: int) -> npt.NDArray[Any]:
    """The array in ``text``, the base64 of an ``.npy`` file, as a native-byte-order array.

    Args:
        text: the field's value.
        field: the field's name, for error messages.
        dtypes: accepted dtype names (``"int64"``, ``"float64"``, ...).
        ndim: the required number of dimensions.

    Raises:
        JobFailed: ``INVALID_PAYLOAD``: not a string, not base64, not an ``.npy`` file, a dtype not
            accepted, another number of dimensions, a Fortran-ordered array of more than one dimension,
            or data shorter or longer than the header says.
    """
    import numpy as np
    from numpy.lib import format as npy_format

    if not isinstance(text, str):
        raise JobFailed("INVALID_PAYLOAD", f"{field}: {type(text).__name__} is not a base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise JobFailed("INVALID_PAYLOAD", f"{field}: not base64 ({exc})") from None
    stream = io.BytesIO(raw)
    try:
        version = npy_format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"unsupported .npy version {version[0]}.{version[1]}")
    except ValueError as exc:
        raise JobFailed("INVALID_PAYLOAD", f"{field}: not an .npy file ({exc})") from None
    if dtype.kind == "O" or dtype.hasobject or dtype.newbyteorder("=").name not in dtypes:
        raise JobFailed("INVALID_PAYLOAD", f"{field}: dtype {dtype.str!r} is not one of {', '.join(dtypes)}")
    if len(shape) != ndim:
        raise JobFailed("INVALID_PAYLOAD", f"{field}: shape {tuple(shape)} is not {ndim}-D")
    if fortran and ndim > 1:
        raise JobFailed("INVALID_PAYLOAD", f"{field}: Fortran-ordered arrays are not accepted")
    count = math.prod(shape)
    offset = stream.tell()
    if len(raw) - offset != count * dtype.itemsize:
        raise JobFailed(
            "INVALID_PAYLOAD",
            f"{field}: {len(raw) - offset} data bytes, the header declares {count} x {dtype.itemsize}",
        )
    array = np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(shape)
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    return array


def encode_npy(array: npt.NDArray[Any]) -> str:
    """The base64 of ``array`` as an ``.npy`` file (what :func:`decode_npy` reads)."""
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def numbers_to_array(values: object, field: str, dtype: str) -> npt.NDArray[Any]:
    """A JSON list of numbers as a 1-D ``int64`` or ``float64`` array.

    For int64, integral floats (what a Struct makes of every number) count as integers, exactly.

    Raises:
        JobFailed: ``INVALID_PAYLOAD`` naming the element: not a list, a non-number, a fraction for
            int64, a value outside int64, NaN or infinity.
    """
    import numpy as np

    if not isinstance(values, list):
        raise JobFailed("INVALID_PAYLOAD", f"{field}: {type(values).__name__} is not an array")
    if dtype == "float64":
        for i, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise JobFailed("INVALID_PAYLOAD", f"{field}.{i}: {value!r} is not a finite number")
        return np.array(values, dtype=np.float64).reshape(len(values))
    if not all(type(v) is int for v in values):
        values = [as_int(v, f"{field}.{i}") for i, v in enumerate(values)]
    try:
        return np.array(values, dtype=np.int64).reshape(len(values))
    except OverflowError:
        bad = next(i for i, v in enumerate(values) if not -(2**63) <= v < 2**63)
        raise JobFailed("INVALID_PAYLOAD", f"{field}.{bad}: {values[bad]} is outside the int64 range") from None
