"""Auth against a real control plane and real workers on 127.0.0.1.

- Every RPC of every service (walked from the descriptors, so a new RPC is covered by itself) and
  every REST route (walked from the http annotations) refuses a missing, malformed or wrong token and
  a token of the other role, with UNAUTHENTICATED / 401, and accepts the right one.
- A refused call changes nothing; health and /metrics stay open; reflection needs a client token.
- A worker without the worker token (none, a wrong one, a client token) never registers.
- The principal reaches the servicers through the ``PRINCIPAL`` context variable, on gRPC (unary,
  server stream and bidi handlers) and through the REST bridge.
- The Python clients and the CLI send their token; bad auth settings stop start-up, naming the variable.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import corral
from control.api import SERVICES
from control.api.interceptors import Authenticate, RequestIds
from control.auth import Authenticator, Role, TokenError, role_of
from control.config import ConfigError, ControlConfig
from control.gateway import Gateway, InProcess, http_routes
from control.identity import PRINCIPAL
from control.metrics import Metrics
from corral.v1 import jobs_pb2, workers_pb2
from tests.conftest import ROOT, ControlProc, base_env, wait_until
from tests.integration.test_cli import Up
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest

UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
WORKER_SERVICE = "corral.v1.WorkerService"


def token() -> str:
    return secrets.token_urlsafe(24)


@dataclass
class Secured:
    """A control plane with client auth and a worker token, and one legitimate worker."""

    cp: ControlProc
    alice: str
    """A named client token from CORRAL_AUTH_TOKENS."""
    anonymous: str
    """An unnamed client token from CORRAL_AUTH_TOKENS."""
    bob: str
    """A named client token from CORRAL_AUTH_TOKEN_FILE."""
    worker_token: str
    worker_id: str


@pytest.fixture
def secured(make_control_plane: Any, spawn_worker: Any, tmp_path: Path) -> Secured:
    alice, anonymous, bob, worker_token = token(), token(), token(), token()
    token_file = tmp_path / "tokens"
    token_file.write_text(f"# client tokens\n\nbob:{bob}\n")
    cp = make_control_plane(
        CORRAL_AUTH_TOKENS=f"alice:{alice}, {anonymous}",
        CORRAL_AUTH_TOKEN_FILE=str(token_file),
        CORRAL_WORKER_TOKEN=worker_token,
    )
    cp.token = alice
    worker = spawn_worker(cp, env={"CORRAL_WORKER_TOKEN": worker_token})
    return Secured(cp, alice, anonymous, bob, worker_token, worker.worker_id)


def bearer(value: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {value}"),)


def call_status(
    channel: grpc.Channel, service: str, method: MethodDescriptor, metadata: Any, worker_id: str = "intruder"
) -> grpc.StatusCode:
    """Call ``method`` with an empty request (a Register of ``worker_id`` on the worker stream); its status."""
    path = f"/{service}/{method.name}"
    request = message_factory.GetMessageClass(method.input_type)()
    if method.full_name == "corral.v1.WorkerService.Connect":
        request = workers_pb2.WorkerMessage(register=workers_pb2.Register(worker_id=worker_id, threads=1, slots=1))
    data = request.SerializeToString()
    try:
        if method.client_streaming and method.server_streaming:
            call = channel.stream_stream(path)(iter([data]), metadata=metadata, timeout=10)
            next(iter(call), None)  # a registered worker gets Registered first; then hang up
            call.cancel()
            return grpc.StatusCode.OK
        if method.server_streaming:
            for _ in channel.unary_stream(path)(data, metadata=metadata, timeout=10):
                pass
        elif method.client_streaming:
            channel.stream_unary(path)(iter([data]), metadata=metadata, timeout=10)
        else:
            channel.unary_unary(path)(data, metadata=metadata, timeout=10)
    except grpc.RpcError as err:
        code: grpc.StatusCode = err.code()
        return code
    return grpc.StatusCode.OK


def test_every_rpc_refuses_missing_or_wrong_credentials(secured: Secured) -> None:
    channel = secured.cp.channel()
    refused_for = {
        "no token": None,
        "empty authorization": (("authorization", ""),),
        "not a bearer token": (("authorization", f"Basic {secured.alice}"),),
        "wrong token": bearer(token()),
        "a prefix of a right token": bearer(secured.alice[:-1]),
    }
    walked = anyone = 0
    for service in SERVICES:
        worker_call = service.full_name == WORKER_SERVICE
        other_role = bearer(secured.alice) if worker_call else bearer(secured.worker_token)
        for method in service.methods:
            walked += 1
            cases = {**refused_for, "the other role's token": other_role}
            if role_of(service.full_name, method.name) is Role.ANYONE:
                # Login and Register are how one gets credentials: none is fine, wrong ones are not.
                code = call_status(channel, service.full_name, method, cases.pop("no token"))
                assert code != UNAUTHENTICATED, f"{method.full_name} with no token: {code}"
                anyone += 1
            for label, metadata in cases.items():
                code = call_status(channel, service.full_name, method, metadata)
                assert code == UNAUTHENTICATED, f"{method.full_name} with {label}: {code}"
            # The right credentials get past auth (whatever the empty request then earns).
            right = bearer(secured.worker_token if worker_call else secured.bob)
            code = call_status(channel, service.full_name, method, right, worker_id="probe")
            assert code != UNAUTHENTICATED, method.full_name
    assert walked == sum(len(s.methods) for s in SERVICES) >= 10
    assert anyone == 2

    # Nothing the refused calls asked for happened: no job, no intruder worker (the probe had the token).
    jobs = secured.cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10, metadata=bearer(secured.anonymous))
    assert jobs.total == 0
    assert sorted(w.id for w in secured.cp.workers()) == sorted([secured.worker_id, "probe"])


def test_a_refusal_says_why_and_carries_the_request_id(secured: Secured) -> None:
    stats = secured.cp.jobs.GetStats
    cases = {
        "missing credentials": None,
        "not a bearer token": (("authorization", "Basic abc"),),
        "invalid token": bearer(token()),
        "the worker token cannot call the client API": bearer(secured.worker_token),
    }
    for reason, metadata in cases.items():
        with pytest.raises(grpc.RpcError) as caught:
            stats(jobs_pb2.GetStatsRequest(), timeout=10, metadata=(*(metadata or ()), ("x-request-id", "r-42")))
        err: Any = caught.value
        assert err.code() == UNAUTHENTICATED and reason in err.details()
        assert ("x-request-id", "r-42") in err.trailing_metadata()
        assert secured.worker_token not in err.details()
    # ...and each refusal is a log event with the call's request id, never with the token
    lines = [line for line in secured.cp.log.read_text().splitlines() if '"auth_refused"' in line]
    refused = [json.loads(line) for line in lines]
    assert sum(r.get("request_id") == "r-42" and r["method"].endswith("/GetStats") for r in refused) == len(cases)
    assert not any(secured.worker_token in line for line in lines)


def test_a_refused_submit_stores_nothing_and_a_client_token_runs_jobs(secured: Secured) -> None:
    cp = secured.cp
    request = jobs_pb2.SubmitJobRequest(type="add_numbers", idempotency_key=f"k-{uuid.uuid4().hex}")
    request.payload.update({"a": 1, "b": 2})
    for metadata in (None, bearer(token()), bearer(secured.worker_token)):
        with pytest.raises(grpc.RpcError) as caught:
            cp.jobs.SubmitJob(request, timeout=10, metadata=metadata)
        assert caught.value.code() == UNAUTHENTICATED  # type: ignore[attr-defined]
    assert cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10, metadata=cp.metadata).total == 0

    # With a client token from the file, the same request is stored, and the worker runs it.
    job = cp.jobs.SubmitJob(request, timeout=10, metadata=bearer(secured.bob)).job
    events = list(cp.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job.id), timeout=30, metadata=cp.metadata))
    assert events[-1].job.state == jobs_pb2.Job.SUCCEEDED


def test_health_stays_open_and_reflection_needs_a_client_token(secured: Secured) -> None:
    channel = secured.cp.channel()
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "corral.v1.JobService"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status in (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        )
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    with pytest.raises(grpc.RpcError) as caught:
        list(reflection.ServerReflectionInfo(iter([ask]), timeout=10))
    assert caught.value.code() == UNAUTHENTICATED  # type: ignore[attr-defined]
    (answer,) = reflection.ServerReflectionInfo(iter([ask]), timeout=10, metadata=bearer(secured.alice))
    assert {s.name for s in answer.list_services_response.service} >= {s.full_name for s in SERVICES}


def route_path(template: str) -> str:
    """A concrete path for a route template: every ``{variable}`` becomes ``job-x``."""
    parts = []
    for part in template.split("/"):
        head, _, verb = part.partition("}")
        parts.append("job-x" + verb if head.startswith("{") else part)
    return "/".join(parts)


def test_every_rest_route_refuses_missing_or_wrong_credentials(secured: Secured) -> None:
    rest = Rest(secured.cp.http_port)
    routes = http_routes(SERVICES)
    assert len(routes) >= 10
    refused_for = {
        "no token": ({}, 'Bearer realm="corral"'),
        "not a bearer token": ({"Authorization": f"Basic {secured.alice}"}, 'error="invalid_token"'),
        "wrong token": ({"Authorization": f"Bearer {token()}"}, 'error="invalid_token"'),
        "the worker token": ({"Authorization": f"Bearer {secured.worker_token}"}, 'error="invalid_token"'),
    }
    anyone = 0
    for route in routes:
        path = route_path(route.template.text)
        body: dict[str, Any] | None = {} if route.body else None
        cases = dict(refused_for)
        if role_of(route.service.full_name, route.method.name) is Role.ANYONE:  # login, register
            reply = rest.call(route.http_method, path, body, headers=cases.pop("no token")[0])
            assert reply.status != 401, f"{route.http_method} {path} with no token: {reply.body!r}"
            anyone += 1
        for label, (headers, challenge) in cases.items():
            reply = rest.call(route.http_method, path, body, headers=headers)
            where = f"{route.http_method} {path} with {label}"
            assert reply.status == 401, f"{where}: {reply.status} {reply.body!r}"
            assert (
                reply.headers["WWW-Authenticate"].startswith("Bearer")
                and challenge in reply.headers["WWW-Authenticate"]
            ), where
            status = reply.json()
            assert status["code"] == UNAUTHENTICATED.value[0] and status["message"], where
            assert reply.headers["X-Request-ID"], where
        ok = rest.call(route.http_method, path, body, headers={"Authorization": f"bearer {secured.anonymous}"})
        assert ok.status != 401, f"{route.http_method} {path} with a client token: {ok.body!r}"
    assert anyone == 2
    assert int(rest.get("/v1/jobs", headers={"Authorization": f"Bearer {secured.alice}"}).json()["total"]) == 0

    # Probes and Prometheus need no token.
    assert rest.get("/healthz").status == 200
    assert rest.get("/readyz").status == 200
    assert rest.get("/metrics").status == 200


def logged_twice(log: Path, text: str) -> Callable[[], bool]:
    """A condition: ``text`` appears at least twice in the log file."""
    return lambda: log.read_text().count(text) >= 2


def test_a_worker_without_the_worker_token_never_registers(secured: Secured, spawn_worker: Any) -> None:
    cp = secured.cp
    intruders = {
        "none": {},
        "wrong": {"CORRAL_WORKER_TOKEN": token()},
        "client": {"CORRAL_WORKER_TOKEN": secured.alice},
    }
    procs = {name: spawn_worker(cp, env=env, wait=False) for name, env in intruders.items()}
    for name, proc in procs.items():
        # Each keeps trying (a refusal is retried like any broken stream) and is refused every time.
        wait_until(logged_twice(proc.log, "UNAUTHENTICATED"), 20, what=f"{name} refused twice")
        assert proc.proc.poll() is None
    log = procs["client"].log.read_text()
    assert "a client token cannot connect a worker" in log and secured.alice not in log
    assert [w.id for w in cp.workers()] == [secured.worker_id]
    # ...and the refusals are counted, by the role the calls needed
    assert scrape(Rest(cp.http_port))['corral_auth_refused_total{role="worker"}'] >= 2 * len(intruders)


# -- the principal reaches the handlers ---------------------------------------------------------------


def test_the_principal_set_by_the_interceptor_is_what_handlers_see() -> None:
    """grpc.aio runs the interceptor and the handler of a call in one task: the context variable
    set by the interceptor is visible in unary, server-streaming and bidi handlers, per call."""
    alice, bob, worker_token = token(), token(), token()
    auth = Authenticator({alice: "alice", bob: "bob"}, worker_token)

    async def unary(request: bytes, context: Any) -> bytes:
        return str(PRINCIPAL.get()).encode()

    async def stream(request: bytes, context: Any) -> Any:
        for _ in range(2):
            await asyncio.sleep(0)
            yield str(PRINCIPAL.get()).encode()

    async def bidi(requests: Any, context: Any) -> None:
        async for _ in requests:
            await context.write(str(PRINCIPAL.get()).encode())

    async def main() -> None:
        server = grpc.aio.server(interceptors=[RequestIds(), Authenticate(auth)])
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "corral.v1.JobService",
                    {
                        "Who": grpc.unary_unary_rpc_method_handler(unary),
                        "WhoStream": grpc.unary_stream_rpc_method_handler(stream),
                    },
                ),
                grpc.method_handlers_generic_handler(
                    WORKER_SERVICE, {"Who": grpc.stream_stream_rpc_method_handler(bidi)}
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                who = channel.unary_unary("/corral.v1.JobService/Who")
                who_stream = channel.unary_stream("/corral.v1.JobService/WhoStream")
                worker_who = channel.stream_stream(f"/{WORKER_SERVICE}/Who")
                # Interleaved calls from two principals: each handler sees its own caller.
                answers = await asyncio.gather(*(who(b"", metadata=bearer(t)) for t in (alice, bob) * 5))
                assert answers == [b"alice", b"bob"] * 5
                assert [m async for m in who_stream(b"", metadata=bearer(bob))] == [b"bob", b"bob"]
                assert [m async for m in worker_who(iter([b"", b""]), metadata=bearer(worker_token))] == [
                    b"worker",
                    b"worker",
                ]
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await who(b"", metadata=bearer(worker_token))
                assert caught.value.code() == UNAUTHENTICATED
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_made_up_method_names_are_unimplemented_and_leave_nothing_behind() -> None:
    """Each name a caller made up was kept in the interceptor's table of roles, up to 1,024 of them; past
    that, the methods served were worked out again on every call."""
    alice = token()
    interceptor = Authenticate(Authenticator({alice: "alice"}, token()))

    async def unary(request: bytes, context: Any) -> bytes:
        return str(PRINCIPAL.get()).encode()

    async def main() -> None:
        server = grpc.aio.server(interceptors=[interceptor])
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "corral.v1.JobService", {"Who": grpc.unary_unary_rpc_method_handler(unary)}
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                for n in range(50):
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await channel.unary_unary(f"/corral.v1.JobService/Nope{n}")(b"", metadata=bearer(alice))
                    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
                assert await channel.unary_unary("/corral.v1.JobService/Who")(b"", metadata=bearer(alice)) == b"alice"
        finally:
            await server.stop(None)

    asyncio.run(main())
    assert list(interceptor._roles) == ["/corral.v1.JobService/Who"]


class StatsRecorder:
    """A JobService stand-in whose GetStats records the principal it sees."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []

    async def GetStats(self, request: jobs_pb2.GetStatsRequest, context: Any) -> jobs_pb2.Stats:
        self.seen.append(PRINCIPAL.get())
        return jobs_pb2.Stats()


def test_the_rest_bridge_sets_the_principal_for_the_services() -> None:
    alice, worker_token = token(), token()
    recorder = StatsRecorder()

    async def main() -> None:
        gateway = Gateway(
            "127.0.0.1", 0, InProcess({SERVICES[0].full_name: recorder}), http_routes(SERVICES),
            lambda: None, Metrics(), max_body_bytes=1024, auth=Authenticator({alice: "alice"}, worker_token),
        )  # fmt: skip
        async with gateway, aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{gateway.port}/v1/stats"
            async with session.get(url, headers={"Authorization": f"Bearer {alice}"}) as resp:
                assert resp.status == 200
            async with session.get(url) as resp:
                assert resp.status == 401 and resp.headers["WWW-Authenticate"] == 'Bearer realm="corral"'

    asyncio.run(main())
    assert recorder.seen == ["alice"]


# -- clients ------------------------------------------------------------------------------------------


def test_the_python_clients_send_their_token(secured: Secured) -> None:
    address = secured.cp.address
    with corral.Client(address, token=secured.alice) as client:
        assert [w.id for w in client.workers()] == [secured.worker_id]
    with corral.Client(address) as client, pytest.raises(corral.Unauthenticated, match="missing credentials"):
        client.list()
    with corral.Client(address, token=token()) as client, pytest.raises(corral.Unauthenticated):
        client.stats()

    async def main() -> None:
        async with corral.AsyncClient(address, token=secured.bob) as client:
            assert [w.id for w in await client.workers()] == [secured.worker_id]
        async with corral.AsyncClient(address, token=secured.worker_token) as client:
            with pytest.raises(corral.Unauthenticated, match="worker token cannot call the client API"):
                await client.workers()

    asyncio.run(main())


def corral_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", *args], cwd=ROOT, env=base_env(env), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def test_the_cli_takes_a_token_from_the_flag_or_the_environment(secured: Secured) -> None:
    control = ["--control", secured.cp.address]
    refused = corral_cli("workers", *control, env={"CORRAL_TOKEN": ""})
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    by_flag = corral_cli("workers", *control, "--json", f"--token={secured.alice}")
    assert by_flag.returncode == 0 and secured.worker_id in by_flag.stdout
    by_env = corral_cli("stats", *control, "--json", env={"CORRAL_TOKEN": secured.anonymous})
    assert by_env.returncode == 0, by_env.stderr


def test_corral_up_with_a_token_turns_auth_on_and_gives_its_workers_a_worker_token(tmp_path: Path) -> None:
    client = token()
    # --token=X, not --token X: a random token may start with "-", which argparse takes for an option.
    up = Up(tmp_path, "--grpc-port", "0", "--http-port", "0", "--db", str(tmp_path / "c.db"), "--workers", "1",
            f"--token={client}")  # fmt: skip
    try:
        address = up.wait_up()
        assert "not every worker registered" not in up.err.read_text()  # its own calls carry the token
        listed = corral_cli("workers", "--json", "--control", address, f"--token={client}")
        assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 1, listed.stderr
        refused = corral_cli("workers", "--control", address, env={"CORRAL_TOKEN": ""})
        assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(60) == 0, up.err.read_text()
    finally:
        up.kill_all()


# -- configuration ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CORRAL_AUTH_TOKENS": "short"}, "CORRAL_AUTH_TOKENS entry 1: a token must be at least 16 characters"),
        ({"CORRAL_AUTH_TOKENS": f"{'t' * 20} x"}, "CORRAL_AUTH_TOKENS entry 1: a token must be printable ASCII"),
        ({"CORRAL_AUTH_TOKENS": f"bad name:{'t' * 20}"}, "CORRAL_AUTH_TOKENS entry 1: the name before ':'"),
        ({"CORRAL_AUTH_TOKENS": f"{'t' * 20},{'t' * 20}"}, "CORRAL_AUTH_TOKENS entry 2: the token repeats"),
        ({"CORRAL_AUTH_TOKENS": "t" * 20}, "CORRAL_WORKER_TOKEN must be set when client tokens are"),
        ({"CORRAL_AUTH_TOKENS": "t" * 20, "CORRAL_WORKER_TOKEN": "t" * 20}, "CORRAL_WORKER_TOKEN must differ"),
        ({"CORRAL_WORKER_TOKEN": "short"}, "CORRAL_WORKER_TOKEN: a token must be at least 16 characters"),
        ({"CORRAL_AUTH_TOKEN_FILE": "/nonexistent/tokens"}, "CORRAL_AUTH_TOKEN_FILE must be a readable file"),
    ],
)
def test_bad_auth_settings_are_refused_naming_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
        ControlConfig.from_env(env)


def test_a_bad_token_file_stops_start_up_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# ok\nalice:{'a' * 20}\n\nbob:short\n")
    with pytest.raises(ConfigError, match=r"CORRAL_AUTH_TOKEN_FILE '.*' line 4: a token must be at least 16"):
        ControlConfig.from_env({"CORRAL_AUTH_TOKEN_FILE": str(path), "CORRAL_WORKER_TOKEN": "w" * 20})
    path.write_text("# only a comment\n")
    with pytest.raises(ConfigError, match="CORRAL_AUTH_TOKEN_FILE must hold at least one token"):
        ControlConfig.from_env({"CORRAL_AUTH_TOKEN_FILE": str(path), "CORRAL_WORKER_TOKEN": "w" * 20})

    # The process itself stops with the message, and no secret is in the configuration's repr.
    done = subprocess.run(
        [sys.executable, "-m", "control", "--grpc-port", "0", "--http-port", "0", "--db", str(tmp_path / "db")],
        cwd=ROOT, env=base_env({"CORRAL_AUTH_TOKENS": "x" * 20}), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "CORRAL_WORKER_TOKEN must be set when client tokens are" in done.stderr
    config = ControlConfig.from_env({"CORRAL_AUTH_TOKENS": "a" * 20, "CORRAL_WORKER_TOKEN": "b" * 20})
    assert "a" * 20 not in repr(config) and "b" * 20 not in repr(config)


# ---- reloading CORRAL_AUTH_TOKEN_FILE -----------------------------------------------------------------


def grpc_accepts(cp: ControlProc, value: str) -> bool:
    try:
        cp.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10, metadata=bearer(value))
    except grpc.RpcError as err:
        assert err.code() == UNAUTHENTICATED  # type: ignore[attr-defined]
        return False
    return True


def rest_accepts(cp: ControlProc, value: str) -> bool:
    status = Rest(cp.http_port).get("/v1/stats", headers={"Authorization": f"Bearer {value}"}).status
    assert status in (200, 401)
    return status == 200


def both_accept(cp: ControlProc, value: str) -> bool:
    """For waiting out a reload: the two calls may fall on either side of the swap, so no agreement check."""
    return grpc_accepts(cp, value) and rest_accepts(cp, value)


def accepted(cp: ControlProc, value: str) -> bool:
    """Whether a client call with ``value`` as its token passes, over gRPC and REST, which must agree.
    Only while no reload is under way: one may land between the two calls."""
    grpc_ok = grpc_accepts(cp, value)
    assert grpc_ok == rest_accepts(cp, value), "the REST bridge and gRPC disagree on a token"
    return grpc_ok


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to a new file and rename it over ``path``, as editors and secret stores do."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_sighup_reloads_the_token_file_and_an_old_token_stops_working(secured: Secured, tmp_path: Path) -> None:
    cp, carol = secured.cp, token()
    assert cp.proc is not None
    assert accepted(cp, secured.bob) and not accepted(cp, carol)
    # Rewritten in place (same inode, same size), then a signal: the signal alone must be enough.
    path = tmp_path / "tokens"
    old, new = path.read_text(), f"# rotated\ncarol:{carol}\n"
    assert len(new) <= len(old)
    path.write_text(new.ljust(len(old), "\n"))
    cp.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: both_accept(cp, carol), what="the new token to pass after SIGHUP")
    assert not accepted(cp, secured.bob), "a token removed from the file still passes"
    assert accepted(cp, secured.alice) and accepted(cp, secured.anonymous), "CORRAL_AUTH_TOKENS tokens must stay"
    assert cp.proc.poll() is None, "SIGHUP stopped the control plane"
    # The reload is logged (the count, never a token) and the worker, untouched, still runs jobs.
    (reloaded,) = [e for e in cp.events("auth_tokens_reloaded") if e["why"] == "signal"]
    assert reloaded["tokens"] == 3 and carol not in json.dumps(reloaded)
    job = cp.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(type="noop"), timeout=10, metadata=bearer(carol)).job
    events = list(cp.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job.id), timeout=30, metadata=bearer(carol)))
    assert events[-1].job.state == jobs_pb2.Job.SUCCEEDED


def test_a_replaced_token_file_is_picked_up_without_a_signal(secured: Secured, tmp_path: Path) -> None:
    cp, carol = secured.cp, token()
    replace_file(tmp_path / "tokens", f"bob:{secured.bob}\ncarol:{carol}\n")
    wait_until(lambda: both_accept(cp, carol), timeout=15, what="the token file to be re-read after it changed")
    assert accepted(cp, secured.bob), "a token kept in the file must keep passing"
    scraped = scrape(Rest(cp.http_port))
    assert scraped['corral_auth_token_reloads_total{result="ok"}'] >= 1
    assert scraped.get('corral_auth_token_reloads_total{result="error"}', 0) == 0


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("bob:short\n", "line 1: a token must be at least 16"),
        ("# every token removed\n", "must hold at least one token"),
        ("carol:{worker}\n", "equals CORRAL_WORKER_TOKEN"),
        ("carol:{bob}\ndave:{bob}\n", "line 2: the token repeats an earlier one"),
    ],
)
def test_a_broken_token_file_keeps_the_tokens_in_force(
    secured: Secured, tmp_path: Path, text: str, reason: str
) -> None:
    cp = secured.cp
    assert cp.proc is not None
    replace_file(tmp_path / "tokens", text.format(worker=secured.worker_token, bob=secured.bob))
    cp.proc.send_signal(signal.SIGHUP)
    failed = wait_until(lambda: cp.events("auth_tokens_reload_failed"), what="the failed reload's log line")
    assert reason in failed[0]["reason"] and failed[0]["level"] == "error"
    assert secured.bob not in failed[0]["reason"] and secured.worker_token not in failed[0]["reason"]
    assert accepted(cp, secured.bob), "a broken file must leave the tokens in force"
    assert not accepted(cp, secured.worker_token) and not accepted(cp, token())
    assert scrape(Rest(cp.http_port))['corral_auth_token_reloads_total{result="error"}'] >= 1
    # Once the file is mended, the next change is read.
    carol = token()
    replace_file(tmp_path / "tokens", f"carol:{carol}\n")
    wait_until(lambda: both_accept(cp, carol), timeout=15, what="the mended file to be read")
    assert not accepted(cp, secured.bob)


def test_sighup_without_a_token_file_is_logged_and_does_not_stop_the_control_plane(make_control_plane: Any) -> None:
    cp = make_control_plane()
    assert cp.proc is not None
    cp.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: cp.events("auth_tokens_reloaded"), what="the SIGHUP to be logged")
    assert cp.proc.poll() is None
    cp.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10)


def test_replace_clients_refuses_an_empty_set_and_the_worker_token() -> None:
    alice, worker = token(), token()
    auth = Authenticator({alice: "alice"}, worker)
    for clients, message in (({}, "no client token left"), ({worker: "w"}, "equals CORRAL_WORKER_TOKEN")):
        with pytest.raises(TokenError, match=message):
            auth.replace_clients(clients)
        assert auth.authenticate(Role.CLIENT, f"Bearer {alice}") == "alice", "a refused set changed the tokens"
    carol = token()
    auth.replace_clients({carol: "carol"})
    assert auth.authenticate(Role.CLIENT, f"Bearer {carol}") == "carol"
    with pytest.raises(corral.Unauthenticated):
        auth.authenticate(Role.CLIENT, f"Bearer {alice}")
