"""The agent websocket under abuse: keys only in headers, rate limits, size and depth limits, each refused with a
reason the agent can read."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from echo2_site.asgi import application

from . import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]


@database_sync_to_async
def worker_and_key():
    return factories.worker(factories.user())


async def test_a_key_in_the_url_is_not_accepted():
    _, key = await worker_and_key()
    comm = WebsocketCommunicator(application, f"/ws/agent/?key={key}")
    connected, _ = await comm.connect()
    assert connected
    assert (await comm.receive_json_from())["reason"] == "unknown or missing agent key"
    assert (await comm.receive_output())["code"] == 4401


async def connect(key: str | None, client: str = "198.51.100.1") -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    comm.scope["client"] = [client, 50000]
    connected, _ = await comm.connect()
    assert connected
    return comm


def rates(settings, **rates: str) -> None:
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], **rates}}


async def test_wrong_keys_from_one_address_get_slower(settings):
    rates(settings, auth_failures="2/min")
    _, key = await worker_and_key()
    for _ in range(2):
        comm = await connect("e2w_wrong")
        assert (await comm.receive_json_from())["reason"] == "unknown or missing agent key"
    refused = await connect(key)  # the right key, from the address that kept guessing
    reason = (await refused.receive_json_from())["reason"]
    assert reason.startswith("too many failed agent keys from 198.51.100.1; retry in")
    assert (await refused.receive_output())["code"] == 4401
    elsewhere = await connect(key, client="203.0.113.5")
    await elsewhere.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await elsewhere.receive_json_from())["type"] == "welcome"
    await elsewhere.disconnect()


async def test_hellos_per_worker_are_limited_across_connections(settings):
    rates(settings, agent_hellos="2/min")
    _, key = await worker_and_key()
    for _ in range(2):
        comm = await connect(key)
        await comm.send_json_to({"type": "hello", "agent_version": "test"})
        assert (await comm.receive_json_from())["type"] == "welcome"
        await comm.disconnect()
    comm = await connect(key)
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    reply = await comm.receive_json_from()
    assert reply["type"] == "rejected" and reply["ref"] == "hello" and "too many hellos from worker" in reply["reason"]
    closed = await comm.receive_output()
    assert closed["code"] == 1008 and "too many hellos" in closed["reason"]


async def test_a_flood_of_messages_is_refused_with_a_reason_then_closed(settings):
    settings.ECHO2 = {**settings.ECHO2, "AGENT_MESSAGES_PER_S": 0.001, "AGENT_MESSAGE_BURST": 3,
                      "AGENT_ABUSE_CLOSE_AFTER": 4}
    _, key = await worker_and_key()
    comm = await connect(key)
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from())["type"] == "welcome"
    for _ in range(2):  # within the burst: heartbeats get no reply
        await comm.send_json_to({"type": "heartbeat"})
    assert await comm.receive_nothing(0.2)
    for _ in range(3):
        await comm.send_json_to({"type": "heartbeat"})
        reply = await comm.receive_json_from()
        assert reply["type"] == "rejected" and reply["reason"].startswith("rate limit: at most 0.001 messages per")
    await comm.send_json_to({"type": "heartbeat"})
    assert "closing after sustained abuse" in (await comm.receive_json_from())["reason"]
    assert (await comm.receive_output())["code"] == 1008
