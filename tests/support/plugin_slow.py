"""A job-type plug-in that takes CORRAL_TEST_IMPORT_SEC seconds (default 2) to import, as one that loads a
model or a large table does (for the worker's start-up tests)."""

import os
import time

time.sleep(float(os.environ.get("CORRAL_TEST_IMPORT_SEC", "2")))  # the slow import itself
