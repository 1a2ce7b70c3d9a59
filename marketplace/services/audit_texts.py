"""The site decodes the text failures a learner reported, with the job's own tokenizer, off the request path
(docs/trust.md "Audits the site checks").

At the report (``services/audit_verify.py``) a text failure whose claimed text is the worker's is ``consistent``
and marked ``site_decode: pending``; the report enqueues the Celery task ``audit_texts_decode``, which runs this:
for every such failure of the job, the sealed group is read again (held copy or stream entry, under the site's seal
and the lease the verdict was given on), the job's tokenizer is had from its version 0
(``infra/job_tokenizer.py``), and each record is decoded as the workers decode it
(``core/audit_checks.decoded_verdict``): ``verified`` (counts toward suspension), ``refused`` (the owner's learner
called a right text wrong), or ``consistent`` with the reason (no tokenizer to be had, a multi-turn record, the
group no longer held). Then the worker's totals, the owner's credit for failed work and a suspension follow as at a
report (``services/audits.py worker_audits_settle``). Nothing here raises for a failure of the learner, its chunks
or the tokenizer: each is a reason in the verdict.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from django.db import transaction

from dataplane.audit_hold import held_entries
from dataplane.chat import as_prompt_format
from dataplane.replay import RedisError
from dataplane.stored import field as stored_field
from dataplane.stored import stored_entry, text

from ..core import audit_checks as checks
from ..core.audit_checks import CONSISTENT, REFUSED, VERIFIED, SiteCheck
from ..infra import group_seal, job_tokenizer, stream
from ..models import Job, Snapshot, WorkerAudit
from .audit_verify import DECODE, DECODED, NOT_DECODED, PENDING, SEALED_LEASE
from .audits import worker_audits_settle

log = logging.getLogger(__name__)


def audit_texts_decode(*, job_id: int) -> int:
    """Decode every text failure of job ``job_id`` still pending and store the site's verdicts; returns how many
    were decided. The tokenizer is read (and the decoding runs) outside any transaction: no row is locked while the
    learner is waited on."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return 0
    pending = [(row_id, worker_id, item)
               for row_id, worker_id, evidence in WorkerAudit.objects.filter(job=job, failed_consistent__gt=0)
               .values_list("pk", "worker_id", "evidence")
               for item in evidence if item.get(DECODE) == PENDING]
    if not pending:
        return 0
    try:
        verdicts = _decode(job, [(worker_id, item) for _, worker_id, item in pending])
    except RedisError as err:  # the held copies cannot be read now: still pending, for the job's next report
        log.warning("job %s: text failures not decoded by the site (Redis: %s)", job.pk, err)
        return 0
    with transaction.atomic():
        rows = {row.pk: row for row in WorkerAudit.objects.select_for_update(no_key=True).filter(
            pk__in={row_id for row_id, _, _ in pending}).order_by("pk")}
        decided: dict[int, list[dict[str, Any]]] = {}
        for (row_id, _, item), (verdict, state) in zip(pending, verdicts, strict=True):
            row = rows.get(row_id)
            if row is not None and _apply(row, item["entry_id"], verdict, state):
                decided.setdefault(row.pk, []).append(item["entry_id"])
        for row_id, entries in decided.items():
            row = rows[row_id]
            row.save(update_fields=["evidence", "failed_verified", "failed_consistent", "failed_refused"])
            settled = [e for e in row.evidence if e.get("entry_id") in entries]
            worker_audits_settle(job=job, worker_id=row.worker_id, evidence=settled, failed=True, reason=row.reason,
                                 what=f"step {row.step} (texts decoded by the site)")
    return sum(map(len, decided.values()))


def _decode(job: Job, failures: list[tuple[int, dict[str, Any]]]) -> list[tuple[SiteCheck, str]]:
    """The site's verdict on each ``(worker id, evidence item)``, in order, each with :data:`DECODED` or, where no
    decoding could be done, :data:`NOT_DECODED`."""
    stored = held_entries(stream.client(), job.pk, [item["entry_id"] for _, item in failures])
    keys, one_turn = group_seal.verifying_keys(), checks.one_turn_task(job.settings.task)
    verdicts: list[tuple[SiteCheck, str] | None] = []
    items: list[dict[str, Any]] = []
    for worker_id, item in failures:
        group, why = _sealed_group(job, worker_id, item, stored.get(item["entry_id"]), keys)
        if group is None:
            verdicts.append((_not_decoded(why), NOT_DECODED))
            continue
        record = item.get("record", 0)
        items.append(checks.text_item(group, record, checks.text_parts(item, group, record), one_turn=one_turn))
        verdicts.append(None)
    if items:
        try:
            decoded = iter([(v, DECODED) for v in job_tokenizer.decoded_verdicts(
                _tokenizer(job), prompt_format=as_prompt_format(job.settings.prompt_format).model_dump(mode="json"),
                items=items)])
        except job_tokenizer.TokenizerUnavailable as err:
            log.warning("job %s: text failures not decoded by the site: %s", job.pk, err)
            decoded = iter([(_not_decoded(str(err)), NOT_DECODED)] * len(items))
        verdicts = [v if v is not None else next(decoded) for v in verdicts]
    return verdicts  # type: ignore[return-value]  # every None was replaced


def _not_decoded(why: str) -> SiteCheck:
    return SiteCheck(CONSISTENT, f"the claimed text is the worker's; the site could not decode its ids: {why}")


def _sealed_group(job: Job, worker_id: int, item: dict[str, Any], fields: dict | None, keys: list[bytes]):
    """(the group the verdict was given on, "") or (None, why it is not to be had now)."""
    entry = item["entry_id"]
    if fields is None:
        return None, f"entry {entry} is no longer held"
    if checks.seal_verdict(fields, entry=entry, job_id=job.pk, keys=keys) is not None \
            or text(stored_field(fields, "lease_id")) != item.get(SEALED_LEASE):
        return None, f"entry {entry} is no longer the sealed group the report was checked against"
    group = stored_entry(entry, fields)
    if group.worker_id != worker_id or group.packed is None or not 0 <= item.get("record", 0) < len(group.packed):
        return None, f"entry {entry} is no longer the sealed group the report was checked against"
    return group, ""


def _tokenizer(job: Job) -> Path:
    """The folder of the job's tokenizer (``infra.job_tokenizer.base_tokenizer``), or TokenizerUnavailable."""
    base = Snapshot.objects.filter(job=job, version=0).values("url", "manifest").first()
    if base is None:
        raise job_tokenizer.TokenizerUnavailable("the job has published no base snapshot (version 0), which holds "
                                                 "its tokenizer")
    return job_tokenizer.base_tokenizer(job_id=job.pk, secret=job.transfer_secret, url=base["url"],
                                        manifest=base["manifest"])


def _apply(row: WorkerAudit, entry: str, verdict: SiteCheck, state: str) -> bool:
    """Put ``verdict`` on ``row``'s failure of ``entry`` if it is still pending (a report sent again meanwhile keeps
    it pending, with its verdict): its count moved from consistent to the verdict's. Whether it was."""
    for item in row.evidence:
        if item.get("entry_id") == entry and item.get(DECODE) == PENDING and not item.get("passed"):
            item.update({**verdict.as_dict(), DECODE: state})
            if verdict.status in (VERIFIED, REFUSED):
                row.failed_consistent -= 1
                setattr(row, f"failed_{verdict.status}", getattr(row, f"failed_{verdict.status}") + 1)
            if verdict.status == REFUSED:
                log.warning("job %s step %s: FORGED audit report refused: worker %s entry %s: %s", row.job_id,
                            row.step, row.worker_id, entry, verdict.why)
            return True
    return False
