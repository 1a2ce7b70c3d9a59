"""The dashboard in a real Chromium against the live ASGI server (daphne): sign in, launch a job through
the form, watch a value change without a reload, see a provider's workers. Screenshots go to
``test-artifacts/``."""

from __future__ import annotations

import httpx
import pytest

from ..marketplace import factories
from .conftest import ARTIFACTS, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

def test_owner_launches_a_job_and_watches_it_update_live(site, browser):
    url, tokens = site
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    sign_in(page, url, "owner", "owner-pass")
    page.click("#launch-link")
    assert page.locator("#plan-workers").inner_text() == "0"  # the provider's agent is not connected

    # A bad value comes back next to its field, and nothing is created.
    page.fill("#id_name", "browser job")
    page.fill("#id_model_dir", factories.checkpoint_dir())
    page.fill("#id_staleness", "1")
    page.click("#launch-button")
    assert "greater than or equal to 2" in page.locator("#error-staleness").inner_text()
    page.screenshot(path=str(ARTIFACTS / "launch-form-error.png"), full_page=True)

    page.fill("#id_staleness", "3")
    page.fill("#id_task_options", '{"max_operand": 4}')
    page.click("#launch-button")
    page.wait_for_url(f"{url}/jobs/*/")
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert page.locator('[data-key="status"]').inner_text() == "running"
    page.evaluate("window.__noReload = true")

    api = httpx.Client(base_url=url + "/api/", headers={"Authorization": f"Token {tokens['owner']}"})
    page.wait_for_timeout(500)  # the page's websocket connects
    api.post(f"jobs/{job_id}/metrics/", json={"step": 1, "reward_mean": 0.625, "max_staleness": 1}).raise_for_status()
    page.wait_for_function("document.querySelector('[data-key=\"step\"]').textContent === '1'", timeout=10_000)
    assert page.locator('[data-key="reward_mean"]').inner_text() == "0.625"
    assert page.evaluate("window.__noReload") is True  # updated in place, not reloaded
    assert page.locator("#reward-curve polyline.reward").get_attribute("points")  # the smoothed line (curves.js)
    page.screenshot(path=str(ARTIFACTS / "job-live.png"), full_page=True)

    page.click("text=Cancel")
    assert page.locator('[data-key="status"]').inner_text() == "cancelled"


def test_provider_sees_their_workers_and_how_to_register(site, browser):
    url, _ = site
    page = browser.new_page()
    sign_in(page, url, "prov", "prov-pass")
    page.click("text=My workers")
    assert page.locator("tr[data-worker='rig-browser']").count() == 1  # its row (the controls table names it too)
    assert "echo2-agent register --server" in page.locator("pre").inner_text()
    page.screenshot(path=str(ARTIFACTS / "provider-workers.png"), full_page=True)
