"""Every figure of the job page says what it is and equals what it is drawn from: the reward as the mean
of the learner's last 10 reported step means as of a step, the step figures of that step, T_bcast of a named
snapshot, the throughput target with its derivation or the launch preview's reason why none can be met, a finished
job's final figures (spent from the ledger, no projection), a job waiting for its learner, and the download: where
the site cannot serve it (the job ended, its learner is silent, nothing published), the page and the API say how
to get the model instead."""

from __future__ import annotations

import html
import math
import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from dataplane.snapshot import build_manifest
from echo2_cli.render import summary_rows
from marketplace import services
from marketplace.core import provisioning
from marketplace.models import Activation, Job, Snapshot
from marketplace.reads import ledger
from marketplace.services.billing import activation_report

from ..lying_servers import closed_port
from ..marketplace import factories
from .test_pages import signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]
REWARDS = [0.05, 0.12, 0.31, 0.22, 0.47, 0.38, 0.61, 0.55, 0.72, 0.66, 0.83, 0.91]  # steps 1..12


def keyed(page: str, key: str) -> list[str]:
    """The text of every element the page marks ``data-key=key`` (what job.js updates live)."""
    return [html.unescape(text) for text in re.findall(rf'data-key="{key}"[^>]*>([^<]*)<', page)]


def shown(page: str, marker: str) -> bool:
    """Whether the element whose opening tag holds ``marker`` is rendered without ``hidden``."""
    before, after = page.split(marker, 1)
    tag = before.rsplit("<", 1)[1] + marker + after.split(">", 1)[0]
    return " hidden" not in tag


def publish(job: Job, version: int, url: str) -> None:
    """The learner's publication of ``version`` (0: the base checkpoint archive) at ``url``."""
    manifest = build_manifest(bytes(16), job_id=job.pk, version=version,
                              format="checkpoint-tar" if version == 0 else "safetensors")
    services.snapshot_publish(job=Job.objects.get(pk=job.pk), version=version, url=url,
                              manifest=manifest.model_dump(mode="json"))


def report_steps(job: Job) -> None:
    for step, reward in enumerate(REWARDS, 1):
        services.metrics_record(job=Job.objects.get(pk=job.pk), step=step, values={
            "reward_mean": reward, "t_train": 0.04 + step / 1000, "wait_s": 0.01, "max_staleness": step % 3,
            "dropped_stale": 2 * step})


@pytest.fixture
def running(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "ALLOW_LOOPBACK_PEERS": True, "WORKER_TIMEOUT_S": 30.0}
    owner = factories.user()
    job = services.job_start(job=factories.job(owner, staleness=3))
    return owner, job


def test_the_step_figures_are_the_learners_reports_as_of_the_last_step(running):
    owner, job = running
    services.learner_announce(job=Job.objects.get(pk=job.pk), t_train=0.05)
    report_steps(job)
    page = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()

    window = REWARDS[-10:]
    assert "-step mean" in page and keyed(page, "reward_recent_steps") == ["10"]
    assert float(keyed(page, "reward_recent_mean")[0]) == pytest.approx(math.fsum(window) / 10, abs=5e-4)
    assert float(keyed(page, "reward_mean")[0]) == pytest.approx(REWARDS[-1], abs=5e-4)  # "that step alone"
    assert set(keyed(page, "as_of_step")) == {"12"} and len(keyed(page, "as_of_step")) == 4  # reward, T_train, ...
    assert float(keyed(page, "t_train")[0]) == pytest.approx(0.05, abs=5e-4)  # the job's, as the learner announced
    assert float(keyed(page, "step_train_s")[0]) == pytest.approx(0.052, abs=5e-4)  # step 12's own
    assert float(keyed(page, "bubble_ratio")[0]) == pytest.approx(0.01 / (0.01 + 0.052), abs=5e-4)
    assert keyed(page, "max_staleness") == [str(max(step % 3 for step in range(1, 13)))]
    assert keyed(page, "dropped_stale") == ["24"]  # cumulative, as the learner reported it at step 12
    assert not shown(page, 'id="learner-waiting"') and not shown(page, 'data-show="final"')
    assert shown(page, 'id="projected"')

    # The target: gamma * mu_min from the learner's T_train and no broadcast yet, with its derivation.
    target = provisioning.mu_target(kappa=job.settings.kappa, batch=8, t_train=0.05, t_bcast=0.0,
                                    gamma=job.settings.gamma)
    assert float(keyed(page, "throughput_target")[0]) == pytest.approx(target, abs=0.05)
    line = keyed(page, "throughput_target_line")[0]
    assert f"= {target:.4g} traj/s from T_train 0.05 s (the median of the learner's last 10 steps), T_bcast " \
           "0 s (no broadcast measured yet: 0 assumed)" in line, line
    assert 'class="target-line"' in page  # not marked as an error

    # echo2 job status says the same figures, from the API's summary
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    rows = dict(summary_rows(api.get(f"/api/jobs/{job.pk}/summary/").json(), staleness=3))
    assert rows["mean reward (10-step)"] == (f"{keyed(page, 'reward_recent_mean')[0]} as of step 12 (that step alone "
                                             f"{keyed(page, 'reward_mean')[0]})")
    assert rows["target"] == line and "projected cost" in rows
    assert keyed(page, "t_bcast_of") == ["no broadcast measured yet"] and keyed(page, "t_bcast") == ["not measured yet"]


def test_one_t_train_on_the_card_in_the_formula_in_the_plan_and_in_echo2_job_status(running):
    """The card beside the target's formula shows the same T_train as the formula, whatever the last step took."""
    owner, job = running
    services.learner_announce(job=Job.objects.get(pk=job.pk), t_train=2.07)  # the median the learner announced
    services.metrics_record(job=Job.objects.get(pk=job.pk), step=1, values={"reward_mean": 0.1, "t_train": 2.43,
                                                                          "wait_s": 0.1})
    page = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()

    card = keyed(page, "t_train")[0]
    formula = re.search(r"from T_train (\S+) s", keyed(page, "throughput_target_line")[0])[1]
    assert float(card) == pytest.approx(2.07, abs=5e-4) and float(formula) == pytest.approx(2.07, abs=5e-3)
    assert float(keyed(page, "step_train_s")[0]) == pytest.approx(2.43, abs=5e-4)  # the step's own, named apart

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    summary = api.get(f"/api/jobs/{job.pk}/summary/").json()
    assert summary["t_train"] == 2.07 and summary["step_train_s"] == 2.43
    assert api.get(f"/api/jobs/{job.pk}/plan/").json()["measurements"]["t_train"] == 2.07
    assert dict(summary_rows(summary, staleness=3))["T_train / T_bcast"].startswith("2.070 s / ")


def test_t_bcast_names_its_snapshot_and_a_target_no_pool_can_meet_says_why(running):
    owner, job = running
    worker, _ = factories.worker(factories.user())
    Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour, state="generating")
    services.learner_announce(job=Job.objects.get(pk=job.pk), t_train=0.001)  # kappa * T_train = 2 ms
    publish(job, 1, "http://127.0.0.1:9/v1/")
    time.sleep(0.05)  # the broadcast takes longer than two steps of training: no pool can keep up
    services.snapshot_installed(worker=worker, job_id=job.pk, version=1, seconds=0.05)
    snap = Snapshot.objects.get(job=job, version=1)
    page = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()

    assert keyed(page, "t_bcast_of") == ["snapshot v1"]
    assert float(keyed(page, "t_bcast")[0]) == pytest.approx(snap.t_bcast, abs=5e-4)
    assert keyed(page, "throughput_target") == ["–"]
    reason = provisioning.feasibility(staleness=3, kappa=job.settings.kappa, t_train=0.001, t_bcast=snap.t_bcast,
                                      batch=8, gamma=job.settings.gamma, mu_pool=0.0).reason  # the preview's words
    assert reason.startswith("no pool can keep up")
    line = keyed(page, "throughput_target_line")[0]
    assert line.startswith("no target: " + reason) and "(snapshot v1)" in line
    assert 'class="target-line error"' in page


def test_a_finished_job_shows_its_final_figures_and_how_to_get_its_model(running):
    owner, job = running
    services.learner_announce(job=Job.objects.get(pk=job.pk), t_train=0.05)
    worker, _ = factories.worker(factories.user(), price="3.6")
    base = timezone.now() - timedelta(seconds=1000)
    activation = Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour,
                                           state="generating", reported_at=base, started_at=base)
    activation_report(activation_id=activation.pk, at=base + timedelta(seconds=20), state="generating")
    report_steps(job)
    for version in (0, 12):  # the learner published the base and its final step; then it exited
        publish(job, version, f"http://127.0.0.1:{closed_port()}/v{version}/")
    services.job_finish(job=Job.objects.get(pk=job.pk), status=Job.Status.COMPLETED, reason="reached 12 steps")
    job = Job.objects.get(pk=job.pk)
    spent = ledger.job_spent_usd(job)
    assert spent == pytest.approx(3.6 * 20 / 3600)
    page = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()

    assert shown(page, 'data-show="final"') and not shown(page, 'id="projected"')  # no projection beside spent
    assert not shown(page, 'id="throughput"')  # no pool, no target: nothing is planned for it
    assert "Final reward</span>" in page and "Spent, final</span>" in page
    assert float(keyed(page, "cost_usd")[0]) == pytest.approx(spent, abs=5e-5)
    assert float(keyed(page, "reward_recent_mean")[0]) == pytest.approx(math.fsum(REWARDS[-10:]) / 10, abs=5e-4)
    assert keyed(page, "step") == ["12"]

    assert not shown(page, 'id="export"') and shown(page, 'id="export-howto"')
    howto = keyed(page, "export_line")[0]
    assert f"Job {job.pk} is completed: its learner exited with it" in howto
    assert "v12, its final model" in howto
    assert f"`echo2-learner export --job {job.pk} --out models/job{job.pk}`" in howto
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    summary = api.get(f"/api/jobs/{job.pk}/summary/").json()
    assert summary["final"] is True and summary["cost_usd"] == pytest.approx(spent)
    rows = dict(summary_rows(summary))  # echo2 job status: the final figures, no projection either
    assert rows["final mean reward (10-step)"].startswith(keyed(page, "reward_recent_mean")[0] + " as of step 12")
    assert rows["spent (ledger, final)"] == f"{spent:.4f} USD" and "projected cost" not in rows
    assert summary["throughput_target_line"].endswith("The job is completed: no worker is planned for it.")
    reply = api.get(f"/api/jobs/{job.pk}/export/")
    assert reply.status_code == 409, reply.content  # a foreseeable state: not a 503 to retry
    assert reply.json()["detail"].startswith(f"job {job.pk} is completed: the learner's snapshot server could not be "
                                             "reached (it serves snapshots only while it runs) and it exits when")
    assert f"`echo2-learner export --job {job.pk} --version 12 --out DIR`" in reply.json()["detail"]


def test_a_job_waiting_for_its_learner_says_so_and_how_to_start_it(running):
    owner, job = running
    client = signed_in(owner)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert shown(page, 'id="learner-waiting"')
    # the whole command, runnable as printed (dataplane/learner_command.py): the token file where the page says
    assert f'<code id="learner-command">echo2-learner --server http://testserver --job {job.pk} --token-file ' \
           "~/.echo2-token</code>" in page
    assert keyed(page, "waiting_reason")[0].startswith("waiting for learner: none has reported yet")
    assert keyed(page, "reward_recent_mean") == ["–"] and not shown(page, 'data-show="stepped"')  # no "as of step"
    assert keyed(page, "pool_throughput") == ["0.0"] and keyed(page, "throughput_target") == ["–"]
    assert keyed(page, "throughput_target_line")[0].startswith("no target yet: T_train is not known")
    assert 'class="target-line"' in page  # calibrating, not an error
    assert keyed(page, "export_line")[0].startswith("Nothing to download yet") and not shown(page, 'id="export"')
    assert keyed(page, "published_of") == ["none published yet"]

    Job.objects.filter(pk=job.pk).update(status=Job.Status.STALLED)  # as jobs_stall_silent_learners leaves it
    assert shown(client.get(f"/jobs/{job.pk}/").content.decode(), 'id="learner-waiting"')

    services.learner_announce(job=Job.objects.get(pk=job.pk), t_train=None)  # it runs again
    publish(job, 0, "http://127.0.0.1:9/v0/")
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert not shown(page, 'id="learner-waiting"') and shown(page, 'id="export"')  # its learner serves it
    assert keyed(page, "published_of") == ["v0"]

    Job.objects.filter(pk=job.pk).update(learner_seen_at=timezone.now() - timedelta(seconds=600))  # gone silent
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert not shown(page, 'id="export"')
    assert "Its learner has not been heard from since" in keyed(page, "export_line")[0]
