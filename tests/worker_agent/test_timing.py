"""The agent's waits on long links (worker_agent/timing.py): RFC 6298's estimate from the round trips it measures,
the reply, opening and ping timeouts between their floors and ceilings, and a transfer's timeout from its size
over the measured rate; figures computed by hand."""

from __future__ import annotations

import pytest

from dataplane.broadcast.relaystate import KEEPALIVE_S, RelayTimeouts
from worker_agent.timing import Rates, RoundTrips, fetch_timeouts, relay_timeouts, transfer_timeout


def test_round_trips_are_kept_as_rfc_6298_keeps_them():
    trips = RoundTrips()
    assert trips.rto is None and trips.path_rtt is None and trips.reply_timeout() == 30.0  # unmeasured: as before
    trips.add(0.2)
    assert (trips.srtt, trips.rttvar) == (0.2, 0.1) and trips.rto == pytest.approx(0.6)
    trips.add(0.6)  # rttvar = 3/4 0.1 + 1/4 |0.2 - 0.6| = 0.175; srtt = 7/8 0.2 + 1/8 0.6 = 0.25
    assert trips.rttvar == pytest.approx(0.175) and trips.srtt == pytest.approx(0.25)
    assert trips.rto == pytest.approx(0.95) and trips.path_rtt == 0.2
    trips.add(float("nan"))
    trips.add(-1.0)  # a clock that stepped back is no round trip
    assert trips.samples == 2


def test_the_reply_timeout_follows_the_replies_between_its_floor_and_ceiling():
    fast, slow, loaded = RoundTrips(), RoundTrips(), RoundTrips()
    for _ in range(20):
        fast.add(0.17)  # harsh: 150 ms of link, 20 of the site's
        slow.add(4.0)  # a site answering in 4 s
        loaded.add(30.0)
    assert fast.reply_timeout() == 10.0  # the floor: a lost reply is asked again after 10 s, not 30
    assert slow.reply_timeout() == pytest.approx(4 * (4.0 + 4 * slow.rttvar))  # 4 RTOs: ~16 s
    assert loaded.reply_timeout() == 60.0  # the ceiling: every wait bounded
    assert fast.open_timeout() == 15.0 and fast.ping_timeout() == 10.0
    assert loaded.open_timeout() == 60.0 and loaded.ping_timeout() == 60.0


def test_a_transfer_may_take_four_times_its_expected_time_within_the_floor_and_ceiling():
    # the harsh slow worker: 16.4 MB at 10 Mbit/s over 170 ms: 4 x (3 x 0.2 + 13.1) = 54.9 s (fixed: 30 s per read)
    assert transfer_timeout(16_415_608, rtt=0.17, rate_bps=10e6 / 8) == pytest.approx(4 * (0.6 + 13.1324864))
    assert transfer_timeout(4 << 20, rtt=0.04, rate_bps=50e6 / 8) == 10.0  # 0.7 s expected: the floor
    assert transfer_timeout(10**10, rtt=0.1, rate_bps=1e6) == 600.0  # the ceiling
    assert transfer_timeout(1 << 20, rtt=None, rate_bps=0.0) == pytest.approx(4 * (0.6 + (1 << 20) / 125e3))


def test_a_whole_fetch_of_a_real_model_is_not_cut_at_the_per_read_ceiling():
    """14 GB (a 7B model in bf16) at 100 Mbit/s takes ~1,120 s: a whole-fetch deadline of 600 s would abandon
    every attempt half way and the worker would never join; its reads keep the 600 s ceiling."""
    per_read, whole = fetch_timeouts([64 << 20] * 209, rtt=0.05, rate_bps=100e6 / 8)
    assert per_read == pytest.approx(4 * (0.6 + (64 << 20) / 12.5e6))
    assert whole == pytest.approx(4 * (0.6 + 209 * (64 << 20) / 12.5e6)) and whole > 4000


def test_the_rate_is_the_median_fetch_and_the_registered_bandwidth_before_any():
    assert Rates().rate == 125e3  # nothing known: 1 Mbit/s
    rates = Rates(declared_bps=10e6 / 8)
    assert rates.rate == 1.25e6
    for nbytes, seconds in ((4e6, 4.0), (4e6, 1.0), (4e6, 2.0)):
        rates.add(int(nbytes), seconds)
    rates.add(100, 0.0)  # not a measurement
    assert rates.rate == 2e6


def test_the_websockets_own_pings_feed_the_round_trips_once_each():
    """A real websocket pinging every 0.2 s: each new ping's round trip is one sample (the heartbeat loop asks
    every 0.2 s, and the same ping is not counted twice)."""
    import asyncio

    import websockets
    from websockets.asyncio.server import serve

    from worker_agent.connection import SiteConnection

    async def scenario() -> None:
        async def hold(ws) -> None:
            await asyncio.sleep(5)

        async with serve(hold, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            async with websockets.connect(f"ws://127.0.0.1:{port}", ping_interval=0.2) as ws:
                connection = SiteConnection("http://127.0.0.1:9", "k")
                connection.attach(ws)
                connection.sample_ping()
                assert connection.round_trips.samples == 0  # no pong yet
                deadline = asyncio.get_running_loop().time() + 10
                while connection.round_trips.samples < 2 and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.05)
                    connection.sample_ping()
                taken = connection.round_trips.samples
                connection.sample_ping()
                assert taken >= 2 and connection.round_trips.samples == taken
                assert 0 < connection.round_trips.path_rtt < 1.0

    asyncio.run(scenario())


def test_the_relays_waits_follow_the_round_trips_with_the_fixed_values_as_floors():
    fixed = RelayTimeouts()
    assert relay_timeouts(RoundTrips()) == fixed  # nothing measured yet: as before
    short = RoundTrips()
    for _ in range(8):
        short.add(0.04)  # 40 ms, steady: the floors hold
    assert relay_timeouts(short) == fixed
    long = RoundTrips()
    for seconds in (0.9, 1.1, 0.8, 1.3, 1.0):  # a satellite-like link with jitter
        long.add(seconds)
    rto = long.rto
    waits = relay_timeouts(long)
    assert waits.connect == pytest.approx(max(fixed.connect, 4 * rto))
    assert waits.stall == pytest.approx(KEEPALIVE_S + 4 * rto) and waits.stall > fixed.stall
    assert waits.assign_wait == pytest.approx(max(fixed.assign_wait, 4 * rto))
    assert (waits.parent_retries, waits.give_up, waits.fallback_in_flight) == (
        fixed.parent_retries, fixed.give_up, fixed.fallback_in_flight)
    awful = RoundTrips()
    awful.add(40.0)
    assert (relay_timeouts(awful).stall, relay_timeouts(awful).connect) == (30.0, 60.0)  # ceilings: still bounded


def test_a_late_reply_to_a_request_given_up_by_a_release_is_expected_not_warned(caplog):
    import asyncio
    import json
    import logging

    from dataplane import messages as m
    from worker_agent.connection import SiteConnection

    async def scenario() -> list[str]:
        connection, sent = SiteConnection("http://127.0.0.1:9", "k"), []

        class Socket:
            async def send(self, text: str) -> None:
                sent.append(json.loads(text)["id"])

        connection.ws = Socket()
        connection.welcomed.set()
        asked = asyncio.create_task(connection.request(m.LeaseRequest(job_id=1), deadline_s=30))
        while not sent:
            await asyncio.sleep(0.01)
        asked.cancel()  # the release stops the rollout loop that waited
        with pytest.raises(asyncio.CancelledError):
            await asked
        with caplog.at_level(logging.DEBUG, logger="echo2.agent"):
            connection.answer(m.Rejected(reason="job 1 is completed", ref="lease_request", ref_id=sent[0]))
            connection.answer(m.Rejected(reason="?", ref="lease_request", ref_id="never-sent-1"))
        return sent

    (request_id,) = asyncio.run(scenario())
    said = [(r.levelname, request_id in r.getMessage()) for r in caplog.records]
    assert said == [("DEBUG", True), ("WARNING", False)], caplog.text  # a reply to nothing asked is still news
