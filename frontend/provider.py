"""What the provider page adds to each worker and to the page: a flag where the GPU its provider
declared is not what its agent measured, and the earnings per UTC day from the ledger (docs/ledger.md). Reads only."""

from __future__ import annotations

import re
from datetime import timedelta

from django.utils import timezone

from marketplace.models import Worker
from marketplace.reads import ledger

EARNINGS_DAYS = 30
"""Days of earnings the page lists; a longer period is a statement (the page's form, or ``echo2 ledger --from``)."""


def hardware_flag(worker: Worker) -> str:
    """"" when the GPU declared at registration agrees with what the agent measured (or nothing was measured yet);
    else the disagreement in words: matching uses the measurement, an owner reading the declared name would not."""
    facts, declared = worker.facts, (worker.gpu or "").strip()
    if facts is None or not declared or declared.lower() in ("cpu", "none", "no gpu"):
        return ""
    if not facts.gpus:
        return f"declared {declared}, but its agent measured no GPU"
    measured = " ".join(g.name for g in facts.gpus).lower()
    # the model number ("5090", "a100", "h100") is what tells GPUs apart; vendors' prefixes vary
    models = re.findall(r"[a-z]?\d{2,}[a-z]?", declared.lower())
    if models and not any(m in measured for m in models):
        return f"declared {declared}, but its agent measured {facts.gpus[0].name}"
    return ""


def decorate(workers: list[Worker]) -> None:
    """Each worker's hardware flag, for the page's table."""
    for worker in workers:
        worker.hardware_flag = hardware_flag(worker)


def earnings_by_day(user) -> list[dict]:
    """The user's workers' ledger per UTC day over the last :data:`EARNINGS_DAYS` days, newest first."""
    since = timezone.now() - timedelta(days=EARNINGS_DAYS)
    qs = ledger.entries(user=user, since=since).filter(provider__user=user)
    return [{**day, "hours": float(day["seconds"]) / 3600} for day in ledger.by_day(qs)[::-1]]
