"""Template filters for the figures the pages show."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def percent(share: float | None) -> str:
    """A share in [0, 1] as a percentage with one decimal ("99.5 %"); a dash where there is none yet."""
    return "—" if share is None else f"{share * 100:.1f} %"


@register.filter
def mbit(bytes_per_s: float | None) -> str:
    """A rate in bytes/s as Mbit/s ("100.0"), the unit providers register their link in; a dash when unknown."""
    return "—" if bytes_per_s is None else f"{bytes_per_s * 8 / 1e6:.1f}"
