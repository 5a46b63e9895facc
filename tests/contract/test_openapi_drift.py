"""openapi/corral.v1.yaml is what protos/openapi.py generates from the protos, is valid OpenAPI 3, and
lists exactly the routes the REST bridge serves (DESIGN.md's table, and the accounts and audit routes
Corral adds to it)."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from openapi_spec_validator import validate

from control.api import SERVICES
from control.gateway import http_routes

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "openapi" / "corral.v1.yaml"

DESIGN_TABLE = {
    ("POST", "/v1/jobs"): "JobService.SubmitJob",
    ("POST", "/v1/jobs:batchSubmit"): "JobService.SubmitJobs",
    ("GET", "/v1/jobs/{id}"): "JobService.GetJob",
    ("GET", "/v1/jobs"): "JobService.ListJobs",
    ("POST", "/v1/jobs/{id}:cancel"): "JobService.CancelJob",
    ("DELETE", "/v1/jobs/{id}"): "JobService.CancelJob",
    ("POST", "/v1/jobs/{id}:retry"): "JobService.RetryJob",
    ("GET", "/v1/jobs/{id}:watch"): "JobService.WatchJob",
    ("GET", "/v1/stats"): "JobService.GetStats",
    ("GET", "/v1/workers"): "AdminService.ListWorkers",
    ("POST", "/v1/workers/{id}:drain"): "AdminService.DrainWorker",
    ("GET", "/v1/autoscaler"): "AdminService.GetAutoscaler",
}
ADDED = {
    ("POST", "/v1/jobs:run"): "JobService.RunJob",
    ("POST", "/v1/jobs:runMany"): "JobService.RunJobs",
    ("GET", "/v1/jobs/{id}:watchOutput"): "JobService.WatchOutput",
    ("POST", "/v1/jobs:watchMany"): "JobService.WatchJobs",
    ("POST", "/v1/jobs:cancelMany"): "JobService.CancelJobs",
    ("POST", "/v1/jobs:retryMany"): "JobService.RetryJobs",
    ("POST", "/v1/accounts"): "AccountService.Register",
    ("POST", "/v1/login"): "AccountService.Login",
    ("GET", "/v1/whoami"): "AccountService.WhoAmI",
    ("GET", "/v1/accounts"): "AccountService.ListAccounts",
    ("POST", "/v1/accounts/{name}:setPassword"): "AccountService.SetPassword",
    ("DELETE", "/v1/accounts/{name}"): "AccountService.DeleteAccount",
    ("POST", "/v1/accounts:endAllLogins"): "AccountService.EndAllLogins",
    ("GET", "/v1/audit"): "AdminService.ListAuditEvents",
    ("GET", "/v1/shares"): "AdminService.ListShares",
}
"""Routes beyond DESIGN.md's table: submit-and-watch in one call (and for many jobs on one stream), a
job's output as it prints it, accounts (CORRAL_ACCOUNTS) and the audit log, none of which changes a
route above."""


def spec() -> Any:
    return yaml.safe_load(SPEC.read_text())


def test_committed_spec_matches_the_protos() -> None:
    result = subprocess.run(
        [sys.executable, "protos/openapi.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_spec_is_valid_openapi_3() -> None:
    document = spec()
    assert document["openapi"].startswith("3.")
    validate(document)


def test_routes_are_the_design_table_and_all_in_the_spec() -> None:
    routes = {(r.http_method, r.template.text): r.name for r in http_routes(SERVICES)}
    assert not set(ADDED) & set(DESIGN_TABLE)
    assert routes == DESIGN_TABLE | ADDED
    paths = spec()["paths"]
    documented = {(m.upper(), p) for p, ops in paths.items() for m in ops if p.startswith("/v1/")}
    assert documented == set(DESIGN_TABLE) | set(ADDED)
    assert {"/healthz", "/readyz", "/metrics"} <= set(paths)


def test_idempotency_headers_say_a_key_that_differs_from_the_body_is_a_400() -> None:
    # The server refuses a header that differs from a non-empty idempotencyKey (control/api/convert.py
    # submission, README); the spec said the body's field won, so a client trusting it got a 400
    for path in ("/v1/jobs", "/v1/jobs:run"):
        headers = {p["name"]: p["description"] for p in spec()["paths"][path]["post"]["parameters"]}
        for name in ("Idempotency-Key", "X-Idempotency-Key"):
            assert "wins" not in headers[name]
            assert "idempotencyKey" in headers[name] and "a 400" in headers[name], name
