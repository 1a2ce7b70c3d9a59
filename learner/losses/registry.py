"""The registry of policy-loss variants: name -> one :class:`~learner.losses.base.PolicyLoss` (like verl's
``register_policy_loss``). The names a job may choose are declared torch-free in ``dataplane/losses.py``."""

from __future__ import annotations

from collections.abc import Callable

from dataplane.registry import Registry

from .base import PolicyLoss

POLICY_LOSSES: Registry[PolicyLoss] = Registry("loss type")


def register_policy_loss(name: str) -> Callable[[type[PolicyLoss]], type[PolicyLoss]]:
    """Class decorator: register one instance of the decorated variant under ``name`` (``LossConfig.type``)."""

    def register(cls: type[PolicyLoss]) -> type[PolicyLoss]:
        cls.name = name
        POLICY_LOSSES.add(name, cls())
        return cls

    return register


def get_policy_loss(name: str) -> PolicyLoss:
    """The variant registered as ``name``; ValueError naming the registered ones otherwise."""
    return POLICY_LOSSES.lookup(name)
