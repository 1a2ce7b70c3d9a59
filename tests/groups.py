"""Test helpers: trajectory groups as the agent builds them and the site stores them."""

from __future__ import annotations

from dataplane.groupcodec import encode_group
from dataplane.records import Trajectory, TrajectoryGroup


def group_of(records: list[dict]) -> TrajectoryGroup:
    """The ``TrajectoryGroup`` of record dicts (each a full ``Trajectory``)."""
    return TrajectoryGroup.of([Trajectory.model_validate(r) for r in records])


def stream_fields(records: list[dict], *, worker_id: int = 1, legacy: bool = False) -> dict[str, str | bytes]:
    """The trajectory-stream entry of an accepted group, exactly as the site's return script writes it (``legacy``:
    as it wrote it before ``dataplane.groupcodec``, the group's JSON)."""
    group = group_of(records)
    data = group.model_dump_json() if legacy else encode_group(group)
    return {"lease_id": group.lease_id, "worker_id": str(worker_id), "data": data}


def stream_entries(client, key: str) -> list[tuple[str, dict]]:
    """A trajectory stream's entries, whatever the client decodes: ids and field names as text, ``data`` (a stored
    group: binary) as bytes, the other fields as text."""
    return [(entry_id.decode(), {name.decode(): value if name == b"data" else value.decode()
                                 for name, value in fields.items()})
            for entry_id, fields in client.execute_command("XRANGE", key, "-", "+", NEVER_DECODE=True)]


def entry_ids(client, key: str) -> list[str]:
    """The ids of a stream's entries (:func:`stream_entries`)."""
    return [entry_id for entry_id, _ in stream_entries(client, key)]
