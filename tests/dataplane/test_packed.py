"""The learner's read of a stored group (dataplane/packed.py): for every group the site stores, the columns equal
what the old path (``TrajectoryGroup.model_validate_json``, then the records) gives; whatever else an entry holds
is refused with a reason naming the field, never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.packed import pack_json, pack_records
from dataplane.records import RecordError, Trajectory, TrajectoryGroup

COLUMNS = ("group_ids", "versions", "rewards", "prompts", "completions", "prompt_lens", "completion_lens", "tokens",
           "logprobs", "mask")


@st.composite
def groups(draw) -> TrajectoryGroup:
    """Valid groups as the site stores them: any sizes, masks or none, rewards, versions."""
    n, version = draw(st.integers(1, 6)), draw(st.integers(0, 10**6))
    prompt = draw(st.text(min_size=0, max_size=12))
    prompt_ids = draw(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=8))
    records = []
    for _ in range(n):
        length = draw(st.integers(1, 12))
        records.append(Trajectory(
            job_id=3, lease_id="1-0", group_id="g", prompt=prompt, prompt_ids=prompt_ids,
            completion=draw(st.text(max_size=8)), completion_ids=draw(st.lists(st.integers(0, 10**9), min_size=length,
                                                                                 max_size=length)),
            logprobs=draw(st.lists(st.floats(-1e4, 0.0), min_size=length, max_size=length)),
            reward=draw(st.floats(-1e6, 1e6)), version=version,
            loss_mask=draw(st.none() | st.lists(st.integers(0, 1), min_size=length, max_size=length)),
            metadata=draw(st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))))
    return TrajectoryGroup.of(records)


def columns(packed) -> dict:
    return {name: list(getattr(packed, name)) for name in COLUMNS}


@settings(max_examples=150, deadline=None)
@given(groups())
def test_packed_columns_equal_the_validated_records(group: TrajectoryGroup) -> None:
    data = group.model_dump_json()  # exactly what the site appends to the stream
    old = TrajectoryGroup.model_validate_json(data).records  # the learner's read before

    packed = pack_json(data)

    assert columns(packed) == columns(pack_records(old))
    assert packed.versions == [group.version] * len(old) and packed.group_ids == [group.group_id] * len(old)
    assert list(packed.mask) == [m for r in old for m in (r.loss_mask or [1] * len(r.completion_ids))]
    assert list(packed.tokens) == [t for r in old for t in r.prompt_ids + r.completion_ids]


def valid() -> dict:
    rec = {"job_id": 3, "lease_id": "1-0", "group_id": "g", "prompt": "3+4=", "prompt_ids": [1, 5, 6],
           "completion": "7", "completion_ids": [9, 2], "logprobs": [-1.0, -0.5], "reward": 1.0, "version": 2,
           "loss_mask": None, "metadata": {}}
    return {"job_id": 3, "lease_id": "1-0", "group_id": "g", "version": 2, "records": [rec, dict(rec)]}


def changed(path: str, value) -> str:
    doc = valid()
    *parents, last = path.split(".")
    target = doc
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is KeyError:
        del target[last if not last.isdigit() else int(last)]
    else:
        target[int(last) if last.isdigit() else last] = value
    return json.dumps(doc)


@pytest.mark.parametrize(("data", "reason"), [
    ("{not json", "data: not valid JSON"),
    ("[1, 2]", "data: not a JSON object"),
    (changed("version", -1), "version: must be an integer >= 0"),
    (changed("version", "2"), "version: must be an integer >= 0"),
    (changed("records", []), "records: a group needs at least one record"),
    (changed("records.1", "x"), "records.1.record: not a JSON object"),
    (changed("records.1.completion_ids", KeyError), "records.1.completion_ids: missing or not a list"),
    (changed("records.0.prompt", 7), "records.0.prompt: missing or not a str"),
    (changed("records.1.version", 3), "records.1.version: 3 differs from the group's 2"),
    (changed("records.1.group_id", "h"), "records.1.group_id: 'h' differs from the group's 'g'"),
    (changed("records.0.reward", "1"), "records.0.reward: missing or not a number"),
    (changed("records.0.reward", True), "records.0.reward: missing or not a number"),
    (changed("records.1.logprobs", [-1.0]), "records.1.logprobs: 1 entries for 2 completion tokens"),
    (changed("records.1.loss_mask", [1]), "records.1.loss_mask: must be null or a list of 2 entries"),
    (changed("records.1.completion_ids", []), "records.1.prompt_ids: a record needs prompt and completion tokens"),
    (changed("records.1.prompt_ids", [1, 5, 7]), "records.1.prompt: differs from the rest of the group"),
    (changed("records.0.completion_ids", [9, 2.5]), "records.0.completion_ids: must hold integers within int64"),
    (changed("records.0.completion_ids", [9, 2**64]), "records.0.completion_ids: must hold integers within int64"),
    (changed("records.1.logprobs", [-1.0, "x"]), "records.1.logprobs: must hold numbers"),
    (changed("records.0.loss_mask", [1, None]), "records.0.loss_mask: must hold integers within int64"),
    (json.dumps(valid()).replace("-0.5", "NaN", 1), "data: not valid JSON"),
])
def test_what_the_learner_cannot_train_on_is_refused_with_a_reason(data: str, reason: str) -> None:
    with pytest.raises(RecordError) as err:
        pack_json(data)
    assert str(err.value).startswith(reason)


def test_values_are_left_to_the_learner_s_checks() -> None:
    """A negative token id or a positive log-prob parses (learner/quarantine.py refuses it, counted as no group,
    as the schema's own check did); so does a huge reward (refused against the task's range)."""
    packed = pack_json(changed("records.0.logprobs", [-1.0, 3.0]).replace('"reward": 1.0', '"reward": 1e300', 1))
    assert list(packed.logprobs)[:2] == [-1.0, 3.0] and packed.rewards[0] == 1e300


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=5), max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_entry_either_packs_or_is_refused_with_a_reason(data) -> None:
    """Fuzz: a valid group with one field replaced by any JSON value, or any JSON document, or any bytes."""
    doc = valid()
    choice = data.draw(st.sampled_from(["field", "document", "bytes"]))
    if choice == "field":
        record = doc["records"][data.draw(st.integers(0, 1))]
        record[data.draw(st.sampled_from(sorted(record)))] = data.draw(json_values)
        raw: bytes | str = json.dumps(doc)
    elif choice == "document":
        raw = json.dumps(data.draw(json_values))
    else:
        raw = data.draw(st.binary(max_size=64))
    try:
        packed = pack_json(raw)
    except RecordError as err:
        assert str(err)
        return
    assert len(packed.tokens) == sum(packed.prompt_lens) + sum(packed.completion_lens)
    assert len(packed.logprobs) == len(packed.mask) == sum(packed.completion_lens)
