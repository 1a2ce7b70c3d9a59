"""Snapshot broadcast, the same code for the learner and the agents (paper section 4.2, docs/broadcast.md).

- :mod:`.framing`: the framed chunk stream between two relays (frame format, timeouts, peer errors).
- :mod:`.ratelimit`: token buckets capping a link (``B0``, ``Bw``).
- :mod:`.relay`: :class:`~.relay.SnapshotRelay`, one version of one job, parent and child side.
- :mod:`.hub`: :class:`~.hub.RelayHub`, the one listening port of an agent or the learner.
- :mod:`.process`: one relay as a process (``python -m dataplane.broadcast.process``), for tests and
  ``bench/broadcast.py``.

This package's ``__init__`` imports nothing, so importing the data plane's messages stays cheap.
"""
