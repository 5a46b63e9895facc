"""Helpers shared by tests: ``jobtypes`` is a plug-in module of job types made for tests."""
