"""The learner holds the job's code package before its workers ask: downloaded from the owner's upload on the site
(never from ``--dataset``, which is the data set's), laid out for its snapshot server beside the data set, and
imported from by the learner's own task (its audits run the workers' code)."""

from __future__ import annotations

import json
import sys

import pytest

from dataplane import usercode
from dataplane.dataset import content
from dataplane.tasks import build_task
from learner.client import SiteClient, SiteError
from learner.datasets import provide

from ..marketplace import factories


@pytest.mark.django_db(transaction=True)
def test_the_code_package_comes_from_the_site_and_is_served_and_imported(tmp_path, live_server, settings) -> None:
    settings.ECHO2 = {**settings.ECHO2, "DATASET_DIR": tmp_path / "site-datasets"}
    site = SiteClient(live_server.url, factories.token(factories.user("owner")), retries=0)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"prompt": "2+2=", "answer": "4"}\n')
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "ownpkg_l.py").write_text("def four(completions, **kwargs):\n    return [4.0 for _ in completions]\n")
    package = tmp_path / "package" / usercode.ARCHIVE
    package.parent.mkdir()
    package.write_bytes(usercode.pack(["ownpkg_l"], [checkout]))
    code = content.digest(package)
    task = build_task({"name": "dataset", "data": {"digest": content.digest(data), "format": "jsonl"}, "code": code,
                       "reward": [{"function": "ownpkg_l:four", "scored_on": "worker"}]})
    store = tmp_path / "store"
    with pytest.raises(SiteError, match=f"{code[:12]}...: the site answered 404.*uploads a job file's task.code_mod"):
        provide(task, root=store, job_id=5, dataset=data, site=site)  # not uploaded: the learner cannot serve it
    assert site.http.post("datasets/", content=content.pack(package),
                          headers={"Content-Type": "application/x-tar"}).status_code == 201

    assert provide(task, root=store, job_id=5, dataset=data, site=site) == [content.digest(data), code]

    assert content.locate(code) == store / "data-files" / code
    assert json.loads((store / "data" / code / "manifest.json").read_text())["sha256"] == code
    try:
        task.prepare(allow_user_code=True)  # the learner: the owner's machine
        assert task.reward("2+2=", "anything") == 4.0
        assert sys.modules["ownpkg_l"].__file__.startswith(str(store / "data-files" / code))
    finally:
        usercode.deactivate()
        sys.modules.pop("ownpkg_l", None)
        site.close()
