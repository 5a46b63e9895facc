"""CPU-bound: pure-Python loops over range(N) on 2 one-slot workers, against the 2-core ideal.

Three figures in each run, measured back to back:

- ``ideal_s``: jobs x (one loop's time, in-process, median of 5 before and 5 after the run) / 2;
- ``bare_s``: the same loops in two bare processes (half each) with no scheduler at all: what this
  machine's two cores really give (a shared VM's clock and its two vCPUs move this a lot);
- ``makespan_s``: submit to the last completion through Corral.

``efficiency_pct`` = ideal / makespan (the issue's measure); ``vs_bare_pct`` = bare / makespan
isolates Corral's own overhead; ``busy_pct`` = (the jobs' own run times, as their records give them)
/ 2 / makespan: how much of the two cores' time went to the loops, whatever the clock of the machine
did meanwhile. The loops are short (tens of ms here), so one slow moment of this shared VM moves the
first two by a lot; ``busy_pct`` moves least. ``hops_ms`` (median over the jobs) is how long a job
was leased without running: from its lease to its result in the control plane, less its run in the
runner. That is the Assign's way to the runner and the result's way back, each crossing two processes
whose code has waited a whole loop meanwhile (see :mod:`bench.quiet` for what that costs here).

The client waits the way a program waiting for a batch would: one ``WatchJobs`` stream that carries
only the ends (``Client.wait_all``). ``--wait each`` opens a ``WatchJob`` stream per job instead, in
turn; each stream costs the control plane CPU that the loops then do not get.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

from bench.cluster import Cluster
from bench.report import table
from corral.v1 import jobs_pb2

WAYS = ("all", "each")


def one_loop(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    return time.perf_counter() - t0


def _loops(count: int, n: int) -> None:
    for _ in range(count):
        for _ in range(n):
            pass


def bare(jobs: int, n: int) -> float:
    # Not fork: after the first run this process has gRPC's threads, and a forked copy that runs Python
    # can hang on gRPC's fork handlers. A fork server forks from a process without them; one warm-up
    # process, before the clock, has it started and this module imported there.
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload([__name__])
    warm_up = forks.Process(target=_loops, args=(0, 0))
    warm_up.start()
    warm_up.join()
    procs = [forks.Process(target=_loops, args=(jobs // 2, n)) for _ in range(2)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return time.perf_counter() - t0


def run_once(jobs: int, n: int, wait: str = "all") -> dict[str, float]:
    loops = [one_loop(n) for _ in range(5)]
    bare_s = bare(jobs, n)
    with Cluster(workers=2, threads=1, imports=("tests.support.jobtypes",)) as c:
        req = jobs_pb2.SubmitJobRequest(type="py_loop")
        req.payload.update({"n": n})
        t0 = time.perf_counter()
        submitted = c.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=[req] * jobs)).jobs
        busy = 0.0
        hops: list[float] = []
        if wait == "each":
            ends = [list(c.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job.id)))[-1] for job in submitted]
        else:
            watch = jobs_pb2.WatchJobsRequest(ids=[job.id for job in submitted], ends_only=True)
            ends = list(c.jobs.WatchJobs(watch))
        makespan = time.perf_counter() - t0
        assert len(ends) == jobs, f"{len(ends)} ends of {jobs} jobs"
        for end in ends:
            assert end.job.state == jobs_pb2.Job.SUCCEEDED
            busy += end.job.exec_seconds
            held = end.job.finished_at.ToNanoseconds() - end.job.started_at.ToNanoseconds()
            hops.append(held / 1e6 - end.job.exec_seconds * 1000)
    loops += [one_loop(n) for _ in range(5)]
    single = statistics.median(loops)
    ideal = jobs * single / 2
    return {
        "one_loop_s": single,
        "ideal_s": ideal,
        "bare_s": bare_s,
        "makespan_s": makespan,
        "efficiency_pct": 100 * ideal / makespan,
        "vs_bare_pct": 100 * bare_s / makespan,
        "busy_pct": 100 * busy / 2 / makespan,
        "hops_ms": statistics.median(hops),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=40)
    p.add_argument("--n", type=int, default=2_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--wait",
        choices=WAYS,
        default="all",
        help="how the client waits: one WatchJobs stream of ends (all, as Client.wait_all) or a WatchJob each",
    )
    a = p.parse_args(argv)
    rows = [run_once(a.jobs, a.n, a.wait) for _ in range(a.runs)]
    title = f"cpu-bound: {a.jobs} jobs of `for _ in range({a.n:,})`, 2 workers x 1 slot, waited for {a.wait}"
    table(title, rows)


if __name__ == "__main__":
    main()
