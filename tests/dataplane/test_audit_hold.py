"""Held copies of failed entries (dataplane/audit_hold.py) on a real Redis: the copy is the stream entry as the site
stored it, made inside Redis, and it outlives the learner's acknowledgement (which deletes the entry)."""

from __future__ import annotations

from dataplane.audit_hold import held_groups, held_key, hold
from dataplane.records import TrajectoryGroup
from dataplane.replay import ReplayBuffer, connect


def _group(lease_id: str, group_id: str, prompt: str, reward: float) -> TrajectoryGroup:
    record = {"job_id": 7, "lease_id": lease_id, "group_id": group_id, "prompt": prompt, "prompt_ids": [1, 5],
              "completion": "7", "completion_ids": [12, 2], "logprobs": [-1.5, -0.2], "reward": reward, "version": 3}
    return TrajectoryGroup.model_validate({"job_id": 7, "lease_id": lease_id, "group_id": group_id, "version": 3,
                                          "records": [record, record]})


def test_a_held_entry_outlives_its_acknowledgement(redis_url):
    client = connect(redis_url, decode_responses=True)
    replay = ReplayBuffer(client, 7)
    replay.ensure_groups()
    replay.add_prompts(["1+6=", "2+2="])
    leased = replay.lease(worker_id=4, count=2, timeout_s=60)
    ids = [replay.return_group(worker_id=4, group=_group(p.lease_id, p.group_id, p.prompt, 1.0)) for p in leased]
    assert {g.worker_id for g in held_groups(client, 7, ids).values()} == {4}  # still in the stream: read there

    assert hold(client, 7, [ids[0], "99999999999999-0"]) == 1  # an id not in the stream has nothing to copy
    replay.ack(ids)  # the learner drops both: deleted from the stream
    found = held_groups(client, 7, ids)
    assert list(found) == [ids[0]]  # the held one stays, the other is gone
    group = found[ids[0]]
    assert (group.worker_id, group.version, group.packed.rewards, group.packed.prompts[0]) == (4, 3, [1.0, 1.0],
                                                                                             leased[0].prompt)
    assert 0 < client.ttl(held_key(7, ids[0])) <= 7 * 86_400
    assert hold(client, 7, [ids[0]]) == 0  # gone from the stream: the copy stays as it was
    assert held_groups(client, 8, ids) == {}  # another job's keys hold nothing of this one
