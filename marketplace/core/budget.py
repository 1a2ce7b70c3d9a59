"""A job's budget (``JobSpec.budget_usd``, docs/ledger.md "Budgets"): what a step costs, what the rest will cost,
and when to stop.

The paper's cost model pays ``c_i`` per hour while worker ``i`` serves (section 3.4), so while the pool holds, one
learner step costs ``sum(c_i) x step time / 3600``. The site forecasts with the pool it measures now (the active
workers' prices, the learner's last step time) and pauses the job before a step would take the spend past the
budget, so a job stops within one step's cost of its budget and never more than that over it (a step already
under way when the pause lands is still billed: the workers are released at once). Plain functions.
"""

from __future__ import annotations

from collections.abc import Iterable


def cost_per_step(*, prices_per_hour: Iterable[float], step_s: float) -> float:
    """USD one learner step costs with the pool at ``prices_per_hour`` (USD/h) and a step of ``step_s`` seconds."""
    return sum(prices_per_hour) * max(0.0, step_s) / 3600.0


def forecast(*, spent: float, per_step: float, steps_left: int, budget: float | None = None) -> float:
    """The job's cost at its end: spent so far plus the steps left at ``per_step``; a budget caps it (the job
    pauses there)."""
    total = spent + per_step * max(0, steps_left)
    return min(total, budget) if budget is not None else total


def over_budget(*, spent: float, per_step: float, budget: float | None) -> str:
    """Why the job must stop now ("": it need not): its spend, or its spend plus the next step, passes ``budget``."""
    if budget is None:
        return ""
    if spent >= budget or spent + per_step > budget:
        return (f"over budget: spent {usd(spent)} of {usd(budget)}, the next step would cost {usd(per_step)} "
                f"(raise budget_usd to continue)")
    return ""


def usd(amount: float) -> str:
    """``$1.25``; below a dollar, to the tenth of a cent where it has one (``$0.055``), so a small budget reads
    as it was set."""
    text = f"{amount:.2f}" if amount >= 1 else f"{amount:.4f}".rstrip("0")
    return "$" + (text + "0" if text.endswith(".") or len(text.split(".")[1]) < 2 else text)
