"""The agent websocket under abuse: keys only in headers, rate limits, size and depth limits, each refused with a
reason the agent can read."""

from __future__ import annotations

import json
import random

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
    assert reason.startswith("too many failed credentials from 198.51.100.1; retry in")
    assert "agent key" not in reason, "the agent would take it for a revoked key and stop for good"
    assert (await refused.receive_output())["code"] == 4429
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
    assert closed["code"] == 4429 and "too many hellos" in closed["reason"]


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
        assert reply["ref"] == "heartbeat"  # named, so an agent can tell which submission was dropped
    await comm.send_json_to({"type": "heartbeat"})
    assert "closing after sustained abuse" in (await comm.receive_json_from())["reason"]
    assert (await comm.receive_output())["code"] == 4429


async def hello(comm: WebsocketCommunicator) -> None:
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from())["type"] == "welcome"


async def test_json_nested_100000_deep_is_refused_and_the_session_survives():
    _, key = await worker_and_key()
    comm = await connect(key)
    await comm.send_to(text_data="[" * 100_000 + "]" * 100_000)
    assert (await comm.receive_json_from())["reason"] == "frame is nested deeper than 32 levels"
    await comm.send_to(text_data='{"type": "heartbeat", "x": ' + "[" * 40 + "]" * 40 + "}")
    reply = await comm.receive_json_from()
    assert reply["type"] == "rejected" and reply["reason"].startswith("frame: x.0.0."), reply
    assert reply["reason"].endswith("nested deeper than 32 levels")
    await hello(comm)


async def test_a_frame_over_the_size_limit_is_refused_with_a_reason_and_closed_4413(settings):
    settings.ECHO2 = {**settings.ECHO2, "WS_MAX_MESSAGE_BYTES": 1000}
    _, key = await worker_and_key()
    comm = await connect(key)
    await comm.send_to(text_data='{"type": "heartbeat", "pad": "' + "é" * 600 + '"}')  # 1200+ bytes, 630 characters
    reason = (await comm.receive_json_from())["reason"]
    assert reason.startswith("frame of 1") and "exceeds the site's limit of 1000 bytes; split it" in reason
    closed = await comm.receive_output()
    assert closed["code"] == 4413 and "exceeds the site's limit" in closed["reason"]


async def test_the_largest_legal_group_fits_under_the_default_limit(settings):
    """16 completions of 4096 tokens with their log-probs: about 1.8 MiB of JSON, refused for its content (no such
    lease), not for its size."""
    assert settings.ECHO2["WS_MAX_MESSAGE_BYTES"] == 8 << 20
    _, key = await worker_and_key()
    comm = await connect(key)
    await hello(comm)
    rng = random.Random(0)

    def record() -> dict:  # a 150k-token vocabulary, full-precision log-probs, ~4 characters per token
        return {"job_id": 1, "lease_id": "1-0", "group_id": "g", "prompt": "1+1=", "prompt_ids": [1, 2, 3],
                "completion": "word" * 4096, "completion_ids": [rng.randrange(151_936) for _ in range(4096)],
                "logprobs": [-rng.random() * 10 for _ in range(4096)], "reward": 1.0, "version": 0}

    message = {"type": "trajectories", "group": {"job_id": 1, "lease_id": "1-0", "group_id": "g", "version": 0,
                                                 "records": [record() for _ in range(16)]}}
    text = json.dumps(message)
    assert 1.5 * 2**20 < len(text) < 8 * 2**20
    await comm.send_to(text_data=text)
    reply = await comm.receive_json_from(timeout=30)
    assert reply["type"] == "rejected" and reply["ref"] == "trajectories" and "limit" not in reply["reason"], reply


@pytest.mark.slow
def test_daphne_passes_frames_up_to_the_sites_limit_and_the_site_refuses_beyond(stack):
    """Through the real server: daphne's own limit (1 MiB by default, dropping without a reason) is set above the
    site's, so a 3 MiB frame reaches the site and a 9 MiB one gets the site's reason and close code."""
    import asyncio

    import websockets

    from tests.live import api, create_users, start_site

    tokens = create_users(stack, "prov")
    server = start_site(stack, celery=False)
    registered = api(server, tokens["prov"]).post("workers/", json={"name": "rig", "price_per_hour": "0.3",
                                                                     "bandwidth_bps": 1000})
    key = registered.json()["agent_key"]

    async def exchange(size: int) -> tuple[dict, int | None]:
        async with websockets.connect(server.replace("http", "ws") + "/ws/agent/", max_size=None,
                                      additional_headers={"Authorization": f"Bearer {key}"}) as ws:
            await ws.send('{"type": "heartbeat", "pad": "' + "x" * size + '"}')
            reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
            try:
                await asyncio.wait_for(ws.recv(), 5)
            except websockets.ConnectionClosed as closed:
                return reply, closed.rcvd.code if closed.rcvd else None
            except TimeoutError:
                pass
            return reply, None

    reply, code = asyncio.run(exchange(3 << 20))
    assert reply["type"] == "rejected" and "pad" in reply["reason"] and code is None  # the message's own fault
    reply, code = asyncio.run(exchange(9 << 20))
    assert "exceeds the site's limit of 8388608 bytes" in reply["reason"] and code == 4413
