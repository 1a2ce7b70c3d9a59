"""Test helpers: trajectory groups as the agent builds them and the site stores them."""

from __future__ import annotations

from dataplane.records import Trajectory, TrajectoryGroup


def group_of(records: list[dict]) -> TrajectoryGroup:
    """The ``TrajectoryGroup`` of record dicts (each a full ``Trajectory``)."""
    return TrajectoryGroup.of([Trajectory.model_validate(r) for r in records])


def stream_fields(records: list[dict]) -> dict[str, str]:
    """The trajectory-stream entry of an accepted group, exactly as the site's return script writes it."""
    group = group_of(records)
    return {"lease_id": group.lease_id, "data": group.model_dump_json()}
