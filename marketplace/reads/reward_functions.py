"""Each of the owner's reward functions as the learner scores it (learner/scoring.py): its mean score, the share of
records it failed on and its last failure, from the step reports' ``extra.reward_functions`` (learner/report.py).
The job page shows them beside the reward chart and the API summary carries them (``reward_functions``). Reads
only."""

from __future__ import annotations

import math
from typing import Any

from ..models import Job, JobMetric
from .figures import REWARD_WINDOW

ERROR_WINDOW = 50
"""Steps whose records the error rate counts: recent enough to show a fix, long enough to show a rare failure."""


def function_rows(reports: list[Any]) -> list[dict[str, Any]]:
    """Per function (in the newest report's order): ``mean``, the mean of its per-step means over the newest
    :data:`REWARD_WINDOW` reports (the reward card's window); ``records`` and ``errors`` over all of ``reports``;
    ``error_rate`` and ``error_percent`` (None before a record); ``last_error``, the first line of the newest failure
    reported ("" when none); ``steps``, the reports counted. ``reports`` are the steps' ``extra.reward_functions``,
    newest first; the learner's extra is free-form JSON, so what is not a number or a text is left out."""
    names: list[str] = []
    for report in reports:
        if isinstance(report, dict):
            names += [n for n in report if isinstance(n, str) and n not in names]
    rows = []
    for name in names:
        figures = [r[name] for r in reports if isinstance(r, dict) and isinstance(r.get(name), dict)]
        means = [m for f in figures[:REWARD_WINDOW] if _finite(m := f.get("mean"))]
        records = sum(int(f["records"]) for f in figures if _count(f.get("records")))
        errors = sum(int(f["errors"]) for f in figures if _count(f.get("errors")))
        last = next((f["last_error"] for f in figures if isinstance(f.get("last_error"), str) and f["last_error"]), "")
        rows.append({"function": name, "mean": math.fsum(means) / len(means) if means else None,
                     "mean_steps": len(means), "records": records, "errors": errors,
                     "error_rate": errors / records if records else None,
                     "error_percent": 100.0 * errors / records if records else None,
                     "last_error": last.strip().split("\n")[0][:200], "steps": len(figures)})
    return rows


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def job_reward_functions(job: Job) -> list[dict[str, Any]]:
    """:func:`function_rows` of the job's newest :data:`ERROR_WINDOW` step reports that carry them (empty for a job
    whose workers score its whole reward)."""
    reports = (JobMetric.objects.filter(job=job, extra__has_key="reward_functions").order_by("-step")
               .values_list("extra__reward_functions", flat=True)[:ERROR_WINDOW])
    return function_rows(list(reports))
