"""Job-type plug-ins: modules named with ``--import``, and the ``corral.job_types`` entry points.

An installed distribution adds job types without any flag by declaring entry points in the
``corral.job_types`` group; each names a :class:`~runner.registry.JobType` subclass (registered here
if its module did not already) or a module (which registers its types as it is imported)::

    # pyproject.toml of the plug-in's distribution
    [project.entry-points."corral.job_types"]
    thumbnail = "acme_jobs.thumbnail:Thumbnail"

:func:`load_plugins` loads the entry points once per process, then imports the named modules. The
worker agent calls it before it advertises its job types, and so does every runner process before it
says READY, so the control plane, the worker and its runners agree on the types.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Iterable
from types import ModuleType

from runner.registry import JobType, register

__all__ = ["ENTRY_POINT_GROUP", "load_entry_points", "load_plugins"]

ENTRY_POINT_GROUP = "corral.job_types"
"""The entry-point group plug-in distributions declare their job types in."""

_loaded: list[str] | None = None


def load_entry_points(*, reload: bool = False) -> list[str]:
    """Load every ``corral.job_types`` entry point (once per process); returns their names.

    Raises:
        ImportError: an entry point cannot be loaded, or names something other than a JobType
            subclass or a module (the message names the entry point).
    """
    global _loaded
    if _loaded is not None and not reload:
        return list(_loaded)
    names = []
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            target = entry.load()
        except Exception as exc:
            raise ImportError(f"cannot load job-type entry point {entry.name!r} ({entry.value}): {exc}") from exc
        if inspect.isclass(target) and issubclass(target, JobType):
            try:
                register(target)
            except (TypeError, ValueError) as exc:
                raise ImportError(f"job-type entry point {entry.name!r} ({entry.value}): {exc}") from exc
        elif not isinstance(target, ModuleType):
            raise ImportError(
                f"job-type entry point {entry.name!r} ({entry.value}) names {type(target).__name__}, "
                "not a JobType subclass or a module"
            )
        names.append(entry.name)
    _loaded = names
    return list(names)


def load_plugins(modules: Iterable[str]) -> None:
    """Load the entry points (once), then import each module by dotted name.

    Raises:
        ImportError: an entry point or a module cannot be loaded (the error names it), whatever the
            module raised while importing (a syntax error, a job type its registry refuses, ...).
    """
    load_entry_points()
    for name in modules:
        if not name:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(f"cannot import job-type plug-in {name!r}: {exc}") from exc
        except Exception as exc:  # its own code failed: as fatal as a missing module, and should say where
            raise ImportError(f"cannot import job-type plug-in {name!r}: {type(exc).__name__}: {exc}") from exc
