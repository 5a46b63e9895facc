"""Make an upgrade fixture: a SQLite database written by an OLD release of Corral, and what it held.

The upgrade tests (``tests/fault/test_upgrade_store.py``) open these databases with the current code and
check every job and field, so that an upgrade in place (stop the control plane, install the new release,
start it on the same file) is tested in CI without git history or old trees. Regenerate one with::

    .venv/bin/python tests/support/make_upgrade_fixture.py REV [--stop clean|kill] [--out tests/fixtures/upgrade]

It checks out ``REV`` in a throw-away git worktree (``/tmp/corral-fixture-<rev>``, removed afterwards),
gives it the current tree's compiled extensions where the ``.pyx`` sources are the same (and builds the
others with ``setup.py build_ext --inplace``), then runs, with that tree's own packages first on the path
(checked: the run fails unless ``control``, ``corral`` and ``worker`` come from it):

- that release's control plane (``python -m control``) on 127.0.0.1, with two client tokens (``alice``,
  ``ops``, an admin) where it knows them, keys that live a century and retention off, so that the jobs
  and keys are still there whenever a test opens the copy;
- one of its workers, with one slot (two with ``--stop kill``), importing its ``tests.support.jobtypes``;
- jobs in every state, each with what that release's SubmitJobRequest can carry: SUCCEEDED (a result,
  printed output, labels, a name, a key), FAILED (the dead-letter queue, one of them after a retry),
  CANCELLED (and the audit event of that cancel), RUNNING (a long sleep, on the worker at the stop),
  PENDING behind it (priorities, keys, a dependency on a SUCCEEDED job, a worker selector, GPUs and
  memory, a notification, ``start_when``), SCHEDULED far in the future, a dependency on that one, and
  SCHEDULED soon (due by the time a test opens it); an account, where the release has them.

Then it reads every job back from that control plane (``GetJob``) and its stats, and stops it:

- ``clean``: SIGTERM, as an operator's stop before an upgrade; the worker is then killed (``kill -9``), so
  that the RUNNING job's worker never comes back.
- ``kill``: a second long job fills the worker's second slot; after the snapshot a burst of 20 short
  jobs at the top priority is submitted (ahead of the PENDING jobs, which stay where they are), the second
  long job is cancelled (freeing a slot for the burst), and once 5 of the burst succeeded the control
  plane and the worker are killed (``kill -9``), mid-work.

Either way the log is then folded into the database file (``wal_checkpoint``, as SQLite's next open would
do) and the file vacuumed, so that one small file holds what was committed.

It writes ``<rev>-<stop>.db`` and ``<rev>-<stop>.json`` into ``--out``: the JSON holds the release, the
tokens, each job as that release answered ``GetJob`` (by its role in the list above) and which roles it
may have moved on after that answer (``in_flux``: the cancelled second long job, with ``kill``), the
burst's ids, the settings that release was given (``settings``; a test gives the current one the same),
the requests that carried an idempotency key (``requests``, to replay) and ``GetStats``. The database must stay small (each under ~200 KB): it is committed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
TOKENS = {"alice": "alice-upgrade-token", "ops": "ops-upgrade-token"}
WORKER_TOKEN = "worker-upgrade-token"
FAR_FUTURE = 4102444800.0  # 2100-01-01: SCHEDULED whenever a test opens the copy
CENTURY = 100 * 365 * 86400


def _tree_for(rev: str) -> Path:
    """A worktree of ``rev`` with its compiled extensions in place."""
    tree = Path(tempfile.gettempdir()) / f"corral-fixture-{rev}"
    if tree.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True)
    build = False
    for pyx in tree.glob("runner/**/*.pyx"):
        mine = ROOT / pyx.relative_to(tree)
        built = list(mine.parent.glob(mine.stem + ".cpython-*.so"))
        if mine.exists() and built and mine.read_bytes() == pyx.read_bytes():
            shutil.copy2(built[0], pyx.parent / built[0].name)
        else:
            build = True
    if build:
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree, check=True)
    return tree


def main(argv: list[str] | None = None) -> int:
    """Make one fixture (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rev", help="the old release's commit")
    p.add_argument("--stop", choices=("clean", "kill"), default="clean")
    p.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "upgrade")
    p.add_argument("--tree", type=Path, help="an existing tree of REV (built) instead of a new worktree")
    args = p.parse_args(argv)
    rev = subprocess.run(
        ["git", "rev-parse", "--short=7", args.rev], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    tree = args.tree.resolve() if args.tree else _tree_for(rev)
    try:
        with tempfile.TemporaryDirectory(prefix="corral-fixture-") as work:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env["PYTHONPATH"] = str(tree)
            env["PYTHONUNBUFFERED"] = "1"
            code = (
                "import runpy, sys; sys.argv = sys.argv[1:]; "
                f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__drive__')"
            )
            subprocess.run(
                [sys.executable, "-c", code, "drive", str(tree), work, args.stop], cwd=tree, env=env, check=True
            )
            args.out.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(work) / "corral.db", args.out / f"{rev}-{args.stop}.db")
            manifest = json.loads((Path(work) / "manifest.json").read_text())
            manifest["release"] = rev
            (args.out / f"{rev}-{args.stop}.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    finally:
        if not args.tree:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    print(f"wrote {args.out}/{rev}-{args.stop}.db ({(args.out / f'{rev}-{args.stop}.db').stat().st_size} bytes)")
    return 0


# ---- what runs inside the old tree's interpreter (its packages, its stubs) ----------------------------


def _wait(predicate: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def _drive(tree: Path, work: Path, stop: str) -> None:
    """Make the database in ``work`` with the release in ``tree`` (the process's own imports)."""
    import grpc
    from google.protobuf import json_format, timestamp_pb2

    import control
    import corral
    import worker
    from corral.v1 import admin_pb2, admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc

    for module in (control, corral, worker):  # the editable install of the current tree must not win
        if not str(module.__file__).startswith(str(tree)):
            raise SystemExit(f"{module.__name__} came from {module.__file__}, not from {tree}")
    config_text = (tree / "control" / "config.py").read_text()

    def knows(name: str) -> bool:
        return f'"{name}"' in config_text

    env = {k: v for k, v in os.environ.items()}
    settings = {
        "WORKER_HEARTBEAT_TIMEOUT_SEC": "10",
        "CORRAL_HEARTBEAT_INTERVAL_SEC": "0.25",
        "CORRAL_BACKOFF_BASE_SEC": "0.1",
        "CORRAL_BACKOFF_CAP_SEC": "0.2",
        "CORRAL_SHUTDOWN_GRACE_SEC": "2",
        "IDEMPOTENCY_TTL_SEC": str(CENTURY),
        "CORRAL_JOB_RETENTION_SEC": "0",
        "CORRAL_FAILED_RETENTION_SEC": "0",
        "CORRAL_AUDIT_RETENTION_SEC": "0",
        "CORRAL_AUTH_TOKENS": ",".join(f"{k}:{v}" for k, v in TOKENS.items()),
        "CORRAL_AUTH_ADMINS": "ops",
        "CORRAL_JOB_VISIBILITY": "owner",
        "CORRAL_WORKER_TOKEN": WORKER_TOKEN,
        "CORRAL_ACCOUNTS": "open",
        "CORRAL_PASSWORD_ROUNDS": "10",
        "CORRAL_LOG_FORMAT": "json",
    }
    applied = {k: v for k, v in settings.items() if knows(k) or not k.startswith("CORRAL_")}
    env.update(applied)
    db = work / "corral.db"
    port_file = work / "control.port"
    log = (work / "control.log").open("ab")
    serve = ("--port-file", str(port_file), "--db", str(db))
    cp = subprocess.Popen(
        [*(sys.executable, "-m", "control", "--grpc-port", "0", "--http-port", "0", "--worker-port", "0"), *serve],
        cwd=tree,
        env=env,
        stdout=log,
        stderr=log,
    )
    workers: list[subprocess.Popen[bytes]] = []
    try:
        _wait(lambda: cp.poll() is not None or (port_file.exists() and port_file.read_text()), "the control plane")
        if cp.poll() is not None:
            raise SystemExit(f"the control plane exited with {cp.returncode}")
        address = f"127.0.0.1:{port_file.read_text().strip()}"
        channel = grpc.insecure_channel(address)
        jobs = jobs_pb2_grpc.JobServiceStub(channel)
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        alice = (("authorization", f"Bearer {TOKENS['alice']}"),)
        ops = (("authorization", f"Bearer {TOKENS['ops']}"),)
        wlog = (work / "worker.log").open("ab")
        workers.append(
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "worker", "--control", address, "--threads", "2", "--worker-id"),
                    *("old-worker", "--slots", "2" if stop == "kill" else "1", "--token", WORKER_TOKEN),
                    *("--import", "tests.support.jobtypes"),
                ],
                cwd=tree,
                env=env,
                stdout=wlog,
                stderr=wlog,
            )
        )
        _wait(lambda: admin.ListWorkers(admin_pb2.ListWorkersRequest(), metadata=ops).workers, "the worker")
        fields = set(jobs_pb2.SubmitJobRequest.DESCRIPTOR.fields_by_name)
        roles: dict[str, str] = {}
        requests: dict[str, dict[str, Any]] = {}

        def submit(role: str, type_: str, payload: dict[str, Any], who: Any = alice, **extra: Any) -> str:
            request = jobs_pb2.SubmitJobRequest(name=f"upgrade-{role}", type=type_)
            request.payload.update(payload)
            for key, value in extra.items():
                if key not in fields:
                    continue  # this release cannot carry it
                if key == "scheduled_at":
                    request.scheduled_at.CopyFrom(timestamp_pb2.Timestamp(seconds=int(value)))
                elif key in ("labels", "worker_selector"):
                    getattr(request, key).update(value)
                elif key == "depends_on":
                    request.depends_on.extend(roles[r] for r in value)
                elif key == "notify":
                    request.notify.add(email=value, on=[jobs_pb2.Job.FAILED])
                elif key == "start_when":
                    if "StartWhen" in jobs_pb2.DESCRIPTOR.enum_types_by_name:
                        request.start_when = jobs_pb2.StartWhen.Value(value)
                else:
                    setattr(request, key, value)
            roles[role] = jobs.SubmitJob(request, metadata=who).job.id
            if request.idempotency_key:  # replayed by the tests: the key must find this job
                sent = json_format.MessageToDict(request, preserving_proto_field_name=True)
                requests[role] = {"by": "alice" if who is alice else "ops", "request": sent}
            return roles[role]

        def state(role: str) -> str:
            return str(jobs_pb2.Job.State.Name(jobs.GetJob(jobs_pb2.GetJobRequest(id=roles[role]), metadata=ops).state))

        labels = {"team": "edge", "batch": "b7"}
        submit("succeeded", "add_numbers", {"a": 1, "b": 2}, labels=labels, idempotency_key="key-succeeded", priority=7)
        printing = (
            "chatty" if "chatty" in (tree / "tests" / "support" / "jobtypes.py").read_text() else "reverse_string"
        )
        submit("printed", printing, {"lines": 3} if printing == "chatty" else {"text": "abc"}, labels={"team": "io"})
        submit(
            "dead",
            "failing",
            {"message": "no luck"},
            max_attempts=1,
            labels={"team": "edge"},
            idempotency_key="key-dead",
        )
        submit("dead_retried", "failing", {"message": "twice"}, max_attempts=2, who=ops)
        submit("cancelled", "noop", {}, scheduled_at=FAR_FUTURE, labels={"team": "edge"})
        for role, done in (
            ("succeeded", "SUCCEEDED"),
            ("printed", "SUCCEEDED"),
            ("dead", "FAILED"),
            ("dead_retried", "FAILED"),
        ):
            _wait(lambda role=role, done=done: state(role) == done, f"{role} to be {done}")
        jobs.CancelJob(jobs_pb2.CancelJobRequest(id=roles["cancelled"]), metadata=alice)
        submit("running", "sleep", {"seconds": 600}, timeout_sec=3600.0, idempotency_key="key-running", labels=labels)
        _wait(lambda: state("running") == "RUNNING", "running to run")
        if stop == "kill":  # the second slot: one more long job, so the jobs below wait
            submit("running_2", "sleep", {"seconds": 600}, timeout_sec=3600.0, priority=1)
            _wait(lambda: state("running_2") == "RUNNING", "running_2 to run")
        submit("pending", "add_numbers", {"a": 2, "b": 3}, priority=50, idempotency_key="key-pending", labels=labels)
        submit("pending_low", "reverse_string", {"text": "upgrade"}, priority=0, who=ops)
        submit("pending_after_done", "add_numbers", {"a": 5, "b": 5}, depends_on=["succeeded"])
        submit("pending_selector", "noop", {}, worker_selector={"zone": "mars"})
        submit("pending_resources", "noop", {}, gpu_count=1, memory_mb=256)
        submit("pending_notify", "noop", {}, notify="ops@example.com")
        submit("pending_after_dead", "noop", {}, depends_on=["dead"], start_when="ALL_ENDED")
        submit("scheduled_far", "add_numbers", {"a": 9, "b": 9}, scheduled_at=FAR_FUTURE, labels={"team": "edge"})
        # Due 20 s on: still waiting at the stop, and due whenever a test opens the copy.
        submit("scheduled_soon", "add_numbers", {"a": 4, "b": 4}, scheduled_at=time.time() + 20)
        submit("scheduled_after_far", "noop", {}, depends_on=["scheduled_far"], labels={"team": "edge"})
        account = ""
        if knows("CORRAL_ACCOUNTS"):
            from corral.v1 import accounts_pb2, accounts_pb2_grpc

            accounts = accounts_pb2_grpc.AccountServiceStub(channel)
            accounts.Register(accounts_pb2.RegisterRequest(name="carol", password="carol-password-1"))
            account = "carol"
        snapshot = {
            role: json_format.MessageToDict(
                jobs.GetJob(jobs_pb2.GetJobRequest(id=job_id), metadata=ops), preserving_proto_field_name=True
            )
            for role, job_id in roles.items()
        }
        stats = json_format.MessageToDict(jobs.GetStats(jobs_pb2.GetStatsRequest(), metadata=ops))
        in_flux: list[str] = []
        burst: list[str] = []
        if stop == "kill":
            batch = jobs_pb2.SubmitJobsRequest()
            for i in range(20):  # ahead of the PENDING jobs above, which stay where they are
                r = batch.jobs.add(name=f"upgrade-burst-{i}", type="sleep", priority=100)
                r.payload.update({"seconds": 0.02})
            burst = [j.id for j in jobs.SubmitJobs(batch, metadata=alice).jobs]
            jobs.CancelJob(jobs_pb2.CancelJobRequest(id=roles["running_2"]), metadata=alice)  # frees a slot

            def burst_done() -> int:
                got = [jobs.GetJob(jobs_pb2.GetJobRequest(id=i), metadata=ops).state for i in burst]
                return sum(state == jobs_pb2.Job.SUCCEEDED for state in got)

            _wait(lambda: burst_done() >= 5, "the burst to run")
            cp.send_signal(signal.SIGKILL)  # mid-work: results, leases and dispatches under way
            cp.wait(20)
            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait(20)
            in_flux = ["running_2"]
        else:
            cp.send_signal(signal.SIGTERM)
            if cp.wait(30) != 0:
                raise SystemExit(f"the control plane stopped with {cp.returncode}")
            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait(20)
        channel.close()
        with sqlite3.connect(db) as conn:  # one file: the log folded in (what SQLite's next open would do)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("VACUUM")
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        manifest = {
            "stop": stop,
            "tokens": TOKENS,
            "worker_token": WORKER_TOKEN,
            "worker_id": "old-worker",
            "ids": roles,
            "jobs": snapshot,
            "in_flux": in_flux,
            "burst": burst,
            "stats": stats,
            "account": account,
            "fields": sorted(fields),
            "settings": applied,
            "requests": requests,
        }
        (work / "manifest.json").write_text(json.dumps(manifest))
    finally:
        for proc in (cp, *workers):
            if proc.poll() is None:
                proc.kill()
                proc.wait(20)
        print((work / "control.log").read_text()[-2000:] if cp.returncode not in (0, -9) else "", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
elif __name__ == "__drive__":
    _drive(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
