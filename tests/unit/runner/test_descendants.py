"""Ending a process's descendants by pid (:mod:`runner.descendants`, and its C twin in :mod:`runner._lifeline`),
those that left its process group and session included, and nothing else.

Each case runs in a process of its own (it adopts orphans, as a runner does, and kills what it started),
which starts a ``setsid`` sleep, a shell that leaves a ``setsid`` sleep and a plain one behind as it
exits (orphans it adopts), and a grandchild under a live child; prints the pids of its tree; ends it;
and prints what is left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner.kernels import extensions_disabled
from tests.support.processes import alive

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = """
import json, os, subprocess, sys, time
from runner import descendants
from runner.serve import adopt_orphans

adopt_orphans()
quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
subprocess.Popen(["sleep", "300"], start_new_session=True, **quiet)
shell = subprocess.run(
    ["sh", "-c", "setsid sleep 301 >/dev/null 2>&1 & sleep 302 >/dev/null 2>&1 & echo $!"],
    capture_output=True, text=True, check=True,
)
subprocess.Popen(["sh", "-c", "sleep 303 & wait"], **quiet)
deadline = time.monotonic() + 30
while len(descendants.descendants()) < 5:  # the sleeps of the shells, once they run
    assert time.monotonic() < deadline, descendants.descendants()
    time.sleep(0.005)
tree = descendants.descendants()
if sys.argv[1] == "c":
    from runner import _lifeline
    _lifeline.end_descendants()
else:
    descendants.end_descendants()
print(json.dumps({"tree": tree, "left": descendants.descendants(), "children": sorted(descendants.children())}))
"""


@pytest.mark.parametrize(
    "how",
    [
        "python",
        pytest.param("c", marks=pytest.mark.skipif(extensions_disabled(), reason="runner._lifeline is not built")),
    ],
)
def test_every_descendant_ends_whether_or_not_it_left_the_group(how: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, how], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # Given five processes below it: two setsid sleeps, a plain one it adopted, a shell and its sleep
    assert len(out["tree"]) == 5, out
    # Then none is left, none alive, and every child of its own was reaped
    assert out["left"] == [] and out["children"] == [], out
    assert not any(alive(pid) for pid in out["tree"])


REFUSED = """
import json, os, subprocess, time
from runner import descendants

refused = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
plain = subprocess.Popen(["sleep", "301"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
real_kill = os.kill

def kill(pid, sig):
    if pid == refused.pid:
        raise PermissionError(1, "Operation not permitted")
    real_kill(pid, sig)

os.kill = kill
started = time.monotonic()
killed = descendants.end_descendants()
took = time.monotonic() - started
left = descendants.descendants()
real_kill(refused.pid, 9)
print(json.dumps({"killed": killed, "took": took, "left": left, "refused": refused.pid, "plain": plain.pid}))
"""


def test_a_descendant_that_may_not_be_signalled_is_left_and_the_rest_end() -> None:
    # Another user's process (a set-uid program a job ran) cannot be killed; the tests run as root, so
    # os.kill refuses it here instead. Before, end_descendants waited for it for ever (a blocking waitpid).
    done = subprocess.run(
        [sys.executable, "-c", REFUSED], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["killed"] == 1 and seen["left"] == [seen["refused"]]
    assert not alive(seen["plain"])
