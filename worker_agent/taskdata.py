"""The job's data sets on the agent: fetched by digest from the learner, kept in the base cache, found by the task.

A task that reads an owner's data set (``dataset``: docs/datasets.md) names it by digest
(``task.content_digests()``). Before the job's engine is built the agent makes sure it holds each: an intact
cache entry of the digest is used as it is (re-packed, it hashes to the digest: :class:`~worker_agent.cache.
BaseCache`, the same cache as base models, the same least-recently-used budget); otherwise the archive comes from
the learner's snapshot server (``/data/<digest>/``) with the worker's transfer credential, every chunk checked, the
whole hashed, and is unpacked into the cache. The entry's directory is then registered
(:func:`dataplane.dataset.content.register`), where the task reads its rows.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from dataplane.dataset import content
from dataplane.tasks import build_task

from .cache import BaseCache

log = logging.getLogger("echo2.agent")


def fetch_task_data(cache: BaseCache, task_spec: dict[str, Any], *, snapshot_url: str, credential: str | None,
                    max_bytes: int = content.MAX_BYTES, allow_user_code: bool = False) -> dict[str, Path]:
    """Every data set the task of ``task_spec`` reads, cached (fetched from the learner serving the job's snapshots
    at ``snapshot_url`` when missing) and registered; digest -> its directory. The job's code package
    (``task.code``, dataplane/usercode.py) is one of them only with ``allow_user_code``: a worker whose provider did
    not opt in never holds the owner's code. Raises SnapshotError (a refusal, a tampered chunk) or CacheError
    naming the data set."""
    held: dict[str, Path] = {}
    task = build_task(task_spec)
    for digest in task.content_digests():
        if digest == task.code and not allow_user_code:
            continue
        path = cache.get(digest)
        if path is None:
            url = content.data_url(snapshot_url, digest)
            log.info("fetching data set %s... from %s", digest[:12], url)
            payload = content.fetch(url, digest, credential=credential, max_bytes=max_bytes)
            path = cache.put(digest, payload)
            log.info("data set %s... cached (%d bytes) in %s", digest[:12], len(payload), path)
        else:
            log.info("data set %s... already cached in %s", digest[:12], path)
        content.register(digest, path)
        held[digest] = path
    return held
