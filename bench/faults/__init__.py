"""The fault suite's faults, one object each (bench/faults/base.py), one module each in this folder.

A module registers its fault with ``@register_fault``; importing this package imports every module here but
``base``, so adding a fault is its file (docs/architecture.md, "How to extend"). ``FAULTS`` holds them in the
order of a default run: the fault-free baseline first (the bubble column compares against it), then by name.
bench/bench_faults.py runs them; docs/faults.md's table is :func:`doc_table` (a test checks it).
"""

from __future__ import annotations

from dataplane.registry import import_modules

from .base import REGISTERED, Fault, register_fault

__all__ = ["DEFAULT_FAULTS", "FAULTS", "Fault", "doc_table", "register_fault"]

import_modules(__name__, __path__, shared=("base",))

FAULTS: dict[str, Fault] = {name: REGISTERED[name] for name in sorted(REGISTERED, key=lambda n: (n != "none", n))}
DEFAULT_FAULTS = list(FAULTS)


def doc_table() -> str:
    """docs/faults.md's table of the faults: what the bench does, what detects each."""
    head = ["| fault | what the bench does | what detects it (the recovery allowance adds one step) |",
            "| --- | --- | --- |"]
    return "\n".join(head + [fault.doc_row() for fault in FAULTS.values()])
