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
