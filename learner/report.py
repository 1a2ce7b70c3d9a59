"""What the learner says about a step: its report to the site (``POST /api/jobs/<id>/metrics/``, also what the
experiment logs take) and its line in the log."""

from __future__ import annotations

import collections
import logging

from . import distributed
from .loop import LearnerLoop, StepOutcome

log = logging.getLogger("echo2.learner")


def step_metrics(loop: LearnerLoop, outcome: StepOutcome, ctx: distributed.DistContext) -> dict:
    """The step's report to the site (``POST /api/jobs/<id>/metrics/``)."""
    result, version = outcome.result, outcome.version
    histogram = collections.Counter(outcome.lags)
    metrics = {
        "step": version, "reward_mean": result.reward_mean, "reward_std": result.reward_std, "loss": result.loss,
        "max_staleness": max(outcome.lags), "dropped_stale": loop.consumer.dropped_total,
        "t_train": outcome.t_train, "wait_s": outcome.wait_s,
        "extra": {
            **result.metrics(), "tokens": result.tokens, "tokens_per_s": result.tokens / max(outcome.t_train, 1e-9),
            # rows passed forward and backward; the others' advantage was 0 (learner/step.py skip_idle_rows)
            "trained_rows": result.trained_rows, "sequences": result.sequences,
            "staleness_histogram": {str(lag): histogram[lag] for lag in sorted(histogram)},
            "dropped_this_step": outcome.dropped, "bubble": outcome.wait_s / max(outcome.wait_s + outcome.t_train,
                                                                                   1e-9),
            "checkpointed": outcome.checkpointed, "ranks": ctx.world,
            # where the step's wall time went (dataplane/timing.py): the honest bubble
            "timing": outcome.timing,
            # records quarantined (learner/quarantine.py): per worker id since the job started, and this step
            "quarantined": loop.consumer.quarantine.report(), "quarantined_this_step": outcome.quarantined,
            "entries": outcome.entry_ids,  # the replay-buffer entries trained: audits find losses and repeats
        },
        # the workers' audit outcomes since the last report (learner/audit.py); the site suspends repeat failures
        "audits": loop.consumer.audit.report() if loop.consumer.audit is not None else [],
    }
    if loop.storage_warning:  # a full disk (learner/diskroom.py): the job page and `echo2 job status` say it
        metrics["extra"]["storage"] = loop.storage_warning
    if outcome.lengths:
        metrics["extra"]["completion_length"] = outcome.lengths  # tokens: mean, max, clipped_ratio
    if outcome.scores is not None:  # the owner's functions, scored here (learner/scoring.py)
        metrics["extra"]["rewards"] = outcome.scores.means  # each function's mean score, unweighted
        metrics["extra"]["reward_errors"] = outcome.scores.errors + outcome.scores.non_finite
        if outcome.scores.last_error:
            metrics["extra"]["reward_last_error"] = outcome.scores.last_error
        # each function's mean, records scored, errors among them and latest failure: the job page's table
        metrics["extra"]["reward_functions"] = outcome.scores.functions
    if outcome.samples:
        metrics["samples"] = outcome.samples  # a few trained records (dataplane/samples.py)
    return metrics


def log_step(loop: LearnerLoop, outcome: StepOutcome) -> None:
    """The step's line in the learner's log."""
    result, m = outcome.result, outcome.result.metrics()
    log.info("step %d reward=%.3f loss=%.4f kl=%.4f clip=%.3f |g|=%.3f max_lag=%d dropped=%d rows=%d/%d "
             "t_train=%.3fs wait=%.3fs%s", outcome.version, result.reward_mean, result.loss, m["kl"],
             m["clip_fraction"], result.grad_norm, max(outcome.lags), loop.consumer.dropped_total,
             result.trained_rows, result.sequences, outcome.t_train, outcome.wait_s,
             " (checkpoint)" if outcome.checkpointed else "")
    scores = outcome.scores
    if scores is not None and scores.errors + scores.non_finite:  # loud: an owner's function failing is no detail
        log.warning("step %d: reward functions failed on %d records (%d non-finite); last: %s", outcome.version,
                    scores.errors + scores.non_finite, scores.non_finite, scores.last_error)
