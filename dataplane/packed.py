"""Records in columns: how the learner reads trajectory groups back from the stream.

The site validated every group against the whole schema (:class:`~dataplane.records.TrajectoryGroup`) before it
appended it, and the learner trains on a handful of its fields. So the learner does not build a pydantic object
per record a second time (on a 640-token group that took 0.6 ms, more than reading the entry from Redis): it parses
an entry's JSON once (``orjson``, a quarter faster than pydantic's parser on such groups), checks the structure of
what it trains on (:func:`pack_json`: types, lengths, the group rules), and packs the numbers into flat arrays
(``array.array``: one C loop per column, no Python object kept per token). Their values (token ids within the
vocabulary, rewards and log-probs finite and in range) are checked on whole reads at once by the learner
(learner/quarantine.py), and collation copies the arrays into a batch's tensors, one allocation per tensor
(learner/batch.py). Anything else in an entry (lease and job ids, metadata, string lengths) is the site's to check.

Whatever an entry holds, :func:`pack_json` returns a :class:`PackedRecords` or raises :class:`RecordError` with
a reason: the reader hands the entry on with that reason, and the learner quarantines it.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import orjson

from .records import RecordError, Trajectory


@dataclass(eq=False, slots=True)
class PackedRecords:
    """Records (of one group, or of a whole batch) in columns, in record order.

    Per record: ``group_ids``, ``versions``, ``rewards``, ``prompts``, ``completions``, ``prompt_lens`` and
    ``completion_lens``. Flat: ``tokens`` (each record's prompt ids, then its completion ids), ``logprobs`` and
    ``mask`` (each record's completion log-probs and loss mask; a record without a mask learns every token).
    """

    group_ids: list[str]
    versions: list[int]
    rewards: list[float]
    prompts: list[str]
    completions: list[str]
    prompt_lens: list[int]
    completion_lens: list[int]
    tokens: array  # int64 (or any buffer of them: learner.batch.concat makes numpy arrays)
    logprobs: array  # float64
    mask: array  # int64
    # The rewards the workers claimed, kept when the learner added the owner's functions' scores to ``rewards``
    # (learner/scoring.py); None: ``rewards`` are the workers'.
    worker_rewards: list[float] | None = None

    def __len__(self) -> int:
        return len(self.versions)

    def views(self) -> Iterator[RecordView]:
        """Each record with the attributes the record checks read (``dataplane.records.record_problem``)."""
        tok = comp = 0
        for i, (p, c) in enumerate(zip(self.prompt_lens, self.completion_lens, strict=True)):
            yield RecordView(prompt=self.prompts[i], prompt_ids=self.tokens[tok:tok + p],
                             completion_ids=self.tokens[tok + p:tok + p + c], logprobs=self.logprobs[comp:comp + c],
                             loss_mask=self.mask[comp:comp + c], reward=self.rewards[i])
            tok, comp = tok + p + c, comp + c


@dataclass(frozen=True)
class RecordView:
    """One record of a :class:`PackedRecords` (slices of its arrays), for checks that go record by record."""

    prompt: str
    prompt_ids: array
    completion_ids: array
    logprobs: array
    loss_mask: array
    reward: float


def pack_records(records: Iterable[Trajectory]) -> PackedRecords:
    """Validated records (the schema checked them) in columns."""
    out = _empty()
    for rec in records:
        _append(out, rec.reward, rec.prompt, rec.completion, rec.prompt_ids, rec.completion_ids, rec.logprobs,
                rec.loss_mask)
        out.group_ids.append(rec.group_id)
        out.versions.append(rec.version)
    return out


def pack_json(data: bytes | str) -> PackedRecords:
    """The group stored as ``data`` (a ``TrajectoryGroup``'s JSON) in columns; :class:`RecordError` naming the first
    field that is not what the learner trains on: not JSON, a missing field, a wrong type, a length that does not
    match, a record of another group, version or prompt. Values are not checked here (learner/quarantine.py)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise RecordError(f"data: not valid JSON ({err})") from None
    if type(doc) is not dict:
        raise RecordError("data: not a JSON object")
    version, group_id, records = doc.get("version"), doc.get("group_id"), doc.get("records")
    if type(version) is not int or version < 0:
        raise RecordError("version: must be an integer >= 0")
    if type(group_id) is not str or not group_id:
        raise RecordError("group_id: must be a non-empty string")
    if type(records) is not list or not records:
        raise RecordError("records: a group needs at least one record")
    packed = _packed_at_once(records, version, group_id)
    if packed is not None:
        return packed
    out, first = _empty(), records[0]  # something is wrong: record by record, for the reason
    for i, rec in enumerate(records):
        try:
            if not _take(out, rec, version, group_id, first):
                raise RecordError(f"records.{i}.{_structure_problem(rec, version, group_id, first)}")
        except (TypeError, OverflowError):  # an element that is not a number (or an integer), or one past int64
            raise RecordError(_element_problem(rec, i)) from None
    n = len(records)
    out.group_ids.extend([group_id] * n)
    out.versions.extend([version] * n)
    return out


_FIELDS = operator.itemgetter("prompt_ids", "completion_ids", "logprobs", "prompt", "completion", "reward", "version",
                              "group_id")


def _packed_at_once(records: list, version: int, group_id: str) -> PackedRecords | None:
    """The group in columns, checked and packed a column at a time (each check one C loop over the group's records,
    not a dozen Python steps per record: those took twice orjson's parse on the demo's records); None when any
    check fails (:func:`pack_json` then goes record by record for the reason)."""
    n = len(records)
    try:
        prompt_ids, completion_ids, logprobs, prompts, completions, rewards, versions, group_ids = \
            zip(*map(_FIELDS, records), strict=True)
        masks = [rec.get("loss_mask") for rec in records]
        tokens, flat_logprobs, reward_column = array("q"), array("d"), array("d")
        for prompt, completion, row in zip(prompt_ids, completion_ids, logprobs, strict=True):
            tokens.fromlist(prompt)  # a TypeError unless a list of int64
            tokens.fromlist(completion)
            flat_logprobs.fromlist(row)  # a TypeError unless a list of numbers
        reward_column.fromlist(list(rewards))
        prompt_lens, completion_lens = list(map(len, prompt_ids)), list(map(len, completion_ids))
        fits = (min(prompt_lens) > 0 and min(completion_lens) > 0 and list(map(len, logprobs)) == completion_lens
                and set(map(type, prompts + completions)) == {str} and bool not in set(map(type, rewards))
                and set(map(type, versions)) == {int} and versions.count(version) == n
                and group_ids.count(group_id) == n and prompt_ids.count(prompt_ids[0]) == n
                and prompts.count(prompts[0]) == n)
    except (KeyError, TypeError, OverflowError, ValueError, AttributeError):  # no dict, no field, a wrong type
        return None
    mask = _ONE * len(flat_logprobs) if masks.count(None) == n else _mask(masks, completion_lens)
    if not fits or mask is None:
        return None
    return PackedRecords([group_id] * n, [version] * n, list(reward_column), list(prompts), list(completions),
                         prompt_lens, completion_lens, tokens, flat_logprobs, mask)


def _mask(masks: list, completion_lens: list[int]) -> array | None:
    """The loss masks of a group's records in one column (1 for each token of a record without one), or None."""
    out = array("q")
    for m, n in zip(masks, completion_lens, strict=True):
        if m is None:
            out.extend(_ONE * n)
        elif type(m) is list and len(m) == n:
            try:
                out.fromlist(m)
            except (TypeError, OverflowError):
                return None
        else:
            return None
    return out


def _take(out: PackedRecords, rec: dict, version: int, group_id: str, first: dict) -> bool:
    """Append ``rec`` to ``out`` when its structure is right (the common case: one test of everything); False when
    it is not (the caller asks :func:`_structure_problem` why). Raises TypeError or OverflowError for an element that
    is not an int64 (token ids, loss mask) or a number (log-probs)."""
    if type(rec) is not dict:
        return False
    prompt_ids, completion_ids, logprobs = rec.get("prompt_ids"), rec.get("completion_ids"), rec.get("logprobs")
    prompt, completion, reward, mask = rec.get("prompt"), rec.get("completion"), rec.get("reward"), rec.get("loss_mask")
    if not (type(prompt_ids) is list and type(completion_ids) is list and type(logprobs) is list and prompt_ids
            and completion_ids and len(logprobs) == len(completion_ids) and type(prompt) is str
            and type(completion) is str and type(reward) in _NUMBER and type(rec.get("version")) is int
            and rec["version"] == version and rec.get("group_id") == group_id
            and (mask is None or type(mask) is list and len(mask) == len(completion_ids))
            and (rec is first or prompt_ids == first["prompt_ids"] and prompt == first["prompt"])):
        return False
    _append(out, reward, prompt, completion, prompt_ids, completion_ids, logprobs, mask)
    return True


def _element_problem(rec: dict, i: int) -> str:
    """Which list of record ``i`` holds an element that is not an int64 (token ids, loss mask) or a number."""
    for name, code in (("prompt_ids", "q"), ("completion_ids", "q"), ("logprobs", "d"), ("loss_mask", "q")):
        try:
            array(code).fromlist(rec.get(name) or [])
        except (TypeError, OverflowError):
            return f"records.{i}.{name}: must hold {'numbers' if code == 'd' else 'integers within int64'}"
    return f"records.{i}: token ids and loss_mask must hold integers and logprobs numbers"


_NUMBER = (float, int)
_STRUCTURE = (("prompt", str), ("completion", str), ("prompt_ids", list), ("completion_ids", list),
              ("logprobs", list))


def _structure_problem(rec: object, version: int, group_id: str, first: dict) -> str:
    """What is wrong with the structure of one record of a group (``field: why``)."""
    if type(rec) is not dict:
        return "record: not a JSON object"
    for name, kind in _STRUCTURE:
        if type(rec.get(name)) is not kind:
            return f"{name}: missing or not a {kind.__name__}"
    if type(rec.get("version")) is not int or rec["version"] != version:
        return f"version: {rec.get('version')!r} differs from the group's {version!r}"
    if rec.get("group_id") != group_id:
        return f"group_id: {rec.get('group_id')!r} differs from the group's {group_id!r}"
    if type(rec.get("reward")) not in _NUMBER:
        return "reward: missing or not a number"
    n = len(rec["completion_ids"])
    if not rec["prompt_ids"] or not n:
        return "prompt_ids: a record needs prompt and completion tokens"
    if len(rec["logprobs"]) != n:
        return f"logprobs: {len(rec['logprobs'])} entries for {n} completion tokens"
    mask = rec.get("loss_mask")
    if mask is not None and (type(mask) is not list or len(mask) != n):
        return f"loss_mask: must be null or a list of {n} entries"
    return "prompt: differs from the rest of the group"


def _empty() -> PackedRecords:
    return PackedRecords([], [], [], [], [], [], [], array("q"), array("d"), array("q"))


def _append(out: PackedRecords, reward: float, prompt: str, completion: str, prompt_ids: list[int],
            completion_ids: list[int], logprobs: list[float], mask: list[int] | None) -> None:
    """Append one record (its group id and version are the caller's); fromlist: a C loop over a list, all or nothing,
    twice as fast as extend."""
    out.tokens.fromlist(prompt_ids)
    out.tokens.fromlist(completion_ids)
    out.logprobs.fromlist(logprobs)
    if mask is None:
        out.mask.extend(_ONE * len(completion_ids))
    else:
        out.mask.fromlist(mask)
    out.rewards.append(float(reward))
    out.prompts.append(prompt)
    out.completions.append(completion)
    out.prompt_lens.append(len(prompt_ids))
    out.completion_lens.append(len(completion_ids))


_ONE = array("q", [1])


def mask_runs(ids: Sequence[int], mask: Sequence[int]) -> list[list[int]]:
    """``ids`` cut where the loss mask changes: a multi-turn record's turns and environment replies, each decoded
    on its own as the episode was built (dataplane/tasks/sandbox.py run_episodes). The learner's text check
    (learner/audit.py) and the site's (marketplace/core/audit_checks.py) cut the same way, so both use this."""
    cuts = [i for i in range(1, len(mask)) if mask[i] != mask[i - 1]]
    bounds = [0, *cuts, len(ids)]
    return [[int(token) for token in ids[a:b]] for a, b in zip(bounds, bounds[1:], strict=False)]
