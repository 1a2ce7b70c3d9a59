"""Every page as a phone (390 x 844, mobile layout) and a desktop (1440 x 900) show it, in Debian's Chromium, as the
owner, the provider and staff: the page never scrolls sideways (wide tables scroll in their own box), the charts fit
the screen, and axe-core finds no serious or critical accessibility violation. Screenshots go to var/evidence/."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ..live import create_users, make_stack, start_site
from ..lying_servers import closed_port
from ..marketplace import factories
from .conftest import CHROMIUM, EVIDENCE, axe_violations, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SETUP = """
from decimal import Decimal
from dataplane.jobs import parse_job_spec
from dataplane.snapshot import build_manifest
from marketplace import services
from marketplace.models import Job
owner, prov = User.objects.get(username='owner'), User.objects.get(username='prov')
User.objects.filter(username='staff').update(is_staff=True)
for name, gpu in (('rig-a-rather-long-machine-name', 'RTX 5090'), ('rig-b', 'RTX 4090')):
    services.worker_register(user=prov, name=name, gpu=gpu, price_per_hour=Decimal('0.35'), bandwidth_bps=12_500_000)
job = services.job_start(job=services.job_create(owner=owner, spec=parse_job_spec({
    'name': 'arithmetic on a phone', 'model_dir': MODEL_DIR, 'task': {'name': 'arithmetic'}, 'staleness': 3,
    'batch_trajectories': 8, 'group_size': 4, 'max_steps': 30})))
services.learner_announce(job=Job.objects.get(pk=job.pk), t_train=0.05)
services.snapshot_publish(job=Job.objects.get(pk=job.pk), version=0, url=f'{GONE}/v0/', manifest=build_manifest(
    bytes(16), job_id=job.pk, version=0, format='checkpoint-tar').model_dump(mode='json'))
for step in range(1, 21):
    services.metrics_record(job=Job.objects.get(pk=job.pk), step=step, values={
        'reward_mean': step / 25, 't_train': 17.0 if step == 1 else 0.05 + step / 1000, 'wait_s': 0.01,
        'max_staleness': step % 3, 'dropped_stale': 0, 'loss': 0.5 - step / 100, 'extra': {
            'staleness_histogram': {'0': 6, '1': 2}, 'kl': step / 1000, 'grad_norm': 1.5 - step / 50,
            'tokens_per_s': 900.0 + step, 'completion_length': {'mean': 20.0 + step, 'max': 40, 'clipped_ratio': 0.0}}})
"""

PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True, "device_scale_factor": 2}
DESKTOP = {"viewport": {"width": 1440, "height": 900}}
# (user, page name, path): what each role opens
PAGES = [("owner", "jobs", "/"), ("owner", "job", "/jobs/{job}/"), ("owner", "launch", "/jobs/new/"),
         ("prov", "provider", "/provider/"), ("staff", "marketplace", "/marketplace/"), ("staff", "jobs", "/")]


@pytest.fixture
def responsive_site(tmp_path, redis_url):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    stack = make_stack(tmp_path, redis_url, CELERY_TASK_ALWAYS_EAGER="true")
    setup = f"MODEL_DIR = {factories.checkpoint_dir()!r}\nGONE = 'http://127.0.0.1:{closed_port()}'\n" + SETUP
    create_users(stack, "owner", "prov", "staff", setup=setup)
    yield start_site(stack, celery=False, host="localhost")
    stack.stop()


def layout_problems(page, width: int) -> list[str]:
    """What a reader of this width would notice: a page wider than the screen, a chart that does not fit it."""
    problems = []
    if page.evaluate("window.innerWidth") != width:  # no <meta name=viewport>: a phone lays the page out at 980 px
        problems.append(f"laid out at {page.evaluate('window.innerWidth')} px, not {width}")
    scroll = page.evaluate("document.documentElement.scrollWidth")
    if scroll > width:
        problems.append(f"the page scrolls sideways: {scroll} px wide on a {width} px screen")
    for svg in page.locator("main svg").all():
        box = svg.bounding_box()
        if box and box["x"] + box["width"] > width + 0.5:
            problems.append(f"#{svg.get_attribute('id')} ends at {box['x'] + box['width']:.0f} px")
    return problems


def test_every_page_fits_a_phone_and_a_desktop_and_passes_axe(responsive_site, browser):
    url = responsive_site
    EVIDENCE.mkdir(parents=True, exist_ok=True)
    problems: dict[str, list[str]] = {}
    icon = httpx.get(url + "/favicon.ico", follow_redirects=True, timeout=10)  # what every browser asks for first
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg")
    for device, options in (("phone", PHONE), ("desktop", DESKTOP)):
        width = options["viewport"]["width"]
        for user in ("owner", "prov", "staff"):
            context = browser.new_context(**options)
            page = context.new_page()
            sign_in(page, url, user, f"{user}-pass")
            job = page.evaluate("fetch('/api/jobs/').then(r => r.json()).then(j => j.results.map(x => x.id))")
            for _, name, path in (p for p in PAGES if p[0] == user):
                page.goto(url + path.format(job=job[0] if job else 0))
                page.wait_for_load_state("networkidle")
                where = f"{device} {user} {name}"
                problems[where] = layout_problems(page, width) + axe_violations(page)
                if name == "job":  # its learner reports, no worker is online: it says "waiting", not a green running
                    assert page.locator("#waiting-badge").is_visible()
                    assert "status-waiting" in page.locator('[data-key="status"]').get_attribute("class")
                    assert page.locator("#waiting-reason").inner_text() == "waiting for workers: none online"
                page.screenshot(path=str(EVIDENCE / f"responsive-{device}-{user}-{name}.png"), full_page=True)
            context.close()
    failing = [f"{where}: {problem}" for where, found in problems.items() for problem in found]
    assert not failing, "\n".join(failing)
    assert len(problems) == 2 * len(PAGES)


def test_the_charts_draw_every_series_with_a_readout_keyboard_zoom_and_clipped_outliers(responsive_site, browser):
    url = responsive_site
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    sign_in(page, url, "owner", "owner-pass")
    job = page.evaluate("fetch('/api/jobs/').then(r => r.json()).then(j => j.results[0].id)")
    page.goto(f"{url}/jobs/{job}/")
    for chart, series in (("loss-chart", ["loss"]), ("kl-chart", ["kl"]), ("grad-norm-chart", ["grad-norm"]),
                          ("tokens-chart", ["tokens-per-s"]), ("length-chart", ["completion-mean", "completion-max"])):
        for name in series:  # all 20 steps, drawn
            assert len(page.locator(f"#{chart} polyline.{name}").get_attribute("points").split()) == 20, (chart, name)
        assert page.locator(f"#{chart} line.grid").count() >= 3  # gridlines at round values

    # The 17 s first step is clipped, marked, and does not flatten the other steps (0.05-0.07 s).
    times = page.locator("#time-chart")
    assert "17.000 s (above the scale)" in times.locator("path.clipped title").text_content()
    top = max(float(t) for t in times.locator("text.y-tick").all_text_contents())
    assert top < 1, top
    # Told apart by more than colour: the wait is dashed, the train time is not; a legend names each.
    assert times.locator("polyline.t-wait").get_attribute("stroke-dasharray")
    assert not times.locator("polyline.t-train").get_attribute("stroke-dasharray")
    assert times.locator("g.legend-item text").all_text_contents() == ["train", "learner wait"]

    # Hover: the values at the step under the pointer, as reported and smoothed.
    page.locator("#kl-chart").hover()  # its middle: step 10 of 1-20
    said = page.locator("#kl-chart-readout").inner_text()
    assert said.startswith("Step 10: KL 0.0100 (smoothed"), said

    # Keyboard: Right moves the readout; + zooms every chart around it; 0 shows every step again.
    page.focus("#kl-chart")
    page.keyboard.press("ArrowRight")
    assert page.locator("#kl-chart-readout").inner_text().startswith("Step 11: KL 0.0110")
    page.keyboard.press("+")
    lo, hi = (int(page.locator("#loss-chart").get_attribute(f"data-{k}")) for k in ("lo", "hi"))
    assert 1 < lo <= 11 <= hi < 20 and len(page.locator("#loss-chart polyline.loss").get_attribute(
        "points").split()) == hi - lo + 1
    page.keyboard.press("0")
    assert page.locator("#loss-chart").get_attribute("data-lo") == "1"
    page.screenshot(path=str(EVIDENCE / "charts-desktop.png"), full_page=True)

