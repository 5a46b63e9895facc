"""WorkerConfig.from_env: defaults, derived defaults, and errors that name the variable and the rule.

(Named test_worker_config.py: tests/unit/control/test_config.py exists and test files share one
module namespace.)
"""

from __future__ import annotations

import os
import socket

import pytest

from worker.__main__ import _parser, config_from
from worker.config import ConfigError, WorkerConfig


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
