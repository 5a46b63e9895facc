"""A client given several control-plane addresses: how the list is read, and when a call moves on.

The rules (corral.failover): a call moves on to the next address only when a standby refused it or
gRPC never sent it; anything else is raised where it happened. The last tests pin grpcio's wording
against real loopback servers and a closed port, so that a grpcio that words it otherwise fails here.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

import corral
from control.api.status import rich_status
from corral import addresses
from corral.addresses import AddressError, parse_addresses
from corral.cli import values
from corral.cli.parser import CONTROL_ADDR_ENV, build_parser
from corral.errors import STANDBY_PREFIX, CorralError, InvalidArgument, NotFound, Unavailable
from corral.failover import Failover, client_addresses, moves_on
from corral.v1 import jobs_pb2
from tests.support.ports import dead_address

REFUSED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
    "Failed to connect to remote host: connect: Connection refused (111)"
)

# -- the list rule ------------------------------------------------------------------------------------


def test_a_list_is_split_in_order_without_the_spaces() -> None:
    assert parse_addresses("cp-b:50051 , [::1]:6001,127.0.0.1:6000", "X") == (
        "cp-b:50051",
        "[::1]:6001",
        "127.0.0.1:6000",
    )
    sixteen = ",".join(f"127.0.0.1:{6000 + i}" for i in range(addresses.MAX_ADDRESSES))
    assert len(parse_addresses(sixteen, "X")) == 16


@pytest.mark.parametrize(
    ("raw", "named", "rule"),
    [
        ("a:1,,b:2", "'a:1,,b:2'", "without an empty one"),
        ("a:1,", "'a:1,'", "without an empty one"),
        ("a:1,a:1", "'a:1' twice", "each address once"),
        ("cp:1, CP:01", "'cp:1' and 'CP:01'", "each address once"),
        ("a:1,localhost", "'localhost'", "HOST:PORT"),
        ("a:1,a:0", "'a:0'", "1..65535"),
        (",".join(f"h:{i}" for i in range(1, 18)), "got 17", "at most 16 addresses"),
    ],
)
def test_a_bad_list_names_the_entry_and_the_rule_everywhere(raw: str, named: str, rule: str) -> None:
    # The shared rule: "<name> <rule>", the rule alone in .rule
    with pytest.raises(AddressError) as shared:
        parse_addresses(raw, "SOMEWHERE")
    assert str(shared.value) == f"SOMEWHERE {shared.value.rule}"
    assert named in shared.value.rule and rule in shared.value.rule
    # the clients: InvalidArgument on the field "address", as for any bad constructor argument
    for make in (corral.Client, corral.AsyncClient):
        with pytest.raises(InvalidArgument) as client:
            make(raw)
        assert client.value.field == "address" and client.value.rule == shared.value.rule
    # the CLI: a usage error of --control
    with pytest.raises(argparse.ArgumentTypeError, match=rule.replace(".", r"\.")):
        values.addresses(raw)


def test_one_address_follows_the_rule_of_a_list_and_a_unix_target_is_left_to_grpc() -> None:
    for single in ("unix:/tmp/corral.sock", "127.0.0.1:50051", "[::1]:50051", "localhost:50051"):
        assert client_addresses(single) == (single,)
        client = corral.Client(single)
        assert (client.address, client.addresses, client.current_address) == (single, (single,), single)
        assert repr(client) == f"Client({single!r})"
        client.close()


@pytest.mark.parametrize(
    "bad",
    ["127.0.0.1", "localhost", "::1:5", "[::1", "[::1]", "[nothost]:5", "http://127.0.0.1:5", "a b:1", "", None, 5],
)
def test_an_address_that_is_not_host_port_is_refused_the_same_by_the_clients_and_the_cli(bad: object) -> None:
    # Before: gRPC was left to guess. "127.0.0.1" dialled port 443, "::1:5" the host ::0.1.0.5 on 443 (not
    # loopback), "" printed gRPC's own error lines; None and 5 raised a bare TypeError.
    for make in (corral.Client, corral.AsyncClient):
        with pytest.raises(InvalidArgument) as refused:
            make(bad)  # type: ignore[arg-type]
        assert refused.value.field == "address"
        assert "HOST:PORT" in refused.value.rule and "brackets" in refused.value.rule, refused.value.rule
    if isinstance(bad, str):
        with pytest.raises(argparse.ArgumentTypeError, match=r"HOST:PORT.*brackets"):
            values.addresses(bad)
        with pytest.raises(AddressError):
            parse_addresses(f"127.0.0.1:1,{bad}", "X")  # the same rule inside a list


def test_a_client_keeps_the_list_as_given_and_starts_at_its_first_address() -> None:
    with corral.Client("127.0.0.1:1, 127.0.0.1:2") as client:
        assert client.address == "127.0.0.1:1, 127.0.0.1:2"
        assert client.addresses == ("127.0.0.1:1", "127.0.0.1:2")
        assert client.current_address == "127.0.0.1:1"
    aclient = corral.AsyncClient("127.0.0.1:1,127.0.0.1:2")
    assert (aclient.addresses, aclient.current_address) == (("127.0.0.1:1", "127.0.0.1:2"), "127.0.0.1:1")


def test_the_cli_takes_a_list_from_control_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert values.addresses("127.0.0.1:1") == "127.0.0.1:1"
    assert values.addresses("127.0.0.1:1 , 127.0.0.1:2") == "127.0.0.1:1,127.0.0.1:2"
    with pytest.raises(argparse.ArgumentTypeError, match="use HOST:PORT"):
        values.addresses("localhost")  # one address: the single-address rule and message, as before
    assert build_parser().parse_args(["stats", "--control", "a:1,b:2"]).control == "a:1,b:2"
    monkeypatch.setenv(CONTROL_ADDR_ENV, "a:1,b:2")
    assert build_parser().parse_args(["stats"]).control == "a:1,b:2"
    assert build_parser().parse_args(["demo", "--control", "a:1,b:2"]).control == "a:1,b:2"


# -- when a call moves on -----------------------------------------------------------------------------


def _error(cls: type[CorralError], message: str, answered: bool) -> CorralError:
    error = cls(message)
    error.answered = answered
    return error


@pytest.mark.parametrize(
    ("error", "moves"),
    [
        (_error(Unavailable, f"{STANDBY_PREFIX}another control plane leads", True), True),
        (_error(Unavailable, REFUSED, False), True),
        (_error(Unavailable, "errors resolving cp-b:50051: [field:hostname lookup error]", False), True),
        (_error(Unavailable, "DNS resolution failed for cp-b:50051", False), True),
        # a control plane's own words, even these, come with its status trailer: it was reached
        (_error(Unavailable, REFUSED, True), False),
        (_error(Unavailable, "the store is not writable", True), False),
        # the request may have reached a server: never sent twice
        (_error(Unavailable, "Stream removed (Socket closed)", False), False),
        (_error(Unavailable, "Cancelling all calls", False), False),
        (_error(NotFound, f"{STANDBY_PREFIX}not a standby's code", True), False),
        (_error(CorralError, REFUSED, False), False),
    ],
)
def test_a_call_moves_on_only_from_a_standby_or_when_it_was_never_sent(error: CorralError, moves: bool) -> None:
    assert moves_on(error) is moves


def _round(failover: Failover[str], outcomes: dict[str, CorralError | None]) -> tuple[list[str], str]:
    """One call through ``failover``: each address fails with its outcome's error or takes the call."""
    tried: list[str] = []
    attempts = failover.attempts()
    for address, conn in attempts:
        assert conn == f"conn-{address}"
        tried.append(address)
        error = outcomes[address]
        if error is not None:
            try:
                attempts.failed(address, error)
            except CorralError as exc:
                return tried, f"raised {type(exc).__name__}"
            continue
        attempts.took(address)
        return tried, f"taken by {address}"
    raise attempts.exhausted()


def test_a_call_goes_round_the_list_once_from_the_current_address_which_then_moves() -> None:
    made: list[str] = []

    def connect(address: str) -> str:
        made.append(address)
        return f"conn-{address}"

    failover = Failover(["a", "b", "c"], connect)
    standby, refused = _error(Unavailable, f"{STANDBY_PREFIX}x", True), _error(Unavailable, REFUSED, False)
    # Given a at first: a standby and b refused, so c takes the call and becomes current
    assert _round(failover, {"a": standby, "b": refused, "c": None}) == (["a", "b", "c"], "taken by c")
    assert failover.current == "c" and made == ["a", "b", "c"]
    # the next call goes to c first, and round to a and b after it
    assert _round(failover, {"a": None, "b": None, "c": standby}) == (["c", "a"], "taken by a")
    assert failover.current == "a"
    # an error that must not move on is raised where it happened, which becomes current
    assert _round(failover, {"a": refused, "b": NotFound("no job"), "c": None}) == (["a", "b"], "raised NotFound")
    assert failover.current == "b"
    # and each connection is made once
    assert made == ["a", "b", "c"]


def test_when_no_address_takes_the_call_the_error_names_each_and_why() -> None:
    failover = Failover(["a:1", "b:2"], lambda address: f"conn-{address}")
    standby, refused = _error(Unavailable, f"{STANDBY_PREFIX}x", True), _error(Unavailable, REFUSED, False)
    with pytest.raises(Unavailable) as error:
        _round(failover, {"a:1": refused, "b:2": standby})
    message = error.value.message
    assert message.startswith("none of the 2 control-plane addresses took the call: ")
    assert f"a:1: {REFUSED}" in message and f"b:2: {STANDBY_PREFIX}x" in message
    assert error.value.answered  # a standby answered: the CLI says so rather than "cannot reach"
    assert error.value.__cause__ is standby
    assert failover.current == "a:1"  # nobody took it: where it was
    with pytest.raises(Unavailable) as nobody:
        _round(failover, {"a:1": refused, "b:2": refused})
    assert not nobody.value.answered


def test_one_address_raises_every_error_as_it_comes() -> None:
    failover = Failover(["a"], lambda address: f"conn-{address}")
    refused = _error(Unavailable, REFUSED, False)
    attempts = failover.attempts()
    ((address, _),) = list(attempts)
    with pytest.raises(Unavailable) as error:
        attempts.failed(address, refused)
    assert error.value is refused  # the very error, not a summary of one


# -- against real gRPC servers on loopback --------------------------------------------------------------


class FakePlane(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc ships no types
    """A gRPC server on 127.0.0.1:0 that answers the JobService as scripted: ``answer`` (GetJob returns
    a job named after it, WatchJob one SUCCEEDED event), ``standby`` (a standby's refusal) or
    ``lookalike`` (UNAVAILABLE with the words of a connect failure, as a server: its status trailer)."""

    def __init__(self, name: str, behaviour: str) -> None:
        self.name = name
        self.behaviour = behaviour
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[self])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if details.method.endswith("/WatchJob"):
            return grpc.unary_stream_rpc_method_handler(self._watch)
        return grpc.unary_unary_rpc_method_handler(self._unary)

    def _refuse(self, context: grpc.ServicerContext) -> None:
        self.calls += 1
        self.entered.set()
        if self.behaviour == "hang":  # until the test has stopped the server under the call
            self.release.wait(10)
        message = f"{STANDBY_PREFIX}another control plane leads" if self.behaviour == "standby" else REFUSED
        code, text, trailers = rich_status(Unavailable(message))
        context.set_trailing_metadata(trailers)
        context.abort(code, text)

    def _unary(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        if self.behaviour != "answer":
            self._refuse(context)
        self.calls += 1
        return bytes(jobs_pb2.Job(id="j1", name=self.name, state=jobs_pb2.Job.SUCCEEDED).SerializeToString())

    def _watch(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        if self.behaviour != "answer":
            self._refuse(context)
        self.calls += 1
        job = jobs_pb2.Job(id="j1", name=self.name, state=jobs_pb2.Job.SUCCEEDED)
        yield bytes(jobs_pb2.JobEvent(job=job).SerializeToString())


@pytest.fixture
def planes() -> Iterator[Callable[[str, str], FakePlane]]:
    made: list[FakePlane] = []

    def make(name: str, behaviour: str) -> FakePlane:
        made.append(FakePlane(name, behaviour))
        return made[-1]

    yield make
    for plane in made:
        plane.release.set()
        plane.server.stop(None)


def test_grpc_words_a_refused_connection_as_a_call_never_sent() -> None:
    # The pin: what grpcio says when the address refuses the connection is what moves_on knows
    with corral.Client(dead_address(), timeout=5) as client, pytest.raises(Unavailable) as error:
        client.get("j1")
    assert moves_on(error.value), error.value.message
    assert error.value.message.startswith("failed to connect to all addresses")


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_past_a_standby_and_a_closed_port_to_the_one_that_answers(
    planes: Callable[[str, str], FakePlane], flavour: str
) -> None:
    standby, active = planes("standby", "standby"), planes("active", "answer")
    listed = f"{standby.address},{dead_address()},{active.address}"
    if flavour == "sync":
        with corral.Client(listed, timeout=5) as client:
            first, second = client.get("j1"), client.get("j1")
            waited = client.wait("j1", timeout=10)
            current = client.current_address
    else:

        async def run() -> tuple[corral.Job, corral.Job, corral.Job, str]:
            async with corral.AsyncClient(listed, timeout=5) as client:
                return (
                    await client.get("j1"),
                    await client.get("j1"),
                    await client.wait("j1", 10),
                    client.current_address,
                )

        first, second, waited, current = asyncio.run(run())
    assert first.name == second.name == waited.name == "active"
    assert current == active.address
    # the second call and the watch went straight to the one that took the first
    assert standby.calls == 1 and active.calls == 3


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_server_that_answered_unavailable_is_not_passed_over(
    planes: Callable[[str, str], FakePlane], flavour: str
) -> None:
    lookalike, active = planes("lookalike", "lookalike"), planes("active", "answer")
    listed = f"{lookalike.address},{active.address}"

    async def run_async() -> None:
        async with corral.AsyncClient(listed, timeout=5) as client:
            await client.get("j1")

    with pytest.raises(Unavailable) as error:
        if flavour == "sync":
            with corral.Client(listed, timeout=5) as client:
                client.get("j1")
        else:
            asyncio.run(run_async())
    assert error.value.answered and error.value.message == REFUSED
    assert lookalike.calls == 1 and active.calls == 0


def test_a_call_cut_after_it_reached_a_server_is_raised_not_sent_again(
    planes: Callable[[str, str], FakePlane],
) -> None:
    # Given a server that holds the call, and a second address that would take it
    holder, active = planes("holder", "hang"), planes("active", "answer")
    with corral.Client(f"{holder.address},{active.address}", timeout=10) as client:
        result: dict[str, Any] = {}

        def call() -> None:
            try:
                result["job"] = client.submit("noop")
            except CorralError as exc:
                result["error"] = exc

        caller = threading.Thread(target=call)
        caller.start()
        # When the server goes away under the call it had received
        assert holder.entered.wait(10)
        holder.server.stop(0)
        holder.release.set()
        caller.join(10)
    # Then the call fails UNAVAILABLE, and the submission went nowhere else
    error = result["error"]
    assert isinstance(error, Unavailable) and not moves_on(error), error.message
    assert active.calls == 0


def test_two_threads_that_need_the_same_connection_at_once_make_one() -> None:
    # After Client.close() connections are made again on demand, from whichever threads call then
    made: list[str] = []
    both_in = threading.Barrier(2, timeout=10)
    second = threading.Event()

    def connect(address: str) -> str:
        made.append(address)
        if len(made) == 1:  # the first one made waits a while for a second (it does not come)
            second.wait(0.5)
        else:
            second.set()
        return f"connection to {address}"

    failover = Failover(["a:1"], connect)

    def use() -> None:
        both_in.wait()
        failover.connection("a:1")

    threads = [threading.Thread(target=use) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert made == ["a:1"]  # before: two, and one was never closed
    assert failover.take_connections() == ["connection to a:1"]
