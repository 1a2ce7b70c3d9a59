"""A full disk under the learner (learner/diskroom.py): training goes on, the write is tried again after a back-off
once retention dropped what it may, the step reports say how much room is needed, and no entry is lost or trained
twice. ENOSPC is injected at the write call (the store's own code runs; only the disk says no)."""

from __future__ import annotations

import errno

import torch

from learner import diskroom
from learner.checkpoint import CheckpointStore
from learner.distributed import DistContext
from learner.report import step_metrics

from .test_loop import append_group, make_loop, stream_ids
from .test_publication import _announced, _publisher, site  # noqa: F401 (site: a fixture)


def no_room(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_checkpoint_that_finds_the_disk_full_leaves_training_going_and_its_entries_for_the_next(
        redis_url, redis_client, tiny_model_dir, tmp_path, monkeypatch) -> None:
    ids = [append_group(redis_client, g) for g in range(8)]
    loop = make_loop(redis_url, tiny_model_dir, tmp_path, background=True)
    loop.room = diskroom.Backoff(first=0.0)  # tried again at the next checkpoint (10 s doubling in production)
    monkeypatch.setattr(CheckpointStore, "save", no_room)
    loop.step(timeout_s=5)
    second = loop.step(timeout_s=5)  # v2: its checkpoint fails on the committer's thread
    loop.settle()
    assert second.checkpointed and CheckpointStore(tmp_path).load() is None
    assert loop.storage_warning.startswith("checkpoint store full: ") and loop.unsaved_since == 2
    assert step_metrics(loop, second, DistContext())["extra"]["storage"] == loop.storage_warning
    assert stream_ids(redis_client) == ids  # nothing acknowledged: no checkpoint holds those entries
    monkeypatch.undo()  # room again
    loop.step(timeout_s=5)
    loop.step(timeout_s=5)  # v4: its checkpoint carries v1-v4's entries
    loop.settle()
    loop.close()
    saved = CheckpointStore(tmp_path).load()
    assert saved.version == 4 and saved.trained_entry_ids == ids
    assert stream_ids(redis_client) == [] and loop.storage_warning == "" and loop.unsaved_since is None


def test_a_snapshot_that_finds_the_disk_full_is_retried_after_retention_and_the_back_off(site, tmp_path,  # noqa: F811
                                                                                         tiny_model_dir, monkeypatch):
    publisher = _publisher(site, tmp_path, tiny_model_dir)
    publisher.publish_base("")
    store = publisher.store
    write = store.write
    failures = [1]

    def fills_once(*args, **kwargs):  # the first write after the prune fits
        if failures[0]:
            failures[0] -= 1
            no_room()
        return write(*args, **kwargs)

    store.keep, store.retain_s = 1, 3600.0  # v2 kept while agents may still fetch it: written under a minute ago
    for version in (2, 4):
        publisher.loop.version = version
        publisher.publish_due(version)
    store.retain_s = 0.0  # ... and then an hour passed
    monkeypatch.setattr(store, "write", fills_once)
    publisher.loop.version = 6
    publisher.publish_due(6)  # full; v2 dropped as retention allows (keep 1 besides the base), then written
    assert [v for v, _ in _announced(site)] == [0, 2, 4, 6] and publisher.loop.storage_warning == ""
    assert store.manifest(2) is None

    failures[0] = 10  # full for good
    publisher.loop.version = 8
    with torch.no_grad():
        publisher.loop.trainer.model.weight[0, 0] += 1.0
    publisher.publish_due(8)  # does not raise: training goes on
    assert publisher.version == 6
    assert publisher.loop.storage_warning.startswith("snapshot store full: ")
    assert " MB needed" in publisher.loop.storage_warning and not publisher.room.due()
    publisher.publish_due(10)  # within the back-off: not even tried
    assert failures[0] == 9
    failures[0] = 0
    publisher.room.until = 0.0  # the back-off ran out
    publisher.loop.version = 12
    publisher.publish_due(12)
    assert publisher.version == 12 and publisher.loop.storage_warning == ""
