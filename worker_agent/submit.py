"""A request as the frames that carry it: one frame, or a group cut into ``trajectories_part`` frames.

The site refuses a frame over its limit (``Welcome.max_message_bytes``) and closes the socket (4413); an agent that
sent a legal but large group (n records of up to max_new_tokens tokens with their log-probs) as one frame would be
closed, reconnect and resend it forever. So the agent measures the frame first and, when it is too big, packs the
records in order into as few parts as fit, each a valid group of its own (``dataplane.messages.TrajectoriesPart``).
A single record that fits no frame cannot be split: :class:`RecordTooBig`, and the caller hands the lease back.
"""

from __future__ import annotations

from dataplane import messages as m
from dataplane.records import MAX_GROUP, Trajectory

# daphne's own default frame limit: what a site that announces nothing (an older one) surely takes.
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20


class RecordTooBig(ValueError):
    """A record that alone exceeds the frame limit: its group can never reach the site."""


def frames(message: m._Msg, *, limit: int) -> list[str]:
    """The frames that carry ``message``, each at most ``limit`` bytes of UTF-8 JSON.

    Only a ``trajectories`` message is ever split; any other message goes as it is (ours are all small)."""
    text = message.model_dump_json()
    if not isinstance(message, m.Trajectories) or len(text.encode()) <= limit:
        return [text]
    group = message.group
    slices = pack(sizes=[_size(record) for record in group.records], budget=limit - _overhead(message))
    parts = [m.TrajectoriesPart(group=group.model_copy(update={"records": group.records[s]}), part=i,
                                parts=len(slices), id=message.id).model_dump_json() for i, s in enumerate(slices)]
    too_big = [len(p.encode()) for p in parts if len(p.encode()) > limit]
    if too_big:  # the overhead is an upper bound, so this is a bug in it, never the sender's fault
        raise AssertionError(f"a part of {too_big[0]} bytes exceeds the limit of {limit} bytes")
    return parts


def pack(*, sizes: list[int], budget: int) -> list[slice]:
    """Consecutive slices of items of ``sizes`` bytes, each summing to at most ``budget``: greedy, in order (the
    site joins the parts in order, so the group arrives exactly as built). Each item costs one separator byte."""
    slices: list[slice] = []
    start, used = 0, 0
    for i, size in enumerate(sizes):
        if size + 1 > budget:
            raise RecordTooBig(f"record {i} is {size} bytes of JSON alone, and a frame holds at most {budget} bytes "
                               "of records: the site's limit (ECHO2_WS_MAX_MESSAGE_BYTES) is below one record")
        if used + size + 1 > budget:
            slices.append(slice(start, i))
            start, used = i, 0
        used += size + 1
    slices.append(slice(start, len(sizes)))
    return slices


def _size(record: Trajectory) -> int:
    return len(record.model_dump_json().encode())


def _overhead(message: m.Trajectories) -> int:
    """Bytes of a part beyond its records: the header with the widest part numbers, and an empty record list."""
    header = message.group.model_construct(**{**dict(message.group), "records": []})
    return len(m.TrajectoriesPart.model_construct(group=header, part=MAX_GROUP - 1, parts=MAX_GROUP,
                                                  id=message.id).model_dump_json().encode())
