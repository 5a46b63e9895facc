# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The x86-64-v3 (AVX2) build of ``_array_sum``: the same source, compiled for newer x86-64 CPUs.

setup.py compiles every ``*_v3.pyx`` with ``-march=x86-64-v3`` (on x86-64 only), and
``runner.kernels.array_sum`` loads this module instead of ``_array_sum`` when the CPU has every
x86-64-v3 feature: the int64 loop then moves 32 bytes per step and keeps up with numpy's own sum
when the data is in cache.
"""

from runner.kernels._array_sum cimport LIMBS

include "_array_sum.pyx"
