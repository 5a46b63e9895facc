"""Routes come from the google.api.http annotations; templates parse and match as grpc-gateway's do."""

import pytest

from control.api import SERVICES
from control.gateway import PathTemplate, Router, http_routes
from control.gateway.rules import TemplateError

ROUTER = Router(http_routes(SERVICES))


def test_templates_parse_literals_variables_and_verbs() -> None:
    t = PathTemplate.parse("/v1/jobs/{id}:cancel")
    assert t.segments == ("v1", "jobs", None) and t.variables == ("id",) and t.verb == "cancel"
    assert PathTemplate.parse("/v1/jobs:batchSubmit").verb == "batchSubmit"
    assert PathTemplate.parse("/v1/things/{thing.id=*}").variables == ("thing.id",)
    assert PathTemplate.parse("/v1/jobs/{id}").verb == ""


@pytest.mark.parametrize("bad", ["v1/jobs", "/v1/{id=**}", "/v1/jobs/{Id}", "/v1/a b", "/v1/jobs:"])
def test_templates_outside_the_grammar_are_refused(bad: str) -> None:
    with pytest.raises(TemplateError):
        PathTemplate.parse(bad)


@pytest.mark.parametrize(
    ("method", "path", "rpc", "params"),
    [
        ("POST", "/v1/jobs", "JobService.SubmitJob", {}),
        ("GET", "/v1/jobs", "JobService.ListJobs", {}),
        ("POST", "/v1/jobs:batchSubmit", "JobService.SubmitJobs", {}),
        ("GET", "/v1/jobs/abc", "JobService.GetJob", {"id": "abc"}),
        ("GET", "/v1/jobs/a%2Fb%20c", "JobService.GetJob", {"id": "a/b c"}),
        ("POST", "/v1/jobs/abc:cancel", "JobService.CancelJob", {"id": "abc"}),
        ("DELETE", "/v1/jobs/abc", "JobService.CancelJob", {"id": "abc"}),
        ("POST", "/v1/jobs/abc:retry", "JobService.RetryJob", {"id": "abc"}),
        ("GET", "/v1/jobs/abc:watch", "JobService.WatchJob", {"id": "abc"}),
        ("GET", "/v1/jobs/a:b:watch", "JobService.WatchJob", {"id": "a:b"}),
        ("GET", "/v1/jobs/abc:cancel", "JobService.GetJob", {"id": "abc:cancel"}),  # no GET :cancel route
        ("GET", "/v1/stats", "JobService.GetStats", {}),
        ("GET", "/v1/workers", "AdminService.ListWorkers", {}),
        ("POST", "/v1/workers/w-1:drain", "AdminService.DrainWorker", {"id": "w-1"}),
        ("GET", "/v1/autoscaler", "AdminService.GetAutoscaler", {}),
    ],
)
def test_requests_find_their_route(method: str, path: str, rpc: str, params: dict[str, str]) -> None:
    match = ROUTER.match(method, path)
    assert match.route is not None and match.route.name == rpc and match.params == params


def test_unknown_paths_and_wrong_methods() -> None:
    assert ROUTER.match("GET", "/v1/nothing").route is None
    assert ROUTER.match("GET", "/v1/jobs/").route is None  # an empty variable does not match
    wrong = ROUTER.match("PUT", "/v1/jobs/abc")
    assert wrong.route is None and wrong.allowed == ("GET", "DELETE")
    with pytest.raises(UnicodeDecodeError):
        ROUTER.match("GET", "/v1/jobs/%FF")


def test_query_fields_leave_out_path_and_body_fields() -> None:
    routes = {r.name: r for r in http_routes(SERVICES)}
    assert [f.name for f in routes["JobService.ListJobs"].query_fields()] == [
        "status",
        "type",
        "limit",
        "offset",
        "owner",
        "order",
        "labels",
        "error_code",
    ]
    assert routes["JobService.GetJob"].query_fields() == []
    assert routes["JobService.SubmitJob"].query_fields() == []  # body "*"
    assert routes["JobService.WatchJob"].streaming and not routes["JobService.GetJob"].streaming
