"""The registry of policy-loss variants: name -> one :class:`~learner.losses.base.PolicyLoss` (like verl's
``register_policy_loss``). The names a job may choose are declared torch-free in ``dataplane/losses.py``."""

from __future__ import annotations

from collections.abc import Callable

from .base import PolicyLoss

POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[type[PolicyLoss]], type[PolicyLoss]]:
    """Class decorator: register one instance of the decorated variant under ``name`` (``LossConfig.type``)."""

    def register(cls: type[PolicyLoss]) -> type[PolicyLoss]:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered ({type(POLICY_LOSSES[name]).__name__})")
        cls.name = name
        POLICY_LOSSES[name] = cls()
        return cls

    return register


def get_policy_loss(name: str) -> PolicyLoss:
    """The variant registered as ``name``; ValueError naming the registered ones otherwise."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss type {name!r}; registered: {', '.join(sorted(POLICY_LOSSES))}") from None
