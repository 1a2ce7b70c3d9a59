"""What an export dials and what it tells: the snapshot URL passes the peers' address rules again when the
site dials it (numeric forms, and the addresses a name resolves to); whatever answers there, a closed port, a
service that is not HTTP, a silent one, a TLS error or a server sending far more than a chunk declares, the owner
reads one message while the log keeps the detail; and a liar's bytes are cut off at the chunk's declared size."""

from __future__ import annotations

import logging
import os
import socket
import tracemalloc

import pytest
from rest_framework.test import APIClient

from dataplane.snapshot import build_manifest
from marketplace.api import exports
from marketplace.infra import learner_fetch
from marketplace.models import Snapshot

from ..lying_servers import LyingHTTPServer, RawServer, closed_port
from . import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def dial_loopback(settings):
    settings.ECHO2 = {**settings.ECHO2, "ALLOW_LOOPBACK_PEERS": True}


def export_from(url: str):
    """The owner's export of a job whose learner announced ``url`` for its base and version 2."""
    owner = factories.user()
    job = factories.job(owner)
    for version in (0, 2):
        manifest = build_manifest(os.urandom(100), job_id=job.pk, version=version,
                                  format="checkpoint-tar" if version == 0 else "safetensors")
        Snapshot.objects.create(job=job, version=version, url=url, manifest=manifest.model_dump(mode="json"))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    return job, api.get(f"/api/jobs/{job.pk}/export/")


def unreachable(job) -> str:
    return (f"{exports.UNREACHABLE} (it serves snapshots only while it runs); on the learner's machine, `echo2-learner "
            f"export --job {job.pk} --version 2 --out DIR` (with its --snapshot-dir) reads it from disk")


def test_whatever_answers_the_owner_reads_one_message_and_the_log_says_which(dial_loopback, monkeypatch,
                                                                             caplog) -> None:
    monkeypatch.setattr(learner_fetch, "FETCH_TIMEOUT_S", 0.5)  # the silent service's wait
    caplog.set_level(logging.WARNING, logger="marketplace.api.exports")
    with RawServer(b"SSH-2.0-OpenSSH_9.6\r\n") as ssh, RawServer() as silent, LyingHTTPServer(100) as plain:
        cases = {"closed port": f"http://127.0.0.1:{closed_port()}/v2/",
                 "not HTTP": f"http://127.0.0.1:{ssh.port}/v2/",
                 "silent": f"http://127.0.0.1:{silent.port}/v2/",
                 "TLS to plain HTTP": plain.url().replace("http:", "https:")}
        replies = {case: export_from(url) for case, url in cases.items()}
    for case, (job, reply) in replies.items():
        assert (reply.status_code, reply.json()["detail"]) == (503, unreachable(job)), case
    logged = [r.getMessage() for r in caplog.records if r.name == "marketplace.api.exports"]
    assert len(logged) == len(cases)
    assert len({line.split(": ", 1)[1] for line in logged}) == len(cases)  # the detail, different each time


def test_a_learner_sending_far_more_than_a_chunk_declares_is_cut_off(dial_loopback) -> None:
    with LyingHTTPServer(400 << 20, declare=False) as liar:
        tracemalloc.start()
        try:
            job, reply = export_from(liar.url())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert (reply.status_code, reply.json()["detail"]) == (503, unreachable(job))
    assert peak < 8 << 20, f"the export held {peak} bytes for a 100-byte chunk"
    assert liar.sent < 32 << 20, liar.sent  # it was 400 MiB, and the site's export grew to 979 MiB


@pytest.mark.parametrize("url", ["http://0xa9fea9fe/v2/", "http://2852039166/v2/", "http://[::ffff:a9fe:a9fe]/v2/"])
def test_a_stored_url_the_rules_refuse_is_not_dialled(url, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="marketplace.api.exports")
    job, reply = export_from(url)  # stored before the numeric forms were parsed, say
    assert (reply.status_code, reply.json()["detail"]) == (503, unreachable(job))
    assert "169.254.169.254 is a cloud metadata service" in caplog.text


def test_a_name_that_resolves_to_the_sites_own_machine_is_not_dialled(settings, caplog) -> None:
    name = socket.gethostname()
    resolved = {info[4][0] for info in socket.getaddrinfo(name, None)}
    if not all(ip.startswith("127.") for ip in resolved):
        pytest.skip(f"{name} resolves to {resolved}, not only to loopback")
    settings.ECHO2 = {**settings.ECHO2, "ALLOW_LOOPBACK_PEERS": False}
    caplog.set_level(logging.WARNING, logger="marketplace.api.exports")
    with LyingHTTPServer(100) as server:
        job, reply = export_from(f"http://{name}:{server.port}/v2/")
    assert (reply.status_code, reply.json()["detail"]) == (503, unreachable(job))
    assert server.hits == 0
    assert f"{name} resolves to 127.0.0.1: 127.0.0.1 is loopback" in caplog.text
