"""The built-in job types, the registry, and the ``python -m runner`` contract.

(Named test_runner_jobs.py, not test_jobs.py: test files share one namespace without __init__.py
files, and tests/unit/control/test_jobs.py exists.)
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runner
from corral.jobtypes import BUILTIN_SCHEMAS
from runner import JobContext, JobFailed, JobType, execute, register
from runner.errors import EXIT_FAILED, EXIT_INVALID_PAYLOAD, EXIT_OK, EXIT_UNKNOWN_TYPE, EXIT_USAGE
from runner.jobs.cpu_intensive import count_primes
from runner.jobs.resize_image import test_pattern as pattern

ROOT = Path(__file__).resolve().parents[3]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def ctx(attempt: int = 1, threads: int = 1) -> JobContext:
    return JobContext(job_id="job-1", attempt=attempt, threads=threads)


# -- registry ----------------------------------------------------------------------------------------


def test_every_builtin_schema_has_an_implementation_with_that_schema():
    names = {t.name for t in runner.all_types()}
    assert set(BUILTIN_SCHEMAS) <= names
    for name, schema in BUILTIN_SCHEMAS.items():
        assert runner.get(name).schema == schema
        assert runner.get(name).description


def test_runner_exports_are_pinned():
    assert set(runner.__all__) == {
        "JobContext",
        "execute",
        "load_plugins",
        "JobFailed",
        "JobType",
        "all_types",
        "get",
        "register",
    }


def test_a_new_job_type_is_one_registered_class():
    @register
    class Triple(JobType):
        """Triple a number."""

        name = "test_triple"
        schema = {"type": "object", "properties": {"x": {"type": "integer"}}}

        def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
            return {"y": 3 * payload["x"]}

    assert execute("test_triple", {"x": 4}, ctx()) == {"y": 12}
    assert runner.get("test_triple").description == "Triple a number."


def test_a_result_nested_past_the_limit_fails_the_job_naming_where():
    # Stored, it could never be read back: GetJob, WatchJob and ListJobs carry it deeper than protobuf parses
    @register
    class Deep(JobType):
        """Return an object nested ``levels`` deep."""

        name = "test_deep_result"
        schema = {"type": "object"}

        def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
            top: dict[str, Any] = {}
            inner = top
            for _ in range(payload["levels"]):
                inner["r"] = [{}]
                inner = inner["r"][0]
            return top

    assert execute("test_deep_result", {"levels": 15}, ctx())  # 31 levels: fine
    with pytest.raises(JobFailed) as info:
        execute("test_deep_result", {"levels": 16}, ctx())
    assert info.value.code == "ERROR" and "result.r[0].r[0]" in info.value.message
    assert "deeper than 32 levels" in info.value.message


def test_register_refuses_a_taken_name_and_incomplete_classes():
    class Other(JobType):
        name = "noop"

        def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
            return {}

    with pytest.raises(ValueError, match="already registered"):
        register(Other)

    class NoRun(JobType):
        name = "test_no_run"

    with pytest.raises(TypeError, match="run"):
        register(NoRun)

    class NoName(JobType):
        def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
            return {}

    with pytest.raises(TypeError, match="name"):
        register(NoName)


def test_unknown_type_and_unexpected_exceptions_become_job_failed():
    with pytest.raises(JobFailed) as unknown:
        execute("no_such_type", {}, ctx())
    assert unknown.value.code == "UNKNOWN_TYPE"

    with pytest.raises(JobFailed) as error:
        execute("add_numbers", {"a": 1}, ctx())  # a missing field raises KeyError inside the job
    assert error.value.code == "ERROR"
    assert "KeyError" in error.value.message


# -- built-in types ----------------------------------------------------------------------------------


def test_noop_and_sleep():
    assert execute("noop", {}, ctx()) == {}
    assert execute("sleep", {"seconds": 0}, ctx()) == {"slept": 0}
    assert execute("sleep", {"seconds": 0.01}, ctx()) == {"slept": 0.01}


def exact_sum(total: int) -> dict[str, object]:
    """A sum as a result carries it: beyond ±2**53 (what a Struct's double holds) also as exact text."""
    return {"sum": total} if abs(total) <= 2**53 else {"sum": total, "sum_text": str(total)}


@given(st.integers(), st.integers())
def test_add_numbers_is_exact(a: int, b: int):
    result = execute("add_numbers", {"a": a, "b": b}, ctx())
    assert result == exact_sum(a + b)
    assert type(result["sum"]) is int


@given(st.integers(min_value=-(2**53), max_value=2**53), st.integers(min_value=-(2**53), max_value=2**53))
def test_add_numbers_takes_integral_floats_from_a_struct(a: int, b: int):
    result = execute("add_numbers", {"a": float(a), "b": float(b)}, ctx())
    assert result == exact_sum(a + b)
    assert type(result["sum"]) is int


@pytest.mark.parametrize("bad", [1.5, math.nan, math.inf, True, "1", None])
def test_add_numbers_refuses_non_integers(bad: object):
    with pytest.raises(JobFailed) as failure:
        execute("add_numbers", {"a": bad, "b": 1}, ctx())
    assert failure.value.code == "INVALID_PAYLOAD"
    assert failure.value.message.startswith("a:")


@given(st.text())
def test_reverse_string_by_code_point(text: str):
    reversed_text = execute("reverse_string", {"text": text}, ctx())["reversed"]
    assert reversed_text == "".join(reversed(list(text)))
    assert execute("reverse_string", {"text": reversed_text}, ctx())["reversed"] == text


@given(st.text(alphabet=st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF), min_size=1))
def test_reverse_string_keeps_non_bmp_characters_whole(text: str):
    reversed_text = execute("reverse_string", {"text": text}, ctx())["reversed"]
    assert sorted(reversed_text) == sorted(text)
    reversed_text.encode("utf-8")  # no lone surrogates: it encodes
    # Through JSON (as on the wire) it survives as well.
    assert json.loads(json.dumps({"r": reversed_text}))["r"] == text[::-1]


def test_reverse_string_examples():
    assert execute("reverse_string", {"text": "a😀b"}, ctx()) == {"reversed": "b😀a"}
    assert execute("reverse_string", {"text": ""}, ctx()) == {"reversed": ""}


@given(st.lists(st.integers(min_value=INT64_MIN, max_value=INT64_MAX)))
def test_large_array_sum_is_exact_without_int64_overflow(numbers: list[int]):
    assert execute("large_array_sum", {"numbers": numbers}, ctx(threads=4)) == exact_sum(sum(numbers))


def test_large_array_sum_extremes_and_empty():
    assert execute("large_array_sum", {"numbers": []}, ctx()) == {"sum": 0}
    big = [INT64_MAX] * 1000
    assert execute("large_array_sum", {"numbers": big}, ctx()) == {
        "sum": INT64_MAX * 1000,
        "sum_text": "9223372036854775807000",
    }
    assert execute("large_array_sum", {"numbers": [INT64_MIN] * 3}, ctx()) == {
        "sum": 3 * INT64_MIN,
        "sum_text": "-27670116110564327424",
    }
    assert execute("large_array_sum", {"numbers": [2**53, 0]}, ctx()) == {"sum": 2**53}  # the last exact one
    assert execute("large_array_sum", {"numbers": [1.0, 2.0, 3]}, ctx()) == {"sum": 6}


def _naive_primes(n: int) -> int:
    return sum(1 for k in range(2, n + 1) if all(k % d for d in range(2, math.isqrt(k) + 1)))


@given(st.integers(min_value=1, max_value=3000))
@settings(max_examples=60)
def test_cpu_intensive_counts_primes(n: int):
    assert execute("cpu_intensive", {"n": n}, ctx()) == {"primes": _naive_primes(n)}


def test_cpu_intensive_known_values_across_segments():
    assert count_primes(1) == 0
    assert count_primes(2) == 1
    assert count_primes(10**6) == 78498
    assert count_primes(2 * 10**6 + 1) == 148933  # spans several segments


def test_failing_fails_the_first_k_attempts_then_succeeds():
    payload = {"message": "boom", "fail_attempts": 2}
    for attempt in (1, 2):
        with pytest.raises(JobFailed) as failure:
            execute("failing", payload, ctx(attempt=attempt))
        assert (failure.value.code, failure.value.message) == ("ERROR", "boom")
    assert execute("failing", payload, ctx(attempt=3)) == {"attempt": 3}
    assert execute("failing", {"fail_attempts": 0}, ctx(attempt=1)) == {"attempt": 1}


def test_failing_without_fail_attempts_always_fails():
    for attempt in (1, 5, 100):
        with pytest.raises(JobFailed) as failure:
            execute("failing", {}, ctx(attempt=attempt))
        assert failure.value.code == "ERROR"


# -- resize_image against a per-pixel reference --------------------------------------------------------


def reference_bilinear(img: np.ndarray, tw: int, th: int) -> np.ndarray:
    h, w, c = img.shape
    out = np.zeros((th, tw, c), dtype=np.uint8)
    for y in range(th):
        sy = min(max((y + 0.5) * h / th - 0.5, 0.0), h - 1)
        y0 = math.floor(sy)
        y1, fy = min(y0 + 1, h - 1), sy - y0
        for x in range(tw):
            sx = min(max((x + 0.5) * w / tw - 0.5, 0.0), w - 1)
            x0 = math.floor(sx)
            x1, fx = min(x0 + 1, w - 1), sx - x0
            for k in range(c):
                top = float(img[y0, x0, k]) * (1 - fx) + float(img[y0, x1, k]) * fx
                bottom = float(img[y1, x0, k]) * (1 - fx) + float(img[y1, x1, k]) * fx
                out[y, x, k] = min(255, max(0, math.floor(top * (1 - fy) + bottom * fy + 0.5)))
    return out


def reference_area(img: np.ndarray, tw: int, th: int) -> np.ndarray:
    h, w, _c = img.shape

    def weights(size: int, target: int) -> np.ndarray:
        m = np.zeros((target, size))
        scale = size / target
        for i in range(target):
            lo, hi = i * scale, (i + 1) * scale
            for j in range(size):
                m[i, j] = max(0.0, min(hi, j + 1) - max(lo, j)) / scale
        return m

    wy, wx = weights(h, th), weights(w, tw)
    out = np.einsum("yh,hwc,xw->yxc", wy, img.astype(np.float64), wx)
    rounded: np.ndarray = np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)
    return rounded


def _resize(img: np.ndarray, tw: int, th: int, method: str) -> np.ndarray:
    h, w, c = img.shape
    payload = {
        "width": w,
        "height": h,
        "channels": c,
        "target_width": tw,
        "target_height": th,
        "method": method,
        "pixels_b64": base64.b64encode(img.tobytes()).decode(),
        "return_pixels": True,
    }
    result = execute("resize_image", payload, ctx())
    assert (result["width"], result["height"], result["channels"]) == (tw, th, c)
    raw = base64.b64decode(result["pixels_b64"])
    assert result["checksum"] == hashlib.sha256(raw).hexdigest()
    return np.frombuffer(raw, dtype=np.uint8).reshape(th, tw, c)


SIZES = [(1, 1, 1, 1), (1, 1, 5, 3), (7, 5, 3, 9), (9, 7, 4, 3), (5, 3, 11, 13), (13, 11, 1, 1), (3, 1, 7, 1)]


@pytest.mark.parametrize(("w", "h", "tw", "th"), SIZES)
@pytest.mark.parametrize("channels", [1, 3, 4])
def test_resize_bilinear_equals_the_reference(w: int, h: int, tw: int, th: int, channels: int):
    img = np.random.default_rng(w * 1000 + h * 10 + channels).integers(0, 256, (h, w, channels), dtype=np.uint8)
    np.testing.assert_array_equal(_resize(img, tw, th, "bilinear"), reference_bilinear(img, tw, th))


@pytest.mark.parametrize(("w", "h", "tw", "th"), SIZES)
@pytest.mark.parametrize("channels", [1, 3, 4])
def test_resize_area_equals_the_reference(w: int, h: int, tw: int, th: int, channels: int):
    img = np.random.default_rng(w * 1000 + h * 10 + channels).integers(0, 256, (h, w, channels), dtype=np.uint8)
    got = _resize(img, tw, th, "area").astype(int)
    want = reference_area(img, tw, th).astype(int)
    # Same maths, different summation order: a value sitting exactly on .5 may round either way.
    assert np.abs(got - want).max() <= 1
    assert (got == want).mean() > 0.97


def test_resize_area_of_a_constant_image_is_that_constant():
    img = np.full((7, 9, 3), 201, dtype=np.uint8)
    assert (_resize(img, 4, 5, "area") == 201).all()
    assert (_resize(img, 13, 11, "bilinear") == 201).all()


def test_resize_uses_a_deterministic_pattern_without_pixels():
    payload = {"width": 9, "height": 7, "target_width": 4, "target_height": 3}
    first, second = execute("resize_image", payload, ctx()), execute("resize_image", payload, ctx())
    assert first == second
    assert first["channels"] == 3 and "pixels_b64" not in first
    expected = reference_bilinear(pattern(9, 7, 3), 4, 3)
    assert first["checksum"] == hashlib.sha256(expected.tobytes()).hexdigest()


def test_resize_refuses_pixels_of_the_wrong_size():
    payload = {"width": 2, "height": 2, "channels": 1, "target_width": 1, "target_height": 1}
    with pytest.raises(JobFailed) as failure:
        execute("resize_image", {**payload, "pixels_b64": base64.b64encode(b"abc").decode()}, ctx())
    assert failure.value.code == "INVALID_PAYLOAD"
    assert failure.value.message.startswith("pixels_b64:")


# -- python -m runner ----------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runner", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def test_cli_success_prints_the_result_on_stdout():
    done = run_cli("--job-id", "j1", "--type", "add_numbers", "--payload", '{"a": 2, "b": 40}')
    assert done.returncode == EXIT_OK
    assert json.loads(done.stdout) == {"sum": 42}


@pytest.mark.parametrize(
    ("args", "code", "exit_code", "field"),
    [
        (["--type", "add_numbers", "--payload", '{"a": 1}'], "INVALID_PAYLOAD", EXIT_INVALID_PAYLOAD, "payload.b"),
        (
            ["--type", "add_numbers", "--payload", '{"a": 1, "b": "x"}'],
            "INVALID_PAYLOAD",
            EXIT_INVALID_PAYLOAD,
            "payload.b",
        ),
        (
            ["--type", "add_numbers", "--payload", '{"a": 1, "b": 2, "c": 3}'],
            "INVALID_PAYLOAD",
            EXIT_INVALID_PAYLOAD,
            "payload.c",
        ),
        (
            ["--type", "large_array_sum", "--payload", '{"numbers": [1, 2.5]}'],
            "INVALID_PAYLOAD",
            EXIT_INVALID_PAYLOAD,
            "payload.numbers.1",
        ),
        (["--type", "noop", "--payload", "{not json"], "INVALID_PAYLOAD", EXIT_INVALID_PAYLOAD, "payload"),
        (["--type", "nope"], "UNKNOWN_TYPE", EXIT_UNKNOWN_TYPE, "nope"),
        (["--type", "failing", "--payload", '{"message": "no luck"}'], "ERROR", EXIT_FAILED, "no luck"),
    ],
)
def test_cli_failure_prints_a_json_error_on_stderr(args: list[str], code: str, exit_code: int, field: str):
    done = run_cli("--job-id", "j1", *args)
    assert done.returncode == exit_code
    assert done.stdout == ""
    error = json.loads(done.stderr)
    assert error["code"] == code
    assert field in error["message"]


def test_cli_attempt_and_plugins():
    done = run_cli("--job-id", "j1", "--type", "failing", "--payload", '{"fail_attempts": 1}', "--attempt", "2")
    assert (done.returncode, json.loads(done.stdout)) == (EXIT_OK, {"attempt": 2})
    done = run_cli(
        "--job-id", "j1", "--type", "py_loop", "--payload", '{"n": 10}', "--import", "tests.support.jobtypes"
    )
    assert (done.returncode, json.loads(done.stdout)) == (EXIT_OK, {"n": 10})


def test_cli_usage_error():
    assert run_cli("--type", "noop").returncode == EXIT_USAGE  # --job-id missing
