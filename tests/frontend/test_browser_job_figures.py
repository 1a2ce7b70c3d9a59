"""The job page's figures in Chromium, each against the API's JSON for its job: a running job with samples,
a finished job (final figures, spent from the ledger, no projection, the download's how-to) and a job waiting for
its learner (a banner that goes away, live, when the learner reports). The curves smooth (the EMA the slider sets,
checked against one computed here from the API's metrics) and zoom (drag a step range, double-click for all).
Screenshots go to var/evidence/ (the note cites them)."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from ..live import create_users, make_stack, start_site
from ..lying_servers import closed_port
from ..marketplace import factories
from .conftest import CHROMIUM, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]
EVIDENCE = Path(__file__).resolve().parents[2] / "var" / "evidence"
REWARDS = [0.05, 0.12, 0.31, 0.22, 0.47, 0.38, 0.61, 0.55, 0.72, 0.66, 0.83, 0.91, 0.78, 0.88, 0.95]
W, H, PAD = 600, 240, 34  # curves.js's chart geometry (viewBox units)

SETUP = """
from datetime import timedelta
from decimal import Decimal
from django.utils import timezone
from dataplane.jobs import parse_job_spec
from dataplane.snapshot import build_manifest
from marketplace import services
from marketplace.models import Activation, Job
from marketplace.services.billing import activation_report
from marketplace.services.samples import samples_record
owner, prov = User.objects.get(username='owner'), User.objects.get(username='prov')

def started(name):
    return services.job_start(job=services.job_create(owner=owner, spec=parse_job_spec({
        'name': name, 'model_dir': MODEL_DIR, 'task': {'name': 'arithmetic'}, 'staleness': 3, 'batch_trajectories': 8,
        'group_size': 4, 'max_steps': 15})))

def publish(job, version):
    manifest = build_manifest(bytes(16), job_id=job.pk, version=version,
                              format='checkpoint-tar' if version == 0 else 'safetensors')
    services.snapshot_publish(job=Job.objects.get(pk=job.pk), version=version, url=f'{GONE}/v{version}/',
                              manifest=manifest.model_dump(mode='json'))

def train(job, steps):
    services.learner_announce(job=Job.objects.get(pk=job.pk), t_train=0.05)
    publish(job, 0)
    for step in range(1, steps + 1):
        services.metrics_record(job=Job.objects.get(pk=job.pk), step=step, values={
            'reward_mean': REWARDS[step - 1], 't_train': 0.04 + step / 1000, 'wait_s': 0.01, 'max_staleness': step % 3,
            'dropped_stale': step, 'extra': {'staleness_histogram': {'0': 6, '1': 2}}})

samples = started('with samples')
train(samples, 15)
for step in (10, 15):
    samples_record(job=samples, step=step, rows=[
        {'version': step - 1, 'worker': 0, 'reward': 1.0, 'prompt': f'{step}+4=', 'completion': f'<b>{step + 4}</b>'},
        {'version': step - 1, 'worker': 0, 'reward': 0.0, 'prompt': '2+2=', 'completion': 'five'}])

finished = started('finished')
worker, _ = services.worker_register(user=prov, name='rig-paid', gpu='RTX 5090', price_per_hour=Decimal('3.6'),
                                     bandwidth_bps=12_500_000)
begun = timezone.now() - timedelta(seconds=1000)
paid = Activation.objects.create(job=finished, worker=worker, price_per_hour=worker.price_per_hour,
                                 state='generating', reported_at=begun, started_at=begun)
for second in range(8, 65, 8):  # the agent's state reports, every 8 s for 64 s of generating: billed
    activation_report(activation_id=paid.pk, at=begun + timedelta(seconds=second), state='generating')
train(finished, 12)
publish(finished, 12)
services.job_finish(job=Job.objects.get(pk=finished.pk), status=Job.Status.COMPLETED, reason='reached the target')

waiting = started('waiting for its learner')
"""

NUMERIC = {"reward_recent_mean": 3, "reward_mean": 3, "t_train": 3, "step_train_s": 3, "t_bcast": 3, "bubble_ratio": 3,
           "pool_throughput": 1, "throughput_target": 1, "cost_usd": 4, "projected_cost_usd": 4, "budget_usd": 2}
TEXT = ("status", "step", "reward_recent_steps", "as_of_step", "max_staleness", "dropped_stale", "published_of",
        "active_workers", "t_bcast_of", "throughput_target_line", "waiting_reason", "export_line", "status_reason",
        "step_time_line", "reward_errors_line", "user_code_refusals_line")


@pytest.fixture
def figures_site(tmp_path, redis_url):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    stack = make_stack(tmp_path, redis_url, CELERY_TASK_ALWAYS_EAGER="true")
    setup = f"MODEL_DIR = {factories.checkpoint_dir()!r}\nREWARDS = {REWARDS!r}\n" \
            f"GONE = 'http://127.0.0.1:{closed_port()}'\n" + SETUP  # the learners have exited: nothing answers
    tokens = create_users(stack, "owner", "prov", setup=setup)
    url = start_site(stack, celery=False, host="localhost")
    api = httpx.Client(base_url=url + "/api/", headers={"Authorization": f"Token {tokens['owner']}"}, timeout=30)
    jobs = {job["name"]: job["id"] for job in api.get("jobs/").raise_for_status().json()["results"]}
    yield url, api, jobs
    api.close()
    stack.stop()


def check_figures(page, summary: dict) -> int:
    """Every visible element the page marks with a summary key shows the API's value; returns how many were checked."""
    checked = 0
    for key in (*NUMERIC, *TEXT):
        for element in page.locator(f'[data-key="{key}"]').all():
            if not element.is_visible():
                continue
            text, value = element.inner_text().strip(), summary[key]
            if value is None or value == "":  # said in words where the card has them (data-null), else a dash
                assert text in ("–", "", element.get_attribute("data-null")), (key, text)
            elif key in NUMERIC:
                assert float(text) == pytest.approx(value, abs=0.51 * 10 ** -NUMERIC[key]), (key, text, value)
            else:
                assert text == str(value), (key, text, value)
            checked += 1
    return checked


def shows(page, selector: str) -> bool:
    return page.locator(selector).first.is_visible()


def open_job(browser, url: str, job_id: int):
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    sign_in(page, url, "owner", "owner-pass")
    page.goto(f"{url}/jobs/{job_id}/")
    page.wait_for_function("document.body.dataset.live === 'connected'", timeout=10_000)
    return page


def debiased_ema(values: list[float], weight: float) -> list[float]:
    last, out = 0.0, []
    for i, v in enumerate(values, 1):
        last = last * weight + (1 - weight) * v
        out.append(last / (1 - weight ** i))
    return out


def points(page, selector: str) -> list[tuple[float, float]]:
    raw = page.locator(selector).get_attribute("points")
    return [tuple(map(float, p.split(","))) for p in raw.split()]


def test_the_job_page_shows_every_figure_as_the_api_has_it(figures_site, browser):
    url, api, jobs = figures_site
    EVIDENCE.mkdir(parents=True, exist_ok=True)

    # A running job with samples: the step figures of step 15, the samples the API lists.
    job_id = jobs["with samples"]
    page = open_job(browser, url, job_id)
    summary = api.get(f"jobs/{job_id}/summary/").json()
    assert summary["as_of_step"] == 15 and summary["reward_recent_steps"] == 10
    assert summary["reward_recent_mean"] == pytest.approx(math.fsum(REWARDS[-10:]) / 10)
    assert check_figures(page, summary) >= 20
    assert shows(page, "#projected") and not shows(page, '[data-show="final"]') and shows(page, "#export")
    assert not shows(page, "#learner-waiting")
    listed = api.get(f"jobs/{job_id}/samples/").json()
    listed = listed["results"] if isinstance(listed, dict) else listed
    rows = page.locator("#samples-table tbody tr").all()
    assert [(r.locator("td").nth(0).inner_text(), r.locator("pre").nth(1).inner_text()) for r in rows] == [
        (str(s["step"]), s["completion"]) for s in listed]
    page.screenshot(path=str(EVIDENCE / "job-samples.png"), full_page=True)

    # Smoothing: at 0 the bold line is the reported one; at 0.9 it is the debiased EMA of the API's metrics.
    metrics = api.get(f"jobs/{job_id}/metrics/").json()
    rewards = [m["reward_mean"] for m in metrics]
    set_smoothing = "w => { const s = document.getElementById('smoothing'); s.value = w; " \
                    "s.dispatchEvent(new Event('input')); }"
    page.evaluate(set_smoothing, "0")
    assert points(page, "#reward-curve polyline.reward") == points(page, "#reward-curve polyline.reward-raw")
    page.evaluate(set_smoothing, "0.9")
    assert page.locator("#smoothing-value").inner_text() == "0.90"
    drawn = [(H - PAD - y) / (H - 2 * PAD) for _, y in points(page, "#reward-curve polyline.reward")]
    assert drawn == pytest.approx(debiased_ema(rewards, 0.9), abs=0.002)  # the y range is [0, 1] here

    # Zoom: drag across the middle of the reward curve; both curves show those steps only; double-click resets.
    page.locator("#reward-curve").scroll_into_view_if_needed()  # the pointer only reaches what is on screen
    box = page.locator("#reward-curve").bounding_box()
    page.mouse.move(box["x"] + 0.3 * box["width"], box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + 0.7 * box["width"], box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    lo, hi = (int(page.locator("#reward-curve").get_attribute(f"data-{k}")) for k in ("lo", "hi"))
    assert 1 < lo < hi < 15, (lo, hi)
    assert len(points(page, "#reward-curve polyline.reward")) == hi - lo + 1
    assert len(points(page, "#time-chart polyline.t-train")) == hi - lo + 1
    assert page.locator("#reward-curve text.x-hi").text_content() == f"step {hi}"
    assert page.locator("#zoom-range").inner_text() == f"Showing steps {lo} to {hi}."
    page.screenshot(path=str(EVIDENCE / "job-zoomed.png"), full_page=True)
    page.dblclick("#reward-curve")
    assert page.locator("#reward-curve").get_attribute("data-lo") == "1"
    assert len(points(page, "#reward-curve polyline.reward")) == 15
    page.close()

    # A finished job: final figures, spent from the ledger, no projection, how to get the model; the API agrees.
    job_id = jobs["finished"]
    page = open_job(browser, url, job_id)
    summary = api.get(f"jobs/{job_id}/summary/").json()
    assert summary["final"] and summary["cost_usd"] == pytest.approx(3.6 * 64 / 3600)
    invoice = api.get("ledger/", params={"job": job_id, "format": "json"}).raise_for_status().json()
    assert float(invoice["totals"]["amount_usd"]) == pytest.approx(summary["cost_usd"], abs=1e-6)  # the ledger's sum
    assert check_figures(page, summary) >= 18
    assert shows(page, '[data-show="final"]') and not shows(page, "#projected") and not shows(page, "#export")
    assert page.locator('[data-key="cost_usd"]').inner_text() == f"{summary['cost_usd']:.4f}"
    howto = page.locator("#export-howto").inner_text()
    assert f"echo2-learner export --job {job_id} --out models/job{job_id}" in howto and "v12, its final model" in howto
    export = api.get(f"jobs/{job_id}/export/")
    assert export.status_code == 409 and f"echo2-learner export --job {job_id} --version 12" in export.json()["detail"]
    page.screenshot(path=str(EVIDENCE / "job-finished.png"), full_page=True)
    page.close()

    # A job waiting for its learner: it says so; when the learner reports, the banner goes, live.
    job_id = jobs["waiting for its learner"]
    page = open_job(browser, url, job_id)
    summary = api.get(f"jobs/{job_id}/summary/").json()
    assert summary["learner_waiting"] and summary["as_of_step"] is None
    assert check_figures(page, summary) >= 15
    assert shows(page, "#learner-waiting") and f"--job {job_id}" in page.locator("#learner-waiting").inner_text()
    assert page.locator("#reward-curve text.empty").text_content() == "waiting for its learner: no step reported yet"
    page.screenshot(path=str(EVIDENCE / "job-waiting-learner.png"), full_page=True)
    api.post(f"jobs/{job_id}/metrics/", json={"step": 1, "reward_mean": 0.25, "t_train": 0.05}).raise_for_status()
    page.wait_for_function("document.getElementById('learner-waiting').hidden", timeout=10_000)
    summary = api.get(f"jobs/{job_id}/summary/").json()
    assert check_figures(page, summary) >= 15 and page.locator('[data-key="as_of_step"]').first.inner_text() == "1"
    page.close()
