"""The learner's audit outcomes at the site (marketplace/services/audits.py): counted once per step however
often a report is re-sent, shown to the provider, and a worker past ECHO2_AUDIT_SUSPEND_AFTER failures is
suspended: released from its job (billing stops) and never planned or activated again.

Audits are evidence only within what the site saw: only the job's learner reports them (its
credential, not the owner's token alone), only of workers that delivered groups to that job, never more groups
than they delivered."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from dataplane.credentials import learner_token
from dataplane.records import TrajectoryGroup
from dataplane.replay import NEVER_DECODE
from dataplane.stored import StoredGroup, stored_entry
from dataplane.tasks import build_task
from learner.prompts import PromptFeeder
from marketplace import services
from marketplace.infra import stream
from marketplace.models import Activation, Job, Provider, Worker, WorkerAudit
from marketplace.reads import scheduling

from . import factories

pytestmark = pytest.mark.django_db


def report(api, job, step: int, audits: list[dict]):
    return api.post(f"/api/jobs/{job.pk}/metrics/", {"step": step, "reward_mean": 0.5, "audits": audits},
                    format="json")


def learner_api(owner, job: Job, *, credential: bool = True) -> APIClient:
    """The owner's API token, with the job's learner credential (as ``echo2-learner`` sends it) or without."""
    api = APIClient()
    headers = {"HTTP_AUTHORIZATION": f"Token {factories.token(owner)}"}
    if credential:
        headers["HTTP_X_ECHO2_LEARNER"] = learner_token(job.transfer_secret, job_id=job.pk)
    api.credentials(**headers)
    return api


def deliver(job: Job, worker: Worker, groups: int, *, lie: bool = False) -> None:
    """``worker`` leases and returns ``groups`` well-formed groups of ``job``, each accepted by the site: every
    record answers "7" with the task's reward for it, or (``lie``) the other one."""
    task = build_task(job.spec["task"])
    PromptFeeder(stream.client(), job_id=job.pk, task=task, seed=worker.pk,
                 backlog=stream.replay(job.pk).outstanding() + groups).top_up()
    done = 0
    while done < groups:
        lease = services.prompts_lease(worker=worker, job_id=job.pk, groups=groups - done)
        for leased in lease.leases:
            reward = task.reward(leased.prompt, "7")
            record = {"job_id": job.pk, "lease_id": leased.lease_id, "group_id": leased.group_id,
                      "prompt": leased.prompt, "prompt_ids": [1, 5, 6], "completion": "7", "completion_ids": [12, 2],
                      "logprobs": [-1.5, -0.2], "reward": 1.0 - reward if lie else reward, "version": 0}
            group = TrajectoryGroup.model_validate({"job_id": job.pk, "lease_id": leased.lease_id, "version": 0,
                                                    "group_id": leased.group_id,
                                                    "records": [record] * job.settings.group_size})
            assert services.trajectories_submit(worker=worker, group=group).accepted == job.settings.group_size
            done += 1


def entries(job: Job, worker: Worker) -> list[StoredGroup]:
    """The groups the site stored from ``worker`` in ``job``'s stream, oldest first."""
    replay = stream.replay(job.pk)
    raw = replay.client.execute_command("XRANGE", replay.trajectories, "-", "+", **{NEVER_DECODE: True})
    stored = [stored_entry(entry_id.decode(), fields) for entry_id, fields in raw]
    return [g for g in stored if g.worker_id == worker.pk]


def reward_failures(job: Job, worker: Worker, count: int, *, skip: int = 0) -> list[dict]:
    """The evidence an honest learner sends of ``worker``'s first wrong rewards (after ``skip`` groups)."""
    task = build_task(job.spec["task"])
    return [{"entry_id": g.entry_id, "group_id": g.packed.group_ids[0], "version": g.version, "check": "reward",
             "passed": False, "record": 0, "claimed_reward": g.packed.rewards[0],
             "recomputed_reward": task.reward(g.packed.prompts[0], g.packed.completions[0])}
            for g in entries(job, worker)[skip:skip + count]]


@pytest.fixture
def running(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "AUDIT_SUSPEND_AFTER": 2}
    owner, provider, other = factories.user(), factories.user(), factories.user()
    honest, _ = factories.worker(other, name="honest")  # another provider's (a suspension takes the whole account)
    liar, _ = factories.worker(provider, name="liar")
    Worker.objects.update(status=Worker.Status.IDLE)
    job = factories.job(owner)
    services.job_start(job=job)
    job.refresh_from_db()
    services.job_activate_idle_workers(job=job)  # the calibration phase: both idle workers join
    deliver(job, honest, 3)
    deliver(job, liar, 5, lie=True)
    return {"api": learner_api(owner, job), "job": job, "honest": honest, "liar": liar, "provider": provider,
            "owner": owner}


def test_outcomes_count_once_per_step_and_repeat_failures_suspend(running):
    api, job, honest, liar = running["api"], running["job"], running["honest"], running["liar"]
    assert Activation.objects.filter(job=job, ended_at=None).count() == 2
    first = [{"worker_id": honest.pk, "passed": 2, "failed": 0},
             {"worker_id": liar.pk, "passed": 0, "failed": 1, "dropped_records": 12, "reason": "records.0.reward: ...",
              "evidence": reward_failures(job, liar, 1)}]
    assert report(api, job, 1, first).status_code == 201
    assert report(api, job, 1, first).status_code == 201  # the same step again (a restarted learner): counted once
    liar.refresh_from_db()
    assert (liar.audits_failed, liar.suspended_at) == (1, None)
    assert WorkerAudit.objects.get(worker=liar, step=1).dropped_records == 12
    # Its first failure ends its part in this job (billing stops); suspension waits for the limit.
    assert Activation.objects.get(worker=liar).end_reason.startswith("failed its owner's audit: 1 group(s)")

    assert report(api, job, 2, [{"worker_id": liar.pk, "passed": 1, "failed": 1, "reason": "records.0.reward: x",
                                 "evidence": reward_failures(job, liar, 1, skip=1)}]).status_code == 201
    liar.refresh_from_db()
    assert liar.suspended_at is not None and "after 2 failed audits" in liar.suspended_reason
    assert "records.0.reward" in liar.suspended_reason
    assert liar.audit_pass_rate == pytest.approx(1 / 3)
    # Released (its billing stopped), the honest worker stays; the scheduler never plans it again.
    assert not Activation.objects.filter(worker=liar, ended_at=None).exists()
    assert Activation.objects.filter(worker=honest, ended_at=None).exists()
    pool = scheduling.candidate_pool(model_dir=job.model_dir, task_name="arithmetic")
    assert liar.pk not in pool.workers
    with pytest.raises(services.ServiceError, match="suspended"):
        services.worker_activate(worker=liar, job=job)
    honest.refresh_from_db()
    assert (honest.audits_passed, honest.audits_failed, honest.audit_pass_rate) == (2, 0, 1.0)


def test_the_provider_sees_pass_rates_and_the_suspension(running):
    api, job, liar, provider = running["api"], running["job"], running["liar"], running["provider"]
    report(api, job, 1, [{"worker_id": liar.pk, "passed": 3, "failed": 2, "reason": "records.0.reward: wrong",
                          "evidence": reward_failures(job, liar, 2)}])
    page = Client()
    page.force_login(provider)
    html = page.get("/provider/").content.decode()
    row = html.split('data-worker="liar"', 1)[1].split("</tr>", 1)[0]
    assert "60.0 %" in row and "(5)" in row and "suspended" in row and "records.0.reward: wrong" in row
    listed = {w["name"]: w for w in APIClient().get("/api/workers/", HTTP_AUTHORIZATION=f"Token "
                                                                 f"{factories.token(provider)}").json()["results"]}
    assert listed["liar"]["audit_pass_rate"] == pytest.approx(0.6) and listed["liar"]["suspended_at"]
    assert list(listed) == ["liar"]  # the honest worker is another provider's


@pytest.mark.parametrize("bad", [
    {"worker_id": 0, "passed": 1, "failed": 0},
    {"worker_id": 1, "passed": -1, "failed": 0},
    {"worker_id": 1, "passed": 1, "failed": 10**9},
    {"worker_id": 1, "passed": 1},
])
def test_a_malformed_audit_report_is_a_400_naming_the_field(running, bad):
    reply = report(running["api"], running["job"], 1, [bad])
    assert reply.status_code == 400
    body = reply.json()
    assert body["detail"].startswith("audits.0.") and all(key.startswith("audits.0.") for key in body["errors"])


def test_the_owners_token_alone_reports_no_audits(running):
    """The owner's API token is not the learner: without the job's learner credential (or with another job's) a
    report carrying audits is a 403 and nothing is counted; a report without audits still goes in."""
    owner, job, liar = running["owner"], running["job"], running["liar"]
    forged = [{"worker_id": liar.pk, "passed": 0, "failed": 3, "reason": "forged by the owner"}]
    for api in (learner_api(owner, job, credential=False), _with_learner_header(owner, "e2l1.1.00")):
        reply = report(api, job, 1, forged)
        assert reply.status_code == 403 and "only the job's learner reports audits" in reply.json()["detail"]
    liar.refresh_from_db()
    assert (liar.audits_failed, liar.suspended_at) == (0, None) and not WorkerAudit.objects.exists()
    assert report(learner_api(owner, job, credential=False), job, 1, []).status_code == 201


def _with_learner_header(owner, value: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}", HTTP_X_ECHO2_LEARNER=value)
    return api


def test_an_owner_cannot_fail_a_worker_of_another_job(running):
    """The attack of issue 26: an owner with a running job of his own (and its learner's credential) reports
    failed audits of a worker that serves someone else's job. It delivered nothing to his job: ignored."""
    victim, victims_job = running["honest"], running["job"]
    attacker = factories.user()
    own_job = factories.job(attacker)
    services.job_start(job=own_job)
    api = learner_api(attacker, Job.objects.get(pk=own_job.pk))
    for step in (1, 2, 3):
        assert report(api, own_job, step, [{"worker_id": victim.pk, "passed": 0, "failed": 3,
                                            "reason": "logprobs: made up"}]).status_code == 201
    victim.refresh_from_db()
    assert (victim.audits_failed, victim.suspended_at) == (0, None)
    assert not WorkerAudit.objects.filter(worker=victim).exists()
    assert Activation.objects.filter(worker=victim, job=victims_job, ended_at=None).exists()


def test_audits_count_at_most_the_groups_a_worker_delivered(running):
    """``passed: 1000000`` launders nothing: a worker's audited groups in a job (every step together) never
    exceed the groups the site accepted from it there (5 for the liar), failures counted first."""
    api, job, liar = running["api"], running["job"], running["liar"]
    assert report(api, job, 1, [{"worker_id": liar.pk, "passed": 1_000_000, "failed": 0}]).status_code == 201
    liar.refresh_from_db()
    assert (liar.audits_passed, liar.audits_failed) == (5, 0)
    assert report(api, job, 2, [{"worker_id": liar.pk, "passed": 1_000_000, "failed": 0}]).status_code == 201
    # the same worker twice in one report is one outcome, under the same cap
    assert report(api, job, 3, [{"worker_id": liar.pk, "passed": 3, "failed": 0}] * 2).status_code == 201
    liar.refresh_from_db()
    assert (liar.audits_passed, liar.audits_failed) == (5, 0)
    deliver(job, liar, 2)  # two more groups delivered: room for two more verdicts, the failure counted first
    assert report(api, job, 4, [{"worker_id": liar.pk, "passed": 9, "failed": 1, "reason": "records.0.reward: x",
                                 "evidence": reward_failures(job, liar, 1)}]).status_code == 201
    liar.refresh_from_db()
    assert (liar.audits_passed, liar.audits_failed) == (6, 1)


def evidence(entry: str, *, check: str = "logprobs", **extra) -> dict:
    return {"entry_id": entry, "group_id": "g-1", "version": 0, "check": check, "passed": check == "all",
            "record": 0, "claimed_reward": 1.0, "recomputed_reward": 1.0, "claimed_logprob": -0.01,
            "recomputed_logprob": -2.7, "logprob_gap": 2.69, **extra}


def test_a_suspension_takes_the_provider_account(running):
    """Issue 26: a suspended provider registered a new worker and went on. Now the account is suspended with the
    worker: its other workers' activations end and they are never planned, a worker it registers later starts
    suspended; another provider's worker is untouched; staff lift it all in the admin."""
    api, job, liar, honest, provider = running["api"], running["job"], running["liar"], running["honest"], \
        running["provider"]
    sibling, _ = factories.worker(provider, name="sibling")
    Worker.objects.filter(pk=sibling.pk).update(status=Worker.Status.IDLE)
    services.worker_activate(worker=Worker.objects.get(pk=sibling.pk), job=job)
    fail = [{"worker_id": liar.pk, "passed": 0, "failed": 2, "reason": "records.0.reward: wrong",
             "evidence": reward_failures(job, liar, 2)}]
    assert report(api, job, 1, fail).status_code == 201

    account = Provider.objects.get(user=provider)
    assert account.suspended_at is not None and f"worker {liar.pk} suspended after 2 failed audits" in \
        account.suspended_reason
    sibling.refresh_from_db()
    assert sibling.suspended_at is not None and sibling.suspended_reason.startswith("provider suspended")
    assert not Activation.objects.filter(worker__provider=account, ended_at=None).exists()
    assert Activation.objects.get(worker=sibling).end_reason == f"suspended: provider's worker {liar.pk} failed audits"
    assert Activation.objects.filter(worker=honest, ended_at=None).exists()  # another provider's
    with pytest.raises(services.ServiceError, match="suspended"):  # never activated again (nor planned: scheduling)
        services.worker_activate(worker=sibling, job=job)

    reply = APIClient().post("/api/workers/", {"name": "fresh", "gpu": "x", "price_per_hour": "0.1",
                                               "bandwidth_bps": 1000}, format="json",
                             HTTP_AUTHORIZATION=f"Token {factories.token(provider)}")
    assert reply.status_code == 201, reply.content
    fresh = Worker.objects.get(name="fresh")
    assert fresh.suspended_at is not None and "provider suspended" in fresh.suspended_reason
    with pytest.raises(services.ServiceError, match="suspended"):
        services.worker_activate(worker=fresh, job=job)

    staff = factories.user()
    type(staff).objects.filter(pk=staff.pk).update(is_staff=True, is_superuser=True)
    admin = Client()
    admin.force_login(type(staff).objects.get(pk=staff.pk))
    assert admin.post("/admin/marketplace/provider/", {"action": "lift_suspension",
                                                       "_selected_action": [account.pk]}).status_code == 302
    assert Provider.objects.get(pk=account.pk).suspended_at is None
    assert not Worker.objects.filter(provider=account, suspended_at__isnull=False).exists()


def test_evidence_is_stored_with_the_verdict(running):
    api, job, liar = running["api"], running["job"], running["liar"]
    shown = [evidence("5-0"), evidence("6-0", check="all", logprob_gap=1e-6),
             evidence("7-0", check="text", claimed_text="7", decoded_text="3")]
    assert report(api, job, 1, [{"worker_id": liar.pk, "passed": 1, "failed": 2, "reason": "x",
                                 "evidence": shown}]).status_code == 201
    row = WorkerAudit.objects.get(worker=liar, step=1)
    assert [e["entry_id"] for e in row.evidence] == ["5-0", "6-0", "7-0"]
    assert row.evidence[0]["claimed_logprob"] == -0.01 and row.evidence[0]["recomputed_logprob"] == -2.7
    assert row.evidence[2]["decoded_text"] == "3"


@pytest.mark.parametrize(("bad", "field"), [
    ({"logprob_gap": "NaN"}, "logprob_gap"),
    ({"claimed_reward": 1e300}, "claimed_reward"),
    ({"entry_id": "../etc"}, "entry_id"),
    ({"check": "vibes"}, "check"),
    ({"check": "all", "passed": False}, "check"),  # a pass must say so, and a failure what failed
    ({"claimed_text": "x" * 65}, "claimed_text"),
    ({"version": -1}, "version"),
])
def test_bad_evidence_is_a_400_naming_the_field(running, bad, field):
    api, job, liar = running["api"], running["job"], running["liar"]
    reply = report(api, job, 1, [{"worker_id": liar.pk, "passed": 0, "failed": 1,
                                  "evidence": [evidence("1-0", **bad)]}])
    assert reply.status_code == 400, reply.content
    assert reply.json()["detail"].startswith(f"audits.0.evidence.0.{field}")
    assert not WorkerAudit.objects.exists()


def test_too_much_evidence_is_a_400(running):
    api, job, liar = running["api"], running["job"], running["liar"]
    reply = report(api, job, 1, [{"worker_id": liar.pk, "passed": 0, "failed": 1,
                                  "evidence": [evidence(f"{i}-0") for i in range(33)]}])
    assert reply.status_code == 400 and reply.json()["detail"].startswith("audits.0.evidence")
