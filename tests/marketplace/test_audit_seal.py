"""The site believes a stored group in an audit only under its own seal (dataplane/seal.py,
marketplace/infra/group_seal.py, services/audit_verify.py; docs/trust.md "Audits the site checks"), on the real
database and Redis.

The job owner's learner holds the job's Redis URL with write access: it can write an entry of its own into the
stream or into an audit hold, naming an honest worker with a wrong reward, or alter a held copy. None of that may
count against the worker; a real wrong reward the site accepted and sealed still does."""

from __future__ import annotations

import logging

import pytest

from dataplane import audit_hold
from dataplane.groupcodec import decode_group, encode_group
from dataplane.records import TrajectoryGroup
from dataplane.replay import NEVER_DECODE
from marketplace.infra import stream
from marketplace.models import WorkerAudit

from . import test_audit_site_checks as site_checks
from .test_audit_site_checks import statuses
from .test_audits import entries, report, reward_failures

pytestmark = pytest.mark.django_db
market = site_checks.market  # the fixture: an honest worker and a cheat delivered to one owner's job


def stored_fields(job, entry_id: str) -> dict[bytes, bytes]:
    [(_, flat)] = stream.client().execute_command("XRANGE", stream.replay(job.pk).trajectories, entry_id, entry_id,
                                                  **{NEVER_DECODE: True})
    return dict(zip(flat[::2], flat[1::2], strict=True)) if isinstance(flat, list) else dict(flat)


def held_fields(key: str) -> dict[bytes, bytes]:
    return dict(stream.client().execute_command("HGETALL", key, **{NEVER_DECODE: True}))


def lying(data: bytes) -> bytes:
    """The group of ``data`` with every reward turned the other way (the task's 0 or 1)."""
    doc = decode_group(data).model_dump()
    for record in doc["records"]:
        record["reward"] = 1.0 - record["reward"]
    return encode_group(TrajectoryGroup.model_validate(doc))


def held(job, entry_id: str) -> str:
    """Hold ``entry_id`` as the learner does before dropping it, then drop it: the held copy is all that is left."""
    assert audit_hold.hold(stream.client(), job.pk, [entry_id]) == 1
    stream.replay(job.pk).ack([entry_id])
    return audit_hold.held_key(job.pk, entry_id)


def failure_of(entry_id: str, data: bytes) -> dict:
    """A reward failure of record 0 of the group ``data`` stored under ``entry_id``, as a learner states it."""
    group = decode_group(data)
    return {"entry_id": entry_id, "group_id": group.group_id, "version": group.version, "check": "reward",
            "passed": False, "record": 0, "claimed_reward": group.records[0].reward,
            "recomputed_reward": 1.0 - group.records[0].reward}


def test_records_the_learner_wrote_itself_are_refused(market, caplog):
    """A fake entry in the stream (an honest entry's fields with lying rewards, its seal copied along), a fake held
    copy under an entry id the site never used (a made-up seal), and the honest worker's own held copy with its
    rewards altered after the site sealed it: all refused as forged, none counted. Without the seal each would have
    been re-scored as a wrong reward and verified."""
    api, job, honest = market["api"], market["job"], market["honest"]
    client, mine = stream.client(), entries(job, honest)
    real = stored_fields(job, mine[0].entry_id)
    assert real[b"seal"] and len(real[b"seal"]) == 64

    fake_in_stream = client.xadd(stream.replay(job.pk).trajectories, {**real, b"data": lying(real[b"data"])})
    fake_held_id = "1-0"
    client.hset(audit_hold.held_key(job.pk, fake_held_id),
                mapping={**real, b"data": lying(real[b"data"]), b"seal": b"ab" * 32})
    altered_key = held(job, mine[1].entry_id)
    altered = held_fields(altered_key)
    client.hset(altered_key, b"data", lying(altered[b"data"]))

    forged = [failure_of(fake_in_stream, lying(real[b"data"])), failure_of(fake_held_id, lying(real[b"data"])),
              failure_of(mine[1].entry_id, lying(altered[b"data"]))]
    with caplog.at_level(logging.WARNING, logger="marketplace.services.audit_verify"):
        assert report(api, job, 1, [{"worker_id": honest.pk, "passed": 0, "failed": 3, "reason": "made up",
                                     "evidence": forged}]).status_code == 201
    assert statuses(job, honest) == ["refused"] * 3
    row = WorkerAudit.objects.get(job=job, worker=honest, step=1)
    assert all("seal is not the site's" in e["site_reason"] for e in row.evidence)
    assert sum("FORGED audit report refused" in r.message and "seal" in r.message for r in caplog.records) == 3
    honest.refresh_from_db()
    assert (honest.audits_failed, honest.suspended_at) == (0, None)


def test_a_sealed_wrong_reward_is_verified_held_or_in_the_stream_and_counted_once(market):
    """The cheat's own wrong rewards, sealed by the site: verified in the stream and from a held copy; the same
    sealed group copied by the learner under another entry id is the same failure, refused the second time, in the
    same report or a later one."""
    api, job, cheat = market["api"], market["job"], market["cheat"]
    live, kept = reward_failures(job, cheat, 2)
    held(job, kept["entry_id"])
    copy = stream.client().xadd(stream.replay(job.pk).trajectories, stored_fields(job, live["entry_id"]))
    assert report(api, job, 1, [{"worker_id": cheat.pk, "passed": 0, "failed": 3, "reason": "records.0.reward",
                                 "evidence": [live, kept, {**live, "entry_id": copy}]}]).status_code == 201
    assert statuses(job, cheat) == ["verified", "verified", "refused"]
    assert "reported failed already" in WorkerAudit.objects.get(job=job, worker=cheat).evidence[2]["site_reason"]
    cheat.refresh_from_db()
    assert cheat.audits_failed == 2 and cheat.suspended_at is not None

    again = stream.client().xadd(stream.replay(job.pk).trajectories, stored_fields(job, live["entry_id"]))
    assert report(api, job, 2, [{"worker_id": cheat.pk, "passed": 0, "failed": 1, "reason": "records.0.reward",
                                 "evidence": [{**live, "entry_id": again}]}]).status_code == 201
    assert statuses(job, cheat)[-1] == "refused"
    # step 1 sent again, the copy first: the original keeps its verdict, the copy is refused
    third = stream.client().xadd(stream.replay(job.pk).trajectories, stored_fields(job, live["entry_id"]))
    assert report(api, job, 1, [{"worker_id": cheat.pk, "passed": 0, "failed": 3, "reason": "records.0.reward",
                                 "evidence": [{**live, "entry_id": third}, live, kept]}]).status_code == 201
    assert [e["site"] for e in WorkerAudit.objects.get(job=job, worker=cheat, step=1).evidence] == \
        ["refused", "verified", "verified"]
    cheat.refresh_from_db()
    assert cheat.audits_failed == 2


def test_a_record_stored_before_groups_were_sealed_is_unverified(market):
    """An entry without a seal (appended by the site before this change, or by anyone without one): its content is
    not believed either way, so a wrong reward in it is unverified and not counted."""
    api, job, cheat = market["api"], market["job"], market["cheat"]
    [failure] = reward_failures(job, cheat, 1)
    fields = stored_fields(job, failure["entry_id"])
    del fields[b"seal"]
    old = stream.client().xadd(stream.replay(job.pk).trajectories, fields)
    assert report(api, job, 1, [{"worker_id": cheat.pk, "passed": 0, "failed": 1, "reason": "records.0.reward",
                                 "evidence": [{**failure, "entry_id": old}]}]).status_code == 201
    [checked] = WorkerAudit.objects.get(job=job, worker=cheat).evidence
    assert checked["site"] == "unverified" and "no seal" in checked["site_reason"]
    cheat.refresh_from_db()
    assert cheat.audits_failed == 0


def test_a_rotated_secret_still_verifies_what_it_sealed(market, settings):
    """Groups sealed under the old SECRET_KEY verify after a rotation while it is in SECRET_KEY_FALLBACKS, and are
    refused once it is dropped from them."""
    api, job, cheat = market["api"], market["job"], market["cheat"]
    first, second = reward_failures(job, cheat, 2)
    old = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "a-new-secret-after-rotation", [old]
    assert report(api, job, 1, [{"worker_id": cheat.pk, "passed": 0, "failed": 1, "reason": "records.0.reward",
                                 "evidence": [first]}]).status_code == 201
    settings.SECRET_KEY_FALLBACKS = []
    assert report(api, job, 2, [{"worker_id": cheat.pk, "passed": 0, "failed": 1, "reason": "records.0.reward",
                                 "evidence": [second]}]).status_code == 201
    assert statuses(job, cheat) == ["verified", "refused"]
