"""A group as the site stores it (dataplane/groupcodec.py): for every valid group, the learner's columns and the
whole group come back exactly as they went in, and entries written before the format (the group's JSON) read as
before; whatever else an entry holds is refused with a reason, never another exception."""

from __future__ import annotations

import contextlib

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dataplane.groupcodec import MAGIC, decode_group, decode_packed, encode_group, is_encoded
from dataplane.packed import pack_json, pack_records
from dataplane.records import RecordError, Trajectory, TrajectoryGroup

from .test_packed import columns, groups


@settings(max_examples=200, deadline=None)
@given(groups())
def test_a_stored_group_reads_back_exactly(group: TrajectoryGroup) -> None:
    data = encode_group(group)

    assert is_encoded(data)
    assert columns(decode_packed(data)) == columns(pack_records(group.records))
    assert decode_group(data) == group


@settings(max_examples=50, deadline=None)
@given(groups())
def test_entries_written_before_the_format_read_as_before(group: TrajectoryGroup) -> None:
    legacy = group.model_dump_json()

    assert not is_encoded(legacy) and not is_encoded(legacy.encode())
    assert columns(decode_packed(legacy)) == columns(pack_json(legacy))
    assert decode_group(legacy) == group


def long_group(tokens: int = 640, *, masks: bool = False) -> TrajectoryGroup:
    records = [Trajectory(job_id=1, lease_id="5-0", group_id="g5", prompt="3+4=", prompt_ids=[1, 10, 5, 11, 17],
                          completion="tok " * tokens, completion_ids=[(i * 7919 + r) % 32_000 for i in range(tokens)],
                          logprobs=[-((i * 31 + r) % 97) / 13 for i in range(tokens)], reward=float(r % 2),
                          version=3, loss_mask=[(i + r) % 2 for i in range(tokens)] if masks and r % 2 else None,
                          metadata={"r": r}) for r in range(8)]
    return TrajectoryGroup.of(records)


def test_a_long_group_is_stored_in_fewer_bytes_than_its_json() -> None:
    group = long_group(masks=True)
    data = encode_group(group)
    assert len(data) < 0.75 * len(group.model_dump_json())
    assert decode_group(data) == group
    assert list(decode_packed(data).mask) == [m for r in group.records for m in (r.loss_mask or [1] * 640)]


def header_changed(name: str, value) -> bytes:
    """A stored group whose header has ``name`` (``records.i.field`` for a record's) set to ``value``; the columns
    and the header's length kept, so only the change is wrong."""
    data = encode_group(long_group(4))
    size = int.from_bytes(data[4:8], "little")
    header = orjson.loads(data[8:8 + size])
    *parents, last = name.split(".")
    target = header
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[int(last) if last.isdigit() else last] = value
    text = orjson.dumps(header)
    text += b" " * (-len(text) % 8)
    return MAGIC + len(text).to_bytes(4, "little") + text + data[8 + size:]


@pytest.mark.parametrize(("data", "reason"), [
    (MAGIC, "data: an encoded group cut short"),
    (MAGIC + (10**6).to_bytes(4, "little") + b"{}", "data: an encoded group cut short"),
    (MAGIC + (2).to_bytes(4, "little") + b"{x", "data: the encoded group's header is not JSON"),
    (MAGIC + (2).to_bytes(4, "little") + b"[]", "data: the encoded group's header is not a JSON object"),
    (encode_group(long_group(4))[:-3], "data: the encoded group holds"),
    (encode_group(long_group(4)) + b"\0", "data: the encoded group holds"),
    (header_changed("version", -1), "version: must be an integer >= 0"),
    (header_changed("group_id", ""), "group_id: must be a non-empty string"),
    (header_changed("p", 0), "prompt: a group needs a prompt and its token ids"),
    (header_changed("records", []), "records: a group needs at least one record"),
    (header_changed("records.1", "x"), "records.1: needs a completion"),
    (header_changed("records.1.mask", "yes"), "records.1: needs a completion"),
    (header_changed("records.2.n", 0), "records.2.n: a record needs completion tokens"),
    (header_changed("records.0.reward", "1"), "records.0.reward: missing or not a number"),
    (header_changed("records.0.metadata", []), "records.0.metadata: must be an object"),
    (header_changed("records.3.n", 5), "data: the encoded group holds"),
    (header_changed("records.0", {"completion": "x", "mask": False, "n": 4, "reward": 1.0}),
     "records.0.metadata: must be an object"),
])
def test_a_malformed_entry_is_refused_with_a_reason(data: bytes, reason: str) -> None:
    for decode in (decode_packed, decode_group):
        with pytest.raises(RecordError) as err:
            decode(data)
        assert str(err.value).startswith(reason), str(err.value)


def test_a_header_that_breaks_the_schema_is_left_to_pydantic_for_the_whole_group() -> None:
    data = header_changed("job_id", 0)  # the learner's columns do not hold it; the whole group does
    assert len(decode_packed(data)) == 8
    with pytest.raises(ValidationError):
        decode_group(data)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_corruption_either_reads_or_is_refused_with_a_reason(data) -> None:
    """Fuzz: a stored group with bytes overwritten, cut, or added anywhere (the header included)."""
    stored = bytearray(encode_group(long_group(3, masks=True)))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(stored) - 1))
        match data.draw(st.sampled_from(["overwrite", "cut", "insert"])):
            case "overwrite":
                stored[at] = data.draw(st.integers(0, 255))
            case "cut":
                del stored[at:at + data.draw(st.integers(1, 16))]
            case "insert":
                stored[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    with contextlib.suppress(RecordError, ValidationError):
        decode_group(bytes(stored))  # nothing but a reason, either way
    try:
        packed = decode_packed(bytes(stored))
    except RecordError as err:
        assert str(err)
        return
    assert len(packed.tokens) == sum(packed.prompt_lens) + sum(packed.completion_lens)
    assert len(packed.logprobs) == len(packed.mask) == sum(packed.completion_lens)
