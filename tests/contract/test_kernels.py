"""One conformance suite for the runner's numeric kernels, run against both builds.

Every kernel has a Python twin (``runner/kernels/<name>.py``) and a compiled build
(``runner/kernels/_<name>.pyx``). The ``build`` fixture hands each test one of them; every test checks
the build against an independent reference (plain Python, exact rationals, or numpy) on random
inputs (hypothesis) and on the edge cases: empty arrays, one element, int64 extremes, overflow,
subnormals, 1x1 and odd-sized images, non-square matrices. Results must not depend on the number of
threads either.

The compiled build is required unless ``CORRAL_NO_EXTENSIONS=1`` (then it is skipped): a missing
extension is a broken build, not a reason to skip.
"""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import dataclass
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from runner.kernels import (
    array_sum,
    cpu_has_x86_64_v3,
    extensions_disabled,
    hash_rounds,
    matmul,
    monte_carlo,
    primes,
    resize,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
THREADS = st.integers(min_value=1, max_value=5)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@dataclass(frozen=True)
class Build:
    """One build of every kernel, under the names the suite calls."""

    name: str
    sum_int64: Any
    sum_float64: Any
    count_primes: Any
    hash_rounds: Any
    count_inside: Any
    matmul: Any
    resize_bilinear: Any
    resize_area: Any


def _python() -> Build:
    return Build(
        "python",
        array_sum.py_sum_int64,
        array_sum.py_sum_float64,
        primes.py_count_primes,
        hash_rounds.py_hash_rounds,
        monte_carlo.py_count_inside,
        matmul.py_matmul,
        resize.py_resize_bilinear,
        resize.py_resize_area,
    )


V3_BUILDS = ("array_sum", "resize")  # kernels that also have an x86-64-v3 build, _name_v3


def _compiled(v3: bool = False) -> Build:
    def module(name: str) -> Any:
        suffix = "_v3" if v3 and name in V3_BUILDS else ""
        return importlib.import_module(f"runner.kernels._{name}{suffix}")

    mods = SimpleNamespace(
        **{name: module(name) for name in ("array_sum", "primes", "hash_rounds", "monte_carlo", "matmul", "resize")}
    )
    return Build(
        "compiled (x86-64-v3)" if v3 else "compiled",
        mods.array_sum.sum_int64,
        mods.array_sum.sum_float64,
        mods.primes.count_primes,
        mods.hash_rounds.hash_rounds,
        mods.monte_carlo.count_inside,
        mods.matmul.matmul,
        mods.resize.resize_bilinear,
        mods.resize.resize_area,
    )


@pytest.fixture(params=["compiled", "compiled-x86-64-v3", "python"], scope="module")
def build(request: pytest.FixtureRequest) -> Build:
    if request.param == "python":
        return _python()
    if extensions_disabled():
        pytest.skip("CORRAL_NO_EXTENSIONS=1: the compiled kernels are not used")
    if request.param == "compiled-x86-64-v3" and not cpu_has_x86_64_v3():
        pytest.skip("not an x86-64-v3 CPU: the _v3 builds are neither built nor used")
    try:
        return _compiled(v3=request.param == "compiled-x86-64-v3")
    except ImportError as exc:
        pytest.fail(f"the compiled kernels are not built ({exc}); run `pip install -e .` or `setup.py build_ext -i`")


def test_the_loaders_pick_the_compiled_build_unless_told_not_to() -> None:
    modules = (array_sum, primes, hash_rounds, monte_carlo, matmul, resize)
    assert all(m.COMPILED is not extensions_disabled() for m in modules)
    if not extensions_disabled():
        suffix = "_v3" if cpu_has_x86_64_v3() else ""
        assert (f"_array_sum{suffix}", f"_resize{suffix}") == (array_sum.BUILD, resize.BUILD)


# -- large_array_sum: int64 -------------------------------------------------------------------------------

int64_arrays = hnp.arrays(
    np.int64,
    st.integers(min_value=0, max_value=300),
    elements=st.one_of(st.integers(INT64_MIN, INT64_MAX), st.sampled_from([INT64_MIN, INT64_MAX, -1, 0, 1])),
)


@SETTINGS
@given(values=int64_arrays, threads=THREADS)
def test_int64_sum_is_exact(build: Build, values: np.ndarray, threads: int) -> None:
    assert build.sum_int64(values, threads) == sum(int(v) for v in values)


@pytest.mark.parametrize(
    "values",
    [[], [0], [INT64_MAX], [INT64_MIN], [INT64_MAX, 1], [INT64_MIN, -1], [INT64_MAX] * 1000, [INT64_MIN] * 1001],
)
def test_int64_sum_edges_never_wrap(build: Build, values: list[int]) -> None:
    array = np.array(values, dtype=np.int64)
    for threads in (1, 2, 7):
        total = build.sum_int64(array, threads)
        assert total == sum(values)
        assert type(total) is int


def test_int64_sum_of_a_large_random_array_matches_numpy_and_any_thread_count(build: Build) -> None:
    rng = np.random.default_rng(1)
    small = rng.integers(-(2**40), 2**40, 1_000_003, dtype=np.int64)  # numpy cannot overflow on these
    assert build.sum_int64(small, 1) == int(small.sum()) == build.sum_int64(small, 3)
    big = rng.integers(INT64_MIN, INT64_MAX, 1_000_003, dtype=np.int64, endpoint=True)  # numpy wraps these
    exact = sum(big.tolist())
    assert {build.sum_int64(big, t) for t in (1, 2, 4)} == {exact}


# -- large_array_sum: float64 ---------------------------------------------------------------------------

finite_floats = st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True)
float_arrays = hnp.arrays(
    np.float64,
    st.integers(min_value=0, max_value=200),
    elements=st.one_of(finite_floats, st.sampled_from([0.0, -0.0, 5e-324, -5e-324, sys.float_info.max, 1e308])),
)


def exact_float_sum(values: np.ndarray) -> float:
    """The exact sum, correctly rounded (OverflowError past the float64 range)."""
    return float(sum((Fraction(v) for v in values.tolist()), Fraction(0)))


@SETTINGS
@given(values=float_arrays, threads=THREADS)
def test_float64_sum_is_the_correctly_rounded_exact_sum(build: Build, values: np.ndarray, threads: int) -> None:
    try:
        expected = exact_float_sum(values)
    except OverflowError:
        with pytest.raises(OverflowError):
            build.sum_float64(values, threads)
        return
    got = build.sum_float64(values, threads)
    assert got == expected and math.copysign(1, got) == math.copysign(1, expected or 0.0)


def test_float64_sum_edges(build: Build) -> None:
    big = sys.float_info.max
    assert build.sum_float64(np.array([], dtype=np.float64), 1) == 0.0
    assert build.sum_float64(np.array([2.5]), 2) == 2.5
    assert build.sum_float64(np.array([big, big, -big]), 2) == big  # no intermediate overflow
    assert build.sum_float64(np.array([1e16, 1.0, -1e16]), 1) == 1.0  # no lost bits (numpy gives 0.0)
    assert build.sum_float64(np.array([5e-324] * 7), 3) == 7 * 5e-324
    assert build.sum_float64(np.array([-0.0, -0.0]), 1) == 0.0
    with pytest.raises(OverflowError):
        build.sum_float64(np.array([big, big]), 1)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            build.sum_float64(np.array([1.0, bad]), 2)


def test_float64_sum_of_a_large_array_is_close_to_numpy_and_the_same_for_any_thread_count(build: Build) -> None:
    values = np.random.default_rng(2).standard_normal(1_000_001) * 1e6
    results = {build.sum_float64(values, t) for t in (1, 2, 5)}
    assert len(results) == 1
    assert results.pop() == pytest.approx(float(values.sum()), rel=1e-9, abs=1e-3)


# -- cpu_intensive: primes -------------------------------------------------------------------------------


def naive_primes(n: int) -> int:
    return sum(1 for k in range(2, n + 1) if all(k % d for d in range(2, math.isqrt(k) + 1)))


@SETTINGS
@given(n=st.integers(min_value=-5, max_value=4000), threads=THREADS)
def test_prime_count_matches_trial_division(build: Build, n: int, threads: int) -> None:
    assert build.count_primes(n, threads) == naive_primes(n)


@pytest.mark.parametrize(
    ("n", "pi"),
    [(0, 0), (1, 0), (2, 1), (3, 2), (4, 2), (9, 4), (25, 9), (65_535, 6542), (65_537, 6543), (131_071, 12251),
     (10**6, 78498), (2 * 10**6 + 1, 148933), (10**7, 664579)],
)  # fmt: skip
def test_prime_count_known_values_across_segments_and_threads(build: Build, n: int, pi: int) -> None:
    assert {build.count_primes(n, t) for t in (1, 2, 3)} == {pi}


# -- cpu_intensive: hash rounds ----------------------------------------------------------------------------


@SETTINGS
@given(
    seed=st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 2**64 - 1])),
    rounds=st.integers(0, 300),
    threads=THREADS,
)
def test_hash_rounds_match_the_python_definition(build: Build, seed: int, rounds: int, threads: int) -> None:
    expected = 0
    for lane in range(hash_rounds.LANES):
        state = hash_rounds.mix64((seed + (lane + 1) * hash_rounds.GOLDEN) % 2**64)
        for _ in range(rounds):
            state = hash_rounds.mix64((state + hash_rounds.GOLDEN) % 2**64)
        expected = hash_rounds.mix64(expected ^ state)
    assert build.hash_rounds(seed, rounds, threads) == expected


def test_hash_rounds_known_digest(build: Build) -> None:
    # SplitMix64 from state 0: its first output is 0xE220A8397B1DCDAF
    assert hash_rounds.mix64(hash_rounds.GOLDEN) == 0xE220A8397B1DCDAF
    assert build.hash_rounds(7, 1000, 1) == build.hash_rounds(7, 1000, 4) == hash_rounds.py_hash_rounds(7, 1000)


# -- monte_carlo_pi ------------------------------------------------------------------------------------------


@SETTINGS
@given(seed=st.integers(0, 2**64 - 1), samples=st.integers(0, 2000), threads=THREADS)
def test_monte_carlo_matches_the_one_sample_at_a_time_definition(
    build: Build, seed: int, samples: int, threads: int
) -> None:
    assert build.count_inside(seed, samples, threads) == monte_carlo.inside_reference(seed, samples)


def test_monte_carlo_is_reproducible_across_threads_and_near_pi(build: Build) -> None:
    samples = 3_000_001
    counts = {build.count_inside(42, samples, t) for t in (1, 2, 3)}
    assert len(counts) == 1
    inside = counts.pop()
    assert inside == monte_carlo.py_count_inside(42, samples)
    assert abs(4 * inside / samples - math.pi) < 0.005


# -- matmul ------------------------------------------------------------------------------------------------

dims = st.integers(min_value=0, max_value=11)
elements = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_subnormal=False)


@SETTINGS
@given(m=dims, k=dims, n=dims, threads=THREADS, data=st.data())
def test_matmul_equals_the_sequential_definition_exactly(
    build: Build, m: int, k: int, n: int, threads: int, data: st.DataObject
) -> None:
    a = data.draw(hnp.arrays(np.float64, (m, k), elements=elements))
    b = data.draw(hnp.arrays(np.float64, (k, n), elements=elements))
    got = build.matmul(a, b, threads)
    assert got.shape == (m, n) and got.dtype == np.float64
    assert got.tolist() == matmul.matmul_reference(a.tolist(), b.tolist(), n)


@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (1, 300, 1), (67, 33, 130), (130, 70, 5), (4, 4, 4), (65, 1, 66)])
def test_matmul_of_non_square_matrices_is_close_to_numpy_and_the_same_for_any_thread_count(
    build: Build, m: int, k: int, n: int
) -> None:
    rng = np.random.default_rng(m * 10_000 + k * 100 + n)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    results = [build.matmul(a, b, t) for t in (1, 2, 3)]
    assert all(np.array_equal(results[0], r) for r in results[1:])
    np.testing.assert_allclose(results[0], a @ b, rtol=1e-12, atol=1e-12)


def test_matmul_refuses_shapes_that_do_not_multiply(build: Build) -> None:
    with pytest.raises(ValueError):
        build.matmul(np.zeros((2, 3)), np.zeros((2, 3)), 1)
    with pytest.raises(ValueError):
        build.matmul(np.zeros((2, 3), dtype=np.float32), np.zeros((3, 3)), 1)


# -- resize_image ------------------------------------------------------------------------------------------


def bilinear_reference(img: np.ndarray, tw: int, th: int) -> np.ndarray:
    """The contract of runner.kernels.resize, one value at a time in Python floats."""
    h, w, c = img.shape
    out = np.zeros((th, tw, c), dtype=np.uint8)

    def axis(i: int, size: int, target: int) -> tuple[int, int, float]:
        pos = min(max((i + 0.5) * (size / target) - 0.5, 0.0), size - 1)
        lo = math.floor(pos)
        return lo, min(lo + 1, size - 1), pos - lo

    for y in range(th):
        y0, y1, fy = axis(y, h, th)
        for x in range(tw):
            x0, x1, fx = axis(x, w, tw)
            for ch in range(c):
                top = float(img[y0, x0, ch]) * (1.0 - fx) + float(img[y0, x1, ch]) * fx
                bottom = float(img[y1, x0, ch]) * (1.0 - fx) + float(img[y1, x1, ch]) * fx
                out[y, x, ch] = min(255, max(0, math.floor(top * (1.0 - fy) + bottom * fy + 0.5)))
    return out


def area_reference(img: np.ndarray, tw: int, th: int) -> np.ndarray:
    """The exact coverage-weighted mean of each footprint (rationals), rounded half up."""
    h, w, c = img.shape
    out = np.zeros((th, tw, c), dtype=np.uint8)

    def cover(i: int, size: int, target: int) -> list[tuple[int, Fraction]]:
        lo, hi = Fraction(i * size, target), Fraction((i + 1) * size, target)
        overlaps = [(j, min(hi, Fraction(j + 1)) - max(lo, Fraction(j))) for j in range(size)]
        return [(j, part) for j, part in overlaps if part > 0]

    for y in range(th):
        rows = cover(y, h, th)
        for x in range(tw):
            cols = cover(x, w, tw)
            for ch in range(c):
                total = sum(wy * wx * int(img[j, k, ch]) for j, wy in rows for k, wx in cols)
                mean = total / (Fraction(h, th) * Fraction(w, tw))
                out[y, x, ch] = math.floor(mean + Fraction(1, 2))
    return out


@st.composite
def images(draw: st.DrawFn, max_side: int = 9) -> np.ndarray:
    h = draw(st.integers(1, max_side))
    w = draw(st.integers(1, max_side))
    c = draw(st.sampled_from([1, 3, 4]))
    return draw(hnp.arrays(np.uint8, (h, w, c), elements=st.integers(0, 255)))


@SETTINGS
@given(img=images(), tw=st.integers(1, 13), th=st.integers(1, 13), threads=THREADS)
def test_bilinear_equals_the_per_pixel_definition(
    build: Build, img: np.ndarray, tw: int, th: int, threads: int
) -> None:
    np.testing.assert_array_equal(build.resize_bilinear(img, tw, th, threads), bilinear_reference(img, tw, th))


@SETTINGS
@given(img=images(), tw=st.integers(1, 13), th=st.integers(1, 13), threads=THREADS)
def test_area_equals_the_exact_rational_mean(build: Build, img: np.ndarray, tw: int, th: int, threads: int) -> None:
    np.testing.assert_array_equal(build.resize_area(img, tw, th, threads), area_reference(img, tw, th))


@pytest.mark.parametrize(
    ("w", "h", "tw", "th"), [(1, 1, 1, 1), (1, 1, 7, 5), (5, 3, 1, 1), (333, 211, 97, 61), (641, 479, 80, 60)]
)
def test_resize_of_odd_sizes_matches_across_builds_and_threads(build: Build, w: int, h: int, tw: int, th: int) -> None:
    img = np.random.default_rng(w + h).integers(0, 256, (h, w, 3), dtype=np.uint8)
    for method, twin in (("bilinear", resize.py_resize_bilinear), ("area", resize.py_resize_area)):
        impl = build.resize_bilinear if method == "bilinear" else build.resize_area
        expected = twin(img, tw, th)
        for threads in (1, 2, 3):
            np.testing.assert_array_equal(impl(img, tw, th, threads), expected, err_msg=f"{method} x{threads}")


def test_area_of_a_constant_image_is_that_constant(build: Build) -> None:
    img = np.full((7, 9, 4), 201, dtype=np.uint8)
    assert (build.resize_area(img, 4, 5, 2) == 201).all()
    assert (build.resize_area(img, 13, 11, 2) == 201).all()
    assert (build.resize_bilinear(img, 13, 11, 2) == 201).all()


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.sum_int64(np.zeros(3, dtype=np.int64), 0),
        lambda b: b.sum_int64(np.zeros(3, dtype=np.int32), 1),
        lambda b: b.sum_float64(np.zeros((2, 2)), 1),
        lambda b: b.count_primes(10, 0),
        lambda b: b.hash_rounds(-1, 1, 1),
        lambda b: b.count_inside(0, -1, 1),
        lambda b: b.resize_bilinear(np.zeros((2, 2, 3), dtype=np.uint8), 0, 1, 1),
        lambda b: b.resize_area(np.zeros((2, 2), dtype=np.uint8), 1, 1, 1),
    ],
)
def test_bad_arguments_are_refused_by_both_builds(build: Build, call: Any) -> None:
    with pytest.raises(ValueError):
        call(build)
