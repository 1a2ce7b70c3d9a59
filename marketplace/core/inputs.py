"""What the pure cores check of their inputs (``provisioning``, ``activation``, ``controller``): a bad input raises
:class:`ProvisioningInputError` naming the offending field, so an API can turn it into a field error."""

from __future__ import annotations

import math
import numbers


class ProvisioningInputError(ValueError):
    """An input that makes no sense; ``field`` names it (``str(err)`` reads ``"<field>: <message>"``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ProvisioningInputError(field, message)


def finite(value: object) -> bool:
    try:
        return math.isfinite(value)
    except TypeError:  # None, a string, ...
        return False


def positive(field: str, value: float) -> None:
    require(finite(value) and value > 0, field, f"must be a positive number, got {value!r}")


def non_negative(field: str, value: float) -> None:
    require(finite(value) and value >= 0, field, f"must be a number >= 0, got {value!r}")


def whole(field: str, value: int, low: int, why: str) -> None:
    require(isinstance(value, numbers.Integral) and value >= low, field, f"must be an integer >= {low}{why}, "
             f"got {value!r}")


def ceil_steps(x: float) -> int:
    """``ceil`` that forgives float noise: ``1.1 / 0.1 = 11.000000000000002`` counts as 11 steps, not 12."""
    return math.ceil(x - 1e-9)
