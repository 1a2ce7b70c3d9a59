"""Data sets at the site (docs/datasets.md): an owner uploads a data set's archive and gets its digest; a job names
the digest, never a path; only the uploader (and its learner, with the owner's token) gets the archive back; a body
that is no data set archive, or too big, is a 400 naming the body."""

from __future__ import annotations

import io
import tarfile

import pytest
from rest_framework.test import APIClient

from dataplane.dataset import content
from marketplace.services import ServiceError, datasets

from . import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


@pytest.fixture
def store(settings, tmp_path):
    settings.ECHO2 = {**settings.ECHO2, "DATASET_DIR": tmp_path / "datasets", "DATASET_MAX_BYTES": 64 << 10}
    return tmp_path / "datasets"


def client() -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(factories.user())}")
    return api


def archive(tmp_path, text: str = '{"prompt": "1+1=", "answer": "2"}\n') -> bytes:
    (tmp_path / "files").mkdir(parents=True, exist_ok=True)
    (tmp_path / "files" / "train.jsonl").write_text(text)
    return content.pack(tmp_path / "files")


def upload(api: APIClient, body: bytes):
    return api.generic("POST", "/api/datasets/", body, content_type="application/x-tar")


def job(api: APIClient, digest: str, **data):
    task = {"name": "dataset", "reward": "exact_match", "data": {"digest": digest, "format": "jsonl", **data}}
    return api.post("/api/jobs/", {"name": "d", "model_dir": factories.checkpoint_dir(), "task": task,
                                   "batch_trajectories": 8, "group_size": 4}, format="json")


def test_an_upload_is_stored_by_digest_and_a_job_may_name_it(store, tmp_path) -> None:
    owner, body = client(), archive(tmp_path)

    reply = upload(owner, body)

    assert reply.status_code == 201, reply.content
    digest = reply.json()["digest"]
    assert digest == content.sha256(body) and reply.json()["files"] == ["train.jsonl"]
    assert (store / f"{digest}.tar").read_bytes() == body
    assert b"".join(owner.get(f"/api/datasets/{digest}/").streaming_content) == body
    created = job(owner, digest)
    assert created.status_code == 201, created.content
    assert created.json()["task"]["data"]["digest"] == digest


def test_another_owner_can_neither_fetch_nor_name_it(store, tmp_path) -> None:
    digest = upload(client(), archive(tmp_path)).json()["digest"]
    stranger = client()

    assert stranger.get(f"/api/datasets/{digest}/").status_code == 404
    refused = job(stranger, digest)
    assert refused.status_code == 400
    assert refused.json()["errors"]["task"][0].startswith(f"data.digest: no data set {digest[:12]}... was uploaded")
    assert job(stranger, digest, source="learner").status_code == 201  # its learner holds the files: not checked


@pytest.mark.parametrize(("body", "reason"), [
    (b"", "empty"),
    (b"not a tar at all" * 100, "not a data set archive"),
])
def test_a_bad_body_is_a_400_naming_it(store, body, reason) -> None:
    reply = upload(client(), body)

    assert reply.status_code == 400
    assert reason in reply.json()["errors"]["body"][0]
    assert not list(store.glob("*.tar"))


def test_a_body_over_the_cap_is_a_413_naming_it(store) -> None:
    reply = upload(client(), b"x" * (65 << 10))

    assert reply.status_code == 413
    assert "a data set of 66560 bytes, at most 65536" in reply.json()["errors"]["body"][0]
    assert not list(store.glob("*.tar"))


def test_an_owner_past_its_quota_gets_a_409_and_others_still_upload(store, settings, tmp_path) -> None:
    settings.ECHO2 = {**settings.ECHO2, "DATASET_QUOTA_BYTES": 48 << 10}
    owner, bodies = client(), [archive(tmp_path / str(i), f'{{"prompt": "{i}", "answer": "{"y" * 9000}"}}\n')
                               for i in range(4)]
    assert [upload(owner, b).status_code for b in bodies[:2]] == [201, 201]  # 2 x ~20 KB of 48 KB

    refused = upload(owner, bodies[2])

    assert refused.status_code == 409, refused.content
    assert "would pass your data set quota of 49152 bytes" in refused.json()["errors"]["body"][0]
    assert len(list(store.glob("*.tar"))) == 2
    assert upload(client(), bodies[2]).status_code == 201  # the quota is per owner


def test_staff_cannot_read_an_owners_data_set(store, tmp_path) -> None:
    digest = upload(client(), archive(tmp_path)).json()["digest"]
    staff = APIClient()
    staff.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(factories.user(is_staff=True))}")

    assert staff.get(f"/api/datasets/{digest}/").status_code == 404


def test_a_sparse_member_is_refused_before_it_is_stored(store) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("train.parquet")
        info.size = 1
        info.pax_headers = {"GNU.sparse.size": str(50 << 30), "GNU.sparse.map": f"{(50 << 30) - 1},1"}
        tar.addfile(info, io.BytesIO(b"x"))
    reply = upload(client(), out.getvalue())

    assert reply.status_code == 400 and "refusing member 'train.parquet'" in reply.json()["errors"]["body"][0]
    assert not list(store.glob("*.tar"))


def test_a_body_without_a_length_is_cut_at_the_cap(store) -> None:
    with pytest.raises(ServiceError, match="body: a data set of more than 65536 bytes"):
        datasets.dataset_store(owner=factories.user(), stream=io.BytesIO(b"x" * (65 << 10)), length=None)
    assert not list(store.iterdir())


def test_an_archive_with_a_path_or_a_link_is_refused(store) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("../escape.jsonl")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    reply = upload(client(), out.getvalue())

    assert reply.status_code == 400 and "refusing member '../escape.jsonl'" in reply.json()["errors"]["body"][0]
