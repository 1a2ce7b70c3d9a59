"""``GET /api/jobs/<id>/export/``: a published snapshot as a Hugging Face model directory in a tar archive.

The site keeps no weights: the learner does, and serves them to credential holders (learner/serving.py).
The site holds each job's transfer secret, so it issues itself a credential (worker id 0: no worker) for
versions 0..v, fetches the base (version 0: config and tokenizer, reading only the chunks that hold them)
and version ``v`` from the snapshot URLs the learner announced (checked when they were published:
marketplace/core/addresses.py), and streams the archive that :mod:`dataplane.export` plans, chunk by chunk,
verified against the manifests the site recorded. Only the job's owner may export (a job is otherwise
404 to strangers, as everywhere; staff are refused: weights are the owner's).

The learner serves snapshots while it runs. Once it has exited the reply says so and names the learner-side
command (``echo2-learner export``), which reads its snapshot directory directly: a 409 for a job that has ended (its
learner exits with it: foreseeable, nothing to retry), a 503 for a running job whose learner does not answer.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from rest_framework import status
from rest_framework.exceptions import APIException, NotFound, PermissionDenied, ValidationError

from dataplane.chat import as_prompt_format
from dataplane.export import ExportError, Member, plan, tar_size, tar_stream
from dataplane.snapshot import Manifest, SnapshotError
from dataplane.weights import DTYPES

from ..infra.learner_fetch import version_source
from ..models import Job, Snapshot

log = logging.getLogger(__name__)
UNREACHABLE = "the learner's snapshot server could not be reached"
"""What the owner is told of any failure to fetch but a 404: a closed port, a service that is not HTTP, a timeout, a
TLS error, a refusal, bytes that do not verify, an address the rules refuse all read the same (the log has which),
so an export cannot be used to learn what answers at an address."""


class LearnerUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "the job's learner does not answer"


class JobEnded(APIException):
    """A finished job's learner has exited with it (learner/trainer.py): a state the owner can foresee, not an
    outage, so a 409 that says how to get the model instead of a 503 to retry."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "the job has ended and its learner with it"


class LearnerRefused(APIException):
    status_code = status.HTTP_502_BAD_GATEWAY
    default_detail = "the job's learner refused"


@dataclass(frozen=True)
class Export:
    job_id: int
    version: int
    dtype: str
    members: list[Member]

    @property
    def folder(self) -> str:
        return f"job{self.job_id}-v{self.version}"

    @property
    def size(self) -> int:
        return tar_size(self.members, self.folder)

    def pieces(self) -> Iterator[bytes]:
        return tar_stream(self.members, self.folder)


async def off_the_loop(pieces: Iterator[bytes]) -> AsyncIterator[bytes]:
    """``pieces`` for an ASGI response: each read from the learner in a worker thread. (Given a plain iterator,
    Django under ASGI would read the whole archive into memory before sending a byte.)"""
    while (piece := await sync_to_async(next, thread_sensitive=False)(pieces, None)) is not None:
        yield piece


def parse_query(params) -> tuple[int | None, str]:  # noqa: ANN001 - a QueryDict
    """``?version=`` (default: the newest published) and ``?dtype=`` (as-trained or bf16), or a 400."""
    version, dtype = params.get("version"), params.get("dtype", "as-trained")
    errors = {}
    if version is not None and not (version.isascii() and version.isdigit() and len(version) <= 10):
        errors["version"] = ["must be a non-negative integer"]
    if dtype not in DTYPES:
        errors["dtype"] = [f"must be one of {', '.join(DTYPES)}"]
    if errors:
        raise ValidationError(errors)
    return (int(version) if version is not None else None), dtype


def job_export(*, job: Job, user, version: int | None, dtype: str) -> Export:
    """The planned export of ``version`` of ``job`` (default: the newest published) for ``user``: the learner
    was reached and the config, tokenizer and weights' header read, so a failure is an error reply, not a
    broken download. Raises 403, 404 (with the reason), 400, 502 or 503."""
    if job.owner_id != user.pk:
        raise PermissionDenied("only the job's owner may export its weights")
    published = sorted(job.snapshots.values_list("version", flat=True))
    if not published:
        raise NotFound(f"job {job.pk} has published no snapshot yet")
    version = published[-1] if version is None else version
    if version not in published:
        shown = ", ".join(map(str, published[-10:]))
        raise NotFound(f"job {job.pk} has no snapshot version {version} (published: "
                       f"{'..., ' if len(published) > 10 else ''}{shown})")
    if published[0] != 0:
        raise NotFound(f"job {job.pk} has no base snapshot (version 0), which holds its config and tokenizer")
    snapshots = {s.version: s for s in job.snapshots.filter(version__in={0, version})}
    try:
        base = _source(job, snapshots[0], version)
        snapshot = _source(job, snapshots[version], version)
        members = plan(*base, *snapshot, dtype=dtype, prompt_format=as_prompt_format(job.settings.prompt_format))
    except SnapshotError as err:
        raise _learner_error(job, version, err) from None
    except ExportError as err:
        field, _, reason = str(err).partition(": ")
        if field == "dtype":
            raise ValidationError({"dtype": [reason]}) from None
        raise LearnerRefused(f"version {version} cannot be exported: {err}") from None
    return Export(job.pk, version, dtype, members)


def _source(job: Job, snap: Snapshot, highest: int) -> tuple[Manifest, Callable[[int], bytes]]:
    """The manifest and chunk reader of ``snap``'s full payload (a delta version's is served under full/)."""
    return version_source(job_id=job.pk, secret=job.transfer_secret, url=snap.url, manifest=snap.manifest,
                          highest=highest)


def _learner_error(job: Job, version: int, err: SnapshotError) -> APIException:
    offline = (f"on the learner's machine, `echo2-learner export --job {job.pk} --version {version} --out DIR` "
               "(with its --snapshot-dir) reads it from disk")
    if err.status == 404:
        return NotFound(f"version {version} of job {job.pk} is no longer on its learner (it keeps the base, the "
                        f"newest S+2 versions and those of the last --snapshot-retain seconds); {offline}")
    log.warning("export of job %s version %s: %s", job.pk, version, err)
    if job.is_terminal:
        return JobEnded(f"job {job.pk} is {job.status}: {UNREACHABLE} (it serves snapshots only while it runs) and "
                        f"it exits when the job ends; the site keeps no weights: {offline}")
    return LearnerUnavailable(f"{UNREACHABLE} (it serves snapshots only while it runs); {offline}")
