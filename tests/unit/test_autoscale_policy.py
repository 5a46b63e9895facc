"""ScalePolicy as a specification: bounds, thresholds with hysteresis, steps sized to the backlog,
cooldown, the stable period before a scale-down, the oldest job's age, and no flapping under a
square-wave load. Time is a number passed in: nothing sleeps."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from control.autoscale.policy import (
    Action,
    CrashBackoff,
    Decision,
    ScalePolicy,
    ScaleSettings,
    Snapshot,
    WorkerLoad,
    choose_victims,
)
from control.config import ConfigError, ControlConfig

SETTINGS = ScaleSettings(
    min_workers=1,
    max_workers=6,
    threshold_high=4,
    threshold_low=1,
    stable_sec=10.0,
    cooldown_sec=5.0,
    max_wait_sec=30.0,
    threads_per_worker=2,
)


def snap(
    ready: int = 0,
    threads: int | None = None,
    age: float = 0.0,
    free: int = 0,
    workers: int = 2,
    starting: int = 0,
    idle: int | None = None,
    retiring: int = 0,
    held: float = 0.0,
) -> Snapshot:
    """A snapshot; unless ``idle`` says otherwise, the free threads are those of whole idle workers."""
    idle = free // SETTINGS.threads_per_worker if idle is None else idle
    return Snapshot(ready, ready if threads is None else threads, age, free, workers, starting, idle, retiring, held)


def policy(**changes: object) -> ScalePolicy:
    return ScalePolicy(replace(SETTINGS, **changes))  # type: ignore[arg-type]


def act(p: ScalePolicy, s: Snapshot, now: float) -> Decision:
    """Decide and, like the autoscaler, start the cooldown when it acts."""
    d = p.decide(s, now)
    if d.action is not Action.NONE:
        p.acted(now)
    return d


# ---- bounds ---------------------------------------------------------------------------------------
def test_below_min_scales_up_to_min_once_the_cooldown_is_over() -> None:
    p = policy(min_workers=3)
    p.acted(0.0)
    assert p.decide(snap(workers=1), 4.0).reason == "cooldown"  # one action per cooldown window, always
    d = p.decide(snap(workers=1), 5.0)
    assert (d.action, d.step, d.desired, d.reason) == (Action.UP, 2, 3, "below_min")


def test_above_max_scales_down_to_max() -> None:
    d = policy().decide(snap(workers=9, free=18), 0.0)
    assert (d.action, d.step, d.desired, d.reason) == (Action.DOWN, 3, 6, "above_max")


def test_never_above_max_however_big_the_backlog() -> None:
    p = policy()
    d = p.decide(snap(ready=1000, workers=5), 0.0)
    assert (d.action, d.step, d.desired) == (Action.UP, 1, 6)
    assert p.decide(snap(ready=1000, workers=6), 100.0).reason == "at_max"


def test_containers_still_draining_count_toward_max() -> None:
    """A drained container finishes its jobs (up to their timeout) before it goes: a burst meanwhile
    started as many as MAX_WORKERS beside it (3 workers + 3 draining, MAX 6: +3 more)."""
    p = policy()
    assert p.decide(snap(ready=1000, workers=3, retiring=3), 0.0).reason == "at_max"
    d = p.decide(snap(ready=1000, workers=3, retiring=1), 1.0)
    assert (d.action, d.step, d.desired) == (Action.UP, 2, 5)
    # The floor too: below MIN_WORKERS it adds only what room the draining ones leave
    low = policy(min_workers=4)
    assert low.decide(snap(workers=2, retiring=4), 0.0).reason == "at_max"
    d = low.decide(snap(workers=2, retiring=3), 1.0)
    assert (d.action, d.step, d.reason) == (Action.UP, 1, "below_min")


def test_never_below_min_however_idle() -> None:
    p = policy(stable_sec=0.0)
    assert p.decide(snap(workers=1, free=2), 0.0).reason == "steady"
    d = p.decide(snap(workers=3, free=6), 1.0)
    assert (d.action, d.step, d.desired) == (Action.DOWN, 2, 1)


# ---- scale up -------------------------------------------------------------------------------------
def test_step_is_sized_to_the_threads_the_backlog_misses() -> None:
    # 9 ready jobs asking 9 threads, 1 thread free: 8 missing = 4 workers of 2 threads.
    d = policy().decide(snap(ready=9, free=1, workers=1), 0.0)
    assert (d.action, d.step, d.desired, d.reason) == (Action.UP, 4, 5, "backlog")


def test_jobs_asking_many_threads_need_more_workers() -> None:
    # 5 jobs, each capped at a whole 2-thread worker: 10 threads -> 5 workers (capped at MAX 6 - 1).
    d = policy().decide(snap(ready=5, threads=10, workers=1), 0.0)
    assert (d.action, d.step) == (Action.UP, 5)


def test_between_the_thresholds_nothing_happens() -> None:
    p = policy(stable_sec=0.0)
    for ready in (1, 2, 3, 4):  # LOW 1 <= depth <= HIGH 4: the hysteresis band
        d = p.decide(snap(ready=ready, free=0, workers=3), float(ready))
        assert (d.action, d.reason) == (Action.NONE, "steady")


def test_capacity_already_starting_counts_so_one_burst_is_answered_once() -> None:
    p = policy(cooldown_sec=0.0)
    first = act(p, snap(ready=8, workers=1), 0.0)
    assert (first.action, first.step) == (Action.UP, 4)
    # The next look: the 4 containers are starting, the backlog is unchanged.
    d = p.decide(snap(ready=8, workers=5, starting=4), 0.5)
    assert (d.action, d.reason) == (Action.NONE, "capacity_coming")


def test_a_long_wait_scales_up_under_the_threshold() -> None:
    p = policy()
    assert p.decide(snap(ready=2, age=29.0, workers=1), 0.0).reason == "steady"
    d = p.decide(snap(ready=2, age=30.0, workers=1), 1.0)
    assert (d.action, d.step, d.reason) == (Action.UP, 1, "waiting")
    assert policy(max_wait_sec=0.0).decide(snap(ready=2, age=3600.0, workers=1), 0.0).reason == "steady"


# ---- cooldown -------------------------------------------------------------------------------------
def test_no_second_action_inside_the_cooldown() -> None:
    p = policy()
    assert act(p, snap(ready=6, workers=1), 0.0).action is Action.UP
    assert p.decide(snap(ready=20, workers=4), 4.9).reason == "cooldown"
    assert p.cooldown_left(4.0) == pytest.approx(1.0)
    assert act(p, snap(ready=20, workers=4), 5.0).action is Action.UP


# ---- scale down -----------------------------------------------------------------------------------
def test_scale_down_waits_for_the_stable_period_then_removes_the_spare_workers() -> None:
    p = policy()
    idle = snap(ready=0, free=8, workers=4)  # 4 idle workers of 2 threads
    assert p.decide(idle, 100.0).reason == "stabilizing"
    assert p.decide(idle, 109.9).reason == "stabilizing"
    d = p.decide(idle, 110.0)
    assert (d.action, d.step, d.desired, d.reason) == (Action.DOWN, 3, 1, "idle")


def test_scale_down_keeps_the_capacity_still_in_use() -> None:
    p = policy(stable_sec=0.0)
    # 4 workers, 5 of 8 threads busy on three of them: the fourth is a whole idle worker to spare.
    d = p.decide(snap(ready=0, free=3, workers=4, idle=1), 0.0)
    assert (d.action, d.step) == (Action.DOWN, 1)
    # The same 3 free threads spread over all four: none is idle, none goes (it would drain a job).
    assert p.decide(snap(ready=0, free=3, workers=4, idle=0), 1.0).reason == "steady"
    # Fully busy with an empty queue: nothing to remove.
    assert p.decide(snap(ready=0, free=0, workers=4, idle=0), 2.0).reason == "steady"


def test_only_workers_that_run_nothing_are_spare() -> None:
    """Free threads were counted as spare workers: 10 workers of 4 threads, each running one 1-thread
    job (a long one), had 30 threads free, so 7 busy workers were drained."""
    p = policy(max_workers=10, threads_per_worker=4, stable_sec=0.0)
    assert p.decide(snap(free=30, workers=10, idle=0), 0.0).reason == "steady"
    # Two of them finish their jobs: those two may go, not more
    d = p.decide(snap(free=32, workers=10, idle=2), 1.0)
    assert (d.action, d.step, d.desired, d.reason) == (Action.DOWN, 2, 8, "idle")


def test_no_scale_down_while_workers_are_starting() -> None:
    # The burst that asked for them was absorbed meanwhile: their capacity is not spare until they
    # have registered (and can be drained); then the stable period starts.
    p = policy(stable_sec=1.0)
    assert p.decide(snap(ready=0, free=0, workers=3, starting=2), 0.0).reason == "steady"
    assert p.decide(snap(ready=0, free=0, workers=3, starting=2), 5.0).reason == "steady"
    assert p.decide(snap(ready=0, free=4, workers=3), 6.0).reason == "stabilizing"
    d = p.decide(snap(ready=0, free=4, workers=3), 7.0)
    assert (d.action, d.step) == (Action.DOWN, 2)


def test_any_load_restarts_the_stable_period() -> None:
    p = policy()
    assert p.decide(snap(free=8, workers=4), 0.0).reason == "stabilizing"
    assert p.decide(snap(ready=2, free=8, workers=4), 8.0).reason == "steady"  # load came back
    assert p.decide(snap(free=8, workers=4), 9.0).reason == "stabilizing"
    assert p.decide(snap(free=8, workers=4), 18.9).reason == "stabilizing"
    assert p.decide(snap(free=8, workers=4), 19.0).action is Action.DOWN


def test_a_scale_down_restarts_the_stable_period_and_the_cooldown() -> None:
    p = policy(stable_sec=2.0, cooldown_sec=5.0)
    p.decide(snap(free=2, workers=3), 0.0)
    assert act(p, snap(free=2, workers=3), 2.0).step == 1
    assert p.decide(snap(free=4, workers=2), 3.0).reason == "stabilizing"
    assert p.decide(snap(free=4, workers=2), 5.5).reason == "cooldown"
    assert act(p, snap(free=4, workers=2), 7.0).action is Action.DOWN


# ---- square wave ----------------------------------------------------------------------------------
def square_wave(p: ScalePolicy, period: float, until: float, tick: float = 0.5) -> list[tuple[float, Decision]]:
    """A fleet that follows the decisions at once, under bursts of 12 two-thread jobs in the first
    half of every period and nothing in the second; returns the actions."""
    tpw = p.settings.threads_per_worker
    workers = p.settings.min_workers
    actions: list[tuple[float, Decision]] = []
    t = 0.0
    while t < until:
        busy = (t % period) < period / 2
        ready = max(0, 12 - workers) if busy else 0
        free = 0 if busy else workers * tpw
        d = act(p, Snapshot(ready, ready * tpw, 1.0 if ready else 0.0, free, workers, idle_workers=free // tpw), t)
        if d.action is not Action.NONE:
            actions.append((t, d))
            workers = d.desired
        t += tick
    return actions


def test_square_wave_with_a_long_stable_period_never_scales_in() -> None:
    p = policy(max_workers=8, stable_sec=15.0, cooldown_sec=5.0)
    actions = square_wave(p, period=20.0, until=200.0)
    assert actions and all(d.action is Action.UP for _, d in actions)
    assert sum(d.step for _, d in actions) == 7  # up to MAX once, then held there


@pytest.mark.parametrize("period", [20.0, 4.0])
def test_square_wave_at_most_one_action_per_cooldown_window(period: float) -> None:
    # A short stable period, so that it does follow a slow wave (up in each burst, down in each lull);
    # a wave faster than the cooldown (period 4 s) would flip it every 2 s without one.
    p = policy(max_workers=8, stable_sec=1.0, cooldown_sec=6.0)
    actions = square_wave(p, period=period, until=200.0)
    times = [t for t, _ in actions]
    assert len(times) >= 4
    assert all(b - a >= 6.0 for a, b in itertools.pairwise(times))
    assert len(actions) <= 200 / 6.0 + 1
    assert {d.action for _, d in actions} == {Action.UP, Action.DOWN}


def test_without_a_cooldown_a_fast_square_wave_would_flap() -> None:
    # The control for the test above: the cooldown is what holds it.
    actions = square_wave(policy(max_workers=8, stable_sec=1.0, cooldown_sec=0.0), period=4.0, until=40.0)
    times = [t for t, _ in actions]
    assert any(b - a < 6.0 for a, b in itertools.pairwise(times))


# ---- victims --------------------------------------------------------------------------------------
def test_victims_are_idle_workers_first_then_the_least_loaded() -> None:
    workers = [
        WorkerLoad("busy-2", running_jobs=2, running_threads=2),
        WorkerLoad("idle-b", running_jobs=0, running_threads=0),
        WorkerLoad("busy-1", running_jobs=1, running_threads=1),
        WorkerLoad("idle-a", running_jobs=0, running_threads=0),
    ]
    assert choose_victims(workers, 1) == ["idle-a"]
    assert choose_victims(workers, 3) == ["idle-a", "idle-b", "busy-1"]
    assert choose_victims(workers, 0) == []


# ---- containers that die at start ----------------------------------------------------------------
def test_no_step_up_while_starts_are_held_but_a_scale_down_still_happens() -> None:
    # Containers die soon after they start: more of them would too (not the bound, not the backlog)
    p = policy(min_workers=3, stable_sec=0.0)
    assert p.decide(snap(workers=1, held=10.0), 0.0).reason == "crash_backoff"
    assert p.decide(snap(ready=1000, workers=3, held=10.0), 0.0).reason == "crash_backoff"
    d = p.decide(snap(workers=1), 0.0)
    assert (d.action, d.step, d.reason) == (Action.UP, 2, "below_min")
    d = p.decide(snap(ready=0, free=8, workers=5, held=10.0), 1.0)
    assert (d.action, d.step, d.reason) == (Action.DOWN, 2, "idle")


def test_crash_backoff_doubles_to_its_cap_and_ends_once_a_container_stays_up() -> None:
    b = CrashBackoff(base_sec=10.0, cap_sec=60.0, stay_up_sec=30.0)
    assert (b.held(0.0), b.early(started_at=0.0, now=29.0), b.early(started_at=0.0, now=30.0)) == (0.0, True, False)
    # The first failure is replaced at once; then the wait doubles, up to the cap
    holds = []
    now = 0.0
    for _ in range(6):
        holds.append(b.failed(now))
        now += holds[-1] + 1.0
    assert holds == [0.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    last = now - 61.0
    assert (b.held(last + 59.0), b.held(last + 60.0), b.failing(last + 60.0)) == (1.0, 0.0, True)
    # A container started before the last failure proves nothing; one started after it, once up long enough
    assert not b.stayed_up(started_at=last - 1.0, now=last + 100.0)
    assert not b.stayed_up(started_at=last + 60.0, now=last + 89.0)
    assert b.stayed_up(started_at=last + 60.0, now=last + 90.0)
    assert (b.failures, b.failing(last + 90.0), b.failed(last + 91.0)) == (0, False, 0.0)
    # A failure long after the last one (nothing started meanwhile) starts a new series too
    assert b.failed(last + 92.0) == 10.0
    assert b.failed(last + 92.0 + 91.0) == 0.0


# ---- settings -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"threshold_low": 4}, "QUEUE_THRESHOLD_LOW"),
        ({"min_workers": 7}, "MAX_WORKERS"),
        ({"threads_per_worker": 0}, "CORRAL_WORKER_THREADS"),
        ({"cooldown_sec": -1.0}, "CORRAL_SCALE_COOLDOWN_SEC"),
    ],
)
def test_settings_that_break_a_rule_are_refused_by_name(changes: dict[str, object], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        replace(SETTINGS, **changes)  # type: ignore[arg-type]


def test_decision_summary_reads_like_the_log() -> None:
    d = policy().decide(snap(ready=9, free=1, workers=1), 0.0)
    assert d.summary().startswith("up +4 (backlog: 9 ready jobs asking 9 threads")
    assert policy().decide(snap(ready=2), 0.0).summary().startswith("none (steady")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AUTOSCALE_MODE": "kubernetes"}, "AUTOSCALE_MODE must be off, recommend or docker, got 'kubernetes'"),
        (
            {"QUEUE_THRESHOLD_HIGH": "5", "QUEUE_THRESHOLD_LOW": "5"},
            "QUEUE_THRESHOLD_LOW must be >= 0 and < QUEUE_THRESHOLD_HIGH (5), got 5",
        ),
        ({"MIN_WORKERS": "3", "MAX_WORKERS": "2"}, "MAX_WORKERS must be >= 1 and >= MIN_WORKERS (3), got 2"),
        ({"AUTOSCALE_INTERVAL": "0"}, "AUTOSCALE_INTERVAL must be > 0, got 0.0"),
        ({"CORRAL_WORKER_THREADS": "two"}, "CORRAL_WORKER_THREADS must be an integer, got 'two'"),
        ({"CORRAL_AUTOSCALE_CONTROL_ADDRESS": "localhost"}, "CORRAL_AUTOSCALE_CONTROL_ADDRESS must be HOST:PORT"),
        ({"CORRAL_AUTOSCALE_GROUP": "a b"}, "CORRAL_AUTOSCALE_GROUP must match"),
    ],
)
def test_the_control_plane_refuses_bad_autoscaler_settings_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        ControlConfig.from_env(env)
    assert str(err.value).startswith(message)


def test_autoscaler_settings_read_from_the_environment() -> None:
    cfg = ControlConfig.from_env(
        {"AUTOSCALE_MODE": "Docker", "MIN_WORKERS": "0", "MAX_WORKERS": "3", "SCALE_DOWN_STABLE_SEC": "1.5"}
    )
    assert (cfg.autoscale_mode, cfg.min_workers, cfg.max_workers, cfg.scale_down_stable_sec) == ("docker", 0, 3, 1.5)
    assert (cfg.worker_network, cfg.autoscale_control_address, cfg.autoscale_group) == ("host", "", "corral")
