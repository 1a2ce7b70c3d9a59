"""The provider portal in a real Chromium: a worker whose agent is connected shows its relay score, uptime
and since when it is online. Screenshot in ``test-artifacts/provider-score-uptime.png``."""

from __future__ import annotations

import json
import re
import time
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.sync.client import connect

from .conftest import ARTIFACTS, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_provider_sees_score_and_uptime_of_a_connected_worker(site, browser):
    url, tokens = site
    api = httpx.Client(base_url=url + "/api/", headers={"Authorization": f"Token {tokens['prov']}"})
    relay = api.post("workers/", json={"name": "rig-relay", "gpu": "RTX 4090", "price_per_hour": "0.30",
                                       "bandwidth_bps": 25_000_000, "relay_address": "relay.example.net:7070"})
    relay.raise_for_status()
    time.sleep(1.0)  # registered a second before its agent connects: uptime is short of 100 %

    agent = f"ws://127.0.0.1:{urlsplit(url).port}/ws/agent/"
    with connect(agent, additional_headers={"Authorization": f"Bearer {relay.json()['agent_key']}"}) as ws:
        ws.send(json.dumps({"type": "hello", "agent_version": "browser-test"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        time.sleep(1.0)

        page = browser.new_page(viewport={"width": 1400, "height": 800})
        sign_in(page, url, "prov", "prov-pass")
        page.click("text=My workers")
        connected = page.locator('tr[data-worker="rig-relay"]')
        # The only relay: full Speed, full Stability, no successes yet (0.65), fading a little since its hello.
        assert 0.6 <= float(connected.locator("td.score").inner_text()) <= 0.65
        uptime = float(re.fullmatch(r"([\d.]+) %", connected.locator("td.uptime").inner_text()).group(1))
        assert 10 < uptime < 100
        assert re.fullmatch(r"\w{3} \d{1,2}, \d\d:\d\d", connected.locator("td.online-since").inner_text())

        never = page.locator('tr[data-worker="rig-browser"]')  # registered by the fixture, no agent, no relay
        assert never.locator("td.uptime").inner_text() == "0.0 %"
        assert never.locator("td.score").inner_text() == "—"
        assert "No relay address" in never.locator("td.score span").get_attribute("title")
        assert "appendix C.3" in page.locator("th", has_text="Score").get_attribute("title")
        page.screenshot(path=str(ARTIFACTS / "provider-score-uptime.png"), full_page=True)
