"""The audits' probation survives a learner restart (learner/audit.py ``probation_state``, kept in the checkpoint by
learner/loop.py, restored by learner/trainer.py): a worker that passed its probation is not audited in full again
as if new, a worker that just failed is still on full audit, and groups read but not yet trained are not counted
twice (a restarted learner reads them again)."""

from __future__ import annotations

import redis

from dataplane.stored import StoredGroup
from learner.audit import audit_fraction
from learner.trainer import _audit_ready

from .test_audit import auditor, honest_group
from .test_loop import make_loop


def test_a_restarted_learner_keeps_each_workers_probation(redis_url, tiny_model_dir, tmp_path) -> None:
    before = make_loop(redis_url, tiny_model_dir, tmp_path)
    before.consumer.audit = audit = auditor(tiny_model_dir, fraction=0.05, probation=16)
    audit.seen.update({3: 400, 5: 20, 8: 0})  # 3 long past probation, 5 near its end, 8 just failed
    unread = StoredGroup("9-0", honest_group(tiny_model_dir, lease="u"), worker_id=5)
    before.consumer.buffer.append(unread)  # read, not trained: a restart reads it again
    before.write_checkpoint()

    after = make_loop(redis_url, tiny_model_dir, tmp_path)
    ckpt = after.resume()
    after.consumer.audit = fresh = auditor(tiny_model_dir, fraction=0.05, probation=16)
    _audit_ready(after.consumer, redis.Redis.from_url(redis_url), 9, ckpt)

    assert dict(fresh.seen) == {3: 400, 5: 19, 8: 0}
    share = {w: audit_fraction(fresh.seen[w], base=0.05, probation=16) for w in (3, 5, 8, 11)}
    assert share[3] == 0.05 and share[5] < 1.0  # not audited in full again as if new
    assert share[8] == 1.0 and share[11] == 1.0  # the one that failed, and a new worker: every group
    assert fresh.hold is not None  # failed entries are held for the site again


def test_a_checkpoint_without_probation_starts_every_worker_on_probation(redis_url, tiny_model_dir, tmp_path) -> None:
    """A checkpoint written before the probation was kept (or with audits off) restores nothing: full audit."""
    loop = make_loop(redis_url, tiny_model_dir, tmp_path)
    loop.write_checkpoint()
    after = make_loop(redis_url, tiny_model_dir, tmp_path)
    ckpt = after.resume()
    assert ckpt.state["audit_probation"] == {}
    after.consumer.audit = fresh = auditor(tiny_model_dir, fraction=0.05, probation=16)
    ckpt.state.pop("audit_probation")
    _audit_ready(after.consumer, redis.Redis.from_url(redis_url), 9, ckpt)
    assert not fresh.seen
