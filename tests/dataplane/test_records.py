"""Trajectory records: a well-formed record is accepted; each malformed one is refused with a reason."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dataplane.records import RecordError, Trajectory, validate_record


def record(**changes: Any) -> dict[str, Any]:
    base = {
        "job_id": 1, "lease_id": "1700000000000-0", "group_id": "g-1", "prompt": "3+4=",
        "prompt_ids": [1, 10, 5, 11, 17], "completion": "7", "completion_ids": [14, 2],
        "logprobs": [-0.25, -1.5], "reward": 1.0, "version": 3,
    }
    base.update(changes)
    return base


def test_valid_record_is_accepted_with_its_fields() -> None:
    rec = validate_record(record(), job_id=1, max_version=3)

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


def test_record_for_another_job_is_refused() -> None:
    with pytest.raises(RecordError, match=r"^job_id: record is for job 1, not job 2$"):
        validate_record(record(), job_id=2)


def test_version_never_published_is_refused() -> None:
    assert validate_record(record(version=4), max_version=4).version == 4

    with pytest.raises(RecordError, match=r"^version: 5 was never published \(latest is 4\)$"):
        validate_record(record(version=5), max_version=4)


def test_reason_is_one_line() -> None:
    with pytest.raises(RecordError) as err:
        validate_record(record(logprobs=[0.5, 0.5, 0.5], reward=math.nan, extra=1))

    assert "\n" not in str(err.value)
