"""The compiled-kernel job types as a client sees them: payload forms, results, failures.

(The kernels themselves are checked against references in tests/contract/test_kernels.py.)
"""

from __future__ import annotations

import base64
import hashlib
import io
import math
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from runner import JobContext, JobFailed, execute
from runner.arrays import encode_npy
from runner.jobs.matmul import generate
from runner.kernels.matmul import matmul_reference
from runner.payload import validate
from runner.registry import get

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def ctx(threads: int = 1) -> JobContext:
    return JobContext(job_id="job-1", attempt=1, threads=threads)


def failure(job_type: str, payload: dict[str, Any]) -> JobFailed:
    with pytest.raises(JobFailed) as caught:
        execute(job_type, payload, ctx(2))
    return caught.value


def npy(array: np.ndarray) -> str:
    return encode_npy(array)


# -- large_array_sum ---------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(INT64_MIN, INT64_MAX), max_size=200), st.integers(1, 4))
def test_binary_int64_sum_is_exact_and_reports_int64_overflow(numbers: list[int], threads: int) -> None:
    total = sum(numbers)
    result = execute("large_array_sum", {"array_b64": npy(np.array(numbers, dtype=np.int64))}, ctx(threads))
    assert result == {
        "sum": total,
        "sum_text": str(total),
        "count": len(numbers),
        "dtype": "int64",
        "fits_int64": INT64_MIN <= total <= INT64_MAX,
    }


def test_binary_sum_of_a_million_int64_travels_as_npy() -> None:
    values = np.random.default_rng(3).integers(INT64_MIN, INT64_MAX, 1_000_000, dtype=np.int64)
    payload = {"array_b64": npy(values)}
    assert len(payload["array_b64"]) < 11_000_000  # vs ~20 MB as JSON numbers
    validate(get("large_array_sum"), payload)
    assert execute("large_array_sum", payload, ctx(2))["sum_text"] == str(sum(values.tolist()))


def test_big_endian_npy_is_read_in_its_byte_order() -> None:
    values = np.array([1, -2, INT64_MAX], dtype=">i8")
    assert execute("large_array_sum", {"array_b64": npy(values)}, ctx())["sum"] == INT64_MAX - 1


def test_float64_sums_are_correctly_rounded_from_json_and_npy() -> None:
    values = [1e16, 1.0, -1e16, 0.1, 0.2]
    expected = math.fsum(values)
    assert execute("large_array_sum", {"numbers": values, "dtype": "float64"}, ctx()) == {"sum": expected}
    binary = execute("large_array_sum", {"array_b64": npy(np.array(values))}, ctx(2))
    assert (binary["sum"], binary["dtype"], binary["count"]) == (expected, "float64", 5)
    assert float(binary["sum_text"]) == expected
    assert "fits_int64" not in binary


def test_overflow_is_reported_not_wrapped() -> None:
    over = [INT64_MAX, 1]
    assert execute("large_array_sum", {"numbers": over}, ctx()) == {"sum": 2**63, "sum_text": str(2**63)}
    err = failure("large_array_sum", {"numbers": over, "on_overflow": "error"})
    assert err.code == "OVERFLOW" and str(2**63) in err.message
    assert execute("large_array_sum", {"numbers": [INT64_MAX, -1], "on_overflow": "error"}, ctx()) == {
        "sum": INT64_MAX - 1,
        "sum_text": str(INT64_MAX - 1),
    }
    big = sys.float_info.max
    assert failure("large_array_sum", {"numbers": [big, big], "dtype": "float64"}).code == "OVERFLOW"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"array_b64": npy(np.zeros((2, 2), dtype=np.int64))}, "array_b64"),
        ({"array_b64": npy(np.zeros(3, dtype=np.int32))}, "array_b64"),
        ({"array_b64": npy(np.zeros(3, dtype=np.int64)), "dtype": "float64"}, "dtype"),
        ({"array_b64": npy(np.array([1.0, math.nan]))}, "array_b64"),
        ({"array_b64": "k05VTVBZAQB2AHsnZGVzY3InOiAnPGk4Jy"}, "array_b64"),
        ({"array_b64": base64.b64encode(b"PK\x03\x04 a zip file, not an npy file").decode()}, "array_b64"),
        ({"numbers": [1.0, math.inf], "dtype": "float64"}, "numbers.1"),
        ({"numbers": [1, 2.5]}, "numbers.1"),
    ],
)
def test_bad_arrays_fail_naming_the_field(payload: dict[str, Any], field: str) -> None:
    err = failure("large_array_sum", payload)
    assert err.code == "INVALID_PAYLOAD" and err.message.startswith(f"{field}:"), err.message


def test_npy_with_trailing_or_missing_bytes_is_refused() -> None:
    raw = base64.b64decode(npy(np.arange(4, dtype=np.int64)))
    for broken in (raw + b"\x00" * 8, raw[:-8]):
        err = failure("large_array_sum", {"array_b64": base64.b64encode(broken).decode()})
        assert err.code == "INVALID_PAYLOAD" and "data bytes" in err.message


# -- cpu_intensive, monte_carlo_pi, matmul -------------------------------------------------------------------


def test_cpu_intensive_hash_rounds_form() -> None:
    first = execute("cpu_intensive", {"rounds": 1000, "seed": 9}, ctx(1))
    assert first == execute("cpu_intensive", {"rounds": 1000.0, "seed": 9.0}, ctx(3))
    assert first["rounds"] == 1000 and first["lanes"] == 64 and len(first["digest"]) == 16
    assert first != execute("cpu_intensive", {"rounds": 1001, "seed": 9}, ctx(1))
    assert execute("cpu_intensive", {"n": 100}, ctx(2)) == {"primes": 25}


def test_monte_carlo_pi_is_reproducible_and_close() -> None:
    result = execute("monte_carlo_pi", {"samples": 2_000_000, "seed": 5}, ctx(2))
    assert result == execute("monte_carlo_pi", {"samples": 2_000_000, "seed": 5}, ctx(1))
    assert result["samples"] == 2_000_000 and result["pi"] == 4 * result["inside"] / 2_000_000
    assert abs(result["pi"] - math.pi) < 0.01
    assert execute("monte_carlo_pi", {"samples": 1000}, ctx())["seed"] == 0


def test_matmul_generated_is_seeded_and_checksummed() -> None:
    result = execute("matmul", {"n": 37, "m": 5, "k": 11, "seed": 3, "return_matrix": True}, ctx(2))
    a, b = generate(5, 11, 3), generate(11, 37, 3, first=1 + 5 * 11)
    assert a.min() >= -1.0 and a.max() < 1.0 and not np.array_equal(a[0, :5], b[0, :5])
    expected = np.array(matmul_reference(a.tolist(), b.tolist(), 37))
    got = np.load(io.BytesIO(base64.b64decode(result["c_b64"])))
    np.testing.assert_array_equal(got, expected)
    assert (result["rows"], result["cols"], result["inner"]) == (5, 37, 11)
    assert result["checksum"] == hashlib.sha256(expected.astype("<f8").tobytes()).hexdigest()
    assert result["sum"] == math.fsum(expected.ravel().tolist())
    same = execute("matmul", {"n": 37, "m": 5, "k": 11, "seed": 3}, ctx(1))
    assert same["checksum"] == result["checksum"] and "c_b64" not in same


def test_matmul_given_matrices_and_their_errors() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    result = execute("matmul", {"a_b64": npy(a), "b_b64": npy(b), "return_matrix": True}, ctx(2))
    np.testing.assert_allclose(np.load(io.BytesIO(base64.b64decode(result["c_b64"]))), a @ b, rtol=1e-13)
    err = failure("matmul", {"a_b64": npy(a), "b_b64": npy(a)})
    assert err.code == "INVALID_PAYLOAD" and err.message.startswith("b_b64:")
    err = failure("matmul", {"a_b64": npy(np.full((1, 1), np.inf)), "b_b64": npy(np.ones((1, 1)))})
    assert err.code == "INVALID_PAYLOAD" and err.message.startswith("a_b64:")
    big = np.full((1, 2), 1e300)
    assert failure("matmul", {"a_b64": npy(big), "b_b64": npy(big.T.copy())}).code == "OVERFLOW"


# -- resize_image with PNG -------------------------------------------------------------------------------------


def png(array: np.ndarray, mode: str | None = None) -> str:
    image = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    if mode is not None:
        image = image.convert(mode)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_png_in_png_out_equals_raw_in_raw_out(channels: int) -> None:
    img = np.random.default_rng(channels).integers(0, 256, (31, 47, channels), dtype=np.uint8)
    raw = {"width": 47, "height": 31, "channels": channels, "pixels_b64": base64.b64encode(img.tobytes()).decode()}
    common = {"target_width": 13, "target_height": 9, "method": "area", "return_pixels": True}
    from_raw = execute("resize_image", raw | common, ctx(2))
    from_png = execute("resize_image", {"png_b64": png(img)} | common, ctx(2))
    assert from_png["checksum"] == from_raw["checksum"] and from_png["channels"] == channels
    decoded = np.asarray(Image.open(io.BytesIO(base64.b64decode(from_png["png_b64"]))))
    expected = np.frombuffer(base64.b64decode(from_raw["pixels_b64"]), dtype=np.uint8).reshape(9, 13, channels)
    np.testing.assert_array_equal(decoded.reshape(9, 13, channels), expected)
    as_raw = execute("resize_image", {"png_b64": png(img), "output_format": "raw"} | common, ctx(1))
    assert as_raw["pixels_b64"] == from_raw["pixels_b64"]


def test_palette_and_gray_alpha_pngs_become_rgb_or_rgba() -> None:
    img = np.random.default_rng(1).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    result = execute("resize_image", {"png_b64": png(img, "P"), "target_width": 4, "target_height": 4}, ctx())
    assert result["channels"] == 3
    gray = np.random.default_rng(2).integers(0, 256, (8, 8, 1), dtype=np.uint8)
    result = execute("resize_image", {"png_b64": png(gray, "LA"), "target_width": 3, "target_height": 5}, ctx())
    assert result["channels"] == 4


def test_a_broken_png_fails_naming_the_field() -> None:
    good = base64.b64decode(png(np.zeros((4, 4, 3), dtype=np.uint8)))
    for data in (good[:30], b"\x89PNG\r\n\x1a\n" + b"\x00" * 40):
        err = failure(
            "resize_image", {"png_b64": base64.b64encode(data).decode(), "target_width": 2, "target_height": 2}
        )
        assert err.code == "INVALID_PAYLOAD" and err.message.startswith("png_b64:")
    sixteen = Image.fromarray(np.zeros((4, 4), dtype=np.uint16))
    out = io.BytesIO()
    sixteen.save(out, format="PNG")
    err = failure(
        "resize_image", {"png_b64": base64.b64encode(out.getvalue()).decode(), "target_width": 2, "target_height": 2}
    )
    assert err.code == "INVALID_PAYLOAD" and "mode" in err.message


def test_resize_4000x3000_to_800x600_is_a_real_resample() -> None:
    y, x = np.mgrid[0:3000, 0:4000]
    img = np.stack([(x * 255 // 3999), (y * 255 // 2999), np.full_like(x, 77)], axis=-1).astype(np.uint8)
    payload = {
        "width": 4000, "height": 3000, "channels": 3, "target_width": 800, "target_height": 600,
        "pixels_b64": base64.b64encode(img.tobytes()).decode(), "return_pixels": True,
    }  # fmt: skip
    out = np.frombuffer(base64.b64decode(execute("resize_image", payload, ctx(2))["pixels_b64"]), np.uint8)
    out = out.reshape(600, 800, 3)
    # The gradients survive the 5x reduction: red rises along x, green along y, blue stays 77
    assert (np.diff(out[:, :, 0].astype(int), axis=1) >= 0).all() and out[0, 0, 0] <= 1 and out[0, -1, 0] >= 254
    assert (np.diff(out[:, :, 1].astype(int), axis=0) >= 0).all() and (out[:, :, 2] == 77).all()
