"""The dashboard in a real Chromium against the live ASGI server (daphne): sign in, launch a job through
the form, watch a value change without a reload, see a provider's workers. Screenshots go to
``test-artifacts/``."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from ..live import create_users, make_stack, start_site

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture
def site(tmp_path, redis_url):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (make test installs it)")
    stack = make_stack(tmp_path, redis_url, CELERY_TASK_ALWAYS_EAGER="true")
    tokens = create_users(stack, "owner", "prov", setup=(
        "from decimal import Decimal\nfrom marketplace import services\n"
        "services.worker_register(user=User.objects.get(username='prov'), name='rig-browser', gpu='RTX 5090',"
        " price_per_hour=Decimal('0.35'), bandwidth_bps=12500000)"))
    yield start_site(stack, celery=False, host="localhost"), tokens
    stack.stop()


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync"])
        yield chromium
        chromium.close()


def sign_in(page, url: str, user: str, password: str) -> None:
    page.goto(url + "/accounts/login/")
    page.fill("#id_username", user)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(url + "/")


def test_owner_launches_a_job_and_watches_it_update_live(site, browser):
    url, tokens = site
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    sign_in(page, url, "owner", "owner-pass")
    page.click("#launch-link")
    assert page.locator("#plan-workers").inner_text() == "0"  # the provider's agent is not connected

    # A bad value comes back next to its field, and nothing is created.
    page.fill("#id_name", "browser job")
    page.fill("#id_model_dir", "/models/tiny")
    page.fill("#id_staleness", "1")
    page.click("button[type=submit]")
    assert "greater than or equal to 2" in page.locator("#error-staleness").inner_text()
    page.screenshot(path=str(ARTIFACTS / "launch-form-error.png"), full_page=True)

    page.fill("#id_staleness", "3")
    page.fill("#id_task_options", '{"max_operand": 4}')
    page.click("button[type=submit]")
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
    assert page.locator("#reward-curve polyline").get_attribute("points")
    page.screenshot(path=str(ARTIFACTS / "job-live.png"), full_page=True)

    page.click("text=Cancel")
    assert page.locator('[data-key="status"]').inner_text() == "cancelled"


def test_provider_sees_their_workers_and_how_to_register(site, browser):
    url, _ = site
    page = browser.new_page()
    sign_in(page, url, "prov", "prov-pass")
    page.click("text=My workers")
    assert page.locator("td", has_text="rig-browser").count() == 1
    assert "echo2-agent register --server" in page.locator("pre").inner_text()
    page.screenshot(path=str(ARTIFACTS / "provider-workers.png"), full_page=True)
