"""Control messages between the site and an agent, one JSON object per websocket frame.

Every request an agent waits on (``lease_request``, ``trajectories``, ``submit``) carries an ``id`` and its reply
(``lease``, ``no_work``, ``accepted``, ``submitted`` or ``rejected``) names it in ``ref_id``: the agent pairs them
by id, never by order, so a late reply (an agent frozen past its timeout, a request given up on) is recognised and
discarded.

A group whose ``trajectories`` frame would exceed the site's frame limit (announced in the ``welcome``) goes as
``trajectories_part`` frames: each carries a slice of the group's records as a valid group of its own, its index and
the count, and the request's one ``id``; the site assembles them (``marketplace/core/assembly.py``) and answers the
whole group once. A single record too big for a frame cannot be split: the agent hands its lease back
(``lease_return``).

The ``id`` comes right after the ``type`` in every request, so the site can name a request it refuses unparsed (over
its rate budget) by reading the frame's head; such a refusal carries ``retry_after``, and the agent sends the same
request again then (docs/trust.md "Limits"). The ``welcome`` announces the budget, and an honest agent keeps under it
(``worker_agent/pacing.py``).

Both sides parse with :func:`parse_agent_message` / :func:`parse_site_message`, so a message the other
side cannot understand is rejected with a reason (a ``rejected`` reply) instead of being ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from .broadcast import BroadcastStrategy
from .chat import PromptFormat
from .hardware import Hardware
from .records import MAX_GROUP, TrajectoryGroup, error_reason
from .snapshot import MAX_MANIFEST_BYTES
from .strict import StrictModel


class MessageError(ValueError):
    """A frame that is not a valid message; ``str(err)`` is the reason sent back."""


MAX_VERSION = 2**31 - 1  # versions and ids fit the site's integer columns
MAX_THROUGHPUT = 1e6  # trajectories/s: far beyond any one machine, so a larger figure is a lie or a bug
MAX_SECONDS = 1e7  # any duration an agent reports (~116 days): beyond it a figure is a lie or a bug

JobId = Annotated[int, Field(ge=1, le=MAX_VERSION)]
Version = Annotated[int, Field(ge=0, le=MAX_VERSION)]
Count = Annotated[int, Field(ge=0, le=MAX_VERSION)]


class _Msg(StrictModel):
    """Every message: unknown keys, NaN, infinity and NUL characters refused (``dataplane.strict``)."""


# ---- agent -> site -------------------------------------------------------------------------


class Hello(_Msg):
    type: Literal["hello"] = "hello"
    agent_version: str = Field(max_length=32)
    installed_version: int | None = Field(default=None, ge=0, le=MAX_VERSION, description="Snapshot version loaded, "
                                          "if any.")
    job_id: int | None = Field(default=None, ge=1, le=MAX_VERSION, description="The job the agent was serving when "
                               "it (re)connected: a site that no longer has it active in that job answers ``release``.")
    hardware: Hardware | None = Field(default=None, description="What the machine has, as the agent measured it "
                                      "(dataplane/hardware.py): claims, used only for matching jobs' requirements.")
    allow_user_code: bool | None = Field(default=None, description="Whether its provider opted in to run job "
                                         "owners' code (``echo2-agent run --allow-user-code``): the site assigns a job "
                                         "naming user code only to workers that did. None: an agent that does not "
                                         "say (older); the site keeps what it knew.")


WorkerState = Literal["loading", "installing", "generating", "idle", "failed"]
"""What an agent is doing, as it reports it in every heartbeat (and at once when it changes). The site bills an
activation only while its worker is ``installing`` a snapshot or ``generating`` (docs/faults.md, "Billing only
useful work"): ``loading`` (building the job's engine from its base), ``idle`` (no job, no work from the site,
waiting for a version) and ``failed`` (the rollout loop crashed; the agent restarts it) are not billed."""

BILLED_STATES: frozenset[str] = frozenset({"installing", "generating"})
"""The states the site bills (``marketplace.core.billing``); the agent reports entering one at once."""


class Heartbeat(_Msg):
    type: Literal["heartbeat"] = "heartbeat"
    throughput: float | None = Field(default=None, ge=0, le=MAX_THROUGHPUT,
                                     description="mu_i, trajectories/s over a window.")
    installed_version: int | None = Field(default=None, ge=0, le=MAX_VERSION)
    job_id: int | None = Field(default=None, ge=1, le=MAX_VERSION)
    state: WorkerState = Field(default="idle", description="What the agent is doing for ``job_id`` since its last "
                               "report; an agent that reports none is idle (billed nothing).")
    reason: str = Field(default="", max_length=200, description="Why the state is ``failed`` (the crash, short).")
    refused: bool = Field(default=False, description="With ``failed``: the agent will not serve ``job_id`` (its task "
                          "needs user code or a package this machine does not allow); the site releases it at once "
                          "and plans it no more for that job. ``reason`` says why, in words.")


class LeaseRequest(_Msg):
    type: Literal["lease_request"] = "lease_request"
    job_id: JobId
    groups: int = Field(default=1, ge=1, le=64, description="How many prompt groups to lease.")
    id: str | None = Field(default=None, min_length=1, max_length=64,
                           description="Names this request; its reply carries it back as ``ref_id``.")


class Trajectories(_Msg):
    """A leased prompt answered: its group of ``n`` records (parsed and checked by ``TrajectoryGroup``)."""

    type: Literal["trajectories"] = "trajectories"
    id: str | None = Field(default=None, min_length=1, max_length=64,
                           description="Names this request; its reply carries it back as ``ref_id``.")
    group: TrajectoryGroup

    @property
    def job_id(self) -> int:
        return self.group.job_id

    @property
    def lease_id(self) -> str:
        return self.group.lease_id


class TrajectoriesPart(_Msg):
    """One slice of a group too big for one frame: ``group`` holds records ``part`` of ``parts`` (in order; each
    slice obeys the group rules on its own, so a bad record is refused with the part that carries it). Every part of
    one group carries the same header (job, lease, group, version), ``parts`` and ``id``; the site answers once, for
    the whole group, after the last part (or at the first part it refuses, naming why)."""

    type: Literal["trajectories_part"] = "trajectories_part"
    id: str | None = Field(default=None, min_length=1, max_length=64,
                           description="Names the whole group's request; its one reply carries it back as ``ref_id``.")
    group: TrajectoryGroup
    part: int = Field(ge=0, lt=MAX_GROUP, description="This slice's index, from 0.")
    parts: int = Field(ge=2, le=MAX_GROUP, description="How many slices the group was cut into.")

    @model_validator(mode="after")
    def _in_range(self) -> TrajectoriesPart:
        if self.part >= self.parts:
            raise ValueError(f"part {self.part} is out of range for a group of {self.parts} parts")
        return self


MAX_BATCH = 64  # groups one ``submit`` returns, and leases it may ask for


class Submit(_Msg):
    """Several answered leases in one frame, and (``lease`` > 0) a request for the next ones in the same round
    trip: "return these, lease k more". One message per batch instead of one per group plus a lease request, so
    the messages an agent sends per trajectory fall as it gets faster. The site answers with one
    ``submitted`` naming this ``id``: a verdict per group, in order, and the new lease (or ``no_work``). A group too
    big for a frame goes alone as ``trajectories_part`` frames instead."""

    type: Literal["submit"] = "submit"
    id: str | None = Field(default=None, min_length=1, max_length=64,
                           description="Names this request; its reply carries it back as ``ref_id``.")
    job_id: JobId
    groups: list[TrajectoryGroup] = Field(default_factory=list, max_length=MAX_BATCH,
                                          description="Answered leases of ``job_id``, each checked on its own.")
    lease: int = Field(default=0, ge=0, le=MAX_BATCH, description="Prompt groups to lease in the same round trip.")

    @model_validator(mode="after")
    def _one_job(self) -> Submit:
        if not self.groups and not self.lease:
            raise ValueError("groups: a submit returns at least one group or asks for a lease")
        others = sorted({g.job_id for g in self.groups} - {self.job_id})
        if others:
            raise ValueError(f"groups: every group must be of job {self.job_id}, not of job {others[0]}")
        return self


class LeaseReturn(_Msg):
    """Hand a lease back before its timeout: the agent cannot answer it (a record too big for any frame). The
    prompt goes back to the stream at once, for the next worker that asks."""

    type: Literal["lease_return"] = "lease_return"
    job_id: JobId
    lease_id: str = Field(min_length=1, max_length=64)
    reason: str = Field(default="", max_length=500)


class SnapshotInstalled(_Msg):
    type: Literal["snapshot_installed"] = "snapshot_installed"
    job_id: JobId
    version: Version
    seconds: float = Field(ge=0, le=MAX_SECONDS, description="Publication-to-install time seen by this agent.")
    source: Literal["parent", "fallback", "http", "cache"] = Field(
        default="http", description="Where most chunks came from: a relay parent, the learner's HTTP fallback "
        "after a relay failed, plain HTTP (no parent assigned), or (version 0 only) the agent's cache of base "
        "snapshots.")
    from_parent: Count = Field(default=0, description="Chunks received from the relay parent.")
    from_fallback: Count = Field(default=0, description="Chunks fetched over HTTP.")


class RelayFailed(_Msg):
    """A relay link broke: the agent's parent (``culprit_worker_id``; None: the learner or unknown) failed."""

    type: Literal["relay_failed"] = "relay_failed"
    job_id: JobId
    version: Version
    culprit_worker_id: int | None = Field(default=None, ge=1, le=MAX_VERSION)
    reason: str = Field(default="", max_length=500)


class SnapshotRequest(_Msg):
    """Ask for a snapshot of the agent's job: its base (version 0) or the newest published. The site answers
    with a ``snapshot`` message (fetched over HTTP), or with nothing while there is none yet. Sent by an agent
    that joined late, restarted, or failed to install what it was told."""

    type: Literal["snapshot_request"] = "snapshot_request"
    job_id: JobId
    which: Literal["base", "newest"] = "newest"


AgentMessage = Annotated[
    Hello | Heartbeat | LeaseRequest | Trajectories | TrajectoriesPart | Submit | LeaseReturn | SnapshotInstalled
    | RelayFailed | SnapshotRequest,
    Field(discriminator="type"),
]

# ---- site -> agent -------------------------------------------------------------------------


class Welcome(_Msg):
    type: Literal["welcome"] = "welcome"
    worker_id: int
    heartbeat_interval: float = 5.0
    max_message_bytes: int | None = Field(default=None, ge=1, description="The largest frame the site takes (bytes of "
                                          "UTF-8 JSON); a bigger group goes as ``trajectories_part`` frames. None: an "
                                          "older site, the agent assumes a conservative default.")
    messages_per_s: float | None = Field(default=None, gt=0, description="The connection's message budget: the "
                                         "site refuses (``rejected`` with ``retry_after``) what exceeds it. None: none "
                                         "announced (an older site).")
    message_burst: float | None = Field(default=None, ge=1, description="Messages the budget lets through at once.")
    bytes_per_s: float | None = Field(default=None, gt=0, description="The connection's byte budget (frames' UTF-8 "
                                      "bytes per second on average; a burst of two largest frames).")


class Assign(_Msg):
    """Activate the worker for a job: build its engine from the job's base snapshot (version 0), install the
    newest snapshot, then lease and generate."""

    type: Literal["assign"] = "assign"
    job_id: int
    model: str = Field(description="The base checkpoint directory on the learner's machine (for logs: the agent "
                       "builds its engine from the base snapshot, never from this path).")
    base_digest: str | None = Field(default=None, max_length=64, description="sha256 of the job's base snapshot "
                                    "payload; None until the learner published version 0.")
    base: dict[str, Any] | None = Field(default=None, description="The base snapshot (version 0) as a `snapshot` "
                                        "message, once published.")
    task: dict[str, Any]
    group_size: int
    max_new_tokens: int
    temperature: float
    top_p: float = 1.0
    prompt_format: PromptFormat = Field(default_factory=PromptFormat, description="How prompts become token ids "
                                        "(the job's; an older site sends none: plain).")
    snapshot: dict[str, Any] | None = Field(default=None, description="Newest snapshot after the base to install, "
                                            "if any.")


class Release(_Msg):
    type: Literal["release"] = "release"
    job_id: int
    reason: str = ""


class LeasedPrompt(_Msg):
    lease_id: str = Field(description="Answer with one `trajectories` message carrying this id.")
    group_id: str
    prompt: str


class Lease(_Msg):
    """Prompt groups leased to this worker; each must be answered within ``timeout`` seconds."""

    type: Literal["lease"] = "lease"
    job_id: int
    leases: list[LeasedPrompt]
    timeout: float
    ref_id: str | None = Field(default=None, max_length=64, description="The ``id`` of the request answered.")


class NoWork(_Msg):
    type: Literal["no_work"] = "no_work"
    job_id: int
    retry_after: float = 0.5
    ref_id: str | None = Field(default=None, max_length=64, description="The ``id`` of the request answered.")


class SnapshotAvailable(_Msg):
    type: Literal["snapshot"] = "snapshot"
    job_id: int
    version: int
    url: str = Field(description="Base URL serving manifest.json and chunks/<i> (the learner's snapshot server).")
    manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="The manifest by reference: the sha256 of "
                                 "its canonical JSON (dataplane.snapshot.manifest_reference). The agent fetches "
                                 "``{url}manifest.json`` once per version with its credential and uses it only if it "
                                 "hashes to this: the manifest the site checked.")
    manifest_bytes: int = Field(ge=2, le=MAX_MANIFEST_BYTES, description="The size of that canonical JSON: what the "
                                "fetch reads at most (with a little slack for the server's own spacing).")
    published_at: float
    parent: str | None = Field(default=None, max_length=200, description='"host:port" of the relay to pull '
                               "from; None: fetch over HTTP from ``url``.")
    parent_worker_id: int | None = Field(default=None, description="The parent's worker id (None: the learner).")
    children: list[int] = Field(default_factory=list, description="Worker ids this agent's relay must serve.")
    strategy: BroadcastStrategy = "chain"
    credential: str | None = Field(default=None, max_length=200, description="This worker's transfer credential "
                                   "for this version (dataplane.credentials): shown to its relay parent in the hello, "
                                   "and to the learner's HTTP server as `Authorization: Bearer`. Short-lived.")
    child_credential_sha256: dict[int, Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] = Field(
        default_factory=dict, description="For each child in `children`, the sha256 of the credential the site gave "
        "it: the relay admits that child only with that credential, whatever id a peer claims.")


class Accepted(_Msg):
    type: Literal["accepted"] = "accepted"
    job_id: int
    lease_id: str
    accepted: int
    rejected: int
    reasons: list[str] = Field(default_factory=list)
    ref_id: str | None = Field(default=None, max_length=64, description="The ``id`` of the request answered.")


class Rejected(_Msg):
    """A frame the receiver refused; nothing it carried was applied."""

    type: Literal["rejected"] = "rejected"
    reason: str
    ref: str | None = Field(default=None, description="The type of the refused message, when known.")
    ref_id: str | None = Field(default=None, max_length=64, description="The ``id`` of the request answered.")
    retry_after: float | None = Field(default=None, ge=0, le=3600, description="Set when the refusal is the "
                                      "transport's, not a verdict on the content (over the rate budget): nothing was "
                                      "applied, and the same request may be sent again after this many seconds.")


class Submitted(_Msg):
    """The answer to a ``submit``: one verdict per returned group, in order, and the lease it asked for."""

    type: Literal["submitted"] = "submitted"
    job_id: int
    results: list[Accepted] = Field(default_factory=list)
    lease: Lease | NoWork | None = Field(default=None, description="The next leases (``lease`` > 0 was asked), or "
                                         "``no_work`` with when to ask again.")
    earned_usd: float | None = Field(default=None, ge=0, le=1e12, description="What the site's ledger has billed "
                                     "for this worker so far, USD, every job (its provider's earnings from it), as "
                                     "of a sum at most 10 s old. None: an older site.")
    ref_id: str | None = Field(default=None, max_length=64, description="The ``id`` of the request answered.")


SiteMessage = Annotated[
    Welcome | Assign | Release | Lease | NoWork | SnapshotAvailable | Accepted | Rejected | Submitted,
    Field(discriminator="type"),
]

_agent_adapter: TypeAdapter[AgentMessage] = TypeAdapter(AgentMessage)
_site_adapter: TypeAdapter[SiteMessage] = TypeAdapter(SiteMessage)


def _parse(adapter: TypeAdapter, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise MessageError("a message must be a JSON object")
    if "type" not in raw:
        raise MessageError("a message needs a 'type' field")
    try:
        return adapter.validate_python(raw)
    except ValidationError as err:
        if err.errors()[0]["type"] == "union_tag_invalid":
            raise MessageError(f"unknown message type {raw.get('type')!r}") from None
        raise MessageError(error_reason(err, default="message")) from None


def parse_agent_message(raw: Any) -> AgentMessage:
    return _parse(_agent_adapter, raw)


def parse_agent_json(text: str | bytes) -> AgentMessage:
    """An agent message straight from its frame's text, by pydantic's own JSON parser: no tree of Python objects
    is built first, which is most of the cost of a large group. It accepts what
    :func:`parse_agent_message` of the parsed text accepts; its reasons may be worded differently, so a caller that
    shows one parses the frame that way again (see ``marketplace.realtime.consumers``)."""
    try:
        return _agent_adapter.validate_json(text)
    except ValidationError as err:
        raise MessageError(error_reason(err, default="message")) from None


def parse_site_message(raw: Any) -> SiteMessage:
    return _parse(_site_adapter, raw)
