"""Every RPC of the contract has a handler, and every public RPC carries a google.api.http rule."""

from google.api import annotations_pb2

from control.api import SERVICES, AccountServicer, AdminServicer, JobServicer, WorkerServicer

SERVICERS = {
    "JobService": JobServicer,
    "WorkerService": WorkerServicer,
    "AdminService": AdminServicer,
    "AccountService": AccountServicer,
}


def test_every_rpc_has_a_handler() -> None:
    for service in SERVICES:
        servicer = SERVICERS[service.name]
        missing = [m.name for m in service.methods if not callable(getattr(servicer, m.name, None))]
        assert missing == [], f"{service.full_name} lacks handlers for {missing}"


def test_public_rpcs_have_http_rules() -> None:
    for service in SERVICES:
        if service.name == "WorkerService":
            continue  # internal bidirectional stream: no REST mapping
        for method in service.methods:
            rule = method.GetOptions().Extensions[annotations_pb2.http]
            assert rule.WhichOneof("pattern"), f"{service.name}.{method.name} has no google.api.http rule"
