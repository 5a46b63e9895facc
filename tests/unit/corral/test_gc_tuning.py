"""corral.gc_tuning: start-up objects frozen, older generations collected less often."""

import subprocess
import sys

from corral.gc_tuning import GEN0_THRESHOLD, OLDER_THRESHOLDS

CODE = """
import gc
from corral import gc_tuning
gc_tuning.apply()
print(gc.get_threshold(), gc.get_freeze_count() > 1000)
"""


def test_apply_freezes_start_up_objects_and_sets_the_thresholds() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout.strip()
    assert out == f"{(GEN0_THRESHOLD, *OLDER_THRESHOLDS)} True"
