"""Submission rules name the field and the rule."""

import pytest

from control.admission import JobTypeCatalog, Limits, Submission, validate, validate_batch
from control.store import JobTypeEntry
from corral.errors import InvalidArgument

LIMITS = Limits(max_payload_bytes=1000, max_batch=3)


def check(sub: Submission) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        validate(sub, JobTypeCatalog(), LIMITS)
    return info.value


@pytest.mark.parametrize(
    ("sub", "field"),
    [
        (Submission("nope", {}), "type"),
        (Submission("", {}), "type"),
        (Submission("add_numbers", {"a": "1", "b": 2}), "payload.a"),
        (Submission("add_numbers", {"a": 1}), "payload"),
        (Submission("add_numbers", {"a": 1, "b": 2, "c": 3}), "payload"),
        (Submission("noop", {}, timeout_sec=-1), "timeout_sec"),
        (Submission("noop", {}, timeout_sec=float("inf")), "timeout_sec"),
        (Submission("noop", {}, priority=101), "priority"),
        (Submission("noop", {}, priority=-1), "priority"),
        (Submission("noop", {}, thread_demand=0), "thread_demand"),
        (Submission("noop", {}, max_attempts=0), "max_attempts"),
        (Submission("noop", {"x": "y" * 2000}), "payload"),
        (Submission("noop", {}, name="\x00"), "name"),
        (Submission("large_array_sum", {"numbers": [1, "2"]}), "payload.numbers[1]"),
    ],
)
def test_each_rule_names_its_field(sub: Submission, field: str) -> None:
    assert check(sub).field == field


def test_a_timeout_that_is_not_finite_is_told_so_not_that_it_is_not_positive() -> None:
    assert check(Submission("noop", {}, timeout_sec=float("inf"))).rule == "must be a finite number of seconds, got inf"
    assert check(Submission("noop", {}, timeout_sec=float("nan"))).rule == "must be a finite number of seconds, got nan"
    assert check(Submission("noop", {}, timeout_sec=0)).rule == "must be > 0 seconds, got 0"


def test_a_valid_submission_gets_its_payload_json() -> None:
    sub = Submission("reverse_string", {"text": "héllo 𝄞"})
    validate(sub, JobTypeCatalog(), LIMITS)
    assert sub.payload_json == '{"text":"héllo 𝄞"}'


def test_batch_errors_carry_the_index() -> None:
    subs = [Submission("noop", {}), Submission("noop", {}, priority=500)]
    with pytest.raises(InvalidArgument) as info:
        validate_batch(subs, JobTypeCatalog(), LIMITS)
    assert info.value.field == "jobs[1].priority"
    with pytest.raises(InvalidArgument):
        validate_batch([Submission("noop", {})] * 4, JobTypeCatalog(), LIMITS)


def test_advertised_types_are_validated_by_their_schema() -> None:
    catalog = JobTypeCatalog([JobTypeEntry("plug", '{"type":"object","required":["x"]}', "")])
    validate(Submission("plug", {"x": 1}), catalog, LIMITS)
    with pytest.raises(InvalidArgument):
        validate(Submission("plug", {}), catalog, LIMITS)
    with pytest.raises(InvalidArgument):
        catalog.add(JobTypeEntry("bad", '{"type": 12}', ""))


def test_equal_requests_hash_equal() -> None:
    a = Submission("noop", {"x": 1, "y": [1, 2]}, labels={"a": "1", "b": "2"})
    b = Submission("noop", {"y": [1, 2], "x": 1}, labels={"b": "2", "a": "1"})
    assert a.request_hash() == b.request_hash()
    assert a.request_hash() != Submission("noop", {"x": 2}).request_hash()


def test_gpus_and_memory_count_in_the_hash_only_when_asked_for() -> None:
    # A key stored before jobs could ask for GPUs (this digest) still matches its replay.
    plain = Submission("noop", {})
    assert plain.request_hash() == "a879325582c5ef306789b44c0f76a797c7243d3e848fc652d9ad7dd1748e5238"
    hashes = {
        plain.request_hash(),
        Submission("noop", {}, gpu_count=1).request_hash(),
        Submission("noop", {}, memory_mb=1).request_hash(),
        Submission("noop", {}, gpu_count=1, memory_mb=1).request_hash(),
    }
    assert len(hashes) == 4


def test_batch_links_count_in_the_hash_only_when_given() -> None:
    plain = Submission("noop", {})
    assert plain.request_hash() == "a879325582c5ef306789b44c0f76a797c7243d3e848fc652d9ad7dd1748e5238"
    linked = {Submission("noop", {}, depends_on_index=links).request_hash() for links in ((0,), (1,), (0, 1))}
    assert len(linked | {plain.request_hash()}) == 4


@pytest.mark.parametrize(
    ("place", "links", "field", "rule"),
    [
        (None, (0,), "depends_on_index", "only in a SubmitJobs batch"),
        (0, (0,), "jobs[0].depends_on_index[0]", "(none: this is the batch's first job), got 0"),
        (2, (2,), "jobs[2].depends_on_index[0]", "(0..1), got 2"),
        (2, (0, -1), "jobs[2].depends_on_index[1]", "(0..1), got -1"),
        (2, (1, 1), "jobs[2].depends_on_index[1]", "repeats 1"),
        (2, (2**31 - 1,), "jobs[2].depends_on_index[0]", "got 2147483647"),
    ],
)
def test_batch_links_point_to_earlier_jobs_of_the_batch(
    place: int | None, links: tuple[int, ...], field: str, rule: str
) -> None:
    sub = Submission("noop", {}, depends_on_index=links)
    with pytest.raises(InvalidArgument) as info:
        validate(sub, JobTypeCatalog(), LIMITS, prefix="" if place is None else f"jobs[{place}].", place=place)
    assert info.value.field == field and rule in info.value.message


def test_batch_links_and_ids_share_the_limit_of_64() -> None:
    ids = tuple(f"{i:032x}" for i in range(62))
    validate(Submission("noop", {}, depends_on=ids, depends_on_index=(0, 1)), JobTypeCatalog(), LIMITS, place=2)
    with pytest.raises(InvalidArgument) as info:
        validate(Submission("noop", {}, depends_on=ids, depends_on_index=(0, 1, 2)), JobTypeCatalog(), LIMITS, place=3)
    assert info.value.field == "depends_on_index" and "got 65" in info.value.message


def test_an_error_about_a_huge_value_stays_short() -> None:
    with pytest.raises(InvalidArgument) as info:
        validate(Submission("add_numbers", {"a": "x" * 500_000, "b": 1}), JobTypeCatalog(), Limits(1 << 20, 10))
    err = info.value
    assert err.field == "payload.a"
    assert len(err.message) < 500
    assert "is not of type 'integer'" in err.message


def test_an_integer_field_refuses_a_number_a_double_may_have_rounded() -> None:
    # Struct numbers are doubles, and the API turns the exact integral ones (within 2**53) back into ints:
    # an integral float left is one that may have been rounded on the way (2**53 + 1 arrives as 2**53).
    plug = JobTypeEntry("plug", '{"type":"object","properties":{"n":{"type":"integer"}}}', "")
    for catalog, job_type in ((JobTypeCatalog(), "add_numbers"), (JobTypeCatalog([plug]), "plug")):
        payload = {"a": 2.0**60, "b": 1} if job_type == "add_numbers" else {"n": 2.0**60}
        field = "payload.a" if job_type == "add_numbers" else "payload.n"
        with pytest.raises(InvalidArgument) as info:
            validate(Submission(job_type, payload), catalog, LIMITS)
        assert info.value.field == field and "beyond ±2**53" in info.value.rule
    validate(Submission("add_numbers", {"a": 2**53, "b": -(2**53)}), JobTypeCatalog(), LIMITS)
    with pytest.raises(InvalidArgument, match="is not of type 'integer'"):
        validate(Submission("add_numbers", {"a": 1.5, "b": 1}), JobTypeCatalog(), LIMITS)
