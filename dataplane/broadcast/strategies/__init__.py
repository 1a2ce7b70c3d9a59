"""Chain strategies: how a publication's snapshot reaches a job's workers (paper section 4.2, the ablation of
section 5.5.1; docs/broadcast.md "Strategies"). One small object per strategy, each in its own module of this
package, registered under its name. Everything that varies with the strategy asks the registry:

- the site's publication planning (``marketplace/services/broadcast.py`` ``broadcast_plan``) and its messages
  (``fanout.Announced.relaying``);
- the simulator (``simulator/broadcast.py`` ``plan_for``, ``uplink``, ``closed_form``);
- the names a job may choose (``dataplane.broadcast.BroadcastStrategy``, read by the job spec, the site's
  messages and model, and the launch form).

Adding a strategy is one module here: a :class:`Strategy` subclass decorated with :func:`register` (this
``__init__`` imports every module of its folder). Pure: plain data in, a :class:`~..chains.ChainPlan` out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import ClassVar

from ...registry import Registry, import_modules
from ..chains import ChainPlan, WorkerStats


class Strategy:
    """One way of moving snapshots from the learner to the workers."""

    name: ClassVar[str]
    """What jobs call it (``JobSpec.broadcast_strategy``)."""
    relayed: ClassVar[bool] = False
    """Snapshots travel down relay chains that the learner's relay seeds (the learner runs a relay, agents are
    told their chain parent and child). False: every worker pulls from the learner's HTTP server."""
    capped: ClassVar[bool] = True
    """The learner's uplink ``B0`` caps its transfers (False: ``star-unlimited``, the ablation's ideal)."""

    def plan(self, workers: Sequence[WorkerStats], *, can_relay: Collection[int], b0_bps: float,
             now: float) -> ChainPlan:
        """Who pulls from whom for one publication. ``workers``: every active worker to place, each with its relay
        statistics and ``bandwidth_bps`` its ``Bw_hat`` (measured, else the registered ``Bw``; the caller
        falls back); ``can_relay``: the ids that can serve a child (a listening relay); ``now``: the callers'
        clock for the score's Decay."""
        raise NotImplementedError

    def closed_form(self, n: int, *, size: float, bw: float, b0: float, chunk: float) -> float:
        """The paper's ``T_bcast`` for ``n`` equal workers (section 5.5.1): what tests and benches compare to."""
        raise NotImplementedError(f"strategy {self.name!r} has no closed form")


_REGISTRY: Registry[Strategy] = Registry("broadcast strategy")


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: register one instance of ``cls`` under ``cls.name`` (a name taken twice is an error)."""
    _REGISTRY.add(cls.name, cls())
    return cls


def unregister(name: str) -> None:
    """Forget ``name`` (tests that register a toy strategy)."""
    _REGISTRY.pop(name, None)


def get(name: str) -> Strategy:
    """The strategy called ``name``; ValueError naming the known ones otherwise."""
    return _REGISTRY.lookup(name)


def names() -> tuple[str, ...]:
    """Every registered name, in registration order (the built-ins: their modules' names in order)."""
    return tuple(_REGISTRY)


import_modules(__name__, __path__)  # each built-in registers itself
