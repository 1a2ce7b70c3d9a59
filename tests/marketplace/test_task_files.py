"""The site reads no file it was not given (dataplane/tasks/files.py).

A math task names its data file by path. Before, the site opened whatever path a request named: ``/dev/zero`` ran
it out of memory, and the answer told whether any file existed and the first hex digits of its sha256
(``/proc/self/environ``). Now it reads only ``builtin:<file>`` or a regular file under ``ECHO2_TASK_DATA_ROOT``,
up to ``ECHO2_TASK_DATA_MAX_BYTES``, and a path outside the root reads the same whether it exists or not.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from rest_framework.test import APIClient

from dataplane.tasks import build_task, files

from . import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]

ROWS = "".join(json.dumps({"problem": f"What is {i} + 1?", "answer": i + 1}) + "\n" for i in range(4))
CAP = 4096


@pytest.fixture
def root(tmp_path) -> Path:
    """A site whose task data root is a fresh folder holding one good file, capped at 4 KiB."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "problems.jsonl").write_text(ROWS)
    with files.using(files.TaskFiles(root=folder, max_bytes=CAP)):
        yield folder


@pytest.fixture
def api() -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(factories.user())}")
    return client


def plan(api: APIClient, path: str):
    body = {"name": "probe", "model_dir": factories.checkpoint_dir(), "task": {"name": "math", "path": path},
            "batch_trajectories": 8, "group_size": 4}
    return api.post("/api/jobs/plan/", body, format="json")


def create(api: APIClient, path: str):
    body = {"name": "probe", "model_dir": factories.checkpoint_dir(), "task": {"name": "math", "path": path},
            "batch_trajectories": 8, "group_size": 4}
    return api.post("/api/jobs/", body, format="json")


def task_errors(reply) -> str:
    assert reply.status_code == 400, reply.content
    return " ".join(reply.json()["errors"]["task"])


def test_the_site_is_confined_to_its_configured_root():
    policy = files.current()
    assert policy.root == Path(django_settings.ECHO2["TASK_DATA_ROOT"])
    assert policy.max_bytes == django_settings.ECHO2["TASK_DATA_MAX_BYTES"] > 0


def test_a_file_under_the_root_and_builtin_files_are_read(root, api):
    for path in (str(root / "problems.jsonl"), "builtin:math_sample.jsonl"):
        assert plan(api, path).status_code == 200
        reply = create(api, path)
        assert reply.status_code == 201, reply.content
        assert len(reply.json()["task"]["sha256"]) == 64


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom", "/proc/self/environ", "/etc/passwd", "/etc/hostname",
                                  "/nonexistent/problems.jsonl", "relative.jsonl", "~/problems.jsonl"])
def test_a_path_outside_the_root_is_refused_and_says_nothing_of_the_file(root, api, path):
    """Refused before the file system is touched: ``/dev/zero`` costs nothing, and a file that exists
    (``/proc/self/environ``) reads exactly as one that does not: no existence, no digest."""
    for reply in (plan(api, path), create(api, path)):
        reason = task_errors(reply)
        assert reason == (f"path: {path!r} is not a file this site may read: give builtin:<file> or an absolute path "
                          f"under the site's task data root, {root} (ECHO2_TASK_DATA_ROOT)")
        assert "sha256" not in reason and "No such file" not in reason


def test_escapes_from_the_root_are_refused(root, api, tmp_path):
    secret = tmp_path / "secret.jsonl"
    secret.write_text(ROWS)
    (root / "link.jsonl").symlink_to(secret)  # a symlink out of the root
    (root / "zero").symlink_to("/dev/zero")
    paths = {f"{root}/../secret.jsonl": "is not a file this site may read",
             f"{root}/link.jsonl": "no readable regular file", f"{root}/zero": "no readable regular file",
             "builtin:../../../etc/passwd": "builtin: takes the name of a file",
             "builtin:/etc/passwd": "builtin: takes the name of a file"}
    for path, reason in paths.items():
        assert reason in task_errors(plan(api, path)), path


def test_what_is_not_a_readable_regular_file_under_the_root_reads_the_same(root, api):
    """A missing file, a folder, a FIFO (which would block a plain read forever) and an unreadable file: one
    answer, and a FIFO does not hang the request."""
    (root / "folder").mkdir()
    os.mkfifo(root / "fifo")
    locked = root / "locked.jsonl"
    locked.write_text(ROWS)
    locked.chmod(0)
    names = ["missing.jsonl", "folder", "fifo"] + ([] if os.geteuid() == 0 else ["locked.jsonl"])
    for name in names:
        path = str(root / name)
        assert task_errors(plan(api, path)) == f"path: no readable regular file at {path!r}"


def test_a_file_over_the_cap_is_refused(root, api):
    big = root / "big.jsonl"
    big.write_text(ROWS * (CAP // len(ROWS) + 1))
    assert "is larger than this site reads (4096 bytes, ECHO2_TASK_DATA_MAX_BYTES)" in task_errors(plan(api, str(big)))


def test_the_learner_and_agents_read_their_own_paths(tmp_path):
    """Outside the site (no Django: the learner, the agents) a task reads the path its machine was given."""
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(ROWS)
    with files.using(files.UNCONFINED):
        assert build_task({"name": "math", "path": str(elsewhere)}).answer("What is 0 + 1?\nPut the final answer "
                                                                          "in \\boxed{}.") == "1"
