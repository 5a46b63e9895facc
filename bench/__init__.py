"""Benchmarks: each module runs real processes on 127.0.0.1 and prints a table (``python -m bench``)."""
