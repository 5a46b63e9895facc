"""WorkerConfig.from_env: defaults, derived defaults, and errors that name the variable and the rule.

(Named test_worker_config.py: tests/unit/control/test_config.py exists and test files share one
module namespace.)
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

import corral.resources
from corral.limits import MAX_GPU_ID, MAX_GPUS, MAX_MEMORY_MB
from corral.resources import detect_gpus, detect_memory_mb
from worker.__main__ import _parser, config_from
from worker.config import ConfigError, WorkerConfig

PHYSICAL_MB = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) >> 20


@pytest.fixture
def no_probes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Point the GPU and memory probes at files that do not exist (yet) in ``tmp_path``, and return it."""
    monkeypatch.setattr(corral.resources, "NVIDIA_GPUS_DIR", str(tmp_path / "nvidia-gpus"))
    monkeypatch.setattr(corral.resources, "CGROUP_V2_MEMORY_MAX", str(tmp_path / "memory.max"))
    monkeypatch.setattr(corral.resources, "CGROUP_V1_MEMORY_LIMIT", str(tmp_path / "memory.limit_in_bytes"))
    return tmp_path


def fake_gpus(probes: Path, count: int) -> None:
    """A /proc/driver/nvidia/gpus/ with ``count`` entries (the driver names them by PCI address)."""
    for i in range(count):
        (probes / "nvidia-gpus" / f"0000:{i:02x}:00.0").mkdir(parents=True)


def test_defaults():
    config = WorkerConfig.from_env({})
    assert config.control_addr == "127.0.0.1:50051"
    assert config.threads == (os.cpu_count() or 1)
    assert config.slots == config.threads
    assert config.labels == {}
    assert config.imports == ()
    assert config.drain_timeout_sec == 30.0
    assert config.kill_grace_sec == 0.025
    assert config.reconnect_max_sec == 2.0


def test_default_worker_id_is_host_pid_suffix_and_differs_per_config():
    first, second = WorkerConfig.from_env({}), WorkerConfig.from_env({})
    host = socket.gethostname()
    assert first.worker_id.startswith(f"{host[:64]}-{os.getpid()}-") or str(os.getpid()) in first.worker_id
    assert first.worker_id != second.worker_id


def test_every_variable_is_read():
    config = WorkerConfig.from_env(
        {
            "CORRAL_CONTROL_ADDR": "127.0.0.1:6000",
            "CORRAL_WORKER_THREADS": "8",
            "CORRAL_WORKER_SLOTS": "3",
            "CORRAL_WORKER_ID": "w-1",
            "CORRAL_WORKER_LABELS": "zone=a, gpu=no",
            "CORRAL_WORKER_IMPORTS": "tests.support.jobtypes, other.mod",
            "CORRAL_DRAIN_TIMEOUT_SEC": "1.5",
            "CORRAL_KILL_GRACE_SEC": "0",
            "CORRAL_RECONNECT_MAX_SEC": "0.5",
            "CORRAL_RUNNER_MAX_JOBS": "1000",
            "CORRAL_RUNNER_MAX_RSS_MB": "512",
        }
    )
    assert config.control_addr == "127.0.0.1:6000"
    assert (config.threads, config.slots, config.worker_id) == (8, 3, "w-1")
    assert config.labels == {"zone": "a", "gpu": "no"}
    assert config.imports == ("tests.support.jobtypes", "other.mod")
    assert (config.drain_timeout_sec, config.kill_grace_sec, config.reconnect_max_sec) == (1.5, 0.0, 0.5)
    assert (config.runner_max_jobs, config.runner_max_rss_mb) == (1000, 512)


def test_slots_default_to_threads():
    assert WorkerConfig.from_env({"CORRAL_WORKER_THREADS": "5"}).slots == 5


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("CORRAL_CONTROL_ADDR", "localhost", "HOST:PORT"),
        ("CORRAL_CONTROL_ADDR", "127.0.0.1:0", "1..65535"),
        ("CORRAL_CONTROL_ADDR", "127.0.0.1:x", "HOST:PORT"),
        ("CORRAL_WORKER_THREADS", "0", "1..1024"),
        ("CORRAL_WORKER_THREADS", "99999999999999", "1..1024"),  # a typo must not start that many processes
        ("CORRAL_WORKER_THREADS", "two", "integer"),
        ("CORRAL_WORKER_SLOTS", "0", "1..1024"),
        ("CORRAL_WORKER_SLOTS", "-2", "1..1024"),
        ("CORRAL_WORKER_SLOTS", "1025", "1..1024"),
        ("CORRAL_WORKER_ID", "has space", "[A-Za-z0-9._:-]"),
        ("CORRAL_WORKER_LABELS", "novalue", "k=v"),
        ("CORRAL_WORKER_LABELS", "a=1,a=2", "repeats"),
        ("CORRAL_WORKER_LABELS", "zone=" + "v" * 257, "values at most 256"),  # shown in ListWorkers, the CLI
        ("CORRAL_WORKER_LABELS", "k" * 64 + "=v", "keys must be at most 63"),
        ("CORRAL_WORKER_LABELS", ",".join(f"k{i}=v" for i in range(65)), "at most 64 labels"),
        ("CORRAL_WORKER_IMPORTS", "not a module", "module names"),
        ("CORRAL_DRAIN_TIMEOUT_SEC", "-1", ">= 0"),
        ("CORRAL_KILL_GRACE_SEC", "-0.1", ">= 0"),
        ("CORRAL_KILL_GRACE_SEC", "nan", "finite"),
        ("CORRAL_DRAIN_TIMEOUT_SEC", "inf", "finite"),
        ("CORRAL_RECONNECT_MAX_SEC", "0", "> 0"),
        ("CORRAL_RECONNECT_MAX_SEC", "soon", "number"),
        ("CORRAL_RUNNER_MAX_JOBS", "-1", "0 (never) to 2147483648"),
        ("CORRAL_RUNNER_MAX_JOBS", "lots", "integer"),
        ("CORRAL_RUNNER_MAX_RSS_MB", "9999999999", "0 (never) to 2147483648"),
        ("CORRAL_RUNNER_MAX_RSS_MB", "1.5", "integer"),
        ("CORRAL_WORKER_GPUS", "65", "a count 0..64 or a list of device ids"),
        ("CORRAL_WORKER_GPUS", "-1", "a count 0..64 or a list of device ids"),
        ("CORRAL_WORKER_GPUS", "0,,1", "without an empty one"),
        ("CORRAL_WORKER_GPUS", "0,1,", "without an empty one"),
        ("CORRAL_WORKER_GPUS", "0,2,0", "each device once"),
        ("CORRAL_WORKER_GPUS", "GPU-a b", "printable ASCII characters without space or comma"),
        ("CORRAL_WORKER_GPUS", "gpu-é", "printable ASCII characters without space or comma"),
        ("CORRAL_WORKER_GPUS", "g" * (MAX_GPU_ID + 1), f"1..{MAX_GPU_ID} printable ASCII"),
        ("CORRAL_WORKER_MEMORY_MB", "0", f"1..{MAX_MEMORY_MB}"),
        ("CORRAL_WORKER_MEMORY_MB", "-5", f"1..{MAX_MEMORY_MB}"),
        ("CORRAL_WORKER_MEMORY_MB", str(MAX_MEMORY_MB + 1), f"1..{MAX_MEMORY_MB}"),
        ("CORRAL_WORKER_MEMORY_MB", "8G", "integer"),
    ],
)
def test_a_bad_value_names_the_variable_and_the_rule(name: str, value: str, rule: str):
    with pytest.raises(ConfigError) as error:
        WorkerConfig.from_env({name: value})
    assert name in str(error.value)
    assert rule in str(error.value)
    assert repr(value) in str(error.value) or value.split("=")[0] in str(error.value)


def test_flags_override_the_environment():
    env = {"CORRAL_WORKER_THREADS": "8", "CORRAL_WORKER_LABELS": "zone=a", "CORRAL_CONTROL_ADDR": "127.0.0.1:1"}
    args = _parser().parse_args(
        [
            *("--control", "127.0.0.1:7000", "--threads", "2", "--label", "gpu=no"),
            *("--import", "tests.support.jobtypes", "--worker-id", "w-9", "--drain-timeout", "4"),
        ]
    )
    config = config_from(args, env)
    assert (config.control_addr, config.threads, config.slots) == ("127.0.0.1:7000", 2, 2)
    assert config.labels == {"zone": "a", "gpu": "no"}
    assert config.imports == ("tests.support.jobtypes",)
    assert (config.worker_id, config.drain_timeout_sec) == ("w-9", 4.0)


def test_a_bad_flag_is_reported_under_its_variable():
    with pytest.raises(ConfigError, match="CORRAL_WORKER_SLOTS"):
        config_from(_parser().parse_args(["--slots", "0"]), {})
    with pytest.raises(ConfigError, match="--label"):
        config_from(_parser().parse_args(["--label", "oops"]), {})


def test_a_single_control_address_is_a_list_of_one():
    config = WorkerConfig.from_env({"CORRAL_CONTROL_ADDR": "[::1]:6000"})
    assert (config.control_addr, config.control_addrs) == ("[::1]:6000", ("[::1]:6000",))


def test_a_list_of_control_addresses_keeps_its_order_without_the_spaces():
    config = WorkerConfig.from_env({"CORRAL_CONTROL_ADDR": "cp-b.example:50051 , [::1]:6001,127.0.0.1:6000"})
    assert config.control_addrs == ("cp-b.example:50051", "[::1]:6001", "127.0.0.1:6000")
    # control_addr stays one HOST:PORT text (what the agent logs), the list written plainly
    assert config.control_addr == "cp-b.example:50051,[::1]:6001,127.0.0.1:6000"
    assert WorkerConfig(control_addr=config.control_addr).control_addrs == config.control_addrs
    sixteen = ",".join(f"127.0.0.1:{6000 + i}" for i in range(16))
    assert len(WorkerConfig.from_env({"CORRAL_CONTROL_ADDR": sixteen}).control_addrs) == 16


def test_the_control_flag_takes_a_list_too():
    config = config_from(_parser().parse_args(["--control", "127.0.0.1:7000,127.0.0.1:7001"]), {})
    assert config.control_addrs == ("127.0.0.1:7000", "127.0.0.1:7001")


@pytest.mark.parametrize(
    ("value", "named", "rule"),
    [
        ("127.0.0.1:6000,localhost", "'localhost'", "HOST:PORT"),
        ("127.0.0.1:6000, 127.0.0.1:0", "'127.0.0.1:0'", "1..65535"),
        ("127.0.0.1:6000,:6001", "':6001'", "HOST:PORT"),
        ("127.0.0.1:6000,127.0.0.1:²", "'127.0.0.1:²'", "1..65535"),  # a digit to isdigit(), not to int()
        ("127.0.0.1:6000,,127.0.0.1:6001", "'127.0.0.1:6000,,127.0.0.1:6001'", "without an empty one"),
        ("127.0.0.1:6000,", "'127.0.0.1:6000,'", "without an empty one"),
        (",127.0.0.1:6000", "',127.0.0.1:6000'", "without an empty one"),
        ("127.0.0.1:6000,127.0.0.1:6000", "'127.0.0.1:6000' twice", "each address once"),
        ("cp.example:6000, CP.example:6000", "'cp.example:6000' and 'CP.example:6000'", "each address once"),
        ("127.0.0.1:6000,127.0.0.1:06000", "'127.0.0.1:6000' and '127.0.0.1:06000'", "each address once"),
        (",".join(f"127.0.0.1:{6000 + i}" for i in range(17)), "got 17", "at most 16 addresses"),
    ],
)
def test_a_bad_control_address_list_names_the_variable_the_entry_and_the_rule(value: str, named: str, rule: str):
    with pytest.raises(ConfigError) as error:
        WorkerConfig.from_env({"CORRAL_CONTROL_ADDR": value})
    message = str(error.value)
    assert message.startswith("CORRAL_CONTROL_ADDR ")
    assert named in message
    assert rule in message


def test_a_bad_control_flag_list_is_reported_under_its_variable():
    with pytest.raises(ConfigError, match="CORRAL_CONTROL_ADDR must list each address once"):
        config_from(_parser().parse_args(["--control", "127.0.0.1:1,127.0.0.1:1"]), {})


# -- GPUs and memory ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "devices"),
    [
        ("2", ("0", "1")),
        ("0", ()),
        (str(MAX_GPUS), tuple(str(i) for i in range(MAX_GPUS))),
        ("0,2", ("0", "2")),
        (" 3 , 1 ", ("3", "1")),  # kept in the order given: the order devices are handed out
        ("GPU-8f6c1e2a-4b1d-11ee-9c3a-0242ac120002", ("GPU-8f6c1e2a-4b1d-11ee-9c3a-0242ac120002",)),
        ("MIG-GPU-1/2/0,MIG-GPU-1/3/0", ("MIG-GPU-1/2/0", "MIG-GPU-1/3/0")),
    ],
)
def test_gpus_are_a_count_or_a_list_of_device_ids(value: str, devices: tuple[str, ...], no_probes: Path) -> None:
    assert WorkerConfig.from_env({"CORRAL_WORKER_GPUS": value}).gpus == devices


def test_set_gpus_win_over_what_the_worker_would_find(no_probes: Path) -> None:
    fake_gpus(no_probes, 2)
    env = {"CUDA_VISIBLE_DEVICES": "3,5"}
    assert WorkerConfig.from_env({**env, "CORRAL_WORKER_GPUS": "0"}).gpus == ()
    assert WorkerConfig.from_env({**env, "CORRAL_WORKER_GPUS": "1"}).gpus == ("0",)


def test_unset_gpus_count_the_driver_s_entries(no_probes: Path) -> None:
    # Given no GPU driver, then one listing two GPUs
    assert WorkerConfig.from_env({}).gpus == ()
    fake_gpus(no_probes, 2)
    assert WorkerConfig.from_env({}).gpus == ("0", "1")
    assert detect_gpus({}, str(no_probes / "nvidia-gpus")) == ("0", "1")


def test_unset_gpus_take_the_devices_an_orchestrator_gave_the_worker(no_probes: Path) -> None:
    fake_gpus(no_probes, 2)
    assert WorkerConfig.from_env({"CUDA_VISIBLE_DEVICES": "3,5"}).gpus == ("3", "5")
    # a single entry is a device (CUDA's meaning), not a count
    assert WorkerConfig.from_env({"CUDA_VISIBLE_DEVICES": "3"}).gpus == ("3",)


@pytest.mark.parametrize("hidden", ["-1", "NoDevFiles", "", "  "])
def test_a_cuda_visible_devices_that_shows_nothing_falls_through_to_the_driver(hidden: str, no_probes: Path) -> None:
    fake_gpus(no_probes, 2)
    assert WorkerConfig.from_env({"CUDA_VISIBLE_DEVICES": hidden}).gpus == ("0", "1")


def test_more_gpus_than_a_worker_may_have_are_refused(no_probes: Path) -> None:
    many = ",".join(f"g{i}" for i in range(MAX_GPUS + 1))
    with pytest.raises(ConfigError, match=f"CORRAL_WORKER_GPUS may list at most {MAX_GPUS} devices, got 65"):
        WorkerConfig.from_env({"CORRAL_WORKER_GPUS": many})
    with pytest.raises(ConfigError, match=f"CUDA_VISIBLE_DEVICES may list at most {MAX_GPUS} devices"):
        WorkerConfig.from_env({"CUDA_VISIBLE_DEVICES": many})


def test_a_cuda_visible_devices_the_worker_cannot_hand_out_is_named(no_probes: Path) -> None:
    with pytest.raises(ConfigError) as error:
        WorkerConfig.from_env({"CUDA_VISIBLE_DEVICES": "0,0"})
    assert "CUDA_VISIBLE_DEVICES must list each device once" in str(error.value)
    assert "CORRAL_WORKER_GPUS" in str(error.value)  # which setting to use instead
    assert WorkerConfig.from_env({"CUDA_VISIBLE_DEVICES": "0,0", "CORRAL_WORKER_GPUS": "1"}).gpus == ("0",)


def test_the_gpus_of_a_config_built_in_code_follow_the_same_rules() -> None:
    assert WorkerConfig(gpus=("1", "0"), memory_mb=10).gpus == ("1", "0")
    with pytest.raises(ConfigError, match="CORRAL_WORKER_GPUS must list each device once"):
        WorkerConfig(gpus=("0", "0"))
    with pytest.raises(ConfigError, match=r"CORRAL_WORKER_MEMORY_MB must be 1\.\."):
        WorkerConfig(memory_mb=0)


def test_memory_is_read_in_mib(no_probes: Path) -> None:
    assert WorkerConfig.from_env({"CORRAL_WORKER_MEMORY_MB": "2048"}).memory_mb == 2048
    assert WorkerConfig.from_env({"CORRAL_WORKER_MEMORY_MB": str(MAX_MEMORY_MB)}).memory_mb == MAX_MEMORY_MB


def test_unset_memory_is_the_machine_s_or_the_cgroup_limit_when_lower(no_probes: Path) -> None:
    # Given no cgroup limit: the machine's memory
    assert WorkerConfig.from_env({}).memory_mb == PHYSICAL_MB
    # cgroup v2 without a limit
    (no_probes / "memory.max").write_text("max\n")
    assert WorkerConfig.from_env({}).memory_mb == PHYSICAL_MB
    # cgroup v2 with a limit of 1 GiB
    (no_probes / "memory.max").write_text("1073741824\n")
    assert WorkerConfig.from_env({}).memory_mb == 1024
    # a set value wins over the limit
    assert WorkerConfig.from_env({"CORRAL_WORKER_MEMORY_MB": "4096"}).memory_mb == 4096


def test_cgroup_v1_limits_only_below_the_machine_s_memory(tmp_path: Path) -> None:
    v1 = tmp_path / "memory.limit_in_bytes"
    missing = str(tmp_path / "missing")
    v1.write_text("9223372036854771712\n")  # v1's "no limit"
    assert detect_memory_mb(missing, str(v1), physical_bytes=8 << 30) == 8192
    v1.write_text(str(512 << 20))
    assert detect_memory_mb(missing, str(v1), physical_bytes=8 << 30) == 512
    # the smaller of the two versions' limits, never below 1 MiB nor above MAX_MEMORY_MB
    (tmp_path / "memory.max").write_text(str(256 << 20))
    assert detect_memory_mb(str(tmp_path / "memory.max"), str(v1), physical_bytes=8 << 30) == 256
    assert detect_memory_mb(missing, missing, physical_bytes=1000) == 1
    assert detect_memory_mb(missing, missing, physical_bytes=(MAX_MEMORY_MB + 5) << 20) == MAX_MEMORY_MB


def test_gpu_and_memory_flags_override_the_environment(no_probes: Path) -> None:
    env = {"CORRAL_WORKER_GPUS": "4", "CORRAL_WORKER_MEMORY_MB": "100", "CUDA_VISIBLE_DEVICES": "7"}
    config = config_from(_parser().parse_args(["--gpus", "GPU-a,GPU-b", "--memory-mb", "2048"]), env)
    assert (config.gpus, config.memory_mb) == (("GPU-a", "GPU-b"), 2048)
    assert config_from(_parser().parse_args(["--gpus", "0"]), env).gpus == ()
    with pytest.raises(ConfigError, match="CORRAL_WORKER_GPUS"):
        config_from(_parser().parse_args(["--gpus", "100"]), env)
    with pytest.raises(ConfigError, match="CORRAL_WORKER_MEMORY_MB"):
        config_from(_parser().parse_args(["--memory-mb", "0"]), env)
