"""The policy-loss variants a job may name (``loss.type``), readable without torch.

The math of each variant lives in the learner, one module per variant (``learner/losses/<name>.py``,
registered with ``learner.losses.register_policy_loss``). The site, the launch form and the job files validate
a job against this table and must not import torch, so the table lives here: what a variant is called, one line
saying what it is, and the aggregation a job gets when it does not choose one. Adding a variant is its module in
``learner/losses/`` plus one :func:`declare_loss_type` line below (docs/architecture.md, "How to extend"); a test
checks that the two lists agree.
"""

from __future__ import annotations

from dataclasses import dataclass

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class LossType:
    name: str
    description: str  # one line, shown in the API schema and the launch form
    default_aggregation: str = "token-mean"  # LossConfig.aggregation when the job leaves it out


LOSS_TYPES: dict[str, LossType] = {}


def declare_loss_type(name: str, *, description: str, default_aggregation: str = "token-mean") -> LossType:
    """Add a variant to the names a job may choose; the learner must register an implementation of the same name."""
    if name in LOSS_TYPES:
        raise ValueError(f"loss type {name!r} is already declared")
    if default_aggregation not in AGGREGATIONS:
        raise ValueError(f"loss type {name!r}: unknown aggregation {default_aggregation!r}")
    LOSS_TYPES[name] = LossType(name, description, default_aggregation)
    return LOSS_TYPES[name]


def loss_types_help() -> str:
    """``name: description`` of every declared variant, for a field's help."""
    return "; ".join(f"{t.name}: {t.description}" for t in LOSS_TYPES.values()) + "."


declare_loss_type("grpo", description="token-level ratio (Shao et al., 2024)")
declare_loss_type("gspo", description="per-sequence geometric-mean ratio (Zheng et al., 2025)",
                  default_aggregation="seq-mean-token-mean")
