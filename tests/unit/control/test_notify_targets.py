"""Notify targets: their rules name the field, and their stored form reads back as it was."""

import pytest

from control.jobs import JobState
from control.notify import NotifyTarget, check_targets, dumps, loads
from corral.errors import InvalidArgument


def test_the_stored_form_reads_back() -> None:
    targets = (
        NotifyTarget(email="ops@example.test"),
        NotifyTarget(webhook_url="https://127.0.0.1:8443/hook?x=1", on=(JobState.FAILED, JobState.CANCELLED)),
    )
    assert loads(dumps(targets)) == targets
    assert dumps(()) == "" and loads("") == ()


def test_a_target_wants_the_ends_it_lists_or_every_end() -> None:
    assert all(NotifyTarget(email="a@b.test").wants(s) for s in (JobState.SUCCEEDED, JobState.FAILED))
    failed_only = NotifyTarget(email="a@b.test", on=(JobState.FAILED,))
    assert failed_only.wants(JobState.FAILED) and not failed_only.wants(JobState.SUCCEEDED)


@pytest.mark.parametrize(
    ("targets", "field", "rule"),
    [
        ([NotifyTarget()], "notify[0]", "exactly one"),
        ([NotifyTarget(email="a@b.test", webhook_url="http://127.0.0.1/x")], "notify[0]", "exactly one"),
        ([NotifyTarget(email="a@b@c")], "notify[0].email", "email address"),
        ([NotifyTarget(email="x" * 250 + "@b.test")], "notify[0].email", "email address"),
        ([NotifyTarget(email="a@b.test\n")], "notify[0].email", "email address"),
        ([NotifyTarget(email="a\x00@b.test")], "notify[0].email", "email address"),
        ([NotifyTarget(webhook_url="http://127.0.0.1/\x01")], "notify[0].webhook_url", "URL"),
        ([NotifyTarget(webhook_url="http://")], "notify[0].webhook_url", "URL"),
        ([NotifyTarget(webhook_url="http://127.0.0.1/" + "x" * 2048)], "notify[0].webhook_url", "at most 2048"),
        ([NotifyTarget(email="a@b.test", on=(JobState.PENDING,))], "notify[0].on[0]", "got PENDING"),
        ([NotifyTarget(email=f"{i}@b.test") for i in range(9)], "notify", "at most 8"),
    ],
)
def test_each_rule_names_its_field(targets: list[NotifyTarget], field: str, rule: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_targets(targets)
    assert info.value.field == field and rule in info.value.message
