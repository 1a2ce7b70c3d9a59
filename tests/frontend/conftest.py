"""Browser-test fixtures: a live site (daphne, eager Celery) with an owner and a provider, and Debian's
Chromium driven by Playwright. Screenshots go to ``test-artifacts/``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ..live import create_users, make_stack, start_site

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


METRICS_TOKEN = "scraper-secret"  # what a Prometheus scraper of the test site sends (Authorization: Bearer)


@pytest.fixture
def site(tmp_path, redis_url):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (make test installs it)")
    stack = make_stack(tmp_path, redis_url, CELERY_TASK_ALWAYS_EAGER="true", ECHO2_METRICS_TOKEN=METRICS_TOKEN)
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
    # owners and staff land on the jobs, a provider with machines and no jobs on its own page (frontend.views.home)
    page.wait_for_url(lambda landed: landed in (url + "/", url + "/provider/"))


AXE = Path(__file__).resolve().parents[2] / "var" / "node" / "node_modules" / "axe-core" / "axe.min.js"
EVIDENCE = Path(__file__).resolve().parents[2] / "var" / "evidence"


def axe_violations(page, impacts: tuple[str, ...] = ("serious", "critical")) -> list[str]:
    """axe-core's violations of the page as it is now, at the given impacts, one line each (rule, impact, where).
    axe-core comes from npm (scripts/ensure-services.sh installs it under var/node); skipped without it."""
    if not AXE.exists():
        pytest.skip("axe-core is not installed (make services installs it with npm)")
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations.map("
                           "v => ({id: v.id, impact: v.impact, help: v.help,"
                           " nodes: v.nodes.map(n => n.target.join(' ') + ': ' + n.failureSummary)}))")
    return [f"{v['id']} ({v['impact']}): {v['help']}: {v['nodes'][:3]}" for v in result if v["impact"] in impacts]
