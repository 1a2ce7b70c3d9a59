"""A group as the learner reads it back from a job's trajectory stream (``dataplane.replay``): its entry id, the
worker the site accepted it from, and its records in columns, decoded lazily."""

from __future__ import annotations

import contextlib

from pydantic import ValidationError

from .groupcodec import decode_group, decode_packed
from .packed import PackedRecords, pack_records
from .records import RecordError, TrajectoryGroup


class StoredGroup:
    """A group read back from the trajectory stream: the entry id that acknowledges it, the worker the site accepted
    it from (stamped by the site, never claimed by the worker; 0 for entries written before the stamp existed), and
    its records in columns (``packed``: what the learner trains on, ``dataplane.packed``). An entry that is not a
    group has no ``packed`` and says why in ``problem``: the reader hands it on rather than raise, so the learner
    quarantines it instead of crashing on it forever. ``group``, the whole validated ``TrajectoryGroup``, is built
    from the stored JSON on first use only (the learner's hot path never asks for it)."""

    __slots__ = ("entry_id", "worker_id", "problem", "packed", "_group", "_data")

    def __init__(self, entry_id: str, group: TrajectoryGroup | None = None, worker_id: int = 0, problem: str = "", *,
                 packed: PackedRecords | None = None, data: bytes | str | None = None) -> None:
        self.entry_id, self.worker_id, self.problem = entry_id, worker_id, problem
        self._group, self._data = group, data
        self.packed = packed if packed is not None or group is None else pack_records(group.records)

    def __repr__(self) -> str:
        return f"StoredGroup({self.entry_id!r}, worker {self.worker_id}, {self.size} records {self.problem!r})"

    @property
    def group(self) -> TrajectoryGroup | None:
        if self._group is None and self._data is not None:
            data, self._data = self._data, None
            # None when it is not a valid group (its packed columns, if any, are what the learner judges)
            with contextlib.suppress(ValidationError, RecordError):
                self._group = decode_group(data)
        return self._group

    @property
    def records(self):
        group = self.group
        return group.records if group is not None else []

    @property
    def size(self) -> int:
        """Records in the group (0 for an entry that is no group)."""
        return len(self.packed) if self.packed is not None else 0

    @property
    def version(self) -> int:
        return self.packed.versions[0] if self.packed is not None else -1


def stored_entry(entry_id: str, fields: dict) -> StoredGroup:
    """The group of one stream entry, or the entry with the reason it is not one (see :class:`StoredGroup`)."""
    worker = text(field(fields, "worker_id") or "0")
    worker_id = int(worker) if worker.isdigit() else 0
    data = field(fields, "data")
    if data is None:
        return StoredGroup(entry_id, None, worker_id, problem="data: missing")
    try:
        return StoredGroup(entry_id, None, worker_id, packed=decode_packed(data), data=data)
    except RecordError as err:
        return StoredGroup(entry_id, None, worker_id, problem=str(err))


def field(fields: dict, name: str):
    value = fields.get(name)
    return fields.get(name.encode()) if value is None else value


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
