"""Benchmarks: each module runs real processes on 127.0.0.1 and prints a table (``python -m bench``).

The benchmark's own client imports ``corral`` before ``grpc``, as a program using Corral's client
would, so it runs with the same gRPC transport defaults (:mod:`corral.transport`).
"""

import corral.transport  # noqa: F401  (first: sets gRPC transport defaults before grpc loads)
