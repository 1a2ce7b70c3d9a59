"""The learner holds the job's data set before it samples a prompt: from ``--dataset PATH`` when its digest is the
job's, else the owner's upload from the site (a live site here); it registers the files and lays the archive out
for its snapshot server. Neither: one error naming ``--dataset``."""

from __future__ import annotations

import json

import pytest

from dataplane.dataset import content
from dataplane.tasks import build_task
from learner.client import SiteClient, SiteError
from learner.datasets import provide

from ..marketplace import factories


def files_of(tmp_path, name: str, text: str):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "train.jsonl").write_text(text)
    return folder


def task_of(digest: str):
    return build_task({"name": "dataset", "reward": "exact_match", "data": {"digest": digest, "format": "jsonl"}})


def served_manifest(root, digest: str) -> dict:
    return json.loads((root / "data" / digest / "manifest.json").read_text())


def test_the_learners_own_copy_is_registered_and_laid_out(tmp_path) -> None:
    files = files_of(tmp_path, "mine", '{"prompt": "1+1=", "answer": "2"}\n')
    digest = content.digest(files)

    assert provide(task_of(digest), root=tmp_path / "store", job_id=3, dataset=files, site=None) == [digest]
    assert content.locate(digest) == files
    manifest = served_manifest(tmp_path / "store", digest)
    assert manifest["sha256"] == digest and manifest["format"] == "dataset-tar" and manifest["job_id"] == 3


def test_a_copy_of_other_content_and_no_site_is_one_error_naming_dataset(tmp_path) -> None:
    other = files_of(tmp_path, "other", '{"prompt": "1+1=", "answer": "3"}\n')

    with pytest.raises(SiteError, match=r"^dataset: give --dataset PATH of the job's data set 5{12}\.\.\."):
        provide(task_of("5" * 64), root=tmp_path / "store", job_id=3, dataset=other, site=None)


@pytest.mark.django_db(transaction=True)
def test_an_upload_is_downloaded_from_the_site(tmp_path, live_server, settings) -> None:
    settings.ECHO2 = {**settings.ECHO2, "DATASET_DIR": tmp_path / "site-datasets"}
    token = factories.token(factories.user("owner"))
    files = files_of(tmp_path, "uploaded", '{"prompt": "2+2=", "answer": "4"}\n')
    site = SiteClient(live_server.url, token, retries=0)
    digest = content.digest(files)
    with pytest.raises(SiteError, match="the site answered 404.*read from --dataset PATH"):
        provide(task_of(digest), root=tmp_path / "store", job_id=3, dataset=None, site=site)
    assert site.http.post("datasets/", content=content.pack(files),
                          headers={"Content-Type": "application/x-tar"}).status_code == 201

    provide(task_of(digest), root=tmp_path / "store", job_id=3, dataset=None, site=site)

    assert content.locate(digest) == tmp_path / "store" / "data-files" / digest
    assert (content.locate(digest) / "train.jsonl").read_text() == (files / "train.jsonl").read_text()
    assert served_manifest(tmp_path / "store", digest)["sha256"] == digest
    site.close()
