"""The site decodes text failures itself with the job's tokenizer, read from version 0 on the learner
(services/audit_texts.py, infra/job_tokenizer.py; docs/trust.md "Audits the site checks"), on the real database,
Redis, a learner's snapshot server and a real tokenizer (tests/tiny_chat.py).

A worker whose text is not its ids decoded is caught on the site's own evidence and counts toward suspension; an
owner whose learner calls an honest worker's text wrong is refused; a tokenizer the site cannot have (its chunks
altered, a digest they do not hash to, the learner gone) leaves the failure consistent, saying why."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from dataplane.chat import prompt_ids
from dataplane.records import TrajectoryGroup
from dataplane.tasks import build_task
from learner.audit import text_mismatches
from learner.prompts import PromptFeeder
from learner.serving import SnapshotServer
from learner.snapshots import SnapshotStore
from marketplace import services
from marketplace.infra import job_tokenizer, stream
from marketplace.models import Activation, Job, LedgerEntry, Snapshot, Worker, WorkerAudit
from marketplace.services.billing import activation_report

from ..tiny_chat import tiny_chatml_model
from . import factories
from .test_audits import entries, learner_api, report

pytestmark = pytest.mark.django_db
TASK = {"name": "arithmetic"}


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny-chat"
    tiny_chatml_model(path, build_task(TASK).alphabet)
    return path


@pytest.fixture
def market(redis_url, settings, chat_model, tmp_path):
    """An owner's job on the tiny chat model, its base (v0) served by its learner's snapshot server, and two workers
    of two providers that delivered to it."""
    from transformers import AutoTokenizer

    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "AUDIT_SUSPEND_AFTER": 2, "ALLOW_LOOPBACK_PEERS": True,
                      "WORKER_TIMEOUT_S": 1000.0, "AUDIT_TOKENIZER_DIR": tmp_path / "tokenizers",
                      "AUDIT_TOKENIZER_READ_S": 30.0}
    job_tokenizer.forget_failures()
    owner = factories.user()
    honest, _ = factories.worker(factories.user(), name="honest")
    forger, _ = factories.worker(factories.user(), name="forger")
    Worker.objects.update(status=Worker.Status.IDLE)
    job = factories.job(owner, model_dir=str(chat_model), task=TASK)
    services.job_start(job=job)
    job = Job.objects.get(pk=job.pk)
    services.job_activate_idle_workers(job=job)
    start = timezone.now() - timedelta(seconds=30)
    Activation.objects.filter(job=job).update(state="generating", reported_at=start, state_since=start)
    store = SnapshotStore(tmp_path / "snapshots" / f"job{job.pk}", job_id=job.pk, chunk_bytes=4096, dtype="fp32")
    manifest = store.write_base(chat_model)
    server = SnapshotServer(store, secret=job.transfer_secret).start()
    Snapshot.objects.create(job=job, version=0, url=server.url_for(0), manifest=manifest.model_dump(mode="json"))
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    deliver(job, honest, tokenizer, 2)
    deliver(job, forger, tokenizer, 3, forge=True)
    for activation in Activation.objects.filter(job=job):  # a heartbeat bills both up to now
        activation_report(activation_id=activation.pk, at=timezone.now(), state="generating")
    yield {"job": job, "api": learner_api(owner, job), "honest": honest, "forger": forger, "store": store,
           "server": server, "tokenizer": tokenizer}
    server.stop()


def deliver(job: Job, worker: Worker, tokenizer, groups: int, *, forge: bool = False) -> None:
    """``worker`` returns ``groups`` groups, each answering its prompt with the ids of "5": as their text (honest),
    or the text "7" (a forger: the right answer over the ids of a wrong sample). Its prompts waited 0.2 s in the
    stream before it leased them: the generating time a failed group gives back."""
    task = build_task(TASK)
    PromptFeeder(stream.client(), job_id=job.pk, task=task, seed=worker.pk,
                 backlog=stream.replay(job.pk).outstanding() + groups).top_up()
    time.sleep(0.2)
    ids = [*tokenizer("5", add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    text = "7" if forge else tokenizer.decode(ids, skip_special_tokens=True)
    for leased in services.prompts_lease(worker=worker, job_id=job.pk, groups=groups).leases:
        record = {"job_id": job.pk, "lease_id": leased.lease_id, "group_id": leased.group_id, "prompt": leased.prompt,
                  "prompt_ids": prompt_ids(tokenizer, leased.prompt), "completion": text, "completion_ids": ids,
                  "logprobs": [-1.0] * len(ids), "reward": task.reward(leased.prompt, text), "version": 0}
        group = TrajectoryGroup.model_validate({"job_id": job.pk, "lease_id": leased.lease_id, "version": 0,
                                                "group_id": leased.group_id,
                                                "records": [record] * job.settings.group_size})
        assert services.trajectories_submit(worker=worker, group=group).accepted == job.settings.group_size


def learner_text_failure(market, worker: Worker, index: int) -> dict:
    """The evidence the learner's own text check gives of the worker's ``index``-th group (learner/audit.py)."""
    tokenizer = market["tokenizer"]
    group = entries(market["job"], worker)[index]
    [verdict] = text_mismatches([group], lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True)).values()
    return {"worker_id": worker.pk, "passed": 0, "failed": 1, "reason": verdict.problem,
            "evidence": [verdict.evidence]}


def site_verdicts(job: Job, worker: Worker) -> list[tuple[str, str, str]]:
    return [(e["site"], e.get("site_decode", ""), e["site_reason"])
            for row in WorkerAudit.objects.filter(job=job, worker=worker).order_by("step")
            for e in row.evidence if not e["passed"]]


def test_a_text_forger_is_verified_by_the_site_and_suspended(market, django_capture_on_commit_callbacks):
    """The report leaves the failure consistent and the decoding to a task; the task decodes the sealed ids with
    version 0's tokenizer and finds the forgery itself: verified, counted, and with a second one suspended (the
    second decoded from the site's cache, with the learner gone)."""
    api, job, forger = market["api"], market["job"], market["forger"]
    with django_capture_on_commit_callbacks(execute=False) as queued:
        assert report(api, job, 1, [learner_text_failure(market, forger, 0)]).status_code == 201
    [(site, decode, why)] = site_verdicts(job, forger)
    assert (site, decode) == ("consistent", "pending") and "decodes its ids with the job's tokenizer next" in why
    assert not LedgerEntry.objects.filter(job=job, state="credit").exists()  # not before the site decoded it
    for callback in queued:
        callback()  # the Celery task (eager): off the request
    [(site, decode, why)] = site_verdicts(job, forger)
    assert (site, decode) == ("verified", "done"), why
    assert "decoded by the site with the job's tokenizer" in why and "'7' against '5'" in why
    row = WorkerAudit.objects.get(job=job, worker=forger, step=1)
    assert (row.failed_verified, row.failed_consistent) == (1, 0)
    assert {c.worker_id for c in LedgerEntry.objects.filter(job=job, state="credit")} == {forger.pk}
    forger.refresh_from_db()
    assert (forger.audits_failed, forger.suspended_at) == (1, None)

    market["server"].stop()
    with django_capture_on_commit_callbacks(execute=True):
        assert report(api, job, 2, [learner_text_failure(market, forger, 1)]).status_code == 201
    assert [s for s, _, _ in site_verdicts(job, forger)] == ["verified", "verified"]
    forger.refresh_from_db()
    assert forger.audits_failed == 2 and forger.suspended_at is not None
    assert "2 verified by the site" in forger.suspended_reason


def test_an_owner_calling_an_honest_text_wrong_is_refused(market, django_capture_on_commit_callbacks):
    api, job, honest = market["api"], market["job"], market["honest"]
    group = entries(job, honest)[0]
    lie = {"entry_id": group.entry_id, "group_id": group.packed.group_ids[0], "version": 0, "check": "text",
           "passed": False, "record": 0, "text_at": 0, "claimed_text": group.packed.completions[0],
           "decoded_text": "9"}
    with django_capture_on_commit_callbacks(execute=True):
        assert report(api, job, 1, [{"worker_id": honest.pk, "passed": 0, "failed": 1, "reason": "records.0.completion",
                                     "evidence": [lie]}]).status_code == 201
    [(site, decode, why)] = site_verdicts(job, honest)
    assert (site, decode) == ("refused", "done") and "text is its ids decoded; the report is false" in why
    row = WorkerAudit.objects.get(job=job, worker=honest)
    assert (row.failed_refused, row.failed_consistent) == (1, 0)
    assert not LedgerEntry.objects.filter(job=job, state="credit").exists()  # a refused failure gives nothing back
    honest.refresh_from_db()
    assert (honest.audits_failed, honest.suspended_at) == (0, None)


def _altered_chunk(market) -> None:
    chunk = market["store"].root / "v0" / "chunks" / "0"
    data = bytearray(chunk.read_bytes())
    data[600] ^= 0xFF
    chunk.write_bytes(bytes(data))


def _digest_of_another_base(market) -> None:
    """The manifest the site recorded names a digest its chunks do not hash to (a learner naming a known base's
    digest over files of its own: workers holding that base never installed these chunks)."""
    snapshot = Snapshot.objects.get(job=market["job"], version=0)
    snapshot.manifest = {**snapshot.manifest, "sha256": "ab" * 32}
    snapshot.save(update_fields=["manifest"])


@pytest.mark.parametrize(("spoil", "said"), [
    (_altered_chunk, "sha256 mismatch"),
    (_digest_of_another_base, "do not hash to its digest"),
    (lambda market: market["server"].stop(), "its snapshot server could not be reached"),
])
def test_without_the_tokenizer_a_text_failure_stays_consistent_saying_why(market, django_capture_on_commit_callbacks,
                                                                          spoil, said):
    api, job, forger = market["api"], market["job"], market["forger"]
    spoil(market)
    with django_capture_on_commit_callbacks(execute=True):
        assert report(api, job, 1, [learner_text_failure(market, forger, 0)]).status_code == 201
    [(site, decode, why)] = site_verdicts(job, forger)
    assert (site, decode) == ("consistent", "failed"), why
    assert "the site could not decode its ids" in why and said in why
    forger.refresh_from_db()
    assert (forger.audits_failed, forger.suspended_at) == (0, None)
