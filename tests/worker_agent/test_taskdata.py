"""A job's data set travels by content: an agent that has no copy fetches it by digest from the learner's snapshot
server (loopback, the job's transfer credentials), every chunk checked; a second use comes from its cache; a tampered
chunk and a credential of another job are refused."""

from __future__ import annotations

import random
import time

import pytest

from dataplane import credentials
from dataplane.dataset import content
from dataplane.snapshot import SnapshotError
from dataplane.tasks import build_task
from learner.datasets import lay_out
from learner.serving import SnapshotServer
from learner.snapshots import SnapshotStore
from worker_agent.cache import BaseCache
from worker_agent.taskdata import fetch_task_data

JOB, SECRET = 7, credentials.new_secret()


def credential(job_id: int = JOB, worker_id: int = 3) -> str:
    return credentials.issue(SECRET, job_id=job_id, worker_id=worker_id, lowest=0, highest=0,
                             expires=int(time.time()) + 600)


@pytest.fixture
def served(tmp_path):
    """The learner's side: a data set of 40 prompts laid out in 1 KB chunks under the job's store, served."""
    files = tmp_path / "learner-files"
    files.mkdir()
    (files / "train.jsonl").write_text("".join(f'{{"prompt": "{i}*2=", "answer": "{2 * i}"}}\n' for i in range(40)))
    digest = content.digest(files)
    store = SnapshotStore(tmp_path / "store", job_id=JOB)
    served_at = lay_out(store.root, digest, content.pack(files), job_id=JOB, chunk_bytes=1024)
    server = SnapshotServer(store, secret=SECRET).start()
    task = {"name": "dataset", "reward": "exact_match", "data": {"digest": digest, "format": "jsonl"}}
    yield server, task, digest, served_at
    server.stop()


def test_an_agent_without_a_copy_fetches_it_and_then_uses_its_cache(served, tmp_path) -> None:
    server, task, digest, served_at = served
    cache = BaseCache(tmp_path / "agent-cache", max_bytes=10**8)
    assert len(list((served_at / "chunks").iterdir())) > 3  # it really travels in several chunks

    held = fetch_task_data(cache, task, snapshot_url=server.url_for(0), credential=credential())

    assert held == {digest: tmp_path / "agent-cache" / digest} and content.locate(digest) == held[digest]
    scorer = build_task(task)
    scorer.prepare(allow_user_code=False)
    prompts = [p.text for p in scorer.sample_prompts(random.Random(1), 40)]
    assert sorted(prompts) == sorted(f"{i}*2=" for i in range(40))
    assert scorer.reward("21*2=", "42") == 1.0 and scorer.reward("21*2=", "41") == 0.0

    server.stop()  # the learner is gone: a second job on the same data set needs no fetch
    again = fetch_task_data(cache, task, snapshot_url=server.url_for(0), credential=credential())
    assert again == held


def test_a_tampered_chunk_is_refused_and_nothing_is_cached(served, tmp_path) -> None:
    server, task, digest, served_at = served
    chunk = served_at / "chunks" / "1"
    chunk.write_bytes(b"X" + chunk.read_bytes()[1:])
    cache = BaseCache(tmp_path / "agent-cache", max_bytes=10**8)

    with pytest.raises(SnapshotError, match="chunk 1 .*sha256"):
        fetch_task_data(cache, task, snapshot_url=server.url_for(0), credential=credential())
    assert cache.get(digest) is None


def test_a_credential_of_another_job_or_none_is_refused(served, tmp_path) -> None:
    server, task, _, _ = served
    cache = BaseCache(tmp_path / "agent-cache", max_bytes=10**8)

    with pytest.raises(SnapshotError, match="403 credential for job 8, not job 7"):
        fetch_task_data(cache, task, snapshot_url=server.url_for(0), credential=credential(job_id=8))
    with pytest.raises(SnapshotError, match="401"):
        fetch_task_data(cache, task, snapshot_url=server.url_for(0), credential=None)
    assert server.refused[403] == 1 and server.refused[401] == 1


def test_a_manifest_of_other_content_is_refused(served, tmp_path) -> None:
    server, task, digest, served_at = served
    other = {**task, "data": {**task["data"], "digest": "e" * 64}}
    (served_at.parent / ("e" * 64)).symlink_to(served_at)  # the server answers for "e"*64 with digest's manifest

    with pytest.raises(SnapshotError, match="manifest is of"):
        fetch_task_data(BaseCache(tmp_path / "c", max_bytes=10**8), other, snapshot_url=server.url_for(0),
                        credential=credential())
