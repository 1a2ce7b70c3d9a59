"""Experiment logs: a few learner steps on a real Redis, reported as the learner reports them to the site, come
back out of the TensorBoard event file (tensorboard's own reader) under the expected tags and steps; a writer
that fails is logged once and switched off, one that stalls never holds up a step, and W&B without its package
is one line."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dataplane.timing import step_split
from learner import distributed
from learner.explog import ExperimentLog, experiment_log
from learner.report import step_metrics
from learner.settings import LearnerSettings

from .test_loop import JOB, append_group, make_loop

EXPECTED_TAGS = {
    "reward/mean", "reward/std", "loss/total", "loss/policy", "loss/kl", "kl/reference", "kl/behaviour",
    "clip/fraction", "clip/low_fraction", "clip/high_fraction", "clip/mean_ratio", "optim/grad_norm",
    "staleness/max", "staleness/mean", "records/dropped_stale", "records/dropped_this_step",
    "records/quarantined_total", "records/quarantined_this_step", "time/t_train", "time/wait", "time/bubble",
    "throughput/tokens", "throughput/tokens_per_s", "step_time/wait", "step_time/train", "step_time/checkpoint",
    "step_time/publish", "step_time/report", "step_time/other", "step_time/wall", "step_time/train_share",
}


def test_learner_steps_land_in_tensorboard_under_the_job_pages_metrics(redis_url, redis_client, tiny_model_dir,
                                                                       tmp_path) -> None:
    for group in range(6):
        append_group(redis_client, group)
    loop = make_loop(redis_url, tiny_model_dir, tmp_path / "ckpt")
    explog = experiment_log(job_id=JOB, run_id="r", logdir=tmp_path / "runs", wandb_project=None,
                            config={"job": {"staleness": 50}})
    rewards = {}
    for _ in range(3):
        outcome = loop.step(timeout_s=5)
        outcome.timing = step_split(outcome.wait_s + outcome.t_train + 0.01, wait=outcome.wait_s,
                                    train=outcome.t_train)
        explog.log(outcome.version, step_metrics(loop, outcome, distributed.DistContext(device="cpu")))
        rewards[outcome.version] = outcome.result.reward_mean
    explog.close()

    assert explog.names == ["tensorboard"] and explog.failed == {} and explog.dropped == 0
    events = EventAccumulator(str(tmp_path / "runs" / f"job{JOB}"))
    events.Reload()
    assert set(events.Tags()["scalars"]) >= EXPECTED_TAGS
    for tag in EXPECTED_TAGS:
        assert [e.step for e in events.Scalars(tag)] == [1, 2, 3], tag
    assert {e.step: e.value for e in events.Scalars("reward/mean")} == pytest.approx(rewards)
    # every record was generated under v0 and trained at v0, v1, v2
    assert [e.value for e in events.Scalars("staleness/max")] == [e.value for e in events.Scalars("staleness/mean")] \
        == [0, 1, 2]
    assert "config/text_summary" in events.Tags()["tensors"]  # the resolved configuration, as text


class Recording:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def write(self, step, values) -> None:
        self.steps.append(step)

    def close(self) -> None:
        pass


class Failing(Recording):
    def write(self, step, values) -> None:
        raise OSError("disk full")


def test_a_failing_writer_is_logged_once_and_switched_off(caplog) -> None:
    good = Recording()
    explog = ExperimentLog([("tensorboard", Failing), ("wandb", lambda: good), ("broken", _raise)])
    with caplog.at_level(logging.ERROR, logger="echo2.learner"):
        for step in (1, 2, 3):
            explog.log(step, {"step": step, "reward_mean": 0.5})
        explog.close()

    assert good.steps == [1, 2, 3]
    assert explog.failed == {"tensorboard": "OSError: disk full", "broken": "RuntimeError: no such project"}
    assert [r.getMessage() for r in caplog.records] == [
        "experiment logs: broken failed and is off for the rest of the run: RuntimeError: no such project",
        "experiment logs: tensorboard failed and is off for the rest of the run: OSError: disk full"]


def _raise():
    raise RuntimeError("no such project")


def test_a_stalled_writer_never_holds_up_a_step(caplog) -> None:
    release = threading.Event()

    class Stalled(Recording):
        def write(self, step, values) -> None:
            release.wait(60)
            super().write(step, values)

    stalled = Stalled()
    explog = ExperimentLog([("wandb", lambda: stalled)], queue_size=2)
    with caplog.at_level(logging.WARNING, logger="echo2.learner"):
        for step in range(1, 11):
            explog.log(step, {"reward_mean": 0.0})  # returns at once although nothing is written
    release.set()
    explog.close()

    assert 6 <= explog.dropped <= 8 and stalled.steps[:2] == [1, 2]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith("experiment logs: the writers fall behind; dropping steps")


@pytest.mark.skipif(__import__("importlib").util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_without_its_package_is_one_line(caplog, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("WANDB_PROJECT", "echo2-runs")
    settings = LearnerSettings(server="http://x", job=1, token="t")
    assert settings.wandb_project == "echo2-runs"  # the variable W&B users already set
    with caplog.at_level(logging.WARNING, logger="echo2.learner"):
        explog = experiment_log(job_id=1, run_id="r", logdir=None, wandb_project=settings.wandb_project, config={})
    assert explog.names == []
    assert [r.getMessage() for r in caplog.records] == [
        "experiment logs: WANDB_PROJECT/--wandb-project is 'echo2-runs' but wandb is not installed (pip install "
        "'echo2[wandb]'); logging without W&B"]
    explog.log(1, {"reward_mean": 1.0})  # nothing to write to: a no-op
    explog.close()


def test_with_wandb_on_tensorboard_stays_in_the_jobs_directory_and_wandb_in_wandb_dir(monkeypatch, tmp_path) -> None:
    """W&B offline (its real package) beside TensorBoard: the event files stay in ``<logdir>/job<ID>`` (they once
    went to ``<logdir>`` itself, mixing every job's curves), W&B writes under ``WANDB_DIR`` with the run's name and
    tags, and a step's samples reach both (a text summary, a table)."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    runs: list = []
    init = wandb.init
    monkeypatch.setattr(wandb, "init", lambda **kw: runs.append(init(**kw)) or runs[-1])
    try:
        explog = experiment_log(job_id=7, run_id="job7-abc", logdir=tmp_path / "runs", wandb_project="echo2-test",
                                config={"job": {"seed": 1}}, wandb_name="grpo-seed1", wandb_tags=["tiny", "cpu"])
        sample = {"step": 2, "version": 1, "worker": 3, "reward": 1.0, "prompt": "2+2?", "completion": "4"}
        explog.log(1, {"reward_mean": 0.25})
        explog.log(2, {"reward_mean": 0.5, "samples": [sample]})
        explog.close(timeout_s=120)
    finally:
        # W&B's service process would otherwise live until the test session's exit, where its atexit teardown found
        # the connection gone (a traceback after the full suite's summary, 2026-12-05)
        wandb.teardown()

    assert explog.failed == {} and explog.names == ["tensorboard", "wandb"]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["job7"]  # nothing of TensorBoard's in --logdir
    events = EventAccumulator(str(tmp_path / "runs" / "job7"))
    events.Reload()
    assert [e.value for e in events.Scalars("reward/mean")] == [0.25, 0.5]
    assert "samples/text_summary" in events.Tags()["tensors"]
    text = events.Tensors("samples/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| 2 | 1 | 3 | 1.0 | 2+2? | 4 |" in text
    (run,) = runs
    assert (run.name, sorted(run.tags), run.id) == ("grpo-seed1", ["cpu", "tiny"], "job7-abc")
    assert Path(run.dir).is_relative_to(tmp_path / "wandb-home")
    assert list((tmp_path / "wandb-home" / "wandb").glob("offline-run-*"))
