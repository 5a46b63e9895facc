"""Limits that the control plane, workers and clients share."""

from __future__ import annotations

MAX_THREADS = 1024
"""The most threads a job may demand, and the most threads or slots (runner processes) one worker may
have: a worker's settings are checked against it before any process starts, so a mistyped
CORRAL_WORKER_THREADS cannot start millions of processes, and the control plane refuses a worker that
registers more."""
