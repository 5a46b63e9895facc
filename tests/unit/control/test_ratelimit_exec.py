"""Execution rate limits: the CORRAL_EXEC_RATE_LIMITS parser and the gates, on a FakeClock.

The dispatcher's side (real workers, real timing) is tests/integration/test_rate_limits.py.
"""

from __future__ import annotations

import asyncio

import pytest

from control.clock import FakeClock, SystemClock
from control.config import ConfigError, ControlConfig
from control.exec_limits import ExecLimits, ExecRule, parse_exec_limits
from control.queue import STRICT, Rank

# ---- the parser -----------------------------------------------------------------------------------


def test_rules_with_units_and_bursts() -> None:
    rules = parse_exec_limits(" type:webhook=10/s , key:api.example.com:443=5/m:20,type:email=7200/h,")
    assert rules == (
        ExecRule("type", "webhook", 10.0, 1, "type:webhook=10/s"),
        ExecRule("key", "api.example.com:443", 5 / 60, 20, "key:api.example.com:443=5/m:20"),
        ExecRule("type", "email", 2.0, 1, "type:email=7200/h"),
    )
    assert [r.target for r in rules] == ["type:webhook", "key:api.example.com:443", "type:email"]
    assert parse_exec_limits("") == () and parse_exec_limits(" , ") == ()


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("type:webhook", "rule 'type:webhook': missing '=rate/unit'"),
        ("webhook=10/s", "rule 'webhook=10/s': must start with type: or key:"),
        ("queue:webhook=10/s", "rule 'queue:webhook=10/s': must start with type: or key:"),
        ("type:=10/s", "rule 'type:=10/s': the type name is empty"),
        ("key: =10/s", "rule 'key: =10/s': the key name is empty"),
        ("type:webhook=10", "rule 'type:webhook=10': the unit must be /s, /m or /h, got '10'"),
        ("type:webhook=10/d", "the unit must be /s, /m or /h, got '10/d'"),
        ("type:webhook=ten/s", "the rate must be a number, got 'ten'"),
        ("type:webhook=0/s", "the rate must be > 0, got '0'"),
        ("type:webhook=-1/s", "the rate must be > 0, got '-1'"),
        ("type:webhook=nan/s", "the rate must be > 0, got 'nan'"),
        ("type:webhook=10/s:x", "the burst must be an integer, got 'x'"),
        ("type:webhook=10/s:0", "the burst must be >= 1, got 0"),
    ],
)
def test_a_bad_rule_is_named_with_what_is_wrong(spec: str, problem: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_exec_limits(spec)
    assert problem in str(info.value)
    assert "type:webhook=10/s or key:api.example.com=5/s:10" in str(info.value)  # an example to copy


def test_a_target_limited_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="rule 'type:a=2/s': type:a is limited twice"):
        parse_exec_limits("type:a=1/s,key:a=1/s,type:a=2/s")


def test_the_setting_is_checked_at_start_up_naming_the_variable() -> None:
    assert ControlConfig.from_env({"CORRAL_EXEC_RATE_LIMITS": "type:webhook=10/s"}).exec_rate_limits == (
        "type:webhook=10/s"
    )
    with pytest.raises(ConfigError) as info:
        ControlConfig.from_env({"CORRAL_EXEC_RATE_LIMITS": "type:webhook=10/s,key:x=5/sec"})
    assert str(info.value).startswith("CORRAL_EXEC_RATE_LIMITS rule 'key:x=5/sec': the unit must be /s, /m or /h")


# ---- the gates ------------------------------------------------------------------------------------


def bundle(spec: str) -> tuple[ExecLimits, FakeClock, list[str]]:
    """The limits under test, their clock, and the rule targets reported as delaying a job."""
    clock = FakeClock(0.0)
    delayed: list[str] = []
    return ExecLimits(parse_exec_limits(spec), clock, on_delayed=delayed.append), clock, delayed


def order(priority: int, seq: int) -> Rank:
    return STRICT.rank(priority, 0.0, seq)


def test_a_job_meets_its_type_rule_and_its_rate_key_rule() -> None:
    limits, _, _ = bundle("type:webhook=10/s,key:api.example.com=5/s")
    webhook, host = limits.gates
    assert limits.gates_for("webhook", {}) == (webhook,)
    assert limits.gates_for("email", {"rate_key": "api.example.com"}) == (host,)
    assert limits.gates_for("webhook", {"rate_key": "api.example.com"}) == (webhook, host)
    assert limits.gates_for("email", {"rate_key": "other.example.com"}) == ()
    assert limits.gates_for("noop", {"team": "api.example.com"}) == ()  # only the rate_key label counts


def test_a_gate_without_a_token_parks_the_job_until_release() -> None:
    limits, clock, delayed = bundle("key:k=10/s")
    gates = limits.gates_for("noop", {"rate_key": "k"})
    (gate,) = gates
    # Given a burst of 1: the first job may start and takes the token
    assert limits.blocker(gates, order(0, 1), clock.now()) is None
    limits.take(gates, "j1", clock.now())
    # When the next ones come, the gate holds them (counted delayed once each)
    for seq in (2, 3, 4):
        assert limits.blocker(gates, order(0, seq), clock.now()) is gate
        assert limits.park(gate, order(0, seq), f"j{seq}")
    assert gate.waiting == 3 and limits.held() == 3
    # A release before the token is due lets nobody go and says when to come back
    released, again = limits.release(gate, clock.now())
    assert released == [] and again == pytest.approx(0.1)
    # At the token, the best one goes; the next token is 0.1 s later
    clock.advance(0.1)
    released, again = limits.release(gate, clock.now())
    assert released == ["j2"] and again == pytest.approx(0.1) and gate.waiting == 2
    limits.take(gates, "j2", clock.now())
    assert limits.held() == 2
    # After a long pause (burst 1) one still goes at a time
    clock.advance(10)
    assert limits.release(gate, clock.now())[0] == ["j3"]
    assert delayed == []  # park() reports; hold() (below) is what calls on_delayed


def test_parked_counts_the_jobs_a_gate_holds_now_not_those_it_let_go() -> None:
    # The autoscaler takes parked jobs out of its backlog: released ones wait for a worker, not a token
    limits, clock, _ = bundle("type:webhook=1000/s:100")
    (gate,) = limits.gates
    for seq in range(100):
        limits.take((gate,), f"burst{seq}", clock.now())
    for seq in range(100):
        limits.park(gate, order(0, seq), f"j{seq}")
    assert limits.parked() == 100
    clock.advance(0.1)
    released, again = limits.release(gate, clock.now())
    assert len(released) == 100 and again is None
    assert gate.waiting == 0 and limits.parked() == 0
    assert limits.held() == 100  # still counted delayed once each, should a worker not take them yet
    limits.discard("j0")
    limits.take((gate,), "j1", clock.now())
    assert limits.held() == 98


def test_a_gate_releases_in_queue_order_as_many_as_it_has_tokens() -> None:
    limits, clock, _ = bundle("type:email=60/m:3")
    (gate,) = limits.gates
    limits.take((gate,), "x", clock.now())
    limits.take((gate,), "y", clock.now())
    limits.take((gate,), "z", clock.now())
    for priority, seq in [(0, 1), (50, 2), (0, 3), (90, 4), (50, 5)]:
        limits.park(gate, order(priority, seq), f"p{priority}s{seq}")
    clock.advance(2)  # 2 tokens back (1 a second)
    released, again = limits.release(gate, clock.now())
    assert released == ["p90s4", "p50s2"] and again == pytest.approx(1.0)
    clock.advance(60)  # the burst caps what a long wait gives
    released, again = limits.release(gate, clock.now())
    assert released == ["p50s5", "p0s1", "p0s3"] and again is None


def test_jobs_already_waiting_go_first() -> None:
    limits, clock, _ = bundle("key:k=10/s:5")
    (gate,) = gates = limits.gates_for("noop", {"rate_key": "k"})
    limits.park(gate, order(10, 1), "waiting")
    # Even with tokens in the bucket, a job ranked below a parked one waits behind it...
    assert limits.blocker(gates, order(0, 2), clock.now()) is gate
    # ...and one ranked above it does not
    assert limits.blocker(gates, order(20, 3), clock.now()) is None


def test_a_cancelled_job_leaves_its_gate() -> None:
    limits, clock, _ = bundle("key:k=1/s")
    (gate,) = limits.gates
    limits.take((gate,), "first", clock.now())
    limits.park(gate, order(0, 1), "cancelled")
    limits.park(gate, order(0, 2), "kept")
    limits.discard("cancelled")
    assert gate.waiting == 1 and limits.held() == 1
    clock.advance(1)
    assert limits.release(gate, clock.now()) == (["kept"], None)


def test_with_two_gates_the_job_waits_for_the_later_token() -> None:
    limits, clock, _ = bundle("type:webhook=10/s,key:slow=1/s")
    gates = limits.gates_for("webhook", {"rate_key": "slow"})
    slow = gates[1]
    limits.take(gates, "first", clock.now())
    assert limits.blocker(gates, order(0, 1), clock.now()) is slow
    clock.advance(0.1)  # the type has a token again, the key does not
    assert limits.blocker(gates, order(0, 1), clock.now()) is slow
    clock.advance(0.9)
    assert limits.blocker(gates, order(0, 1), clock.now()) is None


def test_held_jobs_come_back_through_the_timer() -> None:
    async def main() -> tuple[list[list[str]], list[str], float]:
        got: list[list[str]] = []
        done = asyncio.Event()

        def on_release(ids: list[str]) -> None:
            got.append(ids)
            if sum(map(len, got)) == 3:
                done.set()

        delayed: list[str] = []
        limits = ExecLimits(parse_exec_limits("key:k=50/s"), SystemClock(), on_release, delayed.append)
        (gate,) = gates = tuple(limits.gates)
        loop = asyncio.get_running_loop()
        start = loop.time()
        limits.take(gates, "j0", SystemClock().now())
        for seq in (1, 2, 3):
            limits.hold(gate, order(0, seq), f"j{seq}", SystemClock().now())
        # Each released job takes its token as it starts, as the dispatcher does
        await asyncio.wait_for(done.wait(), 5)
        elapsed = loop.time() - start
        limits.close()
        return got, delayed, elapsed

    got, delayed, elapsed = asyncio.run(main())
    assert [i for ids in got for i in ids] == ["j1", "j2", "j3"]
    assert delayed == ["key:k"] * 3
    assert elapsed >= 0.02  # not all at once: at least the first token's wait (1/50 s)
