"""The launch page: every job setting (broadcast, loss) reaches the job, and "Preview plan" shows the capacity
plan for the form's values without creating anything."""

from __future__ import annotations

import re

import pytest

from dataplane.chat import PromptFormat
from dataplane.evalspec import EvalConfig
from dataplane.jobs import JobSpec, LossConfig
from dataplane.lora import LoraSpec
from dataplane.requirements import Requirements
from frontend.forms import JobLaunchForm
from marketplace.models import Job, Worker, WorkerCalibration

from ..marketplace import factories
from .test_pages import LAUNCH, signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]

# S = 3 (kappa = 2), R = 64, T_train = 10 s, T_bcast = 4 s: mu_min = 2*64/(2*10 - 4) = 8, target 8.8 traj/s.
PREVIEW = {**LAUNCH, "staleness": 3, "batch_trajectories": 64, "group_size": 8, "t_train_s": 10, "t_bcast_s": 4,
           "preview": "1"}


def calibrated(provider, name: str, price: str, throughput: float) -> Worker:
    worker, _ = factories.worker(provider, name=name, price=price)
    Worker.objects.filter(pk=worker.pk).update(status=Worker.Status.IDLE)
    WorkerCalibration.objects.create(worker=worker, model_dir=LAUNCH["model_dir"], task_name="arithmetic",
                                     throughput=throughput)
    return worker


def text_of(html: str, element_id: str) -> str:
    """The text inside the element with this id, tags and runs of spaces removed."""
    inner = html.split(f'id="{element_id}"', 1)[1].split(">", 1)[1]
    tag = re.match(r".*?</(dd|p|table)>", inner, re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", tag.group(0)).split())


@pytest.fixture
def fleet():
    """The cheapest cover of 8.8 traj/s is big-rig alone ($5/h); the greedy by unit cost takes small-rig
    (rho 0.4) first, then big-rig ($6.2/h)."""
    provider = factories.user()
    return {"big": calibrated(provider, "big-rig", "5.0", 10.0), "mid": calibrated(provider, "mid-rig", "4.0", 6.0),
            "small": calibrated(provider, "small-rig", "1.2", 3.0)}


def test_preview_shows_the_chosen_workers_and_their_price_and_creates_no_job(fleet):
    reply = signed_in(factories.user()).post("/jobs/new/", PREVIEW)
    assert reply.status_code == 200 and Job.objects.count() == 0
    html = reply.content.decode()
    assert text_of(html, "plan-target").startswith("8.80 traj/s")
    assert text_of(html, "plan-price") == "5.00 USD/h"
    assert text_of(html, "plan-greedy-price").startswith("6.20 USD/h")
    assert text_of(html, "plan-lag").startswith("3 steps") and text_of(html, "plan-feasible").startswith("yes")
    assert text_of(html, "plan-covered") == "yes"
    chosen = text_of(html, "plan-workers")
    assert chosen.startswith("1 ·")
    table = html.split('class="plan-workers"', 1)[1].split("</table>", 1)[0]
    assert "big-rig" in table and "small-rig" not in table and "calibration" in table
    assert "given by you" in text_of(html, "plan-t-train")
    assert 'value="from the form"' in html  # the form keeps what was typed


def test_preview_without_t_train_is_the_calibration_phase_then_uses_an_earlier_job(fleet):
    owner = factories.user()
    body = {k: v for k, v in PREVIEW.items() if k not in ("t_train_s", "t_bcast_s")}
    html = signed_in(owner).post("/jobs/new/", body).content.decode()
    assert "Calibration phase" in text_of(html, "plan-calibration")
    assert text_of(html, "plan-workers") == "3" and text_of(html, "plan-price") == "10.20 USD/h"

    earlier = factories.job(owner, staleness=3, name="last week", batch_trajectories=64)
    Job.objects.filter(pk=earlier.pk).update(learner_t_train=10.0)
    html = signed_in(owner).post("/jobs/new/", body).content.decode()
    assert f'job #{earlier.pk} "last week"' in text_of(html, "plan-t-train").replace("&quot;", '"')
    assert "0 assumed" in text_of(html, "plan-t-bcast")
    assert text_of(html, "plan-target").startswith("7.04 traj/s")  # T_bcast 0: 1.1 * 2*64/20
    assert Job.objects.count() == 1


def test_preview_of_an_infeasible_schedule_says_why(fleet):
    html = signed_in(factories.user()).post("/jobs/new/", {**PREVIEW, "t_train_s": 1, "t_bcast_s": 3}).content.decode()
    assert text_of(html, "plan-feasible").startswith("no")
    reason = text_of(html, "plan-reason")
    assert "no pool can keep up" in reason and 'id="plan-price"' not in html
    # it still trains, with every worker: the reason says what that costs instead of suggesting it cannot run
    assert "Training still goes on" in reason and "waits at least 1 s" in reason and "bubble of at least 33%" in reason


def test_a_pool_short_of_the_target_is_not_shown_as_covering_it(fleet):
    # R = 256: mu_min = 2 x 256 / (2 x 10 - 4) = 32, target 35.2 traj/s; the fleet has 19
    html = signed_in(factories.user()).post("/jobs/new/", {**PREVIEW, "batch_trajectories": 256}).content.decode()
    assert text_of(html, "plan-feasible").startswith("yes")  # the configuration is fine...
    assert text_of(html, "plan-covered") == "no: 16.20 traj/s short"  # ...the pool is not
    assert "short of the target" in text_of(html, "plan-shortfall")
    assert text_of(html, "plan-lag").endswith("S = 3") and "steps" in text_of(html, "plan-lag")


def test_preview_warns_where_staleness_and_correction_were_measured_unstable(fleet):
    owner = factories.user()
    html = signed_in(owner).post("/jobs/new/", {**PREVIEW, "staleness": 11, "loss_off_policy": "tis"}).content.decode()
    assert '<p class="error" id="plan-staleness">' in html
    warning = text_of(html, "plan-staleness")
    assert warning.startswith("Staleness: S = 11 with off_policy = tis is in a region measured unstable")
    assert "only 5/16 runs reached 0.8" in warning and "Staleness and corrections, measured" in warning
    # the default correction at S = 3: what was measured, not as a warning
    html = signed_in(owner).post("/jobs/new/", PREVIEW).content.decode()
    assert '<p id="plan-staleness">' in html
    assert text_of(html, "plan-staleness").startswith("Staleness: S = 3 with off_policy = behaviour measured good")
    assert Job.objects.count() == 0


def test_the_broadcast_and_loss_settings_reach_the_job():
    owner = factories.user()
    page = signed_in(owner).get("/jobs/new/").content.decode()
    assert "<legend>Loss</legend>" in page and 'name="loss_kl_beta"' in page and 'name="broadcast_strategy"' in page
    assert 'name="loss_is_cap" value="2.0"' in page  # defaults shown
    reply = signed_in(owner).post("/jobs/new/", {
        **LAUNCH, "broadcast_strategy": "star-limited", "loss_type": "gspo", "loss_advantage": "mean",
        "loss_clip_eps_low": "0.2", "loss_clip_eps_high": "0.28", "loss_kl_beta": "0.05",
        "loss_aggregation": "seq-mean-token-sum", "loss_norm_length": "16", "loss_off_policy": "tis",
        "loss_is_cap": "3", "loss_advantage_eps": "", "loss_dual_clip": "3", "loss_advantage_std": "population"})
    job = Job.objects.get()
    assert reply.status_code == 302 and job.settings.broadcast_strategy == "star-limited"
    assert job.settings.loss.model_dump() == {
                        "type": "gspo", "advantage": "mean", "advantage_eps": 1e-6, "advantage_std": "population",
                        "clip_eps_low": 0.2,
                        "clip_eps_high": 0.28, "kl_beta": 0.05, "aggregation": "seq-mean-token-sum",
                        "norm_length": 16, "off_policy": "tis", "is_cap": 3.0, "max_grad_norm": 1.0,
                        "dual_clip": 3.0}


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"loss_kl_beta": "-1"}, "loss_kl_beta", "greater than or equal to 0"),
    ({"loss_clip_eps_low": "1.5"}, "loss_clip_eps_low", "less than 1"),
    ({"loss_is_cap": "0.5"}, "loss_is_cap", "greater than or equal to 1"),
    ({"loss_norm_length": "0"}, "loss_norm_length", "greater than or equal to 1"),
    ({"loss_type": "ppo"}, "loss_type", "Select a valid choice"),
    ({"broadcast_strategy": "smoke"}, "broadcast_strategy", "Select a valid choice"),
    ({"t_train_s": "0", "preview": "1"}, "t_train_s", "positive"),
    ({"t_bcast_s": "-1", "preview": "1"}, "t_bcast_s", "greater than or equal to 0"),
    ({"staleness": "1", "preview": "1"}, "staleness", "greater than or equal to 2"),
])
def test_a_bad_value_shows_its_error_next_to_its_field(change, field, message):
    reply = signed_in(factories.user()).post("/jobs/new/", {**LAUNCH, **change})
    assert reply.status_code == 200 and Job.objects.count() == 0
    html = reply.content.decode()
    error = html.split(f'id="error-{field}"', 1)[1].split("</span>", 1)[0]
    assert message in error and 'id="plan-target"' not in html


def test_every_job_setting_has_a_field_in_one_fieldset():
    form = JobLaunchForm()
    placed = [name for _, names in form.fieldsets for name in names]
    assert sorted(placed) == sorted(form.fields)  # each field drawn exactly once
    tables = {"loss": LossConfig, "prompt_format": PromptFormat, "requirements": Requirements,  # <table>_<name>
              "eval": EvalConfig, "lora": LoraSpec}
    settings = set(JobSpec.model_fields) - {"task", "learner_uplink_bps", *tables}  # task_name/options, Mbit/s
    assert settings | {f"{t}_{name}" for t, model in tables.items() for name in model.model_fields} <= set(form.fields)
