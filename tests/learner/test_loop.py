"""The core loop on a real Redis, in-process: acknowledgement waits for the checkpoint, a crash between the
checkpoint and the acknowledgement trains nothing twice, a checkpoint of another job is refused, and the
site/checkpoint consistency rules."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
import torch

from dataplane import replay
from dataplane.jobs import JobSpec
from dataplane.tasks import build_task
from learner.checkpoint import CheckpointStore, capture_rng, restore_rng
from learner.consumer import StalenessGatedConsumer
from learner.loop import LearnerLoop, ResumeError, check_resume
from learner.outbox import Outbox
from learner.policy import build_policy
from learner.prompts import PromptFeeder

from ..groups import entry_ids, stream_fields

JOB = 9


def append_group(client, group: int, version: int = 0) -> str:
    records = [{"job_id": JOB, "lease_id": f"l{group}", "group_id": f"g{group}", "prompt": "3+4=",
                "prompt_ids": [1, 10, 5, 11, 17], "completion": answer, "completion_ids": [7 + int(answer), 2],
                "logprobs": [-2.0, -1.0], "reward": reward, "version": version}
               for answer, reward in (("7", 1.0), ("5", 0.0))]
    return client.xadd(replay.trajectories_key(JOB), stream_fields(records))


def make_loop(redis_url: str, model_dir: Path, root: Path, *, staleness: int = 50, identity: dict | None = None,
              background: bool = False, feeder: bool = False):
    """The loop; ``background``: as run_job builds it (checkpoints written and prompts topped up on threads of their
    own, the next batch read ahead)."""
    spec = JobSpec(name="loop", model_dir=str(model_dir), task={"name": "arithmetic"}, staleness=staleness, kappa=2,
                   batch_trajectories=4, group_size=2, max_steps=10)
    trainer, _ = build_policy(spec, device="cpu")
    client = redis.Redis.from_url(redis_url)
    consumer = StalenessGatedConsumer(client, JOB, spec.staleness, prefetch=background)
    prompts = PromptFeeder(client, job_id=JOB, task=build_task(spec.task), seed=0, backlog=4,
                           background=background) if feeder else None
    return LearnerLoop(spec=spec, trainer=trainer, consumer=consumer, checkpoints=CheckpointStore(root),
                       identity=identity or {"job_id": JOB, "created_at": "t0"}, background=background, feeder=prompts)


def stream_ids(client) -> list[str]:
    return entry_ids(client, replay.trajectories_key(JOB))


def test_acknowledgement_waits_for_the_checkpoint(redis_url, redis_client, tiny_model_dir, tmp_path) -> None:
    ids = [append_group(redis_client, g) for g in range(4)]
    loop = make_loop(redis_url, tiny_model_dir, tmp_path)

    first = loop.step(timeout_s=5)  # v1: not a checkpoint step (kappa = 2)
    assert first.version == 1 and not first.checkpointed
    assert stream_ids(redis_client) == ids  # trained, but only pending: a crash now would train them again
    second = loop.step(timeout_s=5)  # v2: checkpoint, then acknowledge both updates' groups
    assert second.checkpointed and second.entry_ids == ids[2:]
    assert stream_ids(redis_client) == []
    assert CheckpointStore(tmp_path).load().trained_entry_ids == ids


def test_a_checkpoint_keeps_the_reports_the_site_may_not_have_for_a_learner_killed_before_sending_them(
        redis_url, redis_client, tiny_model_dir, tmp_path) -> None:
    """Its own step's report, and the earlier ones still queued in the outbox (sent from a thread): a learner killed
    right after the checkpoint lost them all, and the fault bench saw steps missing from the site."""
    for g in range(4):
        append_group(redis_client, g)
    loop = make_loop(redis_url, tiny_model_dir, tmp_path)
    built, queued = [], []

    def report(outcome):
        built.append(outcome.version)
        return {"step": outcome.version, "entries": outcome.entry_ids}

    first = loop.step(timeout_s=5, report=report, unsent=lambda: list(queued))  # v1: no checkpoint, nothing kept
    queued.append({"step": 1, "entries": first.entry_ids})  # what the outbox still holds when v2 is checkpointed
    second = loop.step(timeout_s=5, report=report, unsent=lambda: list(queued))
    assert built == [2]
    assert CheckpointStore(tmp_path).load().state["reports"] == [{"step": 1, "entries": first.entry_ids},
                                                                 {"step": 2, "entries": second.entry_ids}]


@pytest.mark.parametrize(("state", "reported_version", "sent"), [
    ({"reports": [{"step": 3}, {"step": 4}, {"step": 5}]}, 3, [4, 5]),  # the site got step 3 before the kill
    ({"reports": [{"step": 3}, {"step": 4}]}, 4, []),  # it got them all
    ({"reports": []}, 0, []),
    ({"report": {"step": 4}}, 3, [4]),  # a checkpoint written before "reports": its own step's report
    ({"report": None}, 3, []),
])
def test_a_restarted_learner_sends_what_its_checkpoint_kept_and_the_site_lacks(state, reported_version, sent) -> None:
    outbox = SimpleNamespace(sent=[])
    outbox.report = lambda metrics: outbox.sent.append(metrics["step"])
    Outbox.resend(outbox, state, reported_version)
    assert outbox.sent == sent


def test_background_commits_take_the_same_updates_and_acknowledge_only_committed_entries(
        redis_url, redis_client, tiny_model_dir, tmp_path) -> None:
    """run_job's loop (checkpoints written by the committer's thread from a copy of the state, the next batch read
    ahead, prompts topped up on the feeder's thread) writes the very checkpoints the plain loop writes, and an
    entry leaves the stream only once the checkpoint holding it is on disk."""
    plain_ids = [append_group(redis_client, g) for g in range(12)]
    plain = make_loop(redis_url, tiny_model_dir, tmp_path / "plain", feeder=True)
    for _ in range(6):
        plain.step(timeout_s=5)
    redis_client.flushdb()
    ids = [append_group(redis_client, g) for g in range(12)]  # the same groups under new entry ids
    loop = make_loop(redis_url, tiny_model_dir, tmp_path / "background", background=True, feeder=True)

    outcomes = []
    for _ in range(6):
        outcomes.append(loop.step(timeout_s=5))
        acknowledged = set(ids) - set(stream_ids(redis_client))  # first: a checkpoint read after is at least as new
        committed = CheckpointStore(tmp_path / "background").load()
        assert acknowledged <= set(ids[: 2 * committed.version] if committed else [])  # 2 entries per update
    loop.settle()
    deadline = time.monotonic() + 10
    while redis_client.xlen(replay.prompts_key(JOB)) < 4 and time.monotonic() < deadline:
        loop.feeder.request_top_up()  # on the feeder's thread, one at a time
        time.sleep(0.05)
    loop.close()

    assert [o.entry_ids for o in outcomes] == [ids[i:i + 2] for i in range(0, 12, 2)]
    assert stream_ids(redis_client) == []  # all six updates checkpointed (v6), everything acknowledged
    background, straight = (CheckpointStore(tmp_path / name).load() for name in ("background", "plain"))
    assert background.version == straight.version == 6
    assert torch.equal(background.rng["torch"], straight.rng["torch"]) and background.rng["python"] == straight.rng[
        "python"]
    assert all(background.state[k] == straight.state[k] for k in ("dropped_total", "quarantined", "recent_rewards"))
    assert background.trained_entry_ids == ids[8:] and straight.trained_entry_ids == plain_ids[8:]
    for name, tensor in straight.model.items():
        assert torch.equal(background.model[name], tensor), name
    assert redis_client.xlen(replay.prompts_key(JOB)) == 4  # topped up to the backlog by the feeder's thread


def test_crash_between_checkpoint_and_acknowledgement_trains_nothing_twice(redis_url, redis_client, tiny_model_dir,
                                                                            tmp_path) -> None:
    ids = [append_group(redis_client, g) for g in range(6)]
    before = make_loop(redis_url, tiny_model_dir, tmp_path)
    before.step(timeout_s=5)
    before.write_checkpoint()  # committed, then the process dies before acknowledging
    assert stream_ids(redis_client) == ids
    weights = {k: v.clone() for k, v in before.trainer.module.state_dict().items()}

    after = make_loop(redis_url, tiny_model_dir, tmp_path)
    ckpt = after.resume()

    assert ckpt.version == after.version == 1
    assert stream_ids(redis_client) == ids[2:]  # the checkpoint's groups are acknowledged now
    for name, tensor in after.trainer.module.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    outcome = after.step(timeout_s=5)
    assert outcome.version == 2 and outcome.entry_ids == ids[2:4]  # the next groups, not the trained ones again


def test_stale_groups_are_dropped_and_lags_reported(redis_url, redis_client, tiny_model_dir, tmp_path) -> None:
    loop = make_loop(redis_url, tiny_model_dir, tmp_path, staleness=3)
    loop.version = 4  # admissible: v >= 4 - 3 = 1
    append_group(redis_client, 0, version=0)
    kept = [append_group(redis_client, 1, version=1), append_group(redis_client, 2, version=4)]

    outcome = loop.step(timeout_s=5)

    assert outcome.dropped == 2 and loop.consumer.dropped_total == 2
    assert outcome.entry_ids == kept
    assert sorted(outcome.lags) == [0, 0, 3, 3]  # the largest lag trained is S, never more


def test_records_dropped_after_the_last_checkpoint_are_still_counted_by_a_learner_killed_before_the_next(
        redis_url, redis_client, tiny_model_dir, tmp_path) -> None:
    """A drop is acknowledged at once (it is deliberate), so the stream no longer has it; its count lives in Redis
    with the acknowledgement, not only in the next checkpoint, or the restarted learner would report it as lost."""
    first = make_loop(redis_url, tiny_model_dir, tmp_path, staleness=3)
    for g in range(8):
        append_group(redis_client, g)
    for _ in range(4):
        first.step(timeout_s=5)
    assert first.version == 4  # checkpointed (kappa = 2)
    append_group(redis_client, 8, version=0)  # stale at v4 (S = 3)
    append_group(redis_client, 9, version=4)
    append_group(redis_client, 10, version=4)
    fifth = first.step(timeout_s=5)  # v5: no checkpoint; the learner dies here
    assert fifth.dropped == 2 and not fifth.checkpointed

    restarted = make_loop(redis_url, tiny_model_dir, tmp_path, staleness=3)
    assert restarted.resume().version == 4
    assert restarted.consumer.dropped_total == 2
    assert replay.ReplayBuffer(redis_client, JOB).counters()[replay.DROPPED_STALE] == 2


def test_checkpoint_of_another_job_is_refused(redis_url, redis_client, tiny_model_dir, tmp_path) -> None:
    append_group(redis_client, 0)
    append_group(redis_client, 1)
    first = make_loop(redis_url, tiny_model_dir, tmp_path)
    first.step(timeout_s=5)
    first.commit()

    other = make_loop(redis_url, tiny_model_dir, tmp_path, identity={"job_id": JOB, "created_at": "t1"})
    with pytest.raises(ResumeError, match="not this one"):
        other.resume()


def test_resume_rules() -> None:
    path = Path("/ckpt/checkpoint.pt")
    check_resume(1, reported_version=0, published_version=0, checkpoint_version=None, path=path)  # fresh
    check_resume(1, reported_version=5, published_version=4, checkpoint_version=4, path=path)  # crashed after v4
    check_resume(1, reported_version=3, published_version=2, checkpoint_version=4, path=path)  # before reporting
    with pytest.raises(ResumeError, match="already trained 5 steps but there is no checkpoint"):
        check_resume(1, reported_version=5, published_version=4, checkpoint_version=None, path=path)
    with pytest.raises(ResumeError, match="published v6 but the checkpoint .* holds v4"):
        check_resume(1, reported_version=6, published_version=6, checkpoint_version=4, path=path)


def test_checkpoint_store_is_atomic_and_round_trips(tmp_path) -> None:
    from learner.checkpoint import Checkpoint

    store = CheckpointStore(tmp_path / "c")
    assert store.load() is None
    extra = random.Random(5)
    rng = capture_rng(extra)
    expected = [torch.rand(3).tolist(), random.random(), extra.random()]
    store.save(Checkpoint(version=3, model={"w": torch.ones(2)}, optimizer={"state": {}, "param_groups": []},
                          rng=rng, trained_entry_ids=["1-0", "2-0"], job={"job_id": 1}, state={"dropped_total": 4}))
    store.save_config({"loss": {"type": "grpo"}})

    loaded = store.load()
    restore_rng(loaded.rng, extra)
    assert [torch.rand(3).tolist(), random.random(), extra.random()] == expected
    assert loaded.version == 3 and loaded.trained_entry_ids == ["1-0", "2-0"] and loaded.state == {"dropped_total": 4}
    assert json.loads(store.config_path.read_text()) == {"loss": {"type": "grpo"}}
    assert sorted(p.name for p in store.root.iterdir()) == ["checkpoint.pt", "run-config.json"]  # no temporary left


def test_feeder_does_not_count_trained_groups_awaiting_the_checkpoint(redis_url, redis_client) -> None:
    # with kappa steps of trained-but-unacknowledged groups in the stream, counting them as outstanding
    # would stop the prompt supply and starve the learner
    feeder = PromptFeeder(redis.Redis.from_url(redis_url), job_id=JOB, task=build_task({"name": "arithmetic"}),
                          seed=0, backlog=4)
    for g in range(4):
        append_group(redis_client, g)

    assert feeder.top_up() == 0
    assert feeder.top_up(trained=4) == 4
    assert redis_client.xlen(replay.prompts_key(JOB)) == 4


def test_a_top_up_counts_trained_groups_when_it_runs_so_an_acknowledgement_is_never_subtracted_twice(
        redis_url, redis_client, tiny_model_dir, tmp_path) -> None:
    """A top-up runs on the feeder's thread, a step or more after the learner asked for it; the committer may have
    acknowledged (deleted) trained groups meanwhile. Counted when asked, they were subtracted from the stream that no
    longer held them, and the backlog overfilled (seen as 6 prompts for a backlog of 4)."""
    loop = make_loop(redis_url, tiny_model_dir, tmp_path, background=True)
    for g in range(4):
        append_group(redis_client, g)
    loop.step(timeout_s=5)
    assert loop.trained_in_stream() == 2  # groups, awaiting the checkpoint
    loop.step(timeout_s=5)  # v2: checkpointed on the committer's thread, then its 4 groups acknowledged
    loop.settle()
    assert stream_ids(redis_client) == [] and loop.trained_in_stream() == 0

    feeder = PromptFeeder(redis.Redis.from_url(redis_url), job_id=JOB, task=build_task({"name": "arithmetic"}),
                          seed=0, backlog=4)
    read: list[str] = []
    in_redis = feeder.replay.outstanding
    feeder.replay.outstanding = lambda: read.append("stream") or in_redis()

    def trained() -> int:
        read.append("trained")
        return loop.trained_in_stream()

    assert feeder.top_up(trained=trained) == 4 and read == ["stream", "trained"]
    assert redis_client.xlen(replay.prompts_key(JOB)) == 4


@pytest.mark.parametrize("field, value", [("is_cap", 0.5), ("kl_beta", -0.1), ("clip_eps_low", 0.0),
                                          ("type", "ppo"), ("aggregation", "sum"), ("off_policy", "vtrace"),
                                          ("unknown", 1)])
def test_loss_config_rejects_bad_fields(field: str, value) -> None:
    from dataplane.jobs import JobSpecError, parse_job_spec

    with pytest.raises(JobSpecError) as err:
        parse_job_spec({"name": "j", "model_dir": "/m", "task": {"name": "arithmetic"}, "loss": {field: value}})
    assert err.value.field == f"loss.{field}"


def test_t_train_is_the_median_of_the_steps_and_a_resumed_learner_keeps_it(
        redis_url, redis_client, tiny_model_dir, tmp_path) -> None:
    """What the learner announces as T_train (dataplane/timing.py): the median of its steps' train times, kept in the
    checkpoint; a checkpoint written before the median (a moving average only) stands for one step."""
    for g in range(4):
        append_group(redis_client, g)
    loop = make_loop(redis_url, tiny_model_dir, tmp_path)
    assert loop.t_train is None
    times = [loop.step(timeout_s=5).t_train for _ in range(2)]  # v2 is checkpointed (kappa = 2)
    assert loop.t_train == pytest.approx((times[0] + times[1]) / 2)  # the median of two

    resumed = make_loop(redis_url, tiny_model_dir, tmp_path)
    resumed.resume()
    assert resumed.t_train == pytest.approx(loop.t_train)

    store = CheckpointStore(tmp_path)
    old = store.load()
    old.state.pop("recent_t_train")
    old.state["t_train_avg"] = 0.25
    store.save(old)
    from_old = make_loop(redis_url, tiny_model_dir, tmp_path)
    from_old.resume()
    assert from_old.t_train == 0.25
