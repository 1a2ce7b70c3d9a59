"""Joining the ``trajectories_part`` frames of one group, per agent connection (pure: no Django, no Redis).

An agent cuts a group too big for one frame into parts (``worker_agent/submit.py``); the site joins them here and
then checks the whole group exactly as a group sent in one frame (``services.trajectories_submit``): GRPO learns from
whole groups, so it is all or nothing. Memory stays bounded: one group in assembly per connection (a part 0 starts
anew, dropping what was unfinished: the agent sends a group only after the last one's reply or its reply timeout),
at most ``group_size`` records and :func:`group_bytes_bound` bytes of frames, an assembly older than the lease
timeout is refused (its lease has expired anyway), and the consumer drops the assembly when the socket closes.

Any refusal drops the assembly (the agent must start the group again from part 0) and names the reason; nothing
reaches the stream and the lease stays open, so the prompt is leased again after the timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import ValidationError

from dataplane import messages as m
from dataplane.records import MAX_TOKENS, RewardErrors, Trajectory, TrajectoryGroup, error_reason

# Bytes of JSON one record can take, from the schema's bounds (dataplane/records.py): a prompt text and a completion
# text of up to 100,000 characters (6 bytes each at worst, escaped), up to MAX_TOKENS prompt ids (7 bytes each with
# the comma), and for each completion token its id (7), log-prob (25: a full-precision float) and mask entry (2).
TEXT_BYTES = 2 * 6 * 100_000
PROMPT_IDS_BYTES = 7 * MAX_TOKENS
TOKEN_BYTES = 7 + 25 + 2
RECORD_SLACK_BYTES = 64 << 10  # field names, ids, reward, version and the task's metadata


class AssemblyError(ValueError):
    """A part that cannot join the group in assembly; ``str(err)`` is the reason, ``records`` how many were dropped."""

    def __init__(self, reason: str, *, records: int) -> None:
        super().__init__(reason)
        self.records = records


def group_bytes_bound(*, group_size: int, max_new_tokens: int) -> int:
    """The most bytes of frames a legal group of the job can take: ``group_size`` records of at most
    ``max_new_tokens`` completion tokens each. The cap on one connection's assembly."""
    record = TEXT_BYTES + PROMPT_IDS_BYTES + RECORD_SLACK_BYTES + TOKEN_BYTES * max_new_tokens
    return group_size * record


@dataclass(frozen=True)
class JobLimits:
    """What the job allows a group: its ``n``, the bytes bound, and how long a group may take to arrive."""

    group_size: int
    max_bytes: int
    timeout_s: float


@dataclass
class _Partial:
    header: tuple
    request_id: str | None
    parts: int
    started: float
    records: list[Trajectory] = field(default_factory=list)
    next_part: int = 0
    size: int = 0
    reward_errors: RewardErrors | None = None  # part 0's (every part carries the group's)


def _header(group: TrajectoryGroup) -> tuple:
    return group.job_id, group.lease_id, group.group_id, group.version


_HEADER_FIELDS = ("job_id", "lease_id", "group_id", "version")


class GroupAssembler:
    """The group in assembly on one connection, if any."""

    def __init__(self) -> None:
        self.partial: _Partial | None = None

    def drop(self) -> None:
        self.partial = None

    def add(self, message: m.TrajectoriesPart, *, frame_bytes: int, limits: JobLimits,
            now: float) -> TrajectoryGroup | None:
        """Take one part; returns the whole group after its last part, else None (more to come).
        Raises :class:`AssemblyError` (and drops the assembly) for a part that does not fit."""
        try:
            return self._add(message, frame_bytes=frame_bytes, limits=limits, now=now)
        except AssemblyError:
            self.partial = None
            raise

    def _add(self, message: m.TrajectoriesPart, *, frame_bytes: int, limits: JobLimits,
             now: float) -> TrajectoryGroup | None:
        if message.part == 0:
            self.partial = _Partial(header=_header(message.group), request_id=message.id, parts=message.parts,
                                    started=now, reward_errors=message.group.reward_errors)
        partial = self.partial
        held = len(partial.records) if partial else 0
        refuse = _refusal(partial, message, limits=limits, now=now, frame_bytes=frame_bytes)
        if refuse:
            raise AssemblyError(refuse, records=held + len(message.group.records))
        partial.records.extend(message.group.records)
        partial.next_part += 1
        partial.size += frame_bytes
        if partial.next_part < partial.parts:
            return None
        self.partial = None
        return _whole(partial)


def _refusal(partial: _Partial | None, message: m.TrajectoriesPart, *, limits: JobLimits, now: float,
             frame_bytes: int) -> str | None:
    """Why ``message`` cannot join ``partial``, or None."""
    group = message.group
    if partial is None:
        return f"part {message.part}: no group of lease {group.lease_id!r} in assembly (parts start at 0, in order)"
    if message.parts > limits.group_size:
        return f"parts: {message.parts} parts for a group of {limits.group_size} records"
    if now - partial.started > limits.timeout_s:
        return (f"part {message.part}: the group of lease {group.lease_id!r} took over {limits.timeout_s:g} s to "
                "arrive (the lease timeout)")
    for name, held in zip(_HEADER_FIELDS, partial.header, strict=True):
        if getattr(group, name) != held:
            return f"group.{name}: part {message.part} says {getattr(group, name)!r}, the group in assembly {held!r}"
    if (message.parts, message.id) != (partial.parts, partial.request_id):
        return (f"part {message.part}: of {message.parts} parts under id {message.id!r}, the group in assembly has "
                f"{partial.parts} under id {partial.request_id!r}")
    if message.part != partial.next_part:
        seen = "a duplicate" if message.part < partial.next_part else "out of order"
        return f"part {message.part}: {seen}, expected part {partial.next_part} of {partial.parts}"
    if len(partial.records) + len(group.records) > limits.group_size:
        return f"records: more than the job's group size of {limits.group_size}"
    if partial.size + frame_bytes > limits.max_bytes:
        return (f"the parts exceed {limits.max_bytes} bytes, the most a group of this job can take "
                f"({limits.group_size} records of its longest completions)")
    return None


def _whole(partial: _Partial) -> TrajectoryGroup:
    """The joined group, checked by the same group rules as one sent in one frame."""
    job_id, lease_id, group_id, version = partial.header
    try:
        return TrajectoryGroup(job_id=job_id, lease_id=lease_id, group_id=group_id, version=version,
                               records=partial.records, reward_errors=partial.reward_errors)
    except ValidationError as err:
        raise AssemblyError(error_reason(err, default="group"), records=len(partial.records)) from None
