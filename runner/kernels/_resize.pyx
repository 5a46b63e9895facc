# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled bilinear and area resampling of uint8 images; the contract is in resize.py.

Both walk the output rows in a ``prange``. Bilinear takes its weights from ``resize.bilinear_axis``
(the same numpy arrays the twin uses) and repeats the twin's float64 operations in the same order.
Area sums the covered source rows into one row of uint32 per thread (at most 255 * height < 2**32),
then the covered columns of that row into an int64, and rounds the exact quotient.
"""

import numpy as np

from cython.parallel cimport prange, threadid
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memcpy, memset


cdef inline void _gather(
    const uint8_t* row, const int32_t* offsets, Py_ssize_t count, Py_ssize_t safe, Py_ssize_t channels,
    uint8_t* dst
) noexcept nogil:
    """dst[x*channels + c] = row[offsets[x] + c]: the pixels at ``offsets``, packed.

    With 3 or 4 channels a pixel moves as one 4-byte word (a 3-channel word's fourth byte is
    overwritten by the next pixel, and dst has a spare byte at the end); only the first ``safe``
    pixels do so, those whose word ends inside the row; the rest move byte by byte.
    """
    cdef Py_ssize_t x, c
    if channels == 3 or channels == 4:
        for x in range(safe):
            memcpy(dst + x * channels, row + offsets[x], 4)
    else:
        safe = 0
    for x in range(safe, count):
        for c in range(channels):
            dst[x * channels + c] = row[offsets[x] + c]


cdef void bilinear_row(
    const uint8_t* row0, const uint8_t* row1, double fy, const int32_t* left, const int32_t* right,
    Py_ssize_t safe_left, Py_ssize_t safe_right, const double* wl, const double* wr, Py_ssize_t target_width,
    Py_ssize_t channels, uint8_t* scratch, uint8_t* out
) noexcept nogil:
    """One output row from its two source rows (``fy`` is the weight of row1).

    ``left[x]``/``right[x]`` are the byte offsets in a source row of output pixel x's two neighbours
    (``safe_*`` of them can be read as 4-byte words), and ``wl[i] = 1 - fx``, ``wr[i] = fx`` the weights
    of value i = x*channels + c. The neighbours are first gathered into four packed byte rows
    (``scratch``, 4 * (n + 1) bytes), so that the float64 arithmetic runs over contiguous arrays and
    vectorises; the operations and their order are the twin's.
    """
    cdef Py_ssize_t n = target_width * channels, stride = n + 1
    cdef uint8_t* a0 = scratch
    cdef uint8_t* b0 = scratch + stride
    cdef uint8_t* a1 = scratch + 2 * stride
    cdef uint8_t* b1 = scratch + 3 * stride
    cdef Py_ssize_t i
    cdef double top, bottom, v, gy = 1.0 - fy
    _gather(row0, left, target_width, safe_left, channels, a0)
    _gather(row0, right, target_width, safe_right, channels, b0)
    _gather(row1, left, target_width, safe_left, channels, a1)
    _gather(row1, right, target_width, safe_right, channels, b1)
    for i in range(n):
        top = <double>a0[i] * wl[i] + <double>b0[i] * wr[i]
        bottom = <double>a1[i] * wl[i] + <double>b1[i] * wr[i]
        v = top * gy + bottom * fy + 0.5
        # 0.5 <= v < 256 (a convex mix of bytes, plus 0.5), so truncation is floor and the twin's
        # clip to 0..255 never changes a value
        out[i] = <uint8_t><int>v


def resize_bilinear(image, target_width, target_height, threads=1):
    """Bilinear resampling of a (height, width, channels) uint8 image, over ``threads`` threads."""
    from runner.kernels.resize import bilinear_axis

    image = _checked(image, target_width, target_height, threads)
    cdef const uint8_t[:, :, ::1] src = image
    cdef Py_ssize_t height = src.shape[0], width = src.shape[1], channels = src.shape[2]
    cdef Py_ssize_t tw = target_width, th = target_height, n = tw * channels
    y0_a, y1_a, fy_a = bilinear_axis(height, th)
    x0_a, x1_a, fx_a = bilinear_axis(width, tw)
    # Per output pixel: byte offsets of its neighbours in a row (a row is < 2**31 bytes), and how
    # many of them can be read as 4-byte words; per output value: the weights.
    left_a = (x0_a * channels).astype(np.int32)
    right_a = (x1_a * channels).astype(np.int32)
    cdef Py_ssize_t safe_left = int(np.count_nonzero(left_a + 4 <= width * channels))
    cdef Py_ssize_t safe_right = int(np.count_nonzero(right_a + 4 <= width * channels))
    wr_a = np.repeat(fx_a, channels)
    wl_a = 1.0 - wr_a
    cdef const Py_ssize_t[::1] y0 = y0_a, y1 = y1_a
    cdef const int32_t[::1] left = left_a, right = right_a
    cdef const double[::1] fy = fy_a, wl = wl_a, wr = wr_a
    out_array = np.empty((th, tw, channels), dtype=np.uint8)
    cdef uint8_t[:, :, ::1] out = out_array
    cdef int nthreads = threads
    scratch_array = np.empty((nthreads, 4 * (n + 1)), dtype=np.uint8)
    cdef uint8_t[:, ::1] scratch = scratch_array
    cdef Py_ssize_t y
    for y in prange(th, nogil=True, num_threads=nthreads, schedule="static"):
        bilinear_row(
            &src[y0[y], 0, 0], &src[y1[y], 0, 0], fy[y], &left[0], &right[0], safe_left, safe_right,
            &wl[0], &wr[0], tw, channels, &scratch[threadid(), 0], &out[y, 0, 0]
        )
    return out_array


cdef void area_row(
    const uint8_t* image, Py_ssize_t width, Py_ssize_t channels, Py_ssize_t first_row,
    const int64_t* wy, Py_ssize_t nwy, const Py_ssize_t* xstart, const Py_ssize_t* xoff, const int64_t* wx,
    Py_ssize_t target_width, int64_t scale, uint32_t* acc, uint8_t* out
) noexcept nogil:
    """One output row: acc = weighted sum of its source rows, then each pixel's covered columns."""
    cdef Py_ssize_t row_len = width * channels, r, i, x, ch, k, col
    cdef const uint8_t* src
    cdef uint32_t w
    cdef int64_t s
    memset(acc, 0, <size_t>row_len * sizeof(uint32_t))
    for r in range(nwy):
        src = image + (first_row + r) * row_len
        w = <uint32_t>wy[r]
        for i in range(row_len):
            acc[i] += w * src[i]
    for x in range(target_width):
        for ch in range(channels):
            s = 0
            col = xstart[x]
            for k in range(xoff[x], xoff[x + 1]):
                s += wx[k] * acc[col * channels + ch]
                col += 1
            out[x * channels + ch] = <uint8_t>((2 * s + scale) // (2 * scale))


def resize_area(image, target_width, target_height, threads=1):
    """Area resampling (exact) of a (height, width, channels) uint8 image, over ``threads`` threads."""
    from runner.kernels.resize import area_weights

    image = _checked(image, target_width, target_height, threads)
    cdef const uint8_t[:, :, ::1] src = image
    cdef Py_ssize_t height = src.shape[0], width = src.shape[1], channels = src.shape[2]
    cdef Py_ssize_t tw = target_width, th = target_height
    ys_a, yo_a, yw_a = area_weights(height, th)
    xs_a, xo_a, xw_a = area_weights(width, tw)
    cdef const Py_ssize_t[::1] ystart = ys_a, yoff = yo_a, xstart = xs_a, xoff = xo_a
    cdef const int64_t[::1] yw = yw_a, xw = xw_a
    cdef int nthreads = threads
    acc_array = np.empty((nthreads, width * channels), dtype=np.uint32)
    cdef uint32_t[:, ::1] acc = acc_array
    out_array = np.empty((th, tw, channels), dtype=np.uint8)
    cdef uint8_t[:, :, ::1] out = out_array
    cdef int64_t scale = <int64_t>width * height
    cdef Py_ssize_t y
    for y in prange(th, nogil=True, num_threads=nthreads, schedule="static"):
        area_row(
            &src[0, 0, 0], width, channels, ystart[y], &yw[yoff[y]], yoff[y + 1] - yoff[y],
            &xstart[0], &xoff[0], &xw[0], tw, scale, &acc[threadid(), 0], &out[y, 0, 0]
        )
    return out_array


def _checked(image, target_width, target_height, threads):
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    shape = getattr(image, "shape", ())
    if len(shape) != 3 or str(getattr(image, "dtype", "")) != "uint8" or min(shape) < 1:
        raise ValueError(f"image must be a non-empty (height, width, channels) uint8 array, got {shape}")
    if target_width < 1 or target_height < 1:
        raise ValueError(f"target size must be >= 1 x 1, got {target_width} x {target_height}")
    return np.ascontiguousarray(image)
