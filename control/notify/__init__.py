"""Announcing jobs' ends by email or webhook (``SubmitJobRequest.notify``).

Modules:
    targets   NotifyTarget: where, for which ends; its rules and stored form
    notices   Notices: the notification jobs a job's end makes
"""

from control.notify.targets import ENDS, MAX_TARGETS, NotifyTarget, check_targets, dumps, end_state, loads

__all__ = ["ENDS", "MAX_TARGETS", "NotifyTarget", "check_targets", "dumps", "end_state", "loads"]
