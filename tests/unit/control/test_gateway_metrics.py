"""control.metrics: event hooks bump the right series; the state collector reads the scheduler at scrape time."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from control.clock import FakeClock
from control.jobs import JobState
from control.metrics import MAX_REASONS, Metrics
from control.registry import WorkerEntry, WorkerRegistry
from control.shares import OwnerUsage
from control.watch import Watchers


class FakeScheduler:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.registry = WorkerRegistry()
        self.counts = {s: 0 for s in JobState}
        self.usage = OwnerUsage()
        self.watchers = Watchers()

    def state_counts(self) -> dict[JobState, int]:
        return dict(self.counts)


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_failure_reasons_past_the_limit_are_counted_as_other_and_the_own_ones_stay_labelled() -> None:
    # Given a job type whose error codes carry a changing value (an id per failure)
    m = Metrics()
    for i in range(MAX_REASONS + 50):
        m.attempt_failed("plugin", f"DB_ERROR_{i}", retry=False)
    m.attempt_failed("plugin", "DB_ERROR_0", retry=False)
    m.attempt_failed("plugin", "TIMEOUT", retry=False)
    m.attempt_failed("plugin", "LEASE_EXPIRED", retry=True)
    got = samples(m)
    failed = {dict(labels)["reason"]: v for (name, labels), v in got.items() if name == "corral_jobs_failed_total"}
    # Then the series stop at the limit (plus OTHER) instead of growing with every failure, nothing is
    # uncounted, a reason seen before the limit keeps its series, and the control plane's own stay labelled
    assert len([r for r in failed if r.startswith("DB_ERROR_")]) == MAX_REASONS
    assert failed["OTHER"] == 50 and failed["DB_ERROR_0"] == 2 and failed["TIMEOUT"] == 1
    assert sum(failed.values()) == MAX_REASONS + 50 + 2
    assert got[("corral_job_retries_total", (("reason", "LEASE_EXPIRED"),))] == 1
    assert got[("corral_lease_timeouts_total", ())] == 1


def test_hooks_count_events_by_type_and_reason() -> None:
    m = Metrics()
    m.job_submitted("noop")
    m.job_submitted("noop")
    m.job_succeeded("noop", 0.02)
    m.attempt_failed("sleep", "TIMEOUT", retry=True)
    m.attempt_failed("sleep", "LEASE_EXPIRED", retry=False)
    m.dispatch_latency.observe(0.001)
    got = samples(m)
    assert got[("corral_jobs_submitted_total", (("type", "noop"),))] == 2
    assert got[("corral_jobs_succeeded_total", (("type", "noop"),))] == 1
    assert got[("corral_job_run_seconds_count", (("type", "noop"),))] == 1
    assert got[("corral_job_attempt_failures_total", (("reason", "TIMEOUT"), ("type", "sleep")))] == 1
    assert got[("corral_job_retries_total", (("reason", "TIMEOUT"),))] == 1
    assert got[("corral_jobs_failed_total", (("reason", "LEASE_EXPIRED"), ("type", "sleep")))] == 1
    assert got[("corral_lease_timeouts_total", ())] == 1
    assert got[("corral_dispatch_latency_seconds_count", ())] == 1
    assert got[("corral_rate_limited_requests_total", ())] == 0


def test_state_is_read_at_scrape_time() -> None:
    m = Metrics()
    s = FakeScheduler()
    ready = [False]
    m.watch(s, lambda: ready[0])
    assert samples(m)[("corral_ready", ())] == 0
    s.counts[JobState.PENDING] = 4
    s.counts[JobState.FAILED] = 2
    worker = WorkerEntry("w1", threads=2, slots=2, registered_at=s.clock.now(), last_seen=s.clock.now())
    worker.heard(s.clock)
    s.registry.add(worker)
    s.clock.advance(3.5)
    ready[0] = True
    got = samples(m)
    assert got[("corral_queue_depth", (("queue", "ready"),))] == 4
    assert got[("corral_jobs", (("state", "FAILED"),))] == 2 and got[("corral_dead_letter_jobs", ())] == 2
    assert got[("corral_workers", (("state", "UNAVAILABLE"),))] == 1  # no stream: not connected
    assert got[("corral_worker_heartbeat_age_max_seconds", ())] == 3.5
    assert got[("corral_ready", ())] == 1
    assert got[("corral_watched_jobs", ())] == 0
    q = s.watchers.subscribe("j1")
    s.watchers.listen("j1", print)
    assert samples(m)[("corral_watched_jobs", ())] == 2
    s.watchers.unsubscribe("j1", q)
    s.watchers.forget("j1", print)
    s.watchers.forget("j1", print)  # twice: counted once
    assert samples(m)[("corral_watched_jobs", ())] == 0


def test_each_instance_has_its_own_registry() -> None:
    a, b = Metrics(), Metrics()
    a.job_submitted("noop")
    assert ("corral_jobs_submitted_total", (("type", "noop"),)) not in samples(b)
