"""The capacity plan of a job not created yet (scheduling.spec_plan, POST /api/jobs/plan/): where its
T_train and T_bcast come from, the calibration phase when there is no T_train, and the infeasible case."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from dataplane.jobs import parse_job_spec
from marketplace import services
from marketplace.models import Job, Worker, WorkerCalibration
from marketplace.reads import scheduling

from . import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]

MODEL = factories.checkpoint_dir()
# S = 3 (kappa = 2), R = 64: with T_train = 10 s and T_bcast = 4 s, mu_min = 2*64/(2*10 - 4) = 8 traj/s and
# the target is gamma * mu_min = 1.1 * 8 = 8.8 traj/s.
BODY = {"name": "next run", "model_dir": MODEL, "task": {"name": "arithmetic"}, "staleness": 3,
        "batch_trajectories": 64, "group_size": 8}


def spec(**change):
    return parse_job_spec({**BODY, **change})


def online(provider, price: str, *, calibrated: float | None = None, measured: float | None = None,
           status: str = Worker.Status.IDLE, model_dir: str = MODEL) -> Worker:
    """A worker whose agent is connected, with a calibration for (model_dir, arithmetic) and/or the throughput
    it last reported on anything."""
    worker, _ = factories.worker(provider, price=price)
    Worker.objects.filter(pk=worker.pk).update(status=status, throughput=measured)
    if calibrated is not None:
        WorkerCalibration.objects.create(worker=worker, model_dir=model_dir, task_name="arithmetic",
                                         throughput=calibrated)
    worker.refresh_from_db()
    return worker


@pytest.fixture
def fleet():
    """Three calibrated idle workers where the cheapest cover (a alone, $5/h) beats the greedy by unit cost
    (c at rho 0.4, then a: $6.2/h), one unmeasured, and two that no new job can have."""
    provider = factories.user()
    fleet = {
        "a": online(provider, "5.0", calibrated=10.0),  # rho 0.5
        "b": online(provider, "4.0", calibrated=6.0),  # rho 0.67
        "c": online(provider, "1.2", calibrated=3.0),  # rho 0.4
        "unmeasured": online(provider, "0.1"),
        "offline": online(provider, "0.2", calibrated=50.0, status=Worker.Status.OFFLINE),
        "busy": online(provider, "0.2", calibrated=50.0),
    }
    other = factories.job(factories.user(), staleness=3)
    services.worker_activate(worker=fleet["busy"], job=other)
    return fleet


def test_given_estimates_give_the_cheapest_cover_and_the_greedy_for_comparison(fleet):
    plan = scheduling.spec_plan(spec(), user=factories.user(), t_train=10.0, t_bcast=4.0)
    sources = plan["measurements"]["sources"]
    assert (plan["measurements"]["t_train"], sources["t_train"]["source"]) == (10.0, "given")
    assert (plan["measurements"]["t_bcast"], sources["t_bcast"]["source"]) == (4.0, "given")
    report = plan["report"]
    assert report["mu_min"] == pytest.approx(8.0) and report["target"] == pytest.approx(8.8)
    assert report["feasible"] is True and report["max_lag"] == 3  # 2 + ceil(0.5 * 4 / 10) <= S = 3
    [chosen] = plan["plan"]["workers"]
    assert (chosen["id"], chosen["price_per_hour"], chosen["throughput"], chosen["source"]) == (
        fleet["a"].pk, 5.0, 10.0, "calibration")
    assert chosen["unit_cost"] == pytest.approx(0.5) and plan["plan"]["price_per_hour"] == pytest.approx(5.0)
    assert {w["id"] for w in plan["greedy"]["workers"]} == {fleet["a"].pk, fleet["c"].pk}
    assert plan["greedy"]["price_per_hour"] == pytest.approx(6.2)
    assert [w["id"] for w in plan["unmeasured"]] == [fleet["unmeasured"].pk]
    assert plan["calibration"] is None and plan["active"] == []


def test_a_worker_without_calibration_is_planned_with_its_last_measured_throughput(fleet):
    provider = factories.user()
    fast = online(provider, "1.0", measured=20.0, calibrated=1.0, model_dir=factories.checkpoint_dir("other"))
    plan = scheduling.spec_plan(spec(), user=factories.user(), t_train=10.0, t_bcast=4.0)
    [chosen] = plan["plan"]["workers"]
    assert (chosen["id"], chosen["throughput"], chosen["source"]) == (fast.pk, 20.0, "last measured")


def test_estimates_come_from_the_newest_earlier_job_of_the_same_model_and_task(fleet):
    owner, stranger = factories.user(), factories.user()
    older = factories.job(owner, staleness=3, batch_trajectories=64)
    Job.objects.filter(pk=older.pk).update(learner_t_train=5.0)
    earlier = factories.job(owner, staleness=3, name="yesterday", batch_trajectories=64)
    Job.objects.filter(pk=earlier.pk).update(learner_t_train=10.0)
    earlier.snapshots.create(version=1, url="http://x/v1/", manifest={}, t_bcast=1.0)
    earlier.snapshots.create(version=2, url="http://x/v2/", manifest={}, t_bcast=4.0)
    earlier.snapshots.create(version=3, url="http://x/v3/", manifest={})  # not installed widely yet
    other_model = factories.job(owner, model_dir=factories.checkpoint_dir("other"), staleness=3)
    Job.objects.filter(pk=other_model.pk).update(learner_t_train=99.0)
    calibrating = factories.job(owner, staleness=3)  # newest, but its learner has measured nothing

    plan = scheduling.spec_plan(spec(), user=owner)
    train, bcast = plan["measurements"]["sources"]["t_train"], plan["measurements"]["sources"]["t_bcast"]
    assert (train["value"], train["source"], train["job"]) == (10.0, "earlier job",
                                                               {"id": earlier.pk, "name": "yesterday"})
    assert f"job #{earlier.pk}" in train["note"] and calibrating.pk != earlier.pk
    assert (bcast["value"], bcast["source"], bcast["job"]["id"]) == (4.0, "earlier job", earlier.pk)
    assert "snapshot v2" in bcast["note"]
    assert plan["report"]["target"] == pytest.approx(8.8) and plan["plan"]["price_per_hour"] == pytest.approx(5.0)

    # Twice the trajectories per update: the earlier job's T_train, scaled to the new R.
    bigger = scheduling.spec_plan(spec(batch_trajectories=128), user=owner)["measurements"]["sources"]["t_train"]
    assert bigger["value"] == pytest.approx(20.0) and "scaled to R = 128" in bigger["note"]

    given = scheduling.spec_plan(spec(), user=owner, t_train=20.0)  # a given T_train wins; T_bcast still measured
    assert given["measurements"]["t_train"] == 20.0 and given["measurements"]["sources"]["t_bcast"]["value"] == 4.0

    # Someone else's jobs are not theirs to see: a stranger gets the calibration phase.
    assert scheduling.spec_plan(spec(), user=stranger)["measurements"]["sources"]["t_train"]["source"] == "none"


def test_without_t_train_the_plan_is_the_calibration_phase_with_every_available_worker():
    provider = factories.user()
    calibrated = online(provider, "0.5", calibrated=2.0)
    measured = online(provider, "0.4", measured=3.0)
    unmeasured = online(provider, "0.3")
    online(provider, "0.1", calibrated=9.0, status=Worker.Status.OFFLINE)

    plan = scheduling.spec_plan(spec(), user=factories.user())
    assert plan["report"]["feasible"] is None and "calibrating" in plan["report"]["reason"]
    assert plan["plan"] is None and plan["greedy"] is None
    assert plan["measurements"]["t_train"] is None and plan["measurements"]["sources"]["t_bcast"]["value"] == 0.0
    pool = plan["calibration"]
    assert [(w["id"], w["source"]) for w in pool["workers"]] == [
        (unmeasured.pk, None), (measured.pk, "last measured"), (calibrated.pk, "calibration")]
    assert pool["price_per_hour"] == pytest.approx(1.2) and pool["throughput"] == pytest.approx(5.0)


def test_a_broadcast_longer_than_kappa_steps_is_infeasible_with_its_reason(fleet):
    plan = scheduling.spec_plan(spec(), user=factories.user(), t_train=1.0, t_bcast=3.0)  # 2 x 1 s <= 3 s
    assert plan["report"]["feasible"] is False and plan["report"]["target"] is None
    assert "no pool can keep up" in plan["report"]["reason"] and "kappa*T_train" in plan["report"]["reason"]
    assert plan["plan"] is None and plan["greedy"] is None


# ---- POST /api/jobs/plan/ ------------------------------------------------------------------------------


def client_for(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(user)}")
    return api


def test_api_previews_the_plan_and_creates_nothing(fleet):
    reply = client_for(factories.user()).post("/api/jobs/plan/", {**BODY, "t_train_s": 10, "t_bcast_s": 4},
                                              format="json")
    assert reply.status_code == 200, reply.content
    plan = reply.json()
    assert set(plan) == {"measurements", "active", "unmeasured", "report", "plan", "greedy", "calibration",
                         "requirements", "staleness_guidance"}
    assert plan["report"]["target"] == pytest.approx(8.8)
    assert [w["name"] for w in plan["plan"]["workers"]] == [fleet["a"].name]
    assert plan["plan"]["price_per_hour"] == pytest.approx(5.0) and plan["greedy"]["price_per_hour"] == 6.2
    assert plan["measurements"]["sources"]["t_train"]["source"] == "given"
    assert Job.objects.filter(name="next run").count() == 0


def test_api_plan_warns_where_staleness_and_correction_were_measured_unstable():
    api = client_for(factories.user())
    risky = api.post("/api/jobs/plan/", {**BODY, "staleness": 11, "loss": {"off_policy": "tis"}}, format="json")
    assert risky.status_code == 200, risky.content
    guidance = risky.json()["staleness_guidance"]
    assert (guidance["staleness"], guidance["correction"], guidance["verdict"]) == (11, "tis", "unstable")
    warning = guidance["warning"]
    assert warning.startswith("S = 11 with off_policy = tis is in a region measured unstable")
    assert "S = 6: only 5/16 runs reached 0.8" in warning and "bench_staleness --full" in warning
    assert 'docs/learner.md, "Staleness and corrections, measured"' in warning
    # S = 6 without a correction: 0/16, and the correction measured good there is named
    none = api.post("/api/jobs/plan/", {**BODY, "staleness": 6, "loss": {"off_policy": "none"}}, format="json").json()
    assert none["staleness_guidance"]["verdict"] == "unstable" and none["staleness_guidance"]["better"] == ["behaviour"]
    assert "off_policy = behaviour" in none["staleness_guidance"]["warning"]


def test_api_plan_gives_the_measurement_but_no_warning_where_it_was_good():
    reply = client_for(factories.user()).post("/api/jobs/plan/", {**BODY, "staleness": 3}, format="json")  # behaviour
    guidance = reply.json()["staleness_guidance"]
    assert (guidance["correction"], guidance["verdict"], guidance["warning"]) == ("behaviour", "good", None)
    assert "+10% [-9%, +23%] against synchronous" in guidance["figure"]
    unmeasured = client_for(factories.user()).post("/api/jobs/plan/", {**BODY, "staleness": 1000}, format="json")
    assert unmeasured.status_code == 200, unmeasured.content
    assert unmeasured.json()["staleness_guidance"]["verdict"] == "slow"  # behaviour's S = 11 row speaks for more


def test_a_stored_jobs_plan_carries_the_same_warning():
    owner = factories.user()
    job = factories.job(owner, staleness=11, loss={"off_policy": "tis"})
    reply = client_for(owner).get(f"/api/jobs/{job.pk}/plan/")
    assert reply.status_code == 200, reply.content
    assert reply.json()["staleness_guidance"]["warning"].startswith("S = 11 with off_policy = tis")


@pytest.mark.parametrize(("change", "field"), [
    ({"staleness": 1}, "staleness"),
    ({"kappa": 3}, "kappa"),
    ({"batch_trajectories": 60}, "batch_trajectories"),
    ({"task": {"name": "nope"}}, "task"),
    ({"loss": {"kl_beta": -1}}, "loss.kl_beta"),
    ({"broadcast_strategy": "smoke-signals"}, "broadcast_strategy"),
    ({"t_train_s": 0}, "t_train_s"),
    ({"t_bcast_s": -1}, "t_bcast_s"),
])
def test_api_plan_names_the_bad_field(change, field):
    reply = client_for(factories.user()).post("/api/jobs/plan/", {**BODY, **change}, format="json")
    assert reply.status_code == 400
    assert reply.json()["detail"].startswith(f"{field}:")


def test_api_plan_needs_sign_in_and_is_documented():
    assert APIClient().post("/api/jobs/plan/", BODY, format="json").status_code in (401, 403)
    schema = client_for(factories.user()).get("/api/schema/").content.decode()
    assert "/api/jobs/plan/:" in schema and "t_train_s" in schema and "CapacityPlan" in schema
