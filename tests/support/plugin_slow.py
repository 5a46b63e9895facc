"""A job-type plug-in that takes CORRAL_TEST_IMPORT_SEC seconds (default 2) to import, as one that loads a
model or a large table does (for the worker's start-up tests). With CORRAL_TEST_IMPORTED_LOG, each
process that imported it appends its pid to that file once done (a test waits for a runner's import)."""

import os
import time

time.sleep(float(os.environ.get("CORRAL_TEST_IMPORT_SEC", "2")))  # the slow import itself
if log := os.environ.get("CORRAL_TEST_IMPORTED_LOG"):
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
