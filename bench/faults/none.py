"""``none``: the fault-free baseline that the bubble column compares against."""

from __future__ import annotations

from .base import Fault, register_fault


@register_fault
class Baseline(Fault):
    name = "none"
    about = "fault-free baseline"
    does = "nothing: the baseline"
