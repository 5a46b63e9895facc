# cython: language_level=3
"""C-level API of the compiled matrix product (contract in matmul.py)."""

cdef void pack_panel(const double* b, Py_ssize_t k, Py_ssize_t n, Py_ssize_t j0, double* panel) noexcept nogil
cdef void block4x4(
    const double* a, Py_ssize_t lda, Py_ssize_t rows, const double* panel, Py_ssize_t k,
    double* c, Py_ssize_t ldc, Py_ssize_t cols
) noexcept nogil
