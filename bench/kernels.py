"""``python -m bench.kernels``: the runner's kernels, compiled (1 and 2 threads) vs numpy vs pure Python.

One table per kernel; each of the 3 runs times every method once (fast calls are repeated and
averaged), and the table's last row is the median of the runs. Rates are per second of wall time;
the ratio columns are what the runner issue sets floors on:

* large_array_sum, 10,000,000 int64: GB/s; 1 thread >= 0.9x numpy's ``sum``, 2 threads >= 90% of the
  best bandwidth any method reaches;

(Compiled columns use the build the runner loads on this CPU: the ``_v3`` builds on x86-64-v3.)
* cpu_intensive: >= 50x the pure-Python reference, 2 threads >= 1.8x one (hash rounds; prime
  counting is reported too);
* resize_image, bilinear 4000x3000 RGB -> 800x600: >= 10x the vectorised numpy twin, 2 threads
  >= 1.8x one (the build the runner loads on this CPU: ``_resize_v3`` on x86-64-v3 machines; the
  baseline x86-64 build is shown beside it);
* matmul (float64 N x N) and monte_carlo_pi: reported, no floor.

The pure-Python methods run on smaller inputs (they would take minutes) and are compared by rate.
numpy's BLAS is left as configured: if ``OPENBLAS_CORETYPE`` is set on this machine, ``a @ b`` runs a
slower kernel than it could (see the environment notes); the matmul table says which is in effect.
Needs the compiled kernels (``pip install -e .``); ``--quick`` shrinks every size for a smoke run.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import statistics
import time
from collections.abc import Callable
from types import ModuleType

import numpy as np

from bench.report import table
from runner.kernels import (
    _hash_rounds,
    _matmul,
    _monte_carlo,
    _primes,
    _resize,
    array_sum,
    monte_carlo,
    primes,
    resize,
)
from runner.kernels import hash_rounds as hr

RUNS = 3


def seconds(fn: Callable[[], object], min_time: float = 0.2) -> float:
    """Wall seconds per call: one warm-up call, then calls until ``min_time`` has passed (mean)."""
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / calls


def once(fn: Callable[[], object]) -> float:
    """Wall seconds of one call (for the slow pure-Python methods)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def loaded(kernel: ModuleType) -> ModuleType:
    """The compiled module a kernel's loader picked on this CPU (``_name_v3`` or ``_name``)."""
    return importlib.import_module(f"runner.kernels.{kernel.BUILD}")


def bench_array_sum(quick: bool) -> dict[str, float]:
    compiled = loaded(array_sum)
    n = 1_000_000 if quick else 10_000_000
    values = np.random.default_rng(0).integers(-(2**62), 2**62, n, dtype=np.int64)
    gb = values.nbytes / 1e9
    py_values = values[: n // 10]
    rows = []
    for _ in range(RUNS):
        rate = {
            "numpy GB/s": gb / seconds(lambda: values.sum()),
            "cython 1t GB/s": gb / seconds(lambda: compiled.sum_int64(values, 1)),
            "cython 2t GB/s": gb / seconds(lambda: compiled.sum_int64(values, 2)),
            "python GB/s": (py_values.nbytes / 1e9) / once(lambda: sum(py_values.tolist())),
        }
        best = max(rate.values())
        rate["1t / numpy"] = rate["cython 1t GB/s"] / rate["numpy GB/s"]
        rate["2t / best %"] = 100 * rate["cython 2t GB/s"] / best
        rows.append(rate)
    return table(f"large_array_sum: {n:,} int64 (exact), build {array_sum.BUILD}", rows)


def bench_float_sum(quick: bool) -> dict[str, float]:
    compiled = loaded(array_sum)
    n = 1_000_000 if quick else 10_000_000
    values = np.random.default_rng(1).standard_normal(n)
    gb = values.nbytes / 1e9
    rows = []
    for _ in range(RUNS):
        rows.append(
            {
                "numpy GB/s (pairwise, not exact)": gb / seconds(lambda: values.sum()),
                "cython 1t GB/s": gb / seconds(lambda: compiled.sum_float64(values, 1)),
                "cython 2t GB/s": gb / seconds(lambda: compiled.sum_float64(values, 2)),
                "python fsum GB/s": gb / once(lambda: math.fsum(values.tolist())),
            }
        )
    return table(f"large_array_sum: {n:,} float64 (correctly rounded)", rows)


def numpy_hash_rounds(seed: int, rounds: int) -> int:
    """The hash rounds vectorised over the 64 lanes with numpy uint64 (wrapping) arithmetic."""
    golden, m1, m2 = np.uint64(hr.GOLDEN), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)

    def mix(z: np.ndarray) -> np.ndarray:
        z = (z ^ (z >> s30)) * m1
        z = (z ^ (z >> s27)) * m2
        out: np.ndarray = z ^ (z >> s31)
        return out

    states = mix(np.uint64(seed) + np.arange(1, hr.LANES + 1, dtype=np.uint64) * golden)
    for _ in range(rounds):
        states = mix(states + golden)
    digest = 0
    for state in states.tolist():
        digest = hr.mix64(digest ^ state)
    return digest


def bench_hash_rounds(quick: bool) -> dict[str, float]:
    c_rounds, np_rounds, py_rounds = (1 << 16, 1 << 10, 1 << 8) if quick else (1 << 21, 1 << 13, 1 << 11)
    assert numpy_hash_rounds(5, 50) == hr.py_hash_rounds(5, 50) == _hash_rounds.hash_rounds(5, 50, 2)
    rows = []
    for _ in range(RUNS):
        rate = {
            "cython 1t Mround/s": hr.LANES * c_rounds / seconds(lambda: _hash_rounds.hash_rounds(1, c_rounds, 1)) / 1e6,
            "cython 2t Mround/s": hr.LANES * c_rounds / seconds(lambda: _hash_rounds.hash_rounds(1, c_rounds, 2)) / 1e6,
            "numpy Mround/s": hr.LANES * np_rounds / once(lambda: numpy_hash_rounds(1, np_rounds)) / 1e6,
            "python Mround/s": hr.LANES * py_rounds / once(lambda: hr.py_hash_rounds(1, py_rounds)) / 1e6,
        }
        rate["1t / python"] = rate["cython 1t Mround/s"] / rate["python Mround/s"]
        rate["2t / 1t"] = rate["cython 2t Mround/s"] / rate["cython 1t Mround/s"]
        rows.append(rate)
    return table("cpu_intensive (rounds): 64 SplitMix64 chains", rows)


def numpy_count_primes(n: int) -> int:
    """A plain numpy sieve of odd numbers (a boolean array of n/2 entries)."""
    if n < 2:
        return 0
    flags = np.ones((n - 1) // 2 + 1, dtype=bool)  # index i: the odd number 2i + 1
    flags[0] = False
    for p in range(3, math.isqrt(n) + 1, 2):
        if flags[p // 2]:
            flags[p * p // 2 :: p] = False
    return 1 + int(np.count_nonzero(flags))


def bench_primes(quick: bool) -> dict[str, float]:
    c_n, py_n = (10**7, 10**6) if quick else (10**9, 10**8)
    assert numpy_count_primes(10**6) == primes.py_count_primes(10**6) == _primes.count_primes(10**6, 2) == 78498
    rows = []
    for _ in range(RUNS):
        rate = {
            "cython 1t Mnum/s": c_n / once(lambda: _primes.count_primes(c_n, 1)) / 1e6,
            "cython 2t Mnum/s": c_n / once(lambda: _primes.count_primes(c_n, 2)) / 1e6,
            "numpy Mnum/s": py_n / once(lambda: numpy_count_primes(py_n)) / 1e6,
            "python Mnum/s": py_n / once(lambda: primes.py_count_primes(py_n)) / 1e6,
        }
        rate["1t / python"] = rate["cython 1t Mnum/s"] / rate["python Mnum/s"]
        rate["2t / 1t"] = rate["cython 2t Mnum/s"] / rate["cython 1t Mnum/s"]
        rows.append(rate)
    return table(f"cpu_intensive (n): primes <= {c_n:,} (python and numpy: <= {py_n:,})", rows)


def python_bilinear(img: np.ndarray, tw: int, th: int) -> list[int]:
    """The bilinear contract one value at a time in pure Python (lists, floats)."""
    h, w, c = img.shape
    data = img.reshape(-1).tolist()
    out = []
    for y in range(th):
        sy = min(max((y + 0.5) * (h / th) - 0.5, 0.0), h - 1)
        y0 = int(sy)
        y1, fy = min(y0 + 1, h - 1), sy - y0
        for x in range(tw):
            sx = min(max((x + 0.5) * (w / tw) - 0.5, 0.0), w - 1)
            x0 = int(sx)
            x1, fx = min(x0 + 1, w - 1), sx - x0
            for ch in range(c):
                top = data[(y0 * w + x0) * c + ch] * (1.0 - fx) + data[(y0 * w + x1) * c + ch] * fx
                bottom = data[(y1 * w + x0) * c + ch] * (1.0 - fx) + data[(y1 * w + x1) * c + ch] * fx
                out.append(int(top * (1.0 - fy) + bottom * fy + 0.5))
    return out


def bench_resize(quick: bool, method: str) -> dict[str, float]:
    (w, h), (tw, th) = ((800, 600), (160, 120)) if quick else ((4000, 3000), (800, 600))
    img = np.random.default_rng(2).integers(0, 256, (h, w, 3), dtype=np.uint8)
    small = img[: h // 10, : w // 10].copy()
    compiled = getattr(loaded(resize), f"resize_{method}")  # what the runner uses on this CPU
    baseline = getattr(_resize, f"resize_{method}")
    twin = resize.py_resize_bilinear if method == "bilinear" else resize.py_resize_area
    mpix = tw * th / 1e6
    rows = []
    for _ in range(RUNS):
        rate = {
            "cython 1t Mpix/s": mpix / seconds(lambda: compiled(img, tw, th, 1)),
            "cython 2t Mpix/s": mpix / seconds(lambda: compiled(img, tw, th, 2)),
            "numpy Mpix/s": mpix / seconds(lambda: twin(img, tw, th), min_time=0.5),
        }
        if baseline is not compiled:
            rate["x86-64 build 1t Mpix/s"] = mpix / seconds(lambda: baseline(img, tw, th, 1))
        if method == "bilinear":
            rate["python Mpix/s"] = (
                (tw // 10) * (th // 10) / 1e6 / once(lambda: python_bilinear(small, tw // 10, th // 10))
            )
        rate["1t / numpy"] = rate["cython 1t Mpix/s"] / rate["numpy Mpix/s"]
        rate["2t / 1t"] = rate["cython 2t Mpix/s"] / rate["cython 1t Mpix/s"]
        rows.append(rate)
    note = " (python: a 10x smaller image)" if method == "bilinear" else ""
    return table(f"resize_image ({method}): {w}x{h} RGB -> {tw}x{th}, build {resize.BUILD}{note}", rows)


def bench_matmul(quick: bool) -> dict[str, float]:
    n, py_n = (300, 60) if quick else (1000, 120)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    pa, pb = a[:py_n, :py_n].tolist(), b[:py_n, :py_n].tolist()
    flops, py_flops = 2 * n**3 / 1e9, 2 * py_n**3 / 1e9
    from runner.kernels.matmul import matmul_reference

    rows = []
    for _ in range(RUNS):
        rate = {
            "cython 1t GFLOP/s": flops / seconds(lambda: _matmul.matmul(a, b, 1)),
            "cython 2t GFLOP/s": flops / seconds(lambda: _matmul.matmul(a, b, 2)),
            "numpy (BLAS) GFLOP/s": flops / seconds(lambda: a @ b),
            "python GFLOP/s": py_flops / once(lambda: matmul_reference(pa, pb, py_n)),
        }
        rate["1t / numpy"] = rate["cython 1t GFLOP/s"] / rate["numpy (BLAS) GFLOP/s"]
        rate["2t / 1t"] = rate["cython 2t GFLOP/s"] / rate["cython 1t GFLOP/s"]
        rows.append(rate)
    coretype = os.environ.get("OPENBLAS_CORETYPE", "unset")
    return table(f"matmul: {n}x{n} float64 (python: {py_n}x{py_n}; OPENBLAS_CORETYPE={coretype})", rows)


def bench_monte_carlo(quick: bool) -> dict[str, float]:
    c_n, np_n, py_n = (10**6, 10**6, 10**5) if quick else (2 * 10**8, 10**7, 10**6)
    rows = []
    for _ in range(RUNS):
        rate = {
            "cython 1t Msample/s": c_n / once(lambda: _monte_carlo.count_inside(1, c_n, 1)) / 1e6,
            "cython 2t Msample/s": c_n / once(lambda: _monte_carlo.count_inside(1, c_n, 2)) / 1e6,
            "numpy Msample/s": np_n / once(lambda: monte_carlo.py_count_inside(1, np_n)) / 1e6,
            "python Msample/s": py_n / once(lambda: monte_carlo.inside_reference(1, py_n)) / 1e6,
        }
        rate["2t / 1t"] = rate["cython 2t Msample/s"] / rate["cython 1t Msample/s"]
        rows.append(rate)
    return table("monte_carlo_pi: seeded samples", rows)


FLOORS: list[tuple[str, str, str, float]] = [
    ("large_array_sum", "1t / numpy", ">=", 0.9),
    ("large_array_sum", "2t / best %", ">=", 90.0),
    ("cpu_intensive (rounds)", "1t / python", ">=", 50.0),
    ("cpu_intensive (rounds)", "2t / 1t", ">=", 1.8),
    ("cpu_intensive (n)", "1t / python", ">=", 50.0),
    ("cpu_intensive (n)", "2t / 1t", ">=", 1.8),
    ("resize_image (bilinear)", "1t / numpy", ">=", 10.0),
    ("resize_image (bilinear)", "2t / 1t", ">=", 1.8),
]


def main(argv: list[str] | None = None) -> None:
    """Run every kernel benchmark and print the tables, then the floors and whether each is met."""
    parser = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a measurement")
    args = parser.parse_args(argv)
    medians = {
        "large_array_sum": bench_array_sum(args.quick),
        "large_array_sum (float64)": bench_float_sum(args.quick),
        "cpu_intensive (rounds)": bench_hash_rounds(args.quick),
        "cpu_intensive (n)": bench_primes(args.quick),
        "resize_image (bilinear)": bench_resize(args.quick, "bilinear"),
        "resize_image (area)": bench_resize(args.quick, "area"),
        "matmul": bench_matmul(args.quick),
        "monte_carlo_pi": bench_monte_carlo(args.quick),
    }
    rows = []
    for kernel, column, _, floor in FLOORS:
        value = medians[kernel][column]
        rows.append(
            f"{kernel:26} {column:14} median {value:9.2f}   floor {floor:6.2f}   {'met' if value >= floor else 'BELOW'}"
        )
    print("\n".join(["floors (medians of 3 runs):", *rows]))
    print(f"load average while running: {statistics.mean(os.getloadavg()):.2f} (other work on the machine skews these)")


if __name__ == "__main__":
    main()
