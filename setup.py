"""Builds the Cython kernels of runner/ next to the pure-Python twins they accelerate.

Everything else about the package lives in pyproject.toml.  Set CORRAL_NO_EXTENSIONS=1 to build
without a C compiler; the runner then falls back to its pure-Python kernels.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from setuptools import setup


def _extensions() -> list[object]:
    if os.environ.get("CORRAL_NO_EXTENSIONS") == "1":
        return []
    pyx = sorted(Path("runner").rglob("*.pyx"))
    if not pyx:
        return []
    import numpy
    from Cython.Build import cythonize
    from setuptools import Extension

    # A `*_v3.pyx` is a second build of a kernel for x86-64-v3 CPUs (AVX2), chosen at run time by the
    # kernel's loader; it only exists on x86-64.
    x86_64 = platform.machine().lower() in ("x86_64", "amd64")
    exts = [
        Extension(
            ".".join(p.with_suffix("").parts),
            [str(p)],
            include_dirs=[numpy.get_include()],
            # -ffp-contract=off: no fused multiply-add, so float results equal the Python twins bit for bit.
            extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off"]
            + (["-march=x86-64-v3"] if p.stem.endswith("_v3") else []),
            extra_link_args=["-fopenmp"],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        )
        for p in pyx
        if x86_64 or not p.stem.endswith("_v3")
    ]
    return list(cythonize(exts, language_level=3, compiler_directives={"embedsignature": True}))


setup(ext_modules=_extensions())
