"""The upgrade fixtures (``tests/fixtures/upgrade``) as the upgrade tests use them.

Each fixture is a database an old release wrote and the JSON its maker wrote beside it (see
``tests/support/make_upgrade_fixture.py``): every job as that release answered GetJob, by its role
("succeeded", "running", "pending_selector", ...), the settings that release ran with and the keyed
requests to replay. A test opens a copy with the current control plane (:meth:`Fixture.open`), never the
committed file.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from google.protobuf import json_format, timestamp_pb2

from corral.v1 import jobs_pb2
from tests.conftest import FAST_ENV, ControlProc

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "upgrade"

DERIVED = frozenset({"queue_position", "estimated_start_time", "waiting_on"})
"""Job fields computed from the queue as it is now, not stored: they change as jobs around them run."""

ANSWERED_SINCE = frozenset({"charged_attempts"})
"""Job fields answered since the kept releases were made: their answers lack them, so each is checked by
its own rule instead (``charged_attempts``: the count kept in the store, at most ``attempts``)."""

SUBMITTED = frozenset(
    {"id", "name", "type", "payload", "priority", "thread_demand", "max_attempts", "timeout_sec", "scheduled_at"}
    | {"created_at", "idempotency_key", "labels", "owner", "worker_selector", "depends_on", "gpu_count"}
    | {"memory_mb", "notify", "start_when"}
)
"""Job fields fixed at submission: a job that moved on after its snapshot still has these as they were."""


def names() -> list[str]:
    """The fixtures there are, as ``<release>-<clean|kill>``."""
    return sorted(p.stem for p in FIXTURES.glob("*.db"))


def as_dict(job: jobs_pb2.Job) -> dict[str, Any]:
    """A job as the fixtures keep it (``MessageToDict``, proto field names, defaults left out)."""
    out: dict[str, Any] = json_format.MessageToDict(job, preserving_proto_field_name=True)
    return out


@dataclass(frozen=True)
class Fixture:
    """One fixture: its database and what the release that wrote it said about it."""

    name: str

    @cached_property
    def manifest(self) -> dict[str, Any]:
        """The maker's JSON."""
        loaded: dict[str, Any] = json.loads((FIXTURES / f"{self.name}.json").read_text())
        return loaded

    @property
    def killed(self) -> bool:
        """Whether that release was killed (``kill -9``) mid-work rather than stopped."""
        return bool(self.manifest["stop"] == "kill")

    @property
    def ids(self) -> dict[str, str]:
        """Job id by role."""
        return dict(self.manifest["ids"])

    @property
    def before(self) -> dict[str, dict[str, Any]]:
        """Each role's job as that release last answered GetJob."""
        return dict(self.manifest["jobs"])

    def carried(self, field: str) -> bool:
        """Whether that release's SubmitJobRequest had ``field`` (else its jobs were submitted without it)."""
        return field in self.manifest["fields"]

    def metadata(self, who: str = "ops") -> tuple[tuple[str, str], ...]:
        """The call metadata of ``who``'s token (``ops`` is an admin: it sees every job)."""
        return (("authorization", f"Bearer {self.manifest['tokens'][who]}"),)

    def open(self, workdir: Path, **env: str) -> ControlProc:
        """Start the current control plane on a copy of the database in ``workdir`` (copied the first time
        only, so that a second open goes on from the first), with the settings that release had, retention
        off, the tests' fast timings, and ``env`` over them."""
        workdir.mkdir(parents=True, exist_ok=True)
        # Retention off whatever that release knew: its finished jobs are older than the default's week by
        # the time a test runs, and would be purged before they are read (which the retention tests check).
        kept = {"CORRAL_JOB_RETENTION_SEC": "0", "CORRAL_FAILED_RETENTION_SEC": "0"}
        cp = ControlProc(workdir, {**self.manifest["settings"], **kept, **FAST_ENV, **env})
        if not cp.db.exists():
            shutil.copyfile(FIXTURES / f"{self.name}.db", cp.db)
        cp.token = self.manifest["tokens"]["ops"]
        cp.start()
        return cp

    def replay(self, role: str) -> tuple[jobs_pb2.SubmitJobRequest, tuple[tuple[str, str], ...]]:
        """The keyed request that submitted ``role``'s job, and the metadata it was sent with."""
        sent = self.manifest["requests"][role]
        request = json_format.ParseDict(sent["request"], jobs_pb2.SubmitJobRequest())
        return request, self.metadata(sent["by"])


def same_times(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``after`` with each time (a ``*_at`` field) that is within a microsecond of ``before``'s replaced
    by ``before``'s text. Releases before 6f74fb7 answered a time with the error of the float it is kept
    as (``.586027520Z`` for the ``.586028Z`` it holds, rounded from a ``t * 1e9`` up to 128 ns off); this
    one answers the microsecond, which can be one off the rounding of that text."""
    out = dict(after)
    for key, was in before.items():
        now = after.get(key)
        if not (key.endswith("_at") and isinstance(was, str) and isinstance(now, str)) or now == was:
            continue
        if abs(_nanoseconds(now) - _nanoseconds(was)) <= 1000:
            out[key] = was
    return out


def _nanoseconds(text: str) -> int:
    ts = timestamp_pb2.Timestamp()
    ts.FromJsonString(text)
    return int(ts.ToNanoseconds())
