"""``python -m bench [NAME ...]``: run the benchmarks (all by default); each prints a table."""

from __future__ import annotations

import sys

from bench import autoscale, backlog, cpu_bound, edge, kernels, latency, rest, throughput, timeouts

BENCHES = {
    "throughput": throughput.main,
    "latency": latency.main,
    "cpu": cpu_bound.main,
    "backlog": backlog.main,
    "rest": rest.main,
    "edge": edge.main,
    "kernels": kernels.main,
    "timeouts": timeouts.main,
    "autoscale": autoscale.main,
}


def main() -> None:
    names = sys.argv[1:] or list(BENCHES)
    for name in names:
        if name not in BENCHES:
            raise SystemExit(f"unknown benchmark {name!r}; choose from {', '.join(BENCHES)}")
        BENCHES[name]([])


if __name__ == "__main__":
    main()
