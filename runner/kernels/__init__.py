"""Numeric kernels the job types call: readable pure-Python references now, compiled twins later.

Modules: ``array_sum`` (exact integer sum).
"""
