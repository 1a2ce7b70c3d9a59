"""A job's own code reaches the workers by content: the learner serves the code package like a data set, an agent
with no copy of the owner's modules (none installed, no PYTHONPATH) fetches it by digest, every chunk checked,
and imports from it, only where its provider opted in (elsewhere it is neither fetched nor imported); a tampered
package is refused."""

from __future__ import annotations

import random
import sys
import time

import pytest

from dataplane import credentials, usercode
from dataplane.dataset import content
from dataplane.rewards import UserCodeRefused
from dataplane.snapshot import SnapshotError
from dataplane.tasks import build_task
from learner.datasets import lay_out
from learner.serving import SnapshotServer
from learner.snapshots import SnapshotStore
from worker_agent.cache import BaseCache
from worker_agent.taskdata import fetch_task_data

JOB, SECRET = 9, credentials.new_secret()

REWARD = '''
from ownpkg_w.rules import target

def ends_right(prompts, completions, answer, **kwargs):
    return [1.0 if c.strip() == target(a) else 0.0 for c, a in zip(completions, answer)]
'''
ENV = '''
import verifiers.v1 as vf


class Data(vf.TaskData):
    answer: str


class Twice(vf.Task[Data, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(trace.last_reply.strip() == task.answer)


class Doubles(vf.Taskset):
    def load(self):
        for a in range(5):
            yield Twice(Data(prompt=f"{a}*2=", answer=str(2 * a)))


def load_environment():
    return Doubles(vf.TasksetConfig())
'''


def credential() -> str:
    return credentials.issue(SECRET, job_id=JOB, worker_id=3, lowest=0, highest=0, expires=int(time.time()) + 600)


@pytest.fixture
def served(tmp_path):
    """The learner's side: a data set and the owner's code package, laid out in 512-byte chunks and served. The
    owner's modules exist only in the package (the owner's checkout is not on this process's path)."""
    checkout = tmp_path / "owner-checkout"
    (checkout / "ownpkg_w").mkdir(parents=True)
    (checkout / "ownpkg_w" / "__init__.py").write_text("")
    (checkout / "ownpkg_w" / "rewards.py").write_text(REWARD)
    (checkout / "ownpkg_w" / "rules.py").write_text("def target(answer):\n    return str(answer).strip()\n")
    (checkout / "ownpkg_w_env.py").write_text(ENV)
    package = tmp_path / "package" / usercode.ARCHIVE
    package.parent.mkdir()
    package.write_bytes(usercode.pack(["ownpkg_w", "ownpkg_w_env"], [checkout]))
    code = content.digest(package)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(f'{{"prompt": "{i}*2=", "answer": "{2 * i}"}}\n' for i in range(20)))
    store = SnapshotStore(tmp_path / "store", job_id=JOB)
    for digest, path in ((content.digest(data), data), (code, package)):
        lay_out(store.root, digest, content.pack(path), job_id=JOB, chunk_bytes=512)
    server = SnapshotServer(store, secret=SECRET).start()
    task = {"name": "dataset", "data": {"digest": content.digest(data), "format": "jsonl"}, "code": code,
            "reward": [{"function": "ownpkg_w.rewards:ends_right", "scored_on": "worker"}]}
    yield server, task, store
    server.stop()
    usercode.deactivate()
    for name in [n for n in sys.modules if n.startswith("ownpkg_w")]:
        del sys.modules[name]


def test_an_opted_in_worker_imports_the_owners_functions_from_the_package(served, tmp_path) -> None:
    server, task, _ = served
    with pytest.raises(ModuleNotFoundError):  # nothing installed here: only the package has it
        __import__("ownpkg_w")
    packages_before = [p for p in sys.path if usercode.ARCHIVE in p]  # another test's, in a full run
    cache = BaseCache(tmp_path / "agent-cache", max_bytes=10**8)

    held = fetch_task_data(cache, task, snapshot_url=server.url_for(0), credential=credential())  # not opted in

    assert set(held) == {task["data"]["digest"]} and cache.get(task["code"]) is None  # the owner's code never came
    refusing = build_task(task)
    with pytest.raises(UserCodeRefused):  # no opt-in: refused, and nothing imported
        refusing.prepare(allow_user_code=False)
    assert "ownpkg_w" not in sys.modules and [p for p in sys.path if usercode.ARCHIVE in p] == packages_before

    held = fetch_task_data(cache, task, snapshot_url=server.url_for(0), credential=credential(), allow_user_code=True)
    assert set(held) == {task["data"]["digest"], task["code"]}
    scorer = build_task(task)
    scorer.prepare(allow_user_code=True)
    assert scorer.reward("7*2=", "14") == 1.0 and scorer.reward("7*2=", "13") == 0.0
    assert sys.modules["ownpkg_w.rules"].__file__.startswith(str(held[task["code"]]))


def test_a_verifiers_environment_comes_from_the_package(served, tmp_path) -> None:
    pytest.importorskip("verifiers.v1")
    server, task, _ = served
    spec = {"name": "verifiers", "env": "ownpkg_w_env:load_environment", "code": task["code"], "size": 5}
    cache = BaseCache(tmp_path / "agent-cache", max_bytes=10**8)

    fetch_task_data(cache, spec, snapshot_url=server.url_for(0), credential=credential(), allow_user_code=True)
    env = build_task(spec)
    env.prepare(allow_user_code=True)

    prompts = sorted(p.text for p in env.sample_prompts(random.Random(0), 30))
    assert prompts[0] == "0*2=\n" and env.reward("3*2=\n", "6") == 1.0 and env.reward("3*2=\n", "5") == 0.0


def test_a_tampered_package_is_refused_and_nothing_is_cached(served, tmp_path) -> None:
    server, task, store = served
    chunk = store.root / content.PREFIX / task["code"] / "chunks" / "1"
    chunk.write_bytes(b"X" + chunk.read_bytes()[1:])
    cache = BaseCache(tmp_path / "agent-cache", max_bytes=10**8)

    with pytest.raises(SnapshotError, match="chunk 1 .*sha256"):
        fetch_task_data(cache, task, snapshot_url=server.url_for(0), credential=credential(), allow_user_code=True)
    assert cache.get(task["code"]) is None
