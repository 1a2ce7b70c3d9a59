"""What the agent socket reads of a frame before it handles it: its type and request id from its head (a frame
refused unread is still named), and a group frame parsed straight from its text."""

from __future__ import annotations

import re

from django.conf import settings

from dataplane import messages as m

from ..infra.jsonlimits import JSONLimitError, check_json

_TYPE = re.compile(r'"type"\s*:\s*"([a-z_]{1,32})"')
_ID = re.compile(r'"id"\s*:\s*"([^"\\]{1,64})"')


GROUP_FRAMES = ("trajectories", "trajectories_part", "submit")
METADATA_LEVEL = 5  # frame > group > records > record > metadata: where a group's free-form JSON sits


def parsed_group(text: str) -> m.Trajectories | m.TrajectoriesPart | m.Submit | None:
    """A group frame parsed straight from its text (``messages.parse_agent_json``) when it is valid, its only
    free-form part (each record's metadata) within the nesting limit; else None, and the frame takes the general
    path, which says why (the same reasons as ever). The schema bounds the nesting of everything else."""
    try:
        message = m.parse_agent_json(text)
    except m.MessageError:
        return None
    if not isinstance(message, m.Trajectories | m.TrajectoriesPart | m.Submit):
        return None
    level = METADATA_LEVEL + 1 if isinstance(message, m.Submit) else METADATA_LEVEL  # a submit's groups: a list
    depth = settings.ECHO2["JSON_MAX_DEPTH"] - level + 1
    groups = message.groups if isinstance(message, m.Submit) else [message.group]
    try:
        for record in (record for group in groups for record in group.records):
            if record.metadata:
                check_json(record.metadata, depth=depth)
    except JSONLimitError:
        return None
    return message


def frame_type(text: str | None) -> str | None:
    """The ``type`` near the start of a frame, without parsing it (agents send it first)."""
    found = _TYPE.search(text[:256]) if text else None
    return found[1] if found else None


def frame_id(text: str | None) -> str | None:
    """The request ``id`` near the start of a frame, without parsing it (agents send it right after the type)."""
    found = _ID.search(text[:256]) if text else None
    return found[1] if found else None
