"""Owners' shares (control.shares): which owner's job a freed slot goes to, caps, usage, settings."""

from __future__ import annotations

import math

import pytest

from control.clock import FakeClock
from control.jobs import JobRecord, JobState
from control.queue import STRICT, QueueOrder
from control.registry import Capacity
from control.shares import OwnerQueues, OwnerUsage, ShareRules

EIGHT_THREADS = Capacity(threads=8, gpus=0, memory_mb=0)


class Harness:
    """OwnerQueues over a dict of live jobs, as the scheduler keeps them; ``start`` plays a lease."""

    def __init__(self, rules: ShareRules, order: QueueOrder = STRICT, capacity: Capacity = EIGHT_THREADS) -> None:
        self.jobs: dict[str, JobRecord] = {}
        self.queued: dict[str, int] = {}
        self.clock = FakeClock()
        self.usage = OwnerUsage(rules.group_of, rules.half_life_sec, self.clock.monotonic)
        self.capacity = capacity
        self.q = OwnerQueues(self._take, self._looks, rules, self.usage, order, lambda: self.capacity)
        self.seq = 0

    def _looks(self, job_id: str, token: int) -> bool:
        return self.queued.get(job_id) == token and self.jobs[job_id].state is JobState.PENDING

    def _take(self, job_id: str, token: int) -> bool:
        live = self._looks(job_id, token)
        if self.queued.get(job_id) == token:
            del self.queued[job_id]
        return live

    def add(self, owner: str, priority: int = 0, threads: int = 1, gpus: int = 0, memory_mb: int = 0) -> str:
        self.seq += 1
        job = JobRecord(id=f"{owner}-{self.seq}", type="noop", payload_json="{}", created_at=float(self.seq),
                        priority=priority, thread_demand=threads, seq=self.seq, owner=owner, gpu_count=gpus,
                        memory_mb=memory_mb)  # fmt: skip
        self.jobs[job.id] = job
        self.queued[job.id] = self.q.push(job.id, priority, job.ready_at, job.seq, owner)
        return job.id

    def start(self) -> str | None:
        """Pop the next job and lease it (it now holds its threads), as a dispatch pass does."""
        job_id = self.q.pop()
        if job_id is not None:
            job = self.jobs[job_id]
            job.state, job.threads_granted, job.started_at = JobState.RUNNING, job.thread_demand, 0.0
            self.usage.started(job)
        return job_id

    def finish(self, job_id: str, at: float = 1.0) -> None:
        job = self.jobs[job_id]
        job.state, job.updated_at = JobState.SUCCEEDED, at
        self.usage.stopped(job)


def owners(ids: list[str | None]) -> list[str]:
    return [i.split("-")[0] if i else "-" for i in ids]


def test_with_aging_waiting_ranks_an_owner_s_jobs_and_equal_shares_but_not_unequal_ones() -> None:
    h = Harness(ShareRules(fair=True), QueueOrder(aging_sec=1.0))
    old = h.add("alice")  # ready at t=1 (a job's ready time is its sequence here)
    h.seq += 3
    newer = h.add("alice", priority=2)  # ready at t=5: two levels up, four levels of waiting behind
    bob = h.add("bob", priority=3)  # ready at t=6
    # Both owners hold nothing: the best-ranked head goes, and alice's is her old job
    assert h.start() == old
    # Now alice holds a thread and bob none: the share decides, whatever the ranks
    assert h.start() == bob
    assert h.start() == newer


@pytest.mark.parametrize(("gpus", "memory_mb"), [(2, 0), (0, 1000)])
def test_fair_share_weighs_the_resource_an_owner_holds_most_of(gpus: int, memory_mb: int) -> None:
    # Given 8 threads, 2 GPUs and 1,000 MiB; alice runs one 1-thread job that holds all the GPUs (or all
    # the memory), bob runs two 1-thread jobs
    h = Harness(ShareRules(fair=True), capacity=Capacity(8, 2, 1000))
    h.add("alice", gpus=gpus, memory_mb=memory_mb)
    h.add("bob")
    h.add("bob")
    assert owners([h.start(), h.start(), h.start()]) == ["alice", "bob", "bob"]
    # When each queues one more plain job
    h.add("alice")
    h.add("bob")
    # Then bob's goes first: he holds a quarter of the threads, alice all of the GPUs (or memory),
    # though she holds fewer threads
    assert owners([h.start(), h.start()]) == ["bob", "alice"]
    # And with the GPUs (or the memory) back, her one thread is less than his three
    h.finish(next(j.id for j in h.jobs.values() if j.gpu_count or j.memory_mb))
    h.add("alice")
    h.add("bob")
    assert owners([h.start()]) == ["alice"]


def test_fair_share_interleaves_a_late_owner_with_a_big_backlog() -> None:
    h = Harness(ShareRules(fair=True))
    for _ in range(6):
        h.add("alice")
    for _ in range(2):
        h.add("bob")
    # alice queued first and more, yet bob's jobs do not wait behind all of hers
    assert owners([h.start() for _ in range(6)]) == ["alice", "bob", "alice", "bob", "alice", "alice"]


def test_fair_share_counts_threads_and_weights() -> None:
    # alice's jobs take 4 threads each, bob's 1: bob gets slots until he holds as many threads
    h = Harness(ShareRules(fair=True))
    for _ in range(3):
        h.add("alice", threads=4)
    for _ in range(8):
        h.add("bob")
    assert owners([h.start() for _ in range(6)]) == ["alice", "bob", "bob", "bob", "bob", "alice"]
    # with weight 3, carol is served until she holds three times what dave holds
    w = Harness(ShareRules(fair=True, weights={"carol": 3.0}))
    for _ in range(8):
        w.add("carol")
        w.add("dave")
    started = owners([w.start() for _ in range(8)])
    assert (started.count("carol"), started.count("dave")) == (6, 2)


def test_with_groups_the_share_is_the_group_s() -> None:
    # alice and bob are one group, carol another: carol gets as many slots as the two of them together
    h = Harness(ShareRules(fair=True, group_of={"alice": "physics", "bob": "physics", "carol": "bio"}))
    for _ in range(4):
        h.add("alice")
        h.add("bob")
        h.add("carol")
    started = owners([h.start() for _ in range(8)])
    assert (started.count("carol"), started.count("alice") + started.count("bob")) == (4, 4)
    assert (h.usage.share_threads["physics"], h.usage.share_threads["bio"]) == (4, 4)


def test_within_a_group_one_owner_s_priority_does_not_keep_another_out() -> None:
    """Owners of one group share its rank, so priority alone decided between them: bob's one older job
    never started while alice kept priority-50 jobs queued."""
    h = Harness(ShareRules(fair=True, group_of={"alice": "physics", "bob": "physics", "carol": "bio"}))
    bob = h.add("bob")
    for _ in range(8):
        h.add("alice", priority=50)
        h.add("carol")
    started = [h.start() for _ in range(4)]
    # physics' two slots go one to alice and one to bob; carol has the other two
    assert bob in started
    assert sorted(owners(started)) == ["alice", "bob", "carol", "carol"]


def test_priority_orders_an_owner_s_jobs_and_breaks_ties_between_owners() -> None:
    h = Harness(ShareRules(fair=True))
    low = h.add("alice", priority=1)
    high = h.add("alice", priority=9)
    bob = h.add("bob", priority=5)
    # equal shares (none running): the higher head first; then bob, below his share; then alice's low
    assert [h.start(), h.start(), h.start()] == [high, bob, low]


def test_a_cap_holds_an_owner_s_jobs_until_its_running_ones_end() -> None:
    h = Harness(ShareRules(max_running=2, max_running_for={"bob": 1}))
    a = [h.add("alice") for _ in range(4)]
    b = [h.add("bob") for _ in range(2)]
    # without fair share the order is the queue's own (priority, then age), within the caps
    assert [h.start() for _ in range(4)] == [a[0], a[1], b[0], None]
    h.finish(a[0])
    assert h.start() == a[2]
    assert h.start() is None
    h.finish(b[0])
    assert h.start() == b[1]
    assert len(h.q) == 1  # a[3] waits for one of alice's to end


def test_superseded_and_finished_entries_are_skipped() -> None:
    h = Harness(ShareRules(fair=True))
    first = h.add("alice")
    second = h.add("alice")
    h.jobs[first].state = JobState.CANCELLED
    h.queued[second] = h.q.push(second, 0, 0.0, 99, "alice")  # pushed again: the old entry is stale
    assert h.start() == second
    assert h.start() is None and len(h.q) == 0


def test_usage_counts_thread_seconds_of_every_lease() -> None:
    h = Harness(ShareRules())
    job_id = h.add("alice", threads=4)
    h.start()
    assert (h.usage.running_jobs["alice"], h.usage.running_threads["alice"]) == (1, 4)
    h.finish(job_id, at=2.5)
    assert h.usage.thread_seconds["alice"] == pytest.approx(10.0)
    assert (h.usage.running_jobs["alice"], h.usage.running_threads["alice"]) == (0, 0)
    assert "alice" not in h.usage.gpu_seconds  # no GPU held: no series for it


def test_usage_counts_gpu_seconds_of_leases_that_held_gpus() -> None:
    h = Harness(ShareRules())
    job_id = h.add("bob", threads=1, gpus=2)
    h.start()
    h.finish(job_id, at=3.0)
    assert h.usage.thread_seconds["bob"] == pytest.approx(3.0)
    assert h.usage.gpu_seconds["bob"] == pytest.approx(6.0)


@pytest.mark.parametrize(
    ("fair", "weights", "caps", "message"),
    [
        ("yes", "", "", "CORRAL_FAIR_SHARE must be on or off"),
        ("on", "alice=0", "", "CORRAL_OWNER_WEIGHTS: alice=0: the weight must be > 0"),
        ("on", "alice=x", "", "CORRAL_OWNER_WEIGHTS: alice=x: the weight must be a number"),
        ("on", "3", "", "CORRAL_OWNER_WEIGHTS: '3': each entry is OWNER=WEIGHT"),
        ("off", "", "-1", "CORRAL_OWNER_MAX_RUNNING: '-1': a cap must be >= 0"),
        ("off", "", "2,bob=two", "CORRAL_OWNER_MAX_RUNNING: 'two': a cap must be a whole number"),
    ],
)
def test_bad_settings_name_the_setting_and_the_rule(fair: str, weights: str, caps: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShareRules.parse(fair, weights, caps)


def test_settings_parse() -> None:
    rules = ShareRules.parse("on", "alice=3, bob=0.5", "4, alice=10")
    assert (rules.fair, rules.weight("alice"), rules.weight("bob"), rules.weight("carol")) == (True, 3.0, 0.5, 1.0)
    assert (rules.cap("alice"), rules.cap("bob"), rules.per_owner) == (10, 4, True)
    assert not ShareRules.parse("off", "", "").per_owner
    assert not ShareRules.parse("off", "", "0").per_owner


@pytest.mark.parametrize(
    ("fair", "half_life", "message"),
    [
        ("on", -1.0, r"CORRAL_FAIR_SHARE_HALF_LIFE_SEC must be >= 0 \(0: off\), got -1.0"),
        ("on", math.inf, "CORRAL_FAIR_SHARE_HALF_LIFE_SEC must be >= 0"),
        ("on", math.nan, "CORRAL_FAIR_SHARE_HALF_LIFE_SEC must be >= 0"),
        ("off", 3600.0, "CORRAL_FAIR_SHARE_HALF_LIFE_SEC needs CORRAL_FAIR_SHARE=on"),
    ],
)
def test_a_bad_half_life_names_the_setting_and_the_rule(fair: str, half_life: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShareRules.parse(fair, "", "", half_life_sec=half_life)


# ---- history: CORRAL_FAIR_SHARE_HALF_LIFE_SEC -------------------------------------------------------------

HALF_LIFE = 100.0


def _held_for(h: Harness, owner: str, jobs: int, seconds: float) -> None:
    """``owner`` runs ``jobs`` one-thread jobs for ``seconds`` on the harness's clock, then they end."""
    ids = [h.add(owner) for _ in range(jobs)]
    assert [h.start() for _ in ids] == ids
    h.clock.advance(seconds)
    for job_id in ids:
        h.finish(job_id)


def test_recent_use_is_the_time_average_of_the_share_held_with_the_half_life() -> None:
    h = Harness(ShareRules(fair=True, half_life_sec=HALF_LIFE))

    def recent() -> float:
        return h.usage.recent_share("alice", EIGHT_THREADS)

    assert recent() == 0.0
    ids = [h.add("alice") for _ in range(8)]
    for _ in ids:
        h.start()
    # Holding the whole cluster: half of it after one half-life, three quarters after two
    h.clock.advance(HALF_LIFE)
    assert recent() == pytest.approx(0.5)
    h.clock.advance(HALF_LIFE)
    assert recent() == pytest.approx(0.75)
    # Then holding half: the average moves half way to a half per half-life
    for job_id in ids[:4]:
        h.finish(job_id)
    h.clock.advance(HALF_LIFE)
    assert recent() == pytest.approx(0.625)
    # And nothing: it fades by half per half-life
    for job_id in ids[4:]:
        h.finish(job_id)
    h.clock.advance(2 * HALF_LIFE)
    assert recent() == pytest.approx(0.625 / 4)
    assert h.usage.remembered() == {"alice"}


@pytest.mark.parametrize("half_life", [0.0, HALF_LIFE])
def test_with_a_half_life_a_share_that_held_the_cluster_lately_gives_way_to_a_newcomer(half_life: float) -> None:
    # Given alice, who had all 8 threads for 10 half-lives and then let them go
    h = Harness(ShareRules(fair=True, half_life_sec=half_life))
    _held_for(h, "alice", 8, 10 * HALF_LIFE)
    # When alice (first) and bob each queue 8 jobs, and 8 threads are free
    for owner in ("alice", "bob"):
        for _ in range(8):
            h.add(owner)
    started = owners([h.start() for _ in range(8)])
    if half_life:
        # Then bob gets every thread: alice's recent use (all of it) outweighs all he holds
        assert started == ["bob"] * 8
    else:
        # Then, without a half-life, they hold as much as each other: turn by turn, alice's older first
        assert started == ["alice", "bob"] * 4


def test_history_fades_until_it_only_breaks_ties() -> None:
    h = Harness(ShareRules(fair=True, half_life_sec=HALF_LIFE))
    _held_for(h, "alice", 8, 10 * HALF_LIFE)
    # 20 half-lives later alice's history is a millionth of the cluster
    h.clock.advance(20 * HALF_LIFE)
    for owner in ("alice", "bob"):
        for _ in range(4):
            h.add(owner)
    # Then they take turns, as without history; only who goes first, a tie before, is bob
    assert owners([h.start() for _ in range(8)]) == ["bob", "alice"] * 4


def test_history_splits_the_threads_in_favour_of_the_share_that_used_less_for_its_weight() -> None:
    # Given alice, who held half the threads for a long time, and bob (weight 0.5) a quarter; neither
    # holds any now
    h = Harness(ShareRules(fair=True, half_life_sec=HALF_LIFE, weights={"bob": 0.5}))
    a = [h.add("alice") for _ in range(4)]
    b = [h.add("bob") for _ in range(2)]
    for _ in a + b:
        h.start()
    h.clock.advance(30 * HALF_LIFE)
    for job_id in a + b:
        h.finish(job_id)
    assert h.usage.recent_share("alice", EIGHT_THREADS) == pytest.approx(0.5)
    assert h.usage.recent_share("bob", EIGHT_THREADS) == pytest.approx(0.25)
    for owner in ("alice", "bob"):
        for _ in range(8):
            h.add(owner)
    # When 8 threads free: alice ranks (held + 0.5) / 1, bob (held + 0.25) / 0.5, the lower first
    started = owners([h.start() for _ in range(8)])
    # Then they end where those are even: alice 5 threads (0.625 + 0.5), bob 3 ((0.375 + 0.25) / 0.5),
    # whichever way the ties on the way went. (At weight 1, bob would hold 5: his history is smaller.)
    assert (started.count("alice"), started.count("bob")) == (5, 3)


def test_rows_list_each_share_with_its_owners_holdings_queue_and_usage_lowest_rank_first() -> None:
    # Given physics (alice and bob, weight 2) running 3 one-thread jobs, carol in no group running one
    # 2-thread job for 5 s that ended, and dave with a job queued only
    rules = ShareRules(fair=True, weights={"physics": 2.0}, group_of={"alice": "physics", "bob": "physics"})
    h = Harness(rules)
    for owner in ("alice", "alice", "bob"):
        h.add(owner)
    carol = h.add("carol", threads=2)
    for _ in range(4):
        h.start()
    h.finish(carol, at=5.0)
    rows = h.usage.rows(rules, EIGHT_THREADS, {"alice": 2, "dave": 1})
    # Then each share is one row, the lowest rank first: dave (nothing held), carol (nothing now),
    # physics (3 of 8 threads for a weight of 2)
    assert [(r.name, r.owners) for r in rows] == [("carol", ("carol",)), ("dave", ("dave",)),
                                                  ("physics", ("alice", "bob"))]  # fmt: skip
    physics = rows[2]
    assert (physics.weight, physics.running_jobs, physics.threads, physics.queued_jobs) == (2.0, 3, 3, 2)
    assert physics.dominant_share == pytest.approx(3 / 8) and physics.rank == pytest.approx(3 / 16)
    assert rows[0].thread_seconds == pytest.approx(10.0) and rows[0].running_jobs == 0
    assert rows[1].queued_jobs == 1 and rows[1].rank == 0.0
