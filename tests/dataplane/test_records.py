"""Trajectory records and groups: a well-formed one is accepted; each malformed one is refused with a reason."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from dataplane.records import RecordError, Trajectory, TrajectoryGroup, error_reason


def validate_record(raw: Any) -> Trajectory:
    try:
        return Trajectory.model_validate(raw)
    except ValidationError as err:
        raise RecordError(error_reason(err)) from None


def record(**changes: Any) -> dict[str, Any]:
    base = {
        "job_id": 1, "lease_id": "1700000000000-0", "group_id": "g-1", "prompt": "3+4=",
        "prompt_ids": [1, 10, 5, 11, 17], "completion": "7", "completion_ids": [14, 2],
        "logprobs": [-0.25, -1.5], "reward": 1.0, "version": 3,
    }
    base.update(changes)
    return base


def test_valid_record_is_accepted_with_its_fields() -> None:
    rec = validate_record(record())

    assert isinstance(rec, Trajectory)
    assert rec.completion_ids == [14, 2]
    assert rec.logprobs == [-0.25, -1.5]
    assert rec.version == 3
    assert rec.loss_mask is None
    assert rec.metadata == {}


def test_valid_record_with_loss_mask_and_zero_logprob_is_accepted() -> None:
    rec = validate_record(record(loss_mask=[1, 0], logprobs=[0.0, -2.0], metadata={"attempt": 2}))

    assert rec.loss_mask == [1, 0]
    assert rec.metadata == {"attempt": 2}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"logprobs": [-0.5]}, "logprobs has 1 entries for 2 completion tokens"),
        ({"logprobs": [-0.5, -0.1, -0.2]}, "logprobs has 3 entries for 2 completion tokens"),
        ({"logprobs": [-0.5, 0.7]}, "logprobs must be finite and <= 0"),
        ({"logprobs": [-0.5, math.nan]}, "logprobs must be finite and <= 0"),
        ({"logprobs": [-math.inf, -0.5]}, "logprobs must be finite and <= 0"),
        ({"reward": math.nan}, "reward must be a finite number"),
        ({"reward": math.inf}, "reward must be a finite number"),
        ({"completion_ids": [14, -2]}, "token ids must be non-negative"),
        ({"prompt_ids": [-1, 10, 5]}, "token ids must be non-negative"),
        ({"loss_mask": [1]}, "loss_mask has 1 entries for 2 completion tokens"),
        ({"loss_mask": [1, 2]}, "loss_mask entries must be 0 or 1"),
        ({"completion_ids": [], "logprobs": []}, "completion_ids"),
        ({"job_id": 0}, "job_id"),
        ({"version": -1}, "version"),
        ({"lease_id": ""}, "lease_id"),
        ({"reward": "high"}, "reward"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_malformed_record_is_refused_with_reason(changes: dict[str, Any], reason: str) -> None:
    with pytest.raises(RecordError, match=reason.replace("(", r"\(")):
        validate_record(record(**changes))


def test_extra_field_is_refused_naming_it() -> None:
    with pytest.raises(RecordError) as err:
        validate_record(record(advantage=3.0))

    assert str(err.value).startswith("advantage:")
    assert "not permitted" in str(err.value)


def test_missing_field_is_refused_naming_it() -> None:
    raw = record()
    del raw["reward"]

    with pytest.raises(RecordError, match=r"^reward: Field required"):
        validate_record(raw)


def test_non_object_is_refused() -> None:
    with pytest.raises(RecordError, match=r"^record: "):
        validate_record(["not", "a", "record"])


def group(rows: list[dict[str, Any]], **changes: Any) -> dict[str, Any]:
    first = rows[0]
    return {"job_id": first["job_id"], "lease_id": first["lease_id"], "group_id": first["group_id"],
            "version": first["version"], "records": rows, **changes}


def test_group_round_trips_as_the_learner_reads_it() -> None:
    built = TrajectoryGroup.of([Trajectory.model_validate(record(reward=float(i))) for i in range(3)])

    back = TrajectoryGroup.model_validate_json(built.model_dump_json())

    assert back == built
    assert back.version == 3 and [r.reward for r in back.records] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("records", "changes", "reason"),
    [
        ([record(), record(lease_id="other")], {}, "records.1.lease_id: 'other' differs from the group's"),
        ([record(), record(group_id="g-2")], {}, "records.1.group_id"),
        ([record(), record(job_id=2)], {}, "records.1.job_id"),
        ([record(), record(version=2)], {}, "records.1.version: 2 differs from the group's 3"),
        ([record(), record(prompt="5+5=")], {}, "records.1.prompt: differs from the rest of the group"),
        ([record()], {"records": []}, "records: List should have at least 1 item"),
        ([record()], {"lease_id": "x"}, "records.0.lease_id"),
    ],
)
def test_group_rules_refuse_a_mixed_group(records, changes, reason) -> None:
    with pytest.raises(ValidationError) as err:
        TrajectoryGroup.model_validate(group(records, **changes))

    assert reason in error_reason(err.value)


def test_group_is_checked_against_its_job() -> None:
    built = TrajectoryGroup.of([Trajectory.model_validate(record()) for _ in range(2)])
    built.check_for_job(job_id=1, group_size=2, max_version=3)

    with pytest.raises(RecordError, match=r"^job_id: group is for job 1, not job 2$"):
        built.check_for_job(job_id=2, group_size=2, max_version=3)
    with pytest.raises(RecordError, match=r"^records: a group needs 4 records, got 2$"):
        built.check_for_job(job_id=1, group_size=4, max_version=3)
    with pytest.raises(RecordError, match=r"^version: 3 was never published \(latest is 2\)$"):
        built.check_for_job(job_id=1, group_size=2, max_version=2)


def test_reason_is_one_line() -> None:
    with pytest.raises(RecordError) as err:
        validate_record(record(logprobs=[0.5, 0.5, 0.5], reward=math.nan, extra=1))

    assert "\n" not in str(err.value)
