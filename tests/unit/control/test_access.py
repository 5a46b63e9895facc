"""Who sees which jobs (control.access): owners, groups, admins, and the settings' rules."""

from __future__ import annotations

import pytest

from control.access import Access, parse_groups
from control.jobs import JobRecord
from corral.errors import NotFound, PermissionDenied, Unauthenticated

GROUPS = {"alice": "physics", "bob": "physics", "carol": "bio"}


def job(owner: str) -> JobRecord:
    return JobRecord(id=f"job-{owner}", type="noop", payload_json="{}", created_at=0.0, owner=owner)


def visible(access: Access, caller: str) -> set[str]:
    seen = set()
    for owner in ("alice", "bob", "carol", "dave"):
        try:
            access.check_visible(job(owner), caller)
            seen.add(owner)
        except NotFound:
            pass
    return seen


def test_what_each_visibility_lets_a_client_see() -> None:
    everyone = {"alice", "bob", "carol", "dave"}
    assert visible(Access.of("all", (), GROUPS), "alice") == everyone
    assert visible(Access.of("owner", ("ops",), GROUPS), "alice") == {"alice"}
    group = Access.of("group", ("ops",), GROUPS)
    assert visible(group, "alice") == {"alice", "bob"}
    assert visible(group, "carol") == {"carol"}
    assert visible(group, "dave") == {"dave"}  # in no group: its own
    assert visible(group, "ops") == everyone


def test_lists_cover_what_the_caller_may_see() -> None:
    group = Access.of("group", ("ops",), GROUPS)
    assert group.listed_owners("alice", "") == ["alice", "bob"]
    assert group.listed_owners("alice", "bob") == ["bob"]
    assert group.listed_owners("alice", "carol") is None
    assert group.listed_owners("ops", "carol") == ["carol"]
    assert group.listed_owners("ops", "") == []
    assert Access.of("all", ()).listed_owners(None, "") == []


def test_admin_service_and_anonymous_calls() -> None:
    group = Access.of("group", ("ops",), GROUPS)
    group.check_admin("ops")
    with pytest.raises(PermissionDenied, match="CORRAL_JOB_VISIBILITY=group"):
        group.check_admin("alice")
    with pytest.raises(Unauthenticated):
        group.scope(None)
    Access.of("all", ()).check_admin(None)


def test_keys_are_each_client_s_own_whatever_the_visibility() -> None:
    assert Access.of("all", ()).idempotency_key("k", "alice") == "alice:k"
    assert Access.of("group", (), GROUPS).idempotency_key("k", "alice") == "alice:k"
    assert Access.of("all", ()).idempotency_key("k", "") == ":k"
    assert Access.of("owner", ()).idempotency_key("", "alice") == ""


def test_groups_parse_and_bad_ones_name_the_rule() -> None:
    assert parse_groups(" physics = alice, bob ; bio=carol;") == GROUPS
    assert parse_groups("") == {}
    with pytest.raises(ValueError, match="'alice' is in both 'physics' and 'bio'"):
        parse_groups("physics=alice;bio=alice")
    with pytest.raises(ValueError, match="each group is NAME=MEMBER"):
        parse_groups("physics")
    with pytest.raises(ValueError, match="each group is NAME=MEMBER"):
        parse_groups("phys ics=alice")
