"""A validated trajectory group as the site stores it in the stream: its numbers as binary columns, the rest JSON.

The site validated every group against the whole schema (:class:`~dataplane.records.TrajectoryGroup`) before it
appends it; what it appends is :func:`encode_group`'s bytes, and the learner reads them back with
:func:`decode_packed` (the columns it trains on, ``dataplane.packed.PackedRecords``) or, where it needs the whole
group (audits), :func:`decode_group`. Storing a 640-token record's ids and log-probs as JSON text made the
learner's parse of it (``orjson`` plus a list-to-array copy per column) cost more than reading it from Redis; as
columns, a group is a few byte copies whatever its length, and a 640-token group's
entry is 30% smaller (the group's one prompt stored once, the loss mask as bytes).

Layout (little-endian): ``MAGIC``, the header's length (uint32), the header (UTF-8 JSON, padded with spaces to a
multiple of 8 bytes so the columns that follow are aligned), then the columns: every record's completion
log-probs (float64), the prompt's token ids followed by every record's completion ids (int64), and the loss
masks of the records that have one (uint8). The header holds the
group's ``job_id``, ``lease_id``, ``group_id``, ``version`` and ``prompt``, the prompt's length ``p``, and per
record its ``completion``, ``reward``, ``metadata``, completion length ``n`` and whether it has a ``mask``.

Entries written before this format (the group's JSON, which starts with ``{``) are still read:
:func:`decode_packed` and :func:`decode_group` take both. A malformed entry is a
:class:`~dataplane.records.RecordError` naming what is wrong, never an exception of another kind: the learner
quarantines it.
"""

from __future__ import annotations

import json
import operator
import sys
from array import array

import orjson

from .packed import PackedRecords, pack_json
from .records import RecordError, TrajectoryGroup

MAGIC = b"E2G1"
_HEAD = 8  # MAGIC, then the header's length
_ONE = array("q", [1])
_RECORD = operator.itemgetter("completion", "reward", "metadata", "n", "mask")


def encode_group(group: TrajectoryGroup) -> bytes:
    """``group`` (validated) as one stream entry's ``data`` (the module's layout)."""
    records = group.records
    prompt_ids = records[0].prompt_ids
    ids = array("q", prompt_ids)
    logprobs, mask = array("d"), bytearray()
    for rec in records:
        ids.fromlist(rec.completion_ids)
        logprobs.fromlist(rec.logprobs)
        if rec.loss_mask is not None:
            mask += bytes(rec.loss_mask)  # 0 and 1 (the schema checked)
    doc = {"job_id": group.job_id, "lease_id": group.lease_id, "group_id": group.group_id, "version": group.version,
           "prompt": records[0].prompt, "p": len(prompt_ids),
           "records": [{"completion": rec.completion, "reward": rec.reward, "metadata": rec.metadata,
                        "n": len(rec.completion_ids), "mask": rec.loss_mask is not None} for rec in records]}
    try:
        header = orjson.dumps(doc)
    except TypeError:  # metadata holding an integer past 64 bits: the standard library writes it exactly
        header = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    header += b" " * (-len(header) % 8)
    return b"".join((MAGIC, len(header).to_bytes(4, "little"), header, _little(logprobs), _little(ids), mask))


def is_encoded(data: bytes | str) -> bool:
    """Whether ``data`` is in this module's layout (else it is a group's JSON, as written before it)."""
    return isinstance(data, bytes | bytearray | memoryview) and bytes(data[:4]) == MAGIC


def decode_packed(data: bytes | str) -> PackedRecords:
    """The records of a stored group in columns (an entry in the old JSON form too); :class:`RecordError` naming
    what is wrong with a malformed one. Values are not checked here (learner/quarantine.py). A group is a few
    byte copies whatever its records' length: no Python step per token, and none of numpy's per-call cost."""
    if not is_encoded(data):
        return pack_json(data)
    header, columns, at = _columns(data)
    completions, rewards, _, n, masked = columns
    view, p = memoryview(data), header["p"]
    lp_end = at + 8 * sum(n)
    logprobs = array("d")
    logprobs.frombytes(view[at:lp_end])
    prompt, parts, start = view[lp_end:lp_end + 8 * p], [], lp_end + 8 * p
    for size in n:
        parts += (prompt, view[start:start + 8 * size])
        start += 8 * size
    tokens = array("q")
    tokens.frombytes(b"".join(parts))
    if _SWAP:  # pragma: no cover - a big-endian machine
        tokens.byteswap()
        logprobs.byteswap()
    if not any(masked):
        mask = _ONE * len(logprobs)
    else:
        mask = array("q")
        flags = view[start:]
        for size, has in zip(n, masked, strict=True):
            if has:
                mask.fromlist(flags[:size].tolist())
                flags = flags[size:]
            else:
                mask.extend(_ONE * size)
    count = len(n)
    return PackedRecords([header["group_id"]] * count, [header["version"]] * count, list(map(float, rewards)),
                         [header["prompt"]] * count, list(completions), [p] * count, list(n), tokens, logprobs, mask)


def decode_group(data: bytes | str) -> TrajectoryGroup:
    """The whole validated group of a stored entry (either form): :class:`RecordError` for a malformed entry,
    pydantic's ``ValidationError`` for one that breaks the schema."""
    if not is_encoded(data):
        return TrajectoryGroup.model_validate_json(data)
    packed = decode_packed(data)  # the header parsed again by the standard library: metadata's big integers exact
    header = json.loads(bytes(memoryview(data)[_HEAD:_HEAD + int.from_bytes(data[4:_HEAD], "little")]))
    same = {name: header.get(name) for name in ("job_id", "lease_id", "group_id", "version")}  # pydantic judges
    records = []
    for rec, view in zip(header["records"], packed.views(), strict=True):
        records.append({**same, "prompt": header["prompt"], "prompt_ids": view.prompt_ids.tolist(),
                        "completion": rec["completion"], "completion_ids": view.completion_ids.tolist(),
                        "logprobs": view.logprobs.tolist(), "reward": rec["reward"], "metadata": rec["metadata"],
                        "loss_mask": view.loss_mask.tolist() if rec["mask"] else None})
    return TrajectoryGroup.model_validate({**same, "records": records})


def _columns(data: bytes) -> tuple[dict, tuple, int]:
    """The header of an encoded entry (its structure checked), its per-record columns (completions, rewards,
    metadata, lengths, mask flags) and the offset where the number columns start."""
    size = int.from_bytes(data[4:_HEAD], "little") if len(data) >= _HEAD else -1
    if size < 0 or _HEAD + size > len(data):
        raise RecordError("data: an encoded group cut short (its header)")
    try:
        header = orjson.loads(memoryview(data)[_HEAD:_HEAD + size])
    except orjson.JSONDecodeError as err:
        raise RecordError(f"data: the encoded group's header is not JSON ({err})") from None
    columns = _checked(header)
    n, masked = columns[3], columns[4]
    expected = _HEAD + size + 16 * sum(n) + 8 * header["p"] + sum(k for k, has in zip(n, masked, strict=True) if has)
    if len(data) != expected:
        raise RecordError(f"data: the encoded group holds {len(data)} bytes, its header describes {expected}")
    return header, columns, _HEAD + size


def _checked(header: object) -> tuple:
    """The per-record columns of a header whose structure is right, checked a column at a time (one C loop each,
    as ``dataplane.packed`` does); else :class:`RecordError` naming the first thing that is not."""
    try:
        columns = tuple(zip(*map(_RECORD, header["records"]), strict=True))
        completions, rewards, metadata, n, masked = columns
        version, group_id, p = header["version"], header["group_id"], header["p"]
        if (set(map(type, completions)) == {str} and set(map(type, rewards)) <= {int, float}
                and set(map(type, metadata)) == {dict} and set(map(type, n)) == {int} and min(n) >= 1
                and set(map(type, masked)) <= {bool} and type(version) is int and version >= 0
                and type(group_id) is str and group_id and type(header["prompt"]) is str and type(p) is int
                and p >= 1):
            return columns
    except (KeyError, TypeError, ValueError, AttributeError):
        pass
    raise RecordError(_header_problem(header))


def _header_problem(header: object) -> str:
    """What is wrong with the structure of an encoded group's header (``field: why``)."""
    if type(header) is not dict:
        return "data: the encoded group's header is not a JSON object"
    version, group_id, records = header.get("version"), header.get("group_id"), header.get("records")
    if type(version) is not int or version < 0:
        return "version: must be an integer >= 0"
    if type(group_id) is not str or not group_id:
        return "group_id: must be a non-empty string"
    if type(header.get("prompt")) is not str or type(header.get("p")) is not int or header["p"] < 1:
        return "prompt: a group needs a prompt and its token ids"
    if type(records) is not list or not records:
        return "records: a group needs at least one record"
    for i, rec in enumerate(records):
        if type(rec) is not dict or type(rec.get("completion")) is not str or type(rec.get("mask")) is not bool:
            return f"records.{i}: needs a completion (a string) and mask (true or false)"
        if type(rec.get("n")) is not int or rec["n"] < 1:
            return f"records.{i}.n: a record needs completion tokens"
        if type(rec.get("reward")) not in (int, float):
            return f"records.{i}.reward: missing or not a number"
        if type(rec.get("metadata")) is not dict:
            return f"records.{i}.metadata: must be an object"
    return "records: malformed"


_SWAP = sys.byteorder != "little"  # columns are stored little-endian ("q" and "d" are 8 bytes on every CPython)


def _little(column: array) -> bytes:
    """A column's bytes, little-endian whatever the machine."""
    if not _SWAP:
        return column.tobytes()
    swapped = array(column.typecode, column)  # pragma: no cover - a big-endian machine
    swapped.byteswap()
    return swapped.tobytes()
