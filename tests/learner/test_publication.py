"""The learner's publication policy (learner/publication.py): the base, every kappa steps (full, then delta), the
final model, what a restart publishes, and a refusal met on the committer's thread; against a real store and a
stand-in site on loopback."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from dataplane.jobs import JobSpec
from learner.checkpoint import Committer
from learner.client import SiteClient
from learner.publication import Publisher, PublishError, republish_on_resume
from learner.serving import SnapshotServer
from learner.snapshots import SnapshotStore

from .test_outbox import FakeSite


@pytest.mark.parametrize(("checkpoint", "published", "due"), [
    (4, 4, False), (4, 2, True),  # the checkpoint of a publication step, announced or not
    (5, 4, False), (5, 2, True), (5, 0, True),  # a checkpoint between two (--checkpoint-every): v4 was due
    (0, 0, False)])
def test_a_restarted_learner_publishes_when_the_site_lacks_the_last_publication_due(checkpoint, published, due):
    assert republish_on_resume(checkpoint, kappa=2, published_version=published) is due


@pytest.fixture
def site():
    fake = FakeSite().start()  # records every POST; refuses step 99 with a 400
    yield fake
    fake.stop()


class _Trainer:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def full_state(self) -> torch.nn.Module:
        return self.model


_servers: list[SnapshotServer] = []


@pytest.fixture(autouse=True)
def _close_servers():
    yield
    while _servers:
        _servers.pop().httpd.server_close()  # never started: only their addresses were used


def _publisher(site, tmp_path, model_dir, *, version=0, committer=None, full_every=2):
    """A Publisher over a real store, HTTP server (bound, not started) and site client, and the loop it reads: a
    stand-in holding the trained version, the policy and the checkpoint's copy."""
    spec = JobSpec(name="pub", model_dir=str(model_dir), task={"name": "arithmetic"}, staleness=4, kappa=2,
                   batch_trajectories=4, group_size=2, max_steps=10)
    store = SnapshotStore(tmp_path / "snapshots", job_id=7, chunk_bytes=4096, keep=10, full_every=full_every)
    loop = SimpleNamespace(version=version, trainer=_Trainer(torch.nn.Linear(16, 8)), committer=committer,
                           last_state=None, unsaved_since=None, storage_warning="")
    client = SiteClient(f"http://127.0.0.1:{site.port}", "token", timeout=2, retries=1)
    _servers.append(SnapshotServer(store))
    return Publisher(client, job_id=7, spec=spec, loop=loop, store=store, server=_servers[-1], relay=None)


def _announced(site) -> list[tuple[int, str]]:
    return [(body["version"], body["manifest"].get("kind", "full")) for path, body in site.received
            if path.endswith("/snapshots/")]


def test_the_base_then_every_kappa_steps_full_then_delta_and_the_final_model(site, tmp_path, tiny_model_dir):
    publisher = _publisher(site, tmp_path, tiny_model_dir)
    publisher.publish_base("")
    for version in range(1, 6):
        publisher.loop.version = version
        with torch.no_grad():
            publisher.loop.trainer.model.weight[0, 0] += 1.0  # trained
        publisher.publish_due(version)
        assert publisher.version == version - version % 2  # the newest published, read by anyone
    publisher.publish_final()  # v5: between two publications
    assert _announced(site) == [(0, "full"), (2, "full"), (4, "delta"), (5, "full")]
    assert publisher.version == 5
    publisher.loop.version = 6
    publisher.publish_due(6)
    received = len(site.received)
    publisher.publish_final()  # v6 was published at its step: nothing more
    assert len(site.received) == received


def test_a_restart_publishes_what_the_site_lacks_or_announces_its_newest_again(site, tmp_path, tiny_model_dir):
    first = _publisher(site, tmp_path, tiny_model_dir, version=4)
    first.publish(4)
    site.received.clear()
    lost = _publisher(site, tmp_path, tiny_model_dir, version=5)  # checkpoint v5; the site has v2: v4 never arrived
    lost.publish_resumed(2)
    assert [version for version, _ in _announced(site)] == [5] and lost.version == 5
    site.received.clear()
    known = _publisher(site, tmp_path, tiny_model_dir, version=5)  # restarted again: the site has v5 now
    known.publish_resumed(5)  # announced again, at the new process's address; not written again
    assert [(body["version"], body["url"]) for _, body in site.received] == [(5, known.server.url_for(5))]
    assert known.server.url_for(5) != lost.server.url_for(5) and known.version == 5


def test_a_refusal_met_on_the_committers_thread_fails_the_next_step(site, tmp_path, tiny_model_dir):
    committer = Committer()
    publisher = _publisher(site, tmp_path, tiny_model_dir, version=2, committer=committer)
    publisher.outbox.start()
    try:
        publisher.outbox.report({"step": 99})  # refused by the site (a 4xx), on the outbox's thread
        while publisher.outbox.refusal is None and publisher.outbox.pending:
            time.sleep(0.05)
        publisher.loop.last_state = (2, publisher.loop.trainer.model.state_dict())  # the checkpoint's copy
        publisher.publish_due(2)  # handed to the committer's thread, which meets the refusal
        committer.finished(wait=True)
        with pytest.raises(PublishError, match="step: refused") as err:
            publisher.publish_due(3)
        assert err.value.version == 2 and publisher.version is None
        publisher.publish_due(3)  # raised once
    finally:
        publisher.outbox.stop()
        committer.close()


def test_a_restarted_learner_writes_its_next_delta_against_what_the_site_announced(site, tmp_path, tiny_model_dir):
    """Deltas on the wire (docs/broadcast.md): v4 was written but the learner died before announcing it; the
    restarted one drops v4 and republishes v6 as a delta against v2, the version the agents may hold."""
    first = _publisher(site, tmp_path, tiny_model_dir, version=2, full_every=0)
    first.publish(2)
    with torch.no_grad():
        first.loop.trainer.model.weight[0, 0] += 1.0
    assert first.store.write(first.loop.trainer.model, 4).base_version == 2  # written; the outbox died with it
    site.received.clear()
    restarted = _publisher(site, tmp_path, tiny_model_dir, version=6, full_every=0)
    restarted.loop.trainer = first.loop.trainer
    with torch.no_grad():
        restarted.loop.trainer.model.weight[0, 1] += 1.0
    restarted.publish_resumed(2)
    assert _announced(site) == [(6, "delta")]
    assert restarted.store.manifest(6).base_version == 2 and restarted.store.manifest(4) is None
