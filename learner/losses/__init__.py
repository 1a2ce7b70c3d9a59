"""Policy-loss variants, one module each, registered by name (``LossConfig.type``; docs/architecture.md "How to
extend"). Importing the package imports every module in this folder, so a new variant is its file here (with
``@register_policy_loss("name")``) plus its ``declare_loss_type`` line in ``dataplane/losses.py``."""

from __future__ import annotations

from dataplane.registry import import_modules

from .base import PolicyLoss, Surrogate
from .registry import POLICY_LOSSES, get_policy_loss, register_policy_loss

__all__ = ["POLICY_LOSSES", "PolicyLoss", "Surrogate", "get_policy_loss", "register_policy_loss"]

SHARED = ("base", "registry")  # the modules of this folder that are no variant

import_modules(__name__, __path__, shared=SHARED)
