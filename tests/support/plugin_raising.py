"""A job-type plug-in whose own code fails as it is imported (for the worker's start-up tests)."""

raise RuntimeError("this plug-in fails as it is imported")
