"""The launch page in a real Chromium: with a calibrated worker online and an expected T_train entered,
"Preview plan" shows the needed throughput, the chosen worker and the price per hour without JavaScript and
creates nothing; with JavaScript the panel follows the form as it is edited. The screenshot of the no-JS
preview goes to ``test-artifacts/launch-plan.png``."""

from __future__ import annotations

import json

import pytest
from websockets.sync.client import connect

from ..live import api
from ..marketplace import factories
from .conftest import ARTIFACTS, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_owner_previews_the_capacity_plan_before_launch(site, browser):
    url, tokens = site
    provider = api(url, tokens["prov"])
    rig = provider.post("workers/", json={"name": "rig-calibrated", "gpu": "RTX 4090", "price_per_hour": "0.5",
                                          "bandwidth_bps": 12_500_000}).json()
    provider.post(f"workers/{rig['id']}/calibrations/", json={
        "model_dir": factories.checkpoint_dir(), "task": {"name": "arithmetic"}, "throughput": 20.0}).raise_for_status()
    # Its agent connects (and stays connected): the worker is online, idle, a candidate for a new job.
    with connect(url.replace("http://", "ws://") + "/ws/agent/",
                 additional_headers={"Authorization": f"Bearer {rig['agent_key']}"}) as agent:
        agent.send(json.dumps({"type": "hello", "agent_version": "test"}))
        assert json.loads(agent.recv(timeout=10))["type"] == "welcome"

        # Without JavaScript: the "Preview plan" button re-renders the form with the plan.
        page = browser.new_page(viewport={"width": 1300, "height": 1000}, java_script_enabled=False)
        sign_in(page, url, "owner", "owner-pass")
        page.click("#launch-link")
        fill(page)
        page.click("#preview-plan")
        assert page.locator("#plan-target").inner_text().startswith("7.04 traj/s")
        assert page.locator("table.plan-workers td", has_text="rig-calibrated").count() == 1
        assert page.locator("#plan-price").inner_text() == "0.50 USD/h"
        assert page.locator("#id_name").input_value() == "planned job"  # nothing lost, nothing launched
        page.screenshot(path=str(ARTIFACTS / "launch-plan.png"), full_page=True)

        # With JavaScript (launch.js) the panel follows the form as it is edited, without a reload.
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        sign_in(page, url, "owner", "owner-pass")
        page.click("#launch-link")
        page.evaluate("window.__noReload = true")
        fill(page)
        page.wait_for_function("document.querySelector('#plan-target')?.textContent.startsWith('7.04')")
        page.fill("#id_t_train_s", "5")  # mu_min = 2*64/10 = 12.8, target 14.08
        page.wait_for_function("document.querySelector('#plan-target')?.textContent.startsWith('14.08')")
        assert page.evaluate("window.__noReload") is True
    owner = api(url, tokens["owner"])
    assert owner.get("jobs/").json()["count"] == 0


def fill(page) -> None:
    page.fill("#id_name", "planned job")
    page.fill("#id_model_dir", factories.checkpoint_dir())
    page.fill("#id_batch_trajectories", "64")
    page.fill("#id_t_train_s", "10")  # kappa = 2, T_bcast 0: mu_min = 2*64/20 = 6.4, target 1.1 x 6.4 = 7.04
