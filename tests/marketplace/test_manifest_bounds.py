"""The site bounds what a learner's manifest may declare: a 4 EiB chunk was accepted; now it is a 400
naming the field, and so is a snapshot over ``ECHO2_MAX_SNAPSHOT_BYTES``."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from . import factories

pytestmark = pytest.mark.django_db

URL = "http://127.0.0.1:8001/v1/"


@pytest.fixture
def started(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    job = factories.job(owner)
    api.post(f"/api/jobs/{job.pk}/start/")
    return api, job


def publish(api: APIClient, job, manifest: dict):
    return api.post(f"/api/jobs/{job.pk}/snapshots/", {"version": 1, "url": URL, "manifest": manifest}, format="json")


def test_a_manifest_declaring_a_4_eib_chunk_is_a_400_naming_the_field(started) -> None:
    api, job = started
    manifest = factories.manifest(job, 1)
    huge = 4 << 60
    manifest |= {"total_bytes": huge, "chunk_bytes": huge, "chunks": [manifest["chunks"][0] | {"size": huge}]}
    reply = publish(api, job, manifest)
    assert reply.status_code == 400
    assert reply.json()["detail"].startswith("manifest: total_bytes: Input should be less than or equal to")


def test_a_snapshot_over_the_sites_bound_is_a_400_naming_the_field(started, settings) -> None:
    api, job = started
    settings.ECHO2 = {**settings.ECHO2, "MAX_SNAPSHOT_BYTES": 15}
    reply = publish(api, job, factories.manifest(job, 1, total_bytes=16))
    assert reply.status_code == 400
    assert reply.json()["detail"] == "manifest: total_bytes: 16 bytes, this site takes snapshots of at most 15"
    settings.ECHO2 = {**settings.ECHO2, "MAX_SNAPSHOT_BYTES": 16}
    assert publish(api, job, factories.manifest(job, 1, total_bytes=16)).status_code == 201
