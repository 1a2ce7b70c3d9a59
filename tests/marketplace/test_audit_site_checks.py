"""The site checks a learner's failed audits before they count (marketplace/core/audit_checks.py,
services/audit_verify.py; docs/trust.md "Audits the site checks"), on the real database and Redis.

A job owner runs the learner and may forge its reports: an honest worker must not be suspended on them, while a
worker that really claims wrong rewards still is. A failure the site cannot check (record gone, a task running
code the site does not run) is stored and shown, never counted on the learner's word alone."""

from __future__ import annotations

import logging

import pytest
from django.test import Client
from rest_framework.test import APIClient

from dataplane import audit_hold
from dataplane.records import TrajectoryGroup
from marketplace import services
from marketplace.core.audit_checks import site_scorer
from marketplace.infra import stream
from marketplace.models import Activation, Job, Worker, WorkerAudit
from marketplace.reads import selectors
from marketplace.services.audit_verify import audit_standing

from . import factories
from .test_audits import deliver, entries, learner_api, report, reward_failures

pytestmark = pytest.mark.django_db


@pytest.fixture
def market(redis_url, settings):
    """Two workers of two providers deliver to one owner's job: ``honest`` with the task's rewards, ``cheat``
    claiming the opposite of every reward."""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "AUDIT_SUSPEND_AFTER": 2}
    owner = factories.user()
    honest, _ = factories.worker(factories.user(), name="honest")
    cheat, _ = factories.worker(factories.user(), name="cheat")
    Worker.objects.update(status=Worker.Status.IDLE)
    job = _running_job(owner)
    deliver(job, honest, 8)
    deliver(job, cheat, 4, lie=True)
    return {"owner": owner, "job": job, "api": learner_api(owner, job), "honest": honest, "cheat": cheat}


def _running_job(owner, **fields) -> Job:
    job = factories.job(owner, **fields)
    services.job_start(job=job)
    job = Job.objects.get(pk=job.pk)
    services.job_activate_idle_workers(job=job)
    return job


def logprob_failure(group, **changes) -> dict:
    """A log-prob failure of ``group`` as a learner states it: the claimed mean per token is the group's own."""
    claimed = sum(group.packed.logprobs) / len(group.packed.logprobs)
    return {"entry_id": group.entry_id, "group_id": group.packed.group_ids[0], "version": group.version,
            "check": "logprobs", "passed": False, "record": 0, "claimed_reward": group.packed.rewards[0],
            "recomputed_reward": group.packed.rewards[0], "claimed_logprob": claimed,
            "recomputed_logprob": claimed - 2.5, "logprob_gap": 2.5, **changes}


def statuses(job: Job, worker: Worker) -> list[str]:
    return [e["site"] for row in WorkerAudit.objects.filter(job=job, worker=worker).order_by("step")
            for e in row.evidence if not e["passed"]]


def test_an_honest_worker_is_not_suspended_by_forged_reports(market, caplog):
    """Every way the owner's learner can call an honest worker's groups failed: its right rewards called wrong, its
    claimed figures altered, another worker's entry put under its name, an entry named twice, failures without
    evidence, and log-prob failures the site cannot recompute, step after step. None counts."""
    api, job, honest, cheat = market["api"], market["job"], market["honest"], market["cheat"]
    mine = entries(job, honest)
    right_called_wrong = reward_failures(job, honest, 1)[0] | {"recomputed_reward": 0.5}
    altered = reward_failures(job, honest, 2)[1] | {"claimed_reward": 0.25}
    not_its_entry = reward_failures(job, cheat, 1)[0]  # the cheat's real failure, reported as the honest worker's
    forged = [right_called_wrong, altered, not_its_entry, logprob_failure(mine[2], claimed_logprob=-0.01)]
    with caplog.at_level(logging.WARNING, logger="marketplace.services.audit_verify"):
        assert report(api, job, 1, [{"worker_id": honest.pk, "passed": 0, "failed": 4, "reason": "made up",
                                     "evidence": forged}]).status_code == 201
    assert statuses(job, honest) == ["refused"] * 4
    assert sum("FORGED audit report refused" in r.message for r in caplog.records) == 4
    row = WorkerAudit.objects.get(job=job, worker=honest, step=1)
    assert (row.failed, row.failed_refused, row.failed_verified) == (4, 4, 0)
    assert "is the task's" in row.evidence[0]["site_reason"] and "not " in row.evidence[2]["site_reason"]

    # The same owner keeps at it: its log-prob failures match what the worker sent, but no second owner says so;
    # failures without evidence, and an entry it reported before, count for nothing either.
    assert report(api, job, 2, [{"worker_id": honest.pk, "passed": 0, "failed": 3, "reason": "logprobs: made up",
                                 "evidence": [logprob_failure(mine[3])]}]).status_code == 201
    assert report(api, job, 3, [{"worker_id": honest.pk, "passed": 0, "failed": 1, "reason": "logprobs: again",
                                 "evidence": [logprob_failure(mine[3])]}]).status_code == 201
    assert statuses(job, honest) == ["refused"] * 4 + ["consistent", "refused"]
    honest.refresh_from_db()
    assert (honest.audits_failed, honest.suspended_at) == (0, None)
    assert WorkerAudit.objects.get(job=job, worker=honest, step=2).failed_unverified == 2  # no evidence


def test_a_worker_claiming_wrong_rewards_is_suspended_on_the_sites_own_scoring(market):
    api, job, cheat = market["api"], market["job"], market["cheat"]
    for step, skip in ((1, 0), (2, 1)):
        assert report(api, job, step, [{"worker_id": cheat.pk, "passed": 0, "failed": 1, "reason": "records.0.reward",
                                        "evidence": reward_failures(job, cheat, 1, skip=skip)}]).status_code == 201
    assert statuses(job, cheat) == ["verified", "verified"]
    cheat.refresh_from_db()
    assert cheat.audits_failed == 2 and cheat.suspended_at is not None
    assert "2 verified by the site" in cheat.suspended_reason and "re-scored by the site" in cheat.suspended_reason
    market["honest"].refresh_from_db()
    assert market["honest"].suspended_at is None


def test_a_record_gone_is_unverified_and_a_held_one_is_checked(market):
    """The stream deletes an entry once the learner acknowledges it: a failure of an entry acknowledged without
    being held is unverified (not counted); one held before the learner dropped it is checked as if it were there,
    and a report sent again keeps its verdict after the held copy expired."""
    api, job, cheat = market["api"], market["job"], market["cheat"]
    gone, held = reward_failures(job, cheat, 2)
    audit_hold.hold(stream.client(), job.pk, [held["entry_id"]])  # what the learner's Auditor.hold does
    stream.replay(job.pk).ack([gone["entry_id"], held["entry_id"]])  # the learner drops both
    failures = [{"worker_id": cheat.pk, "passed": 0, "failed": 2, "reason": "records.0.reward",
                 "evidence": [gone, held]}]
    assert report(api, job, 1, failures).status_code == 201
    row = WorkerAudit.objects.get(job=job, worker=cheat, step=1)
    assert [e["site"] for e in row.evidence] == ["unverified", "verified"]
    assert row.evidence[0]["site_reason"].startswith("record gone")
    cheat.refresh_from_db()
    assert (cheat.audits_failed, cheat.suspended_at) == (1, None)  # 1 of 2: the gone one does not count

    stream.client().delete(audit_hold.held_key(job.pk, held["entry_id"]))  # the held copy expired
    assert report(api, job, 1, failures).status_code == 201  # the same step again (a restarted learner)
    assert [e["site"] for e in WorkerAudit.objects.get(job=job, worker=cheat, step=1).evidence] == \
        ["unverified", "verified"]
    cheat.refresh_from_db()
    assert cheat.audits_failed == 1


def _second_owner_reports(cheat, kind: str = "logprobs") -> None:
    """Another owner's job takes the worker, gets one group and its learner reports it failed."""
    second_owner = factories.user()
    other = factories.job(second_owner)
    services.job_start(job=other)
    other = Job.objects.get(pk=other.pk)
    services.worker_activate(worker=Worker.objects.get(pk=cheat.pk), job=other)
    deliver(other, cheat, 1)
    [group] = entries(other, cheat)
    assert report(learner_api(second_owner, other), other, 1, [
        {"worker_id": cheat.pk, "passed": 0, "failed": 1, "reason": f"{kind}: mean |claimed - recomputed| 2.5",
         "evidence": [logprob_failure(group)]}]).status_code == 201


def test_log_prob_failures_release_from_the_job_and_never_suspend_across_owners(market):
    """A consistent log-prob failure is the learner's word: it ends the worker's part in that owner's job (and the
    scheduler plans it there no more), but however many owners report such failures they never suspend: three
    colluding owner accounts suspended an honest provider that way."""
    job, cheat = market["job"], market["cheat"]
    groups = entries(job, cheat)
    assert report(market["api"], job, 1, [{"worker_id": cheat.pk, "passed": 0, "failed": 3, "reason": "logprobs",
                                           "evidence": [logprob_failure(g) for g in groups[:3]]}]).status_code == 201
    cheat.refresh_from_db()
    assert (cheat.audits_failed, cheat.suspended_at) == (0, None)
    ended = Activation.objects.get(worker=cheat, job=job)
    assert ended.ended_at is not None and ended.end_reason.startswith("failed its owner's audit: 3 group(s)")
    assert cheat.pk in set(selectors.excluded_workers(job).values_list("pk", flat=True))
    assert not Activation.objects.filter(worker=market["honest"], ended_at__isnull=False).exists()
    services.job_activate_idle_workers(job=Job.objects.get(pk=job.pk))
    assert not Activation.objects.filter(worker=cheat, job=job, ended_at=None).exists(), "planned again"

    _second_owner_reports(cheat)
    _second_owner_reports(cheat, kind="text")
    cheat.refresh_from_db()
    assert (cheat.audits_failed, cheat.suspended_at) == (0, None)
    assert "from 3 job owner(s) (not counted: the site cannot verify them" in \
        audit_standing(cheat)["text"]


def test_an_operator_may_still_count_log_prob_failures_corroborated_by_owners(market, settings):
    settings.ECHO2 = {**settings.ECHO2, "AUDIT_CORROBORATING_OWNERS": 2}
    job, cheat = market["job"], market["cheat"]
    groups = entries(job, cheat)
    report(market["api"], job, 1, [{"worker_id": cheat.pk, "passed": 0, "failed": 3, "reason": "logprobs",
                                    "evidence": [logprob_failure(g) for g in groups[:3]]}])
    _second_owner_reports(cheat)
    cheat.refresh_from_db()
    assert cheat.audits_failed == 2 and cheat.suspended_at is not None
    assert "log-prob/text failures from 2 job owner(s) (counted once per owner" in cheat.suspended_reason


def test_a_user_code_task_is_not_rescored_and_its_failures_do_not_count(redis_url, settings):
    """The site never runs an owner's code: a reward failure in a job whose task is a verifiers environment (or a
    user reward function) stays unverified, shown with the reason, not counted."""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "AUDIT_SUSPEND_AFTER": 1}
    owner = factories.user()
    worker, _ = factories.worker(factories.user(), name="w")
    Worker.objects.update(status=Worker.Status.IDLE)
    job = factories.job(owner, task={"name": "verifiers", "env": "owners_pkg.env:load_environment"})
    services.job_start(job=job)
    job = Job.objects.get(pk=job.pk)
    services.worker_activate(worker=Worker.objects.get(pk=worker.pk), job=job)
    replay = stream.replay(job.pk)
    replay.add_prompts(["what is 3+4?"])
    [leased] = services.prompts_lease(worker=worker, job_id=job.pk, groups=1).leases
    record = {"job_id": job.pk, "lease_id": leased.lease_id, "group_id": leased.group_id, "prompt": leased.prompt,
              "prompt_ids": [1, 5, 6], "completion": "7", "completion_ids": [12, 2], "logprobs": [-1.5, -0.2],
              "reward": 1.0, "version": 0}
    group = TrajectoryGroup.model_validate({"job_id": job.pk, "lease_id": leased.lease_id, "version": 0,
                                            "group_id": leased.group_id, "records": [record] * job.settings.group_size})
    assert services.trajectories_submit(worker=worker, group=group).accepted == job.settings.group_size
    [stored] = entries(job, worker)
    failure = {"entry_id": stored.entry_id, "group_id": leased.group_id, "version": 0, "check": "reward",
               "passed": False, "record": 0, "claimed_reward": 1.0, "recomputed_reward": 0.0}
    assert report(learner_api(owner, job), job, 1, [{"worker_id": worker.pk, "passed": 0, "failed": 1,
                                                     "reason": "records.0.reward", "evidence": [failure]}]
                  ).status_code == 201
    [checked] = WorkerAudit.objects.get(job=job, worker=worker).evidence
    assert checked["site"] == "unverified" and "user-code task" in checked["site_reason"]
    worker.refresh_from_db()
    assert (worker.audits_failed, worker.suspended_at) == (0, None)


@pytest.mark.parametrize(("spec", "scorable"), [
    ({"name": "arithmetic"}, True),
    ({"name": "countdown"}, True),
    ({"name": "sandbox", "env": "nim"}, True),
    ({"name": "verifiers", "env": "pkg.env:load"}, False),
    ({"name": "dataset", "data": {"digest": "0" * 64}, "reward": "owners_pkg.rewards:score"}, False),
    ({"name": "dataset", "data": {"digest": "0" * 64}, "reward": ["exact_match", {"function": "pkg.m:f"}]}, False),
    ({"name": "no-such-task"}, False),
    (None, False),
])
def test_which_tasks_the_site_scores_itself(spec, scorable):
    task, why = site_scorer(spec)
    assert (task is not None) == scorable, why
    assert bool(why) != scorable


def test_the_api_lists_a_workers_audit_rows_with_the_sites_checks(market):
    api, job, honest, cheat = market["api"], market["job"], market["honest"], market["cheat"]
    report(api, job, 1, [{"worker_id": cheat.pk, "passed": 1, "failed": 1, "reason": "records.0.reward",
                          "evidence": reward_failures(job, cheat, 1)}])
    provider = APIClient()
    provider.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(cheat.provider.user)}")
    rows = provider.get(f"/api/workers/{cheat.pk}/audits/").json()
    assert [(r["step"], r["failed"], r["failed_verified"]) for r in rows["results"]] == [(1, 1, 1)]
    assert rows["results"][0]["failures"][0]["site"] == "verified"
    assert rows["standing"]["counted"] == 1 and rows["standing"]["limit"] == 2
    assert provider.get(f"/api/workers/{honest.pk}/audits/").status_code == 404  # another provider's worker


def test_the_provider_page_says_why_a_worker_is_or_is_not_suspended(market):
    api, job, honest, cheat = market["api"], market["job"], market["honest"], market["cheat"]
    report(api, job, 1, [{"worker_id": honest.pk, "passed": 0, "failed": 1, "reason": "made up",
                          "evidence": [reward_failures(job, honest, 1)[0]]}])
    report(api, job, 1, [{"worker_id": cheat.pk, "passed": 0, "failed": 2, "reason": "records.0.reward",
                          "evidence": reward_failures(job, cheat, 2)}])
    for worker, standing, site in ((honest, "not suspended: 0 of 2 failures that count", "refused"),
                                   (cheat, "suspended: suspended after 2 failed audits", "verified")):
        page = Client()
        page.force_login(worker.provider.user)
        html = page.get("/provider/").content.decode()
        section = html.split(f'data-audits="{worker.name}"', 1)[1].split("</section>", 1)[0]
        assert standing in section, section
        assert f'<td class="site">{site}</td>' in section
