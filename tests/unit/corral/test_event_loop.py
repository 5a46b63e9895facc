"""corral.event_loop: the control plane and the worker run on uvloop unless told otherwise."""

import asyncio

import uvloop

from corral import event_loop


async def loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_uvloop_by_default_and_asyncio_on_request() -> None:
    assert event_loop.run(loop_type()) is uvloop.Loop
    assert event_loop.run(loop_type(), "uvloop") is uvloop.Loop
    assert not issubclass(event_loop.run(loop_type(), "asyncio"), uvloop.Loop)


def test_the_result_and_errors_of_the_coroutine_come_back() -> None:
    async def fail() -> None:
        raise ValueError("boom")

    assert event_loop.run(asyncio.sleep(0, result=7)) == 7
    try:
        event_loop.run(fail())
    except ValueError as exc:
        assert str(exc) == "boom"
    else:
        raise AssertionError("the error was lost")
