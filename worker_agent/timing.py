"""How long the agent waits on a long link: every timeout that a round trip or a transfer decides is
derived from what the agent measured, between a floor and a ceiling, so every wait stays bounded.

- **Round trips** (:class:`RoundTrips`) are measured on the websocket the agent already uses: each request's reply
  time (first attempts only, Karn's rule: the reply to a request sent twice cannot be told apart) and the
  websocket's ping latency. They are kept as RFC 6298 keeps them (the smoothed time ``srtt`` and its variation
  ``rttvar``) plus the least of the recent samples (the path's own round trip, without the site's work).
- **Rates** (:class:`Rates`): bytes over seconds of the agent's finished HTTP fetches; before the first, the
  link bandwidth it registered (``--bandwidth-mbps``), else :data:`RATE_FLOOR_BPS`.

The rules (docs/agent.md "Timing on long links"):

====================  =============================================================  ==========  ========
wait                  rule                                                           floor       ceiling
====================  =============================================================  ==========  ========
reply to a request    ``srtt + 4 rttvar`` (RFC 6298's RTO) x ``REPLY_RTO_FACTOR``      10 s        60 s
opening the socket    ``4 x rto``                                                     15 s        60 s
ping's pong           ``4 x rto``                                                     10 s        60 s
a transfer of n bytes ``TRANSFER_FACTOR x (SETUP_RTTS x rtt + n / rate)``              10 s        600 s
a whole fetch         the same rule for the payload's bytes                           10 s        none
relay: connect        ``4 x rto`` (a SYN lost costs 1 s, then 2...)                    5 s         60 s
relay: stall          ``KEEPALIVE_S + 4 x rto`` (the parent's keepalive, then its     3 s         30 s
                      trip back, as for a reply)
relay: assignment     ``4 x rto`` (parent and child hear the site at different times)  5 s         60 s
====================  =============================================================  ==========  ========

The deadlines of a request as a whole (``LEASE_DEADLINE_S``, ``RETURN_DEADLINE_S``) stay fixed: they bound how long
the site may be away, which no round trip measures. The site's RTT stands for the learner's and the peers': on a
worker's path its own link dominates, and the factor covers the rest.
"""

from __future__ import annotations

import collections
import math

from dataplane.broadcast.relaystate import KEEPALIVE_S, RelayTimeouts

REPLY_FLOOR_S, REPLY_CEILING_S, REPLY_RTO_FACTOR = 10.0, 60.0, 4.0
REPLY_UNMEASURED_S = 30.0  # before the first sample (the fixed value it replaces)
OPEN_FLOOR_S, PING_FLOOR_S, SOCKET_CEILING_S = 15.0, 10.0, 60.0
TRANSFER_FLOOR_S, TRANSFER_CEILING_S, TRANSFER_FACTOR, SETUP_RTTS = 10.0, 600.0, 4.0, 3
RELAY_CONNECT_FLOOR_S, RELAY_STALL_FLOOR_S, RELAY_ASSIGN_FLOOR_S = (RelayTimeouts.connect, RelayTimeouts.stall,
                                                                   RelayTimeouts.assign_wait)  # the fixed values
RELAY_STALL_CEILING_S = 30.0
RATE_FLOOR_BPS = 1e6 / 8  # bytes/s assumed before any measurement or registration: 1 Mbit/s
MIN_RTO_S = 0.2  # Linux's least retransmission timeout: no link is trusted to answer faster


def clamp(value: float, floor: float, ceiling: float) -> float:
    return min(ceiling, max(floor, value))


class RoundTrips:
    """Round-trip samples to the site (seconds), as RFC 6298 keeps them, and the least of the last ``window``."""

    def __init__(self, window: int = 32) -> None:
        self.srtt: float | None = None
        self.rttvar: float | None = None
        self.recent: collections.deque[float] = collections.deque(maxlen=window)
        self.samples = 0

    def add(self, seconds: float) -> None:
        if not seconds >= 0:  # NaN or negative: a clock that stepped back, not a round trip
            return
        self.samples += 1
        self.recent.append(seconds)
        if self.srtt is None or self.rttvar is None:
            self.srtt, self.rttvar = seconds, seconds / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - seconds)
            self.srtt = 0.875 * self.srtt + 0.125 * seconds

    @property
    def path_rtt(self) -> float | None:
        """The least recent sample: the path's round trip with the least of the site's work in it."""
        return min(self.recent) if self.recent else None

    @property
    def rto(self) -> float | None:
        """RFC 6298's retransmission timeout, at least :data:`MIN_RTO_S`; None before the first sample."""
        if self.srtt is None or self.rttvar is None:
            return None
        return max(MIN_RTO_S, self.srtt + 4 * self.rttvar)

    def reply_timeout(self) -> float:
        """How long a request waits for its reply before it is sent again (same id)."""
        rto = self.rto
        wait = REPLY_UNMEASURED_S if rto is None else REPLY_RTO_FACTOR * rto
        return clamp(wait, REPLY_FLOOR_S, REPLY_CEILING_S)

    def open_timeout(self) -> float:
        """How long opening the websocket (TCP, the HTTP upgrade, the site's check of our key) may take."""
        return clamp(4 * (self.rto or 0.0), OPEN_FLOOR_S, SOCKET_CEILING_S)

    def ping_timeout(self) -> float:
        """How long a ping waits for its pong before the connection counts as lost."""
        return clamp(4 * (self.rto or 0.0), PING_FLOOR_S, SOCKET_CEILING_S)


class Rates:
    """The agent's measured download rate (bytes/s): the median of its last ``window`` HTTP fetches, each timed
    whole; ``declared`` (the registered bandwidth) until the first."""

    def __init__(self, declared_bps: float | None = None, window: int = 8) -> None:
        self.declared = declared_bps if declared_bps and declared_bps > 0 else None
        self.recent: collections.deque[float] = collections.deque(maxlen=window)

    def add(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.recent.append(nbytes / seconds)

    @property
    def rate(self) -> float:
        if self.recent:
            ordered = sorted(self.recent)
            return max(RATE_FLOOR_BPS, ordered[len(ordered) // 2])
        return self.declared or RATE_FLOOR_BPS


def transfer_timeout(nbytes: int, *, rtt: float | None, rate_bps: float,
                     ceiling: float = TRANSFER_CEILING_S) -> float:
    """How long fetching ``nbytes`` may take before it is abandoned: ``TRANSFER_FACTOR`` times its expected time
    (``SETUP_RTTS`` round trips to connect and ask, then the bytes at ``rate_bps``), within the floor and
    ``ceiling``. The factor covers the link shared with our own relaying and a rate measured on a quieter moment."""
    expected = SETUP_RTTS * max(rtt or 0.0, MIN_RTO_S) + nbytes / max(rate_bps, RATE_FLOOR_BPS)
    return clamp(TRANSFER_FACTOR * expected, TRANSFER_FLOOR_S, ceiling)


def fetch_timeouts(chunk_bytes: list[int], *, rtt: float | None, rate_bps: float) -> tuple[float, float]:
    """An HTTP fetch of chunks of these sizes: how long one read may wait (a whole chunk's :func:`transfer_timeout`:
    the largest) and how long the whole may take (the sum's). The whole has no fixed ceiling: a real model's full
    payload (14 GB at 100 Mbit/s: ~19 min) must not be abandoned at a bound meant for one chunk; the rate's floor
    (:data:`RATE_FLOOR_BPS`) keeps it finite, and the per-read wait still ends a stalled server."""
    largest, total = max(chunk_bytes, default=0), sum(chunk_bytes)
    return (transfer_timeout(largest, rtt=rtt, rate_bps=rate_bps),
            transfer_timeout(total, rtt=rtt, rate_bps=rate_bps, ceiling=math.inf))


def relay_timeouts(trips: RoundTrips) -> RelayTimeouts:
    """A snapshot relay's waits on this agent's links (:class:`~dataplane.broadcast.relaystate.RelayTimeouts`), from
    the measured round trips (the site's stands for the peers': on a worker's path its own link dominates), with the
    fixed values they replace as floors: on a short link nothing changes, on a long or jittery one a parent is not
    given up while its keepalive is still on its way. Before the first sample: the fixed values."""
    rto = trips.rto or 0.0
    return RelayTimeouts(connect=clamp(4 * rto, RELAY_CONNECT_FLOOR_S, SOCKET_CEILING_S),
                         stall=clamp(KEEPALIVE_S + 4 * rto, RELAY_STALL_FLOOR_S, RELAY_STALL_CEILING_S),
                         assign_wait=clamp(4 * rto, RELAY_ASSIGN_FLOOR_S, SOCKET_CEILING_S))
