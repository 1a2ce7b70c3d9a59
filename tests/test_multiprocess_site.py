"""The site runs as several ASGI processes sharing Redis and the database (docs/operations.md "Several site
processes"): a push that a request to one process triggers reaches an agent connected to another, through the
channel layer.

Two daphne processes over one SQLite file and one private Redis: the agent's socket is on process A; the job is
created and started, and a snapshot published, through process B's REST API.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import websockets

from dataplane.snapshot import build_manifest
from echo2_site.demo import DAPHNE_WEBSOCKET_LIMITS, free_port, wait_for

from .live import BIN, api, create_users, make_stack, start_site
from .private_redis import PrivateRedis

pytestmark = pytest.mark.slow

PUSH_TIMEOUT_S = 30.0


async def _next(ws, kind: str) -> dict:
    """The next message of type ``kind`` on the agent's socket (others, such as heartbeat replies, skipped)."""
    deadline = time.monotonic() + PUSH_TIMEOUT_S
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no {kind!r} within {PUSH_TIMEOUT_S:g} s")
        message = json.loads(await asyncio.wait_for(ws.recv(), remaining))
        if message["type"] == kind:
            return message


async def test_a_push_triggered_in_one_site_process_reaches_an_agent_on_another(tmp_path):
    redis = PrivateRedis(tmp_path, aof=False).start()
    stack = make_stack(tmp_path, redis.url, ECHO2_CHECK_MODEL_DIR="false")
    try:
        tokens = await asyncio.to_thread(create_users, stack, "own", "prov")
        site_a = await asyncio.to_thread(start_site, stack)  # daphne and the Celery worker
        port_b = free_port()
        stack.start("daphne-b", str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port_b), *DAPHNE_WEBSOCKET_LIMITS,
                    "echo2_site.asgi:application")
        site_b = f"http://127.0.0.1:{port_b}"
        await asyncio.to_thread(wait_for, lambda: httpx.get(site_b + "/healthz", timeout=2).status_code == 200,
                                "site process B", 60)
        worker = api(site_a, tokens["prov"]).post("workers/", json={
            "name": "rig", "price_per_hour": "0.3", "bandwidth_bps": 1_000_000}).raise_for_status().json()

        url = site_a.replace("http://", "ws://") + "/ws/agent/"
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {worker['agent_key']}"},
                                      open_timeout=15) as ws:
            await ws.send(json.dumps({"type": "hello", "agent_version": "test"}))
            welcome = await _next(ws, "welcome")
            assert welcome["worker_id"] == worker["id"]

            owner = api(site_b, tokens["own"])
            job = owner.post("jobs/", json={"name": "across processes", "model_dir": str(tmp_path / "model"),
                                            "task": {"name": "arithmetic"}}).raise_for_status().json()
            owner.post(f"jobs/{job['id']}/start/").raise_for_status()
            assign = await _next(ws, "assign")
            assert assign["job_id"] == job["id"]

            manifest = build_manifest(bytes(16), job_id=job["id"], version=1).model_dump(mode="json")
            owner.post(f"jobs/{job['id']}/snapshots/", json={
                "version": 1, "url": "http://127.0.0.1:9/v1/", "manifest": manifest}).raise_for_status()
            snapshot = await _next(ws, "snapshot")
            assert (snapshot["job_id"], snapshot["version"]) == (job["id"], 1)
    finally:
        stack.stop()
        redis.stop()
