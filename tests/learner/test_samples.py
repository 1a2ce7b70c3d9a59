"""Samples (dataplane/samples.py, learner/loop.py): every ``samples_every`` steps the learner keeps a few records of
the batch it trained, chosen with the job's seed, with texts cut and cleaned for the site, in the step's report."""

from __future__ import annotations

from dataplane import replay, samples
from learner import distributed
from learner.report import step_metrics

from ..groups import stream_fields
from .test_loop import JOB, make_loop

RECORDS = [(w, float(i % 2), 3, f"prompt {i}", f"completion {i}") for i, w in enumerate([5, 5, 6, 6, 7, 7, 8, 8])]


def test_the_same_seed_and_step_pick_the_same_rows_another_seed_others() -> None:
    first = samples.pick(RECORDS, seed=11, step=20, count=4)
    assert first == samples.pick(RECORDS, seed=11, step=20, count=4)
    assert len(first) == 4 and [r["prompt"] for r in first] == sorted(r["prompt"] for r in first)  # batch order
    assert {r["prompt"] for r in first} != {r["prompt"] for r in samples.pick(RECORDS, seed=12, step=20, count=4)} \
        or {r["prompt"] for r in first} != {r["prompt"] for r in samples.pick(RECORDS, seed=11, step=30, count=4)}
    assert first[0].keys() == {"step", "version", "worker", "reward", "prompt", "completion"}
    assert samples.pick(RECORDS[:2], seed=1, step=1, count=4) == [
        {"step": 1, "version": 3, "worker": 5, "reward": 0.0, "prompt": "prompt 0", "completion": "completion 0"},
        {"step": 1, "version": 3, "worker": 5, "reward": 1.0, "prompt": "prompt 1", "completion": "completion 1"}]


def test_texts_are_cut_to_the_sites_bounds_and_lose_nul_characters() -> None:
    (row,) = samples.pick([(1, 1.0, 0, "a\x00b" * 5000, "c" * 10_000)], seed=0, step=1, count=1)
    assert len(row["prompt"]) == samples.PROMPT_CHARS and "\x00" not in row["prompt"] and row["prompt"].endswith("…")
    assert len(row["completion"]) == samples.COMPLETION_CHARS


def test_every_nth_step_reports_a_few_records_of_its_own_batch(redis_url, redis_client, tiny_model_dir,
                                                                tmp_path) -> None:
    for group in range(6):  # two groups (four records) a step; group g from worker 10 + g
        records = [{"job_id": JOB, "lease_id": f"l{group}", "group_id": f"g{group}", "prompt": f"{group}+4=",
                    "prompt_ids": [1, 10, 5, 11, 17], "completion": answer, "completion_ids": [7 + int(answer), 2],
                    "logprobs": [-2.0, -1.0], "reward": reward, "version": 0}
                   for answer, reward in (("7", 1.0), ("5", 0.0))]
        redis_client.xadd(replay.trajectories_key(JOB), stream_fields(records, worker_id=10 + group))
    loop = make_loop(redis_url, tiny_model_dir, tmp_path / "ckpt")
    loop.samples_every, loop.samples_per_step = 2, 3
    outcomes = [loop.step(timeout_s=5) for _ in range(3)]

    assert [len(o.samples) for o in outcomes] == [0, 3, 0]
    rows = outcomes[1].samples
    assert {(r["worker"], r["prompt"][0]) for r in rows} <= {(12, "2"), (13, "3")}  # step 2 trained groups 2 and 3
    assert all(r["step"] == 2 and r["version"] == 0 and r["reward"] == (1.0 if r["completion"] == "7" else 0.0)
               for r in rows)
    batch = [(10 + g, reward, 0, f"{g}+4=", answer) for g in (2, 3) for answer, reward in (("7", 1.0), ("5", 0.0))]
    assert rows == samples.pick(batch, seed=0, step=2, count=3)  # the job's seed (0) decides
    ctx = distributed.DistContext(device="cpu")
    assert step_metrics(loop, outcomes[1], ctx)["samples"] == rows and "samples" not in step_metrics(
        loop, outcomes[0], ctx)
    loop.close()
