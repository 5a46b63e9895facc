# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The x86-64-v3 (AVX2) build of ``_resize``: the same source, compiled for newer x86-64 CPUs.

setup.py compiles every ``*_v3.pyx`` with ``-march=x86-64-v3`` (on x86-64 only; still no fused
multiply-add, so the results are bit-identical), and ``runner.kernels.resize`` loads this module
instead of ``_resize`` when the CPU has every x86-64-v3 feature (AVX2 and friends). Twice the vector
width makes the bilinear arithmetic about 1.5x faster.
"""

include "_resize.pyx"
