"""The public surface of the `corral` package is pinned: changing it is a decision, not an accident."""

from __future__ import annotations

import importlib

import pytest

import corral
import corral.cli

EXPECTED = {
    # Clients
    "AsyncClient",
    "Client",
    # Jobs
    "Job",
    "JobError",
    "JobPage",
    "Changed",
    "JobSpec",
    "OutputChunk",
    "JobState",
    "Notify",
    # Cluster
    "AutoscalerStatus",
    "ExecRateLimit",
    "ShareInfo",
    "Shares",
    "Stats",
    "WorkerInfo",
    "WorkerState",
    # Accounts
    "Account",
    "Identity",
    "Login",
    # The audit log
    "AuditEvent",
    "AuditPage",
    # Errors
    "AlreadyExists",
    "ClientClosed",
    "CorralError",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "MessageTooLarge",
    "NotFound",
    "PermissionDenied",
    "RateLimited",
    "StaleAttempt",
    "Unauthenticated",
    "Unavailable",
}


def test_corral_exports_exactly_the_public_names() -> None:
    assert set(corral.__all__) == EXPECTED
    assert len(corral.__all__) == len(EXPECTED)
    for name in corral.__all__:
        assert getattr(corral, name).__module__.startswith("corral.")


def test_the_cli_package_exports_main_for_the_console_script() -> None:
    assert corral.cli.__all__ == ["main"]
    assert callable(corral.cli.main)


def test_python_m_corral_cli_runs_the_same_entry_point_and_leaves_it_in_place() -> None:
    import runpy
    import sys

    argv = sys.argv
    sys.argv = ["corral", "--help"]
    try:
        with pytest.raises(SystemExit) as ended:
            runpy.run_module("corral.cli", run_name="__main__")
    finally:
        sys.argv = argv
    assert ended.value.code == 0
    assert callable(corral.cli.main) and corral.cli.main.__module__ == "corral.cli.main"


def test_each_public_name_is_its_home_module_s_object_and_listed_by_dir() -> None:
    for name in corral.__all__:
        value = getattr(corral, name)
        assert getattr(importlib.import_module(value.__module__), name) is value
        assert name in dir(corral)


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="'NoSuchThing'"):
        _ = corral.NoSuchThing  # type: ignore[attr-defined]
