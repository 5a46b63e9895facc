# cython: language_level=3
"""C-level API of the compiled resamplers (contract in resize.py)."""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

cdef void bilinear_row(
    const uint8_t* row0, const uint8_t* row1, double fy, const int32_t* left, const int32_t* right,
    Py_ssize_t safe_left, Py_ssize_t safe_right, const double* wl, const double* wr, Py_ssize_t target_width,
    Py_ssize_t channels, uint8_t* scratch, uint8_t* out
) noexcept nogil
cdef void area_row(
    const uint8_t* image, Py_ssize_t width, Py_ssize_t channels, Py_ssize_t first_row,
    const int64_t* wy, Py_ssize_t nwy, const Py_ssize_t* xstart, const Py_ssize_t* xoff, const int64_t* wx,
    Py_ssize_t target_width, int64_t scale, uint32_t* acc, uint8_t* out
) noexcept nogil
