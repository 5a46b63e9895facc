# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled float64 matrix product, blocked; the contract (and the summation order) is in matmul.py."""

import numpy as np

from cython.parallel cimport prange

cdef enum:
    NR = 4   # columns of C per packed panel of B and per register block
    MR = 4   # rows of C per register block
    MC = 64  # rows of C per slab (a thread's unit of work; its rows of A stay in L2)


cdef void pack_panel(const double* b, Py_ssize_t k, Py_ssize_t n, Py_ssize_t j0, double* panel) noexcept nogil:
    """Copy columns j0 .. j0+3 of the (k, n) matrix b into panel[t*4 + s], zero past the last column."""
    cdef Py_ssize_t t, s
    for t in range(k):
        for s in range(NR):
            panel[t * NR + s] = b[t * n + j0 + s] if j0 + s < n else 0.0


cdef void block4x4(
    const double* a, Py_ssize_t lda, Py_ssize_t rows, const double* panel, Py_ssize_t k,
    double* c, Py_ssize_t ldc, Py_ssize_t cols
) noexcept nogil:
    """C[0:rows, 0:cols] = A[0:rows, :] @ panel, each element summed over t in order from 0.0.

    Rows past ``rows`` read row 0 again (their sums are computed and dropped), so the loop has no
    branch; a fused multiply-add is never used (-ffp-contract=off), so each step rounds twice.
    """
    cdef const double* a0 = a
    cdef const double* a1 = a + lda * (1 if rows > 1 else 0)
    cdef const double* a2 = a + lda * (2 if rows > 2 else 0)
    cdef const double* a3 = a + lda * (3 if rows > 3 else 0)
    cdef double c00 = 0.0, c01 = 0.0, c02 = 0.0, c03 = 0.0
    cdef double c10 = 0.0, c11 = 0.0, c12 = 0.0, c13 = 0.0
    cdef double c20 = 0.0, c21 = 0.0, c22 = 0.0, c23 = 0.0
    cdef double c30 = 0.0, c31 = 0.0, c32 = 0.0, c33 = 0.0
    cdef double x, b0, b1, b2, b3
    cdef Py_ssize_t t
    cdef const double* p
    for t in range(k):
        p = panel + t * NR
        b0 = p[0]
        b1 = p[1]
        b2 = p[2]
        b3 = p[3]
        x = a0[t]
        c00 += x * b0
        c01 += x * b1
        c02 += x * b2
        c03 += x * b3
        x = a1[t]
        c10 += x * b0
        c11 += x * b1
        c12 += x * b2
        c13 += x * b3
        x = a2[t]
        c20 += x * b0
        c21 += x * b1
        c22 += x * b2
        c23 += x * b3
        x = a3[t]
        c30 += x * b0
        c31 += x * b1
        c32 += x * b2
        c33 += x * b3
    cdef double out[MR][NR]
    out[0][0] = c00
    out[0][1] = c01
    out[0][2] = c02
    out[0][3] = c03
    out[1][0] = c10
    out[1][1] = c11
    out[1][2] = c12
    out[1][3] = c13
    out[2][0] = c20
    out[2][1] = c21
    out[2][2] = c22
    out[2][3] = c23
    out[3][0] = c30
    out[3][1] = c31
    out[3][2] = c32
    out[3][3] = c33
    cdef Py_ssize_t r, s
    for r in range(rows):
        for s in range(cols):
            c[r * ldc + s] = out[r][s]


def matmul(a, b, threads=1):
    """``A @ B`` for 2-D float64 arrays, summed in the order matmul.py defines, over ``threads``."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    for name, matrix in (("a", a), ("b", b)):
        if getattr(matrix, "ndim", None) != 2 or str(getattr(matrix, "dtype", "")) != "float64":
            raise ValueError(f"{name} must be a 2-D float64 array")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply")
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    cdef Py_ssize_t m = a.shape[0], k = a.shape[1], n = b.shape[1]
    out_array = np.zeros((m, n), dtype=np.float64)
    if m == 0 or n == 0 or k == 0:
        return out_array
    cdef const double[:, ::1] av = a
    cdef const double[:, ::1] bv = b
    cdef double[:, ::1] cv = out_array
    cdef Py_ssize_t npanels = (n + NR - 1) // NR
    packed_array = np.empty((npanels, k * NR), dtype=np.float64)
    cdef double[:, ::1] packed = packed_array
    cdef int nthreads = threads
    cdef Py_ssize_t jp, slab, nslabs = (m + MC - 1) // MC, i, i_end, j0
    for jp in prange(npanels, nogil=True, num_threads=nthreads, schedule="static"):
        pack_panel(&bv[0, 0], k, n, jp * NR, &packed[jp, 0])
    for slab in prange(nslabs, nogil=True, num_threads=nthreads, schedule="dynamic"):
        i_end = min((slab + 1) * MC, m)
        for jp in range(npanels):
            j0 = jp * NR
            i = slab * MC
            while i < i_end:
                block4x4(&av[i, 0], k, min(MR, i_end - i), &packed[jp, 0], k, &cv[i, j0], n, min(NR, n - j0))
                i = i + MR
    return out_array
