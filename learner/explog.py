"""Experiment logs: every step's report (the metrics the job page shows) as TensorBoard scalars, and on W&B.

TensorBoard event files are written by default to ``<logdir>/job<ID>`` (``--logdir``, default ``var/runs``
under the learner's working directory; ``tensorboard --logdir var/runs``), with tensorboardX: a small
maintained writer (numpy and protobuf), where ``torch.utils.tensorboard`` needs the whole ``tensorboard``
package with its server. W&B is used when a project is named (``--wandb-project`` or ``WANDB_PROJECT``) and the
``wandb`` package is installed (``pip install 'echo2[wandb]'``); without it the learner says so in one line. W&B's
files go to ``WANDB_DIR`` when it is set, else to ``<logdir>`` (never into a job's TensorBoard directory); the run is
named ``job-<ID>`` unless a name is given (``--wandb-name`` or ``WANDB_NAME``), with the tags given (``--wandb-tags``
or ``WANDB_TAGS``, comma-separated).

Every few steps the report carries a handful of samples (learner/samples.py): TensorBoard gets them as a markdown
table under the ``samples`` text tag, W&B as a ``samples`` table.

Logging never holds up or fails training: :meth:`ExperimentLog.log` only appends to a bounded queue, which a
thread of its own drains into the writers (it also builds them: ``wandb.init`` may wait on the network). A
writer that raises is logged once with its error and disabled; a full queue drops steps and says so once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import queue
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("echo2.learner")

TAGS = {
    # the report's columns and its extra figures (learner/report.py step_metrics), by TensorBoard tag
    "reward_mean": "reward/mean", "reward_std": "reward/std",
    "loss": "loss/total", "pg_loss": "loss/policy", "kl_loss": "loss/kl",
    "kl": "kl/reference", "behaviour_kl": "kl/behaviour",
    "clip_fraction": "clip/fraction", "clip_low_fraction": "clip/low_fraction",
    "clip_high_fraction": "clip/high_fraction", "dual_clip_fraction": "clip/dual_clip_fraction",
    "mean_ratio": "clip/mean_ratio", "is_weight_mean": "off_policy/is_weight_mean",
    "is_corrected_fraction": "off_policy/is_corrected_fraction", "grad_norm": "optim/grad_norm",
    "max_staleness": "staleness/max", "dropped_stale": "records/dropped_stale",
    "dropped_this_step": "records/dropped_this_step", "quarantined_this_step": "records/quarantined_this_step",
    "t_train": "time/t_train", "wait_s": "time/wait", "bubble": "time/bubble",
    "tokens": "throughput/tokens", "tokens_per_s": "throughput/tokens_per_s",
}


# the held-out evaluations (learner/evaluation.py); no "@" in a tag: tensorboardX rewrites it
TAG_UNSAFE = re.compile(r"[^\w./-]")

EVAL_TAGS = {"pass_at_1": "eval/pass_at_1", "mean_at_k": "eval/mean_at_k", "seconds": "eval/seconds"}


def scalars(report: dict[str, Any]) -> dict[str, float]:
    """The scalars of one step's report (``POST /api/jobs/<id>/metrics/``), by tag: the named figures, the
    mean staleness, records quarantined since the start, and where the step's wall time went (``step_time/``)."""
    flat = {**report, **(report.get("extra") or {})}
    out = {tag: float(flat[key]) for key, tag in TAGS.items() if _number(flat.get(key))}
    histogram = {int(lag): count for lag, count in (flat.get("staleness_histogram") or {}).items()}
    if sum(histogram.values()):
        out["staleness/mean"] = sum(lag * n for lag, n in histogram.items()) / sum(histogram.values())
    if isinstance(flat.get("quarantined"), dict):
        out["records/quarantined_total"] = float(sum(flat["quarantined"].values()))
    for name, mean in (flat.get("rewards") or {}).items():  # each function's mean score (learner/scoring.py)
        if _number(mean):  # pkg.module:fn as a tag TensorBoard keeps as is (no ":", which tensorboardX rewrites)
            out["rewards/" + TAG_UNSAFE.sub(".", str(name)) + "/mean"] = float(mean)
    if _number(flat.get("reward_errors")):
        out["rewards/errors"] = float(flat["reward_errors"])
    for key, value in (flat.get("completion_length") or {}).items():  # TRL's completions/mean_length, ...
        if _number(value):
            out[f"completions/{'clipped_ratio' if key == 'clipped_ratio' else key + '_length'}"] = float(value)
    for part, seconds in (flat.get("timing") or {}).items():
        if _number(seconds):
            out[f"step_time/{part}"] = float(seconds)
    for result in report.get("eval") or []:  # an evaluation, logged at the version it scored (learner/evaluation.py)
        out |= {tag: float(result[key]) for key, tag in EVAL_TAGS.items() if _number(result.get(key))}
    return out


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class Writer(Protocol):
    def write(self, step: int, values: dict[str, float]) -> None: ...

    def write_samples(self, step: int, rows: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


class TensorBoardWriter:
    def __init__(self, logdir: Path, config: dict[str, Any]) -> None:
        import json

        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(logdir), flush_secs=10)
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)

    def write(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def write_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.writer.add_text("samples", samples_markdown(rows), step)

    def close(self) -> None:
        self.writer.close()


SAMPLE_COLUMNS = ["step", "version", "worker", "reward", "prompt", "completion"]


def samples_markdown(rows: list[dict[str, Any]]) -> str:
    """The samples as a markdown table (TensorBoard renders a text summary as markdown)."""
    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in SAMPLE_COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


class WandbWriter:
    def __init__(self, *, project: str, job_id: int, run_id: str, config: dict[str, Any], directory: Path,
                 name: str | None = None, tags: list[str] | None = None) -> None:
        import wandb

        # WANDB_DIR, when set, is where the user keeps W&B's files; else beside the TensorBoard directories
        directory = Path(os.environ.get("WANDB_DIR") or directory)
        directory.mkdir(parents=True, exist_ok=True)
        # A restarted learner continues the same run (its id is the job's), from the step it resumed at.
        self.run = wandb.init(project=project, name=name or f"job-{job_id}", id=run_id, resume="allow", config=config,
                              dir=str(directory), tags=tags or None)

    def write(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def write_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        import wandb

        table = wandb.Table(columns=SAMPLE_COLUMNS, data=[[row.get(c) for c in SAMPLE_COLUMNS] for row in rows])
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class ExperimentLog:
    """The writers behind one queue and one thread. ``makers`` are (name, constructor) pairs, called on the
    thread; ``log`` never blocks, ``close`` waits at most ``timeout_s`` for what is queued to be written."""

    def __init__(self, makers: list[tuple[str, Callable[[], Writer]]], *, queue_size: int = 1000) -> None:
        self.names = [name for name, _ in makers]
        self._makers = makers
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.dropped = 0
        self.failed: dict[str, str] = {}  # writer -> its error, once disabled
        self._thread = threading.Thread(target=self._drain, name="experiment-log", daemon=True)
        if makers:
            self._thread.start()

    def log(self, step: int, report: dict[str, Any]) -> None:
        if not self._makers:
            return
        try:
            self._queue.put_nowait((step, scalars(report), list(report.get("samples") or [])))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("experiment logs: the writers fall behind; dropping steps (from step %d)", step)
        except Exception as err:  # noqa: BLE001 - a report it cannot read must not stop training
            if "report" not in self.failed:
                self._disable("report", err)

    def close(self, timeout_s: float = 30.0) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout_s)

    def _drain(self) -> None:
        writers: dict[str, Writer] = {}
        for name, make in self._makers:
            try:
                writers[name] = make()
            except Exception as err:  # noqa: BLE001 - any writer's failure is logged and the writer left out
                self._disable(name, err)
        while (item := self._queue.get()) is not None:
            step, values, samples = item
            for name, writer in list(writers.items()):
                try:
                    writer.write(step, values)
                    if samples:
                        writer.write_samples(step, samples)
                except Exception as err:  # noqa: BLE001
                    self._disable(name, err)
                    del writers[name]
        for name, writer in writers.items():
            try:
                writer.close()
            except Exception as err:  # noqa: BLE001
                self._disable(name, err)

    def _disable(self, name: str, err: Exception) -> None:
        self.failed[name] = f"{type(err).__name__}: {err}"
        what = "a step report could not be read (such steps are left out)" if name == "report" else (
            f"{name} failed and is off for the rest of the run")
        log.error("experiment logs: %s: %s", what, self.failed[name])


def experiment_log(*, job_id: int, run_id: str, logdir: Path | None, wandb_project: str | None,
                   config: dict[str, Any], wandb_name: str | None = None,
                   wandb_tags: list[str] | None = None) -> ExperimentLog:
    """The learner's writers: TensorBoard under ``logdir/job<ID>`` (None: none), W&B when a project is named
    and the package is there (else one line saying how to get it). Each writer's directory is its own name: a
    closure over one reassigned variable once sent TensorBoard to W&B's directory."""
    makers: list[tuple[str, Callable[[], Writer]]] = []
    if logdir is not None:
        tensorboard_dir = Path(logdir) / f"job{job_id}"
        if importlib.util.find_spec("tensorboardX") is None:
            log.warning("experiment logs: tensorboardX is not installed (pip install 'echo2[learner]'); no "
                        "TensorBoard logs")
        else:
            makers.append(("tensorboard", lambda: TensorBoardWriter(tensorboard_dir, config)))
            log.info("experiment logs: TensorBoard in %s (tensorboard --logdir %s)", tensorboard_dir, logdir)
    if wandb_project:
        if importlib.util.find_spec("wandb") is None:
            log.warning("experiment logs: WANDB_PROJECT/--wandb-project is %r but wandb is not installed (pip "
                        "install 'echo2[wandb]'); logging without W&B", wandb_project)
        else:
            wandb_dir = Path(logdir or "var/runs")
            makers.append(("wandb", lambda: WandbWriter(project=wandb_project, job_id=job_id, run_id=run_id,
                                                        config=config, directory=wandb_dir, name=wandb_name,
                                                        tags=wandb_tags)))
    return ExperimentLog(makers)
