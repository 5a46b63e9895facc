"""``python -m runner``: run one job in this process, for people and scripts.

Usage::

    python -m runner --job-id ID --type T --payload JSON [--threads N] [--attempt N] [--import MODULE]...

The payload is validated against the type's schema first. On success the result JSON is printed on
stdout and the exit code is 0; on failure ``{"code": ..., "message": ...}`` is printed on stderr and
the exit code says why (see :mod:`runner.errors`: 1 job failed, 2 bad command line, 3 invalid
payload, 4 unknown type).
"""

from __future__ import annotations

import argparse
import json
import sys

from runner import JobContext, check_result_json, execute, get, load_plugins
from runner.errors import EXIT_OK, JobFailed, as_text, exit_code_for
from runner.payload import validate


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runner", description="Run one Corral job and print its result.")
    parser.add_argument("--job-id", required=True, help="the job's id (passed to the job)")
    parser.add_argument("--type", required=True, dest="job_type", help="the job type name")
    parser.add_argument("--payload", default="{}", help="the payload, a JSON object (default {})")
    parser.add_argument("--threads", type=int, default=1, help="threads the job may use (default 1)")
    parser.add_argument("--attempt", type=int, default=1, help="the attempt number (default 1)")
    parser.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE", help="plug-in module of job types"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.threads < 1:
            raise JobFailed("INVALID_PAYLOAD", f"--threads must be >= 1, got {args.threads}")
        load_plugins(args.imports)
        job_type = get(args.job_type)
        try:
            payload = json.loads(args.payload)
        except ValueError as exc:
            raise JobFailed("INVALID_PAYLOAD", f"payload: not valid JSON ({exc})") from None
        validate(job_type, payload)
        ctx = JobContext(job_id=args.job_id, attempt=args.attempt, threads=args.threads)
        result = execute(args.job_type, payload, ctx)
        text = json.dumps(result, allow_nan=False)
        check_result_json(args.job_type, text)
    except JobFailed as exc:
        code = as_text(exc.code)
        print(json.dumps({"code": code, "message": as_text(exc.message)}), file=sys.stderr)
        return exit_code_for(code)
    except ImportError as exc:
        print(json.dumps({"code": "ERROR", "message": str(exc)}), file=sys.stderr)
        return exit_code_for("ERROR")
    except ValueError as exc:  # the result is not JSON
        print(json.dumps({"code": "ERROR", "message": f"result: {exc}"}), file=sys.stderr)
        return exit_code_for("ERROR")
    print(text)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
