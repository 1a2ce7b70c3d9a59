"""The launch page in a real Chromium: with a calibrated worker online and an expected T_train entered,
"Preview plan" shows the needed throughput, the chosen worker and the price per hour without JavaScript and
creates nothing; with JavaScript the panel follows the form as it is edited. The screenshot of the no-JS
preview goes to ``test-artifacts/launch-plan.png``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from ..live import api
from ..marketplace import factories
from .conftest import ARTIFACTS, METRICS_TOKEN, sign_in

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


def test_owner_launches_a_job_from_an_uploaded_job_file(site, browser, tmp_path):
    """The issue's case: a job file fills the form (a misspelt key first, listed with the nearest name), the job
    launches with the file's settings, and its page offers them back as a job file."""
    url, tokens = site
    bad, good = tmp_path / "bad.yaml", tmp_path / "job.toml"
    bad.write_text("name: typo\nmodel_dir: /m\ntask: {name: arithmetic}\nstalenes: 4\n")
    good.write_text(f'name = "from a file"\nmodel_dir = "{factories.checkpoint_dir()}"\nstaleness = 5\n'
                    'batch_trajectories = 32\n\n[task]\nname = "arithmetic"\nmax_operand = 4\n\n'
                    '[loss]\nkl_beta = 0.05\n')
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    sign_in(page, url, "owner", "owner-pass")
    page.click("#launch-link")

    page.set_input_files("#id_job_file", str(bad))
    page.click("#load-file")
    assert page.locator("#error-job_file").inner_text() == "stalenes: unknown key (did you mean staleness?)"

    page.set_input_files("#id_job_file", str(good))
    page.click("#load-file")
    assert page.locator("#id_name").input_value() == "from a file"
    assert page.locator("#id_staleness").input_value() == "5"
    assert page.locator("#id_loss_kl_beta").input_value() == "0.05"
    page.click("form.job-form button:text-is('Launch')")
    page.wait_for_url(f"{url}/jobs/*/")

    job = api(url, tokens["owner"]).get("jobs/").json()["results"][0]
    assert (job["name"], job["staleness"], job["kappa"], job["batch_trajectories"]) == ("from a file", 5, 4, 32)
    assert (job["task"]["max_operand"], job["loss"]["kl_beta"]) == (4, 0.05)
    with page.expect_download() as download:
        page.click("#spec-toml")
    assert download.value.suggested_filename == f"job-{job['id']}.toml"
    assert 'name = "from a file"' in Path(download.value.path()).read_text()

    # The learner reports a step (as echo2-learner does): the page shows it live, and Prometheus reads the same.
    page.wait_for_timeout(500)  # the page's websocket connects
    api(url, tokens["owner"]).post(f"jobs/{job['id']}/metrics/", json={
        "step": 7, "reward_mean": 0.8125, "max_staleness": 2}).raise_for_status()
    page.wait_for_function("document.querySelector('[data-key=\"step\"]').textContent === '7'", timeout=10_000)
    shown = {key: page.locator(f'[data-key="{key}"]').inner_text() for key in ("step", "reward_mean")}
    scraped = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).raise_for_status().text
    for key, name in (("step", "echo2_job_step"), ("reward_mean", "echo2_job_reward_mean")):
        value = re.search(rf'^{name}{{job="{job["id"]}"}} (\S+)$', scraped, re.M)
        assert value and abs(float(value.group(1)) - float(shown[key])) <= 5e-4, (key, shown[key], value)  # 3 places
    assert shown == {"step": "7", "reward_mean": "0.813"}
    page.screenshot(path=str(ARTIFACTS / "launch-from-file.png"), full_page=True)
