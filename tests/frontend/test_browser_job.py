"""The live job page in Chromium: charts, worker versions and the forwarding-chain picture change as the
site learns things (no reload), and pause/resume work from the page. Screenshots go to test-artifacts/."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ..live import BIN, create_users, make_stack, start_site
from ..marketplace import factories
from .conftest import ARTIFACTS, CHROMIUM, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Three relay-capable workers serving one running job whose learner has a relay: the chain plan of the
# snapshot it publishes puts them into forwarding chains.
SETUP = """
from decimal import Decimal
from dataplane.jobs import parse_job_spec
from dataplane.snapshot import build_manifest
from marketplace import services
from marketplace.models import Worker
prov = User.objects.get(username='prov')
for i in range(3):
    w, _ = services.worker_register(user=prov, name=f'rig-{i}', gpu='RTX 5090', price_per_hour=Decimal('0.35'),
                                    bandwidth_bps=12_500_000, relay_address=f'127.0.0.1:{7000 + i}')
    Worker.objects.filter(pk=w.pk).update(status='idle')
spec = parse_job_spec({'name': 'live job', 'model_dir': MODEL_DIR, 'task': {'name': 'arithmetic'},
                       'staleness': 3, 'batch_trajectories': 8, 'group_size': 4, 'learner_uplink_bps': 12_500_000})
job = services.job_start(job=services.job_create(owner=User.objects.get(username='owner'), spec=spec))
services.learner_announce(job=job, t_train=None, relay_address='127.0.0.1:6999')
for step in (1, 2):
    services.metrics_record(job=job, step=step, values={'reward_mean': 0.1 * step, 't_train': 0.05, 'wait_s': 0.01,
                            'max_staleness': 1, 'extra': {'staleness_histogram': {'0': 6, '1': 2}}})
services.snapshot_publish(job=job, version=2, url='http://127.0.0.1:1/snapshots/2/',
                          manifest=build_manifest(bytes(16), job_id=job.pk, version=2).model_dump(mode='json'))
"""


@pytest.fixture
def job_site(tmp_path, redis_url):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (make test installs it)")
    stack = make_stack(tmp_path, redis_url, CELERY_TASK_ALWAYS_EAGER="true")
    tokens = create_users(stack, "owner", "prov", setup=f"MODEL_DIR = {factories.checkpoint_dir()!r}\n" + SETUP)
    yield start_site(stack, celery=False, host="localhost"), tokens, stack
    stack.stop()


def site_shell(stack, code: str) -> None:
    """Run ``code`` in the site's Django (as a Celery task or an agent's message would) to make it push."""
    stack.run(str(BIN / "python"), "manage.py", "shell", "-c",
              "from marketplace import services\nfrom marketplace.models import Job, Worker\n" + code)


def test_job_page_draws_chains_versions_and_charts_live_and_pauses(job_site, browser):
    url, tokens, stack = job_site
    api = httpx.Client(base_url=url + "/api/", headers={"Authorization": f"Token {tokens['owner']}"})
    job_id = api.get("jobs/").raise_for_status().json()["results"][0]["id"]
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    sign_in(page, url, "owner", "owner-pass")
    page.goto(f"{url}/jobs/{job_id}/")
    page.wait_for_function("document.body.dataset.live === 'connected'", timeout=10_000)
    page.evaluate("window.__noReload = true")

    # Rendered state: three workers in forwarding chains, all behind v2 (none installed yet).
    nodes = page.locator("#chain-picture g.node[data-kind=chain]")
    assert nodes.count() == 3
    assert page.locator("#chain-picture g.node.behind").count() == 3
    assert page.locator("#chain-caption").inner_text() == "snapshot v2, strategy chain"
    assert page.locator("#staleness-chart rect.bar[data-lag='0']").get_attribute("data-count") == "12"
    assert page.locator("#time-chart polyline.t-train").get_attribute("points")

    # A worker installs v2 from its chain parent: its version and its node change in place.
    first = int(nodes.first.get_attribute("data-worker"))
    site_shell(stack, f"services.snapshot_installed(worker=Worker.objects.get(pk={first}), job_id={job_id}, "
                      "version=2, seconds=0.2, source='parent')")
    page.wait_for_function(f"document.querySelector('#workers tr[data-worker=\"{first}\"] td.version')"
                           ".textContent === '2'", timeout=10_000)
    assert page.locator("#chain-picture g.node.behind").count() == 2

    # The learner reports step 3 with a lag-2 trajectory: the histogram and the reward curve grow.
    api.post(f"jobs/{job_id}/metrics/", json={
        "step": 3, "reward_mean": 0.5, "t_train": 0.07, "wait_s": 0.02, "max_staleness": 2,
        "extra": {"staleness_histogram": {"0": 4, "2": 4}}}).raise_for_status()
    page.wait_for_function("document.querySelector('[data-key=\"step\"]').textContent === '3'", timeout=10_000)
    assert page.locator("#staleness-chart rect.bar[data-lag='2']").get_attribute("data-count") == "4"
    assert page.locator("#staleness-chart rect.bar[data-lag='0']").get_attribute("data-count") == "16"
    assert len(page.locator("#reward-curve polyline.reward").get_attribute("points").split()) == 3
    assert page.evaluate("window.__noReload") is True  # all of it updated in place
    page.screenshot(path=str(ARTIFACTS / "job-chains-live.png"), full_page=True)

    # Pause: the workers are released (billing stops), Resume replaces Pause; resuming activates again.
    page.click("#pause-button")
    assert page.locator('[data-key="status"]').inner_text() == "paused"
    assert page.locator('[data-key="active_workers"]').inner_text() == "0"
    assert page.locator("#resume-button").is_visible() and not page.locator("#pause-button").is_visible()
    assert api.get(f"jobs/{job_id}/").json()["status"] == "paused"
    page.screenshot(path=str(ARTIFACTS / "job-paused.png"), full_page=True)
    page.click("#resume-button")
    assert page.locator('[data-key="status"]').inner_text() == "running"
    page.wait_for_function("document.querySelector('[data-key=\"active_workers\"]').textContent === '3'",
                           timeout=10_000)
    summary = api.get(f"jobs/{job_id}/summary/").json()
    assert summary["status"] == "running" and summary["active_workers"] == 3
