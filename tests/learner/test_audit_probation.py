"""The audits' probation survives a learner restart (learner/audit_probation.py: kept in the checkpoint by
learner/loop.py, restored by learner/trainer.py): a worker that passed its probation is not audited in full again
as if new, a worker that failed, before the checkpoint or after it, is still on full audit, and groups read but not
yet trained are not counted twice (a restarted learner reads them again)."""

from __future__ import annotations

import redis

from dataplane import audit_hold, replay
from dataplane.stored import StoredGroup
from learner.audit import audit_fraction
from learner.trainer import _audit_ready

from .test_audit import auditor, honest_group
from .test_loop import JOB, make_loop


def entry(*, worker_id: int) -> dict:
    """A stream entry's fields as the site writes them (its data does not matter here)."""
    return {"lease_id": "l", "worker_id": str(worker_id), "data": b"{}"}


def test_a_restarted_learner_keeps_each_workers_probation(redis_url, tiny_model_dir, tmp_path) -> None:
    client = redis.Redis.from_url(redis_url)
    before = make_loop(redis_url, tiny_model_dir, tmp_path)
    before.consumer.audit = audit = auditor(tiny_model_dir, fraction=0.05, probation=16)
    audit.seen.update({3: 400, 5: 20, 8: 0, 6: 300})  # 3 and 6 long past probation, 5 near its end, 8 just failed
    old_failure = client.xadd(replay.trajectories_key(JOB), entry(worker_id=3)).decode()
    audit.read_through = "99999999999999-0"  # ... counted in the checkpoint: 3 failed before it (and passed since)
    unread = StoredGroup("9-0", honest_group(tiny_model_dir, lease="u"), worker_id=5)
    before.consumer.buffer.append(unread)  # read, not trained: a restart reads it again
    before.write_checkpoint()

    # After the checkpoint, worker 6 fails: its entry is held for the site, and then the process dies.
    late = client.xadd(replay.trajectories_key(JOB), entry(worker_id=6), id="999999999999999-0").decode()
    assert audit_hold.hold(client, JOB, [old_failure, late]) == 2

    after = make_loop(redis_url, tiny_model_dir, tmp_path)
    ckpt = after.resume()
    after.consumer.audit = fresh = auditor(tiny_model_dir, fraction=0.05, probation=16)
    _audit_ready(after.consumer, client, JOB, ckpt)

    assert dict(fresh.seen) == {3: 400, 5: 19, 8: 0, 6: 0}
    share = {w: audit_fraction(fresh.seen[w], base=0.05, probation=16) for w in (3, 5, 6, 8, 11)}
    assert share[3] == 0.05 and share[5] < 1.0  # not audited in full again as if new
    assert share[6] == share[8] == share[11] == 1.0  # failed after the checkpoint, before it, a new worker: all
    assert fresh.hold is not None  # failed entries are held for the site again


def test_a_checkpoint_without_probation_starts_every_worker_on_probation(redis_url, tiny_model_dir, tmp_path) -> None:
    """A checkpoint written with audits off (or before the probation was kept) restores nothing: full audit."""
    loop = make_loop(redis_url, tiny_model_dir, tmp_path)
    loop.write_checkpoint()
    after = make_loop(redis_url, tiny_model_dir, tmp_path)
    ckpt = after.resume()
    assert ckpt.state["audit_probation"] == {}
    after.consumer.audit = fresh = auditor(tiny_model_dir, fraction=0.05, probation=16)
    ckpt.state.pop("audit_probation")
    _audit_ready(after.consumer, redis.Redis.from_url(redis_url), JOB, ckpt)
    assert not fresh.seen
