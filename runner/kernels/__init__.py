"""Numeric kernels the job types call: a readable Python twin of each, and its compiled (Cython) build.

Each kernel is a pair: ``name.py`` is the reference twin *and* the loader, ``_name.pyx`` the compiled
build (directive header, ``cdef ... nogil`` loops, input checked in the Python-visible ``def``),
``_name.pxd`` its C-level declarations and ``_name.pyi`` the typed surface of the extension.

Modules:
    array_sum    exact sums of int64 and float64 arrays (int64: no wrap; float64: correctly rounded)
    primes       counting primes up to n (segmented sieve of odd numbers)
    hash_rounds  64 independent chains of SplitMix64 rounds folded into one digest
    monte_carlo  seeded points in the unit square that fall inside the quarter circle
    matmul       float64 matrix product (blocked), bit-identical to the sequential-k definition
    resize       bilinear and area resampling of uint8 images
    _splitmix    (``.pxd`` only) the SplitMix64 mixing step shared by the compiled kernels
    _array_sum_v3, _resize_v3   the same sources built for x86-64-v3 (AVX2); see Loading

Loading: ``name.py`` uses ``_name`` unless ``CORRAL_NO_EXTENSIONS=1`` is set or the extension was not
built; ``name.COMPILED`` tells which one runs. A kernel may also have ``_name_v3``, the same source
compiled for x86-64-v3 CPUs (AVX2; still bit-identical), which its loader prefers where
:func:`cpu_has_x86_64_v3` says the CPU can run it. All builds take the same arguments and return the same
results bit for bit, whatever the thread count: one conformance suite (``tests/contract/test_kernels.py``)
runs against every build. Compiled kernels release the GIL and split their work over the ``threads`` they are
given (OpenMP ``prange``); each thread writes its own partial result, combined after the parallel region,
so no lock is taken. The Python twins accept ``threads`` and ignore it.
"""

from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType

__all__ = ["X86_64_V3_FLAGS", "check_threads", "cpu_has_x86_64_v3", "extension", "extensions_disabled"]

X86_64_V3_FLAGS = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})
"""The /proc/cpuinfo flags of the x86-64-v3 level (``abm`` is how Linux shows LZCNT)."""


def extensions_disabled() -> bool:
    """True when ``CORRAL_NO_EXTENSIONS=1`` asks for the pure-Python twins."""
    return os.environ.get("CORRAL_NO_EXTENSIONS", "").strip() == "1"


def extension(name: str) -> ModuleType | None:
    """The compiled module ``runner.kernels.<name>``, or None when disabled or not built."""
    if extensions_disabled():
        return None
    try:
        return importlib.import_module(f"runner.kernels.{name}")
    except ImportError:
        return None


@functools.cache
def cpu_has_x86_64_v3() -> bool:
    """Whether this CPU has every x86-64-v3 feature (read from /proc/cpuinfo; False elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split()) >= X86_64_V3_FLAGS
    except OSError:
        pass
    return False


def check_threads(threads: int) -> int:
    """``threads`` if it is an int >= 1.

    Raises:
        ValueError: it is not.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    return threads
