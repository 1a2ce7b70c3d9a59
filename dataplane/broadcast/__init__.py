"""Snapshot broadcast, the same code for the learner and the agents (paper section 4.2, docs/broadcast.md).

- :mod:`.framing`: the framed chunk stream between two relays (frame format, timeouts, peer errors).
- :mod:`.ratelimit`: token buckets capping a link (``B0``, ``Bw``).
- :mod:`.relay`: :class:`~.relay.SnapshotRelay`, one version of one job, parent and child side.
- :mod:`.hub`: :class:`~.hub.RelayHub`, the one listening port of an agent or the learner.
- :mod:`.process`: one relay as a process (``python -m dataplane.broadcast.process``), for tests and
  ``bench/bench_broadcast.py``.
- :mod:`.chains`: who forwards to whom: the chain score, assembly and repair (pure; the site and the simulator).

This ``__init__`` holds only :data:`BroadcastStrategy` (the job spec, the site's messages and its model use
it), whose names are those of the registry :mod:`.strategies` (pure: the chain core, no I/O), so importing them
does not pull in the relay.
"""

from __future__ import annotations

from typing import Literal

from .strategies import names

BroadcastStrategy = Literal[names()]  # type: ignore[valid-type]
"""How a job's snapshots reach its workers: a name registered in :mod:`.strategies` (section 4.2; the ablation of
section 5.5.1): ``chain``, the learner feeds ``N_ch`` seeds that forward down chains; ``star-limited``, every
worker pulls from the learner under one shared ``B0``; ``star-unlimited``, every worker pulls from the learner
with no cap."""
BROADCAST_STRATEGIES: tuple[str, ...] = names()
