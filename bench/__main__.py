"""``python -m bench [NAME ...]`` runs benchmarks (all by default); ``python -m bench NAME --flag ...``
runs one with its own flags (``python -m bench latency --help`` lists them). Each prints a table."""

from __future__ import annotations

import sys

from bench import (
    autoscale,
    backlog,
    big_batch,
    cancel_many,
    cpu_bound,
    edge,
    fan_out,
    fleet,
    kernels,
    labels,
    latency,
    quiet,
    rest,
    throughput,
    timeouts,
    wait_many,
)

BENCHES = {
    "throughput": throughput.main,
    "latency": latency.main,
    "cpu": cpu_bound.main,
    "backlog": backlog.main,
    "fan_out": fan_out.main,
    "wait_many": wait_many.main,
    "cancel_many": cancel_many.main,
    "big_batch": big_batch.main,
    "labels": labels.main,
    "fleet": fleet.main,
    "rest": rest.main,
    "edge": edge.main,
    "kernels": kernels.main,
    "timeouts": timeouts.main,
    "autoscale": autoscale.main,
    "quiet": quiet.main,
}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    flags = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    names, rest = args[:flags] or list(BENCHES), args[flags:]
    if rest and len(names) != 1:
        raise SystemExit("flags go to one benchmark: python -m bench NAME --flag ...")
    for name in names:
        if name not in BENCHES:
            raise SystemExit(f"unknown benchmark {name!r}; choose from {', '.join(BENCHES)}")
    for name in names:
        BENCHES[name](rest)


if __name__ == "__main__":
    main()
