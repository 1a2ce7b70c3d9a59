"""ECHO-2 worker agent: generates rewarded rollouts for the marketplace (no Django, no Redis)."""

__version__ = "0.1.0"
