"""GPUs and memory a worker gives to jobs: the device list it is told or finds, and its memory.

Shared by the worker (CORRAL_WORKER_GPUS, CORRAL_WORKER_MEMORY_MB) and ``corral up``, which shares the
machine's devices and memory out among its local workers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from corral.limits import MAX_GPU_ID, MAX_GPUS, MAX_MEMORY_MB

__all__ = [
    "ResourceError",
    "check_gpus",
    "detect_gpus",
    "detect_memory_mb",
    "gpus_setting",
    "memory_share_mb",
    "parse_gpus",
    "share_gpus",
]

_GPU_ID = re.compile(r"[!-+\--~]+")
"""Printable ASCII without space or comma (``,`` is 0x2C, between ``+`` and ``-``)."""
_GPU_COUNT = re.compile(r"[+-]?[0-9]+")

NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"
"""Where the NVIDIA driver lists one entry per GPU: the default count of CORRAL_WORKER_GPUS."""
CGROUP_V2_MEMORY_MAX = "/sys/fs/cgroup/memory.max"
"""The cgroup v2 memory limit of the worker's cgroup (``max``: none)."""
CGROUP_V1_MEMORY_LIMIT = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
"""The cgroup v1 memory limit (a huge number when there is none)."""
NO_DEVICES = frozenset({"-1", "NoDevFiles"})
"""Values of CUDA_VISIBLE_DEVICES that list no device (container runtimes set them): the worker then
looks for the driver's GPUs instead, as when the variable is unset or empty."""


class ResourceError(ValueError):
    """A device list or a memory size breaks its rule; the message names the setting and the rule."""


def parse_gpus(raw: str, name: str = "CORRAL_WORKER_GPUS") -> tuple[str, ...]:
    """``"2"`` -> ``("0", "1")``; ``"0, 2"`` or ``"GPU-8f6c..."`` -> those device ids, in order. A bare
    number is a count; one device by its index is written with a comma after it: ``"3,"`` -> ``("3",)``.

    Raises:
        ResourceError: a count outside 0..MAX_GPUS, or a list that breaks :func:`check_gpus`.
    """
    raw = raw.strip()
    single = raw[:-1].strip() if raw.endswith(",") else ""
    if single and "," not in single:
        return check_gpus((single,), name)
    if _GPU_COUNT.fullmatch(raw):
        count = int(raw)
        if not 0 <= count <= MAX_GPUS:
            raise ResourceError(f"{name} must be a count 0..{MAX_GPUS} or a list of device ids, got {raw!r}")
        return tuple(str(i) for i in range(count))
    return check_gpus(tuple(entry.strip() for entry in raw.split(",")), name)


def check_gpus(ids: tuple[str, ...], name: str = "CORRAL_WORKER_GPUS") -> tuple[str, ...]:
    """``ids`` if they are at most MAX_GPUS distinct device ids, each 1..MAX_GPU_ID printable ASCII
    characters without space or comma (a comma would split it in CUDA_VISIBLE_DEVICES).

    Raises:
        ResourceError: one breaks the rule (the message names ``name``, the rule and the id).
    """
    if len(ids) > MAX_GPUS:
        raise ResourceError(f"{name} may list at most {MAX_GPUS} devices, got {len(ids)}")
    for device in ids:
        if not device:
            raise ResourceError(f"{name} must list device ids without an empty one, got {','.join(ids)!r}")
        if len(device) > MAX_GPU_ID or not _GPU_ID.fullmatch(device):
            raise ResourceError(
                f"{name} device ids must be 1..{MAX_GPU_ID} printable ASCII characters without space or comma, "
                f"got {device[: MAX_GPU_ID + 8]!r}"
            )
    if len(set(ids)) < len(ids):
        twice = next(d for i, d in enumerate(ids) if d in ids[:i])
        raise ResourceError(f"{name} must list each device once, got {','.join(ids)!r} ({twice!r} twice)")
    return ids


def detect_gpus(environ: Mapping[str, str] | None = None, gpus_dir: str | None = None) -> tuple[str, ...]:
    """The devices a worker gives to jobs when CORRAL_WORKER_GPUS is unset: those of its own
    ``CUDA_VISIBLE_DEVICES`` (what an orchestrator gave it), else ``"0".."n-1"`` for the ``n`` entries
    of ``gpus_dir`` (default :data:`NVIDIA_GPUS_DIR`, at most MAX_GPUS), else none.

    Raises:
        ResourceError: ``CUDA_VISIBLE_DEVICES`` lists ids the worker cannot hand out (it names the
            variable, and CORRAL_WORKER_GPUS, which overrides it).
    """
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and visible not in NO_DEVICES:
        try:
            return check_gpus(tuple(entry.strip() for entry in visible.split(",")), "CUDA_VISIBLE_DEVICES")
        except ResourceError as exc:
            raise ResourceError(f"{exc} (CORRAL_WORKER_GPUS, when set, is used instead)") from None
    try:
        count = len(os.listdir(NVIDIA_GPUS_DIR if gpus_dir is None else gpus_dir))
    except OSError:  # no NVIDIA driver loaded (or no /proc): no GPUs
        return ()
    return tuple(str(i) for i in range(min(count, MAX_GPUS)))


def detect_memory_mb(
    cgroup_v2: str | None = None, cgroup_v1: str | None = None, physical_bytes: int | None = None
) -> int:
    """The memory a worker gives to jobs when CORRAL_WORKER_MEMORY_MB is unset, in MiB: the machine's
    (``physical_bytes``, default from ``os.sysconf``) or its cgroup's limit when lower, 1..MAX_MEMORY_MB.

    ``cgroup_v2`` and ``cgroup_v1`` default to :data:`CGROUP_V2_MEMORY_MAX` and
    :data:`CGROUP_V1_MEMORY_LIMIT`; a file that is missing or holds no number (``max``) sets no limit.
    """
    physical = _physical_bytes() if physical_bytes is None else physical_bytes
    limits = [physical] if physical > 0 else []
    for path in (
        CGROUP_V2_MEMORY_MAX if cgroup_v2 is None else cgroup_v2,
        CGROUP_V1_MEMORY_LIMIT if cgroup_v1 is None else cgroup_v1,
    ):
        limit = _read_bytes(path)
        # cgroup v1 says "no limit" with a number near 2**63; below the machine's memory it is a limit
        if limit is not None and (physical <= 0 or limit < physical):
            limits.append(limit)
    if not limits:
        return MAX_MEMORY_MB
    return max(1, min(min(limits) >> 20, MAX_MEMORY_MB))


def memory_share_mb(workers: int) -> int:
    """What each of ``workers`` workers on this machine gives jobs, in MiB, when their memory is not set:
    :func:`detect_memory_mb` shared out evenly, so that together they promise no more than there is
    (``corral up``'s workers, and the autoscaler's containers up to MAX_WORKERS)."""
    return max(1, detect_memory_mb() // max(1, workers))


def _physical_bytes() -> int:
    """The machine's memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def _read_bytes(path: str) -> int | None:
    """The number in a cgroup file, or None when it is missing or holds none (``max``)."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def gpus_setting(devices: tuple[str, ...]) -> str:
    """The CORRAL_WORKER_GPUS value that gives exactly ``devices`` (:func:`parse_gpus` reads it back)."""
    if not devices:
        return "0"
    return devices[0] + "," if len(devices) == 1 else ",".join(devices)


def share_gpus(devices: tuple[str, ...], workers: int) -> list[tuple[str, ...]]:
    """``devices`` shared out among ``workers`` in contiguous runs whose sizes differ by at most one
    (the first ones get the extra devices; a worker gets none when there are fewer devices than workers).
    No workers get no shares (``corral up --workers 0``: a control plane alone)."""
    if workers <= 0:
        return []
    base, extra = divmod(len(devices), workers)
    out: list[tuple[str, ...]] = []
    start = 0
    for i in range(workers):
        size = base + (1 if i < extra else 0)
        out.append(devices[start : start + size])
        start += size
    return out
