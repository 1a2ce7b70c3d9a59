"""Code packages (dataplane/usercode.py): the owner's modules packed by content, the same bytes for the same sources,
named by a job file and turned into the task's digest, checked before use, imported from the package only once it
is activated, and what a package must never hold refused."""

from __future__ import annotations

import io
import os
import sys
import zipfile

import pytest

from dataplane import usercode
from dataplane.dataset import content
from dataplane.jobfiles import JobFileError, load_job_file
from dataplane.jobs import parse_job_spec
from dataplane.tasks import TaskSpecError, build_task


def write_owner_code(root, *, answer: str = "1.0", top: str = "ownpkg_a") -> None:
    """An owner's checkout: a package with a sub-package and a helper module beside it, and some noise."""
    (root / top / "scoring").mkdir(parents=True)
    (root / top / "__init__.py").write_text("")
    (root / top / "scoring" / "__init__.py").write_text("")
    (root / top / "scoring" / "rules.py").write_text(
        f"from {top}.helpers import BONUS\n\ndef score(completions, **kwargs):\n"
        f"    return [{answer} + BONUS for _ in completions]\n")
    (root / top / "helpers.py").write_text("BONUS = 0.5\n")
    (root / top / "__pycache__").mkdir()
    (root / top / "__pycache__" / "helpers.cpython-311.pyc").write_bytes(b"\0stale")
    (root / top / ".secret").write_text("not shipped")


def names(payload: bytes) -> list[str]:
    """The package's files (its directories' entries left out)."""
    return [n for n in zipfile.ZipFile(io.BytesIO(payload)).namelist() if not n.endswith("/")]


@pytest.fixture
def clean_imports():
    """Every package activated in a test is taken off the path after it, and its modules forgotten."""
    before = set(sys.modules)
    yield
    usercode.deactivate()
    for name in set(sys.modules) - before:
        if name.startswith("ownpkg"):
            del sys.modules[name]


def test_the_same_sources_give_the_same_bytes_wherever_they_lie(tmp_path) -> None:
    write_owner_code(tmp_path / "a")
    write_owner_code(tmp_path / "b")
    os.utime(tmp_path / "b" / "ownpkg_a" / "helpers.py", (1, 1))  # another mtime changes nothing

    one = usercode.pack(["ownpkg_a"], [tmp_path / "a"])
    assert one == usercode.pack(["ownpkg_a"], [tmp_path / "b"])
    assert names(one) == ["ownpkg_a/__init__.py", "ownpkg_a/helpers.py", "ownpkg_a/scoring/__init__.py",
                          "ownpkg_a/scoring/rules.py"]  # no __pycache__, no hidden file
    # a module alone ships with the __init__.py of each package above it, not its siblings
    assert names(usercode.pack(["ownpkg_a.scoring.rules"], [tmp_path / "a"])) == [
        "ownpkg_a/__init__.py", "ownpkg_a/scoring/__init__.py", "ownpkg_a/scoring/rules.py"]
    write_owner_code(tmp_path / "c", answer="2.0")
    assert usercode.pack(["ownpkg_a"], [tmp_path / "c"]) != one  # other content, other package


def test_what_cannot_ship_is_named(tmp_path) -> None:
    write_owner_code(tmp_path)
    with pytest.raises(usercode.CodeError, match="no module 'ownpkg_b' under"):
        usercode.pack(["ownpkg_b"], [tmp_path])
    with pytest.raises(usercode.CodeError, match="is not a module name"):
        usercode.pack(["../etc"], [tmp_path])
    (tmp_path / "ownpkg_a" / "fast.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    with pytest.raises(usercode.CodeError, match="native extension"):
        usercode.pack(["ownpkg_a"], [tmp_path])
    (tmp_path / "big.py").write_bytes(b"#" * (usercode.MAX_BYTES + 1))
    with pytest.raises(usercode.CodeError, match="more than"):
        usercode.pack(["big"], [tmp_path])


@pytest.mark.parametrize("member", ["../evil.py", "/abs.py", "pkg/../../x.py", ".hidden/x.py"])
def test_a_package_with_a_path_out_of_it_is_refused(member) -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr(member, "x = 1\n")
    with pytest.raises(usercode.CodeError, match="refusing member"):
        usercode.check_package(out.getvalue())
    with pytest.raises(usercode.CodeError, match="not a zip"):
        usercode.check_package(b"PK not really")


JOB = """
name = "rewards on the workers"
model_dir = "/models/tiny"
batch_trajectories = 16
group_size = 4

[task]
name = "dataset"
reward = [{{ function = "ownpkg_a.scoring.rules:score", scored_on = "worker" }}]
code_modules = {modules}

[task.data]
path = "sums.jsonl"
format = "jsonl"
"""


def test_a_job_file_names_modules_and_the_job_names_their_package(tmp_path, monkeypatch) -> None:
    write_owner_code(tmp_path)
    (tmp_path / "sums.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "job.toml").write_text(JOB.format(modules='["ownpkg_a"]'))
    monkeypatch.chdir(tmp_path / "..")  # found beside the job file too, not only in the working directory

    raw = load_job_file(tmp_path / "job.toml")

    task = parse_job_spec(raw).task
    held = content.locate(task["code"])
    assert "code_modules" not in task and usercode.upload_path(raw) == held  # what echo2 job submit uploads
    assert held.name == usercode.ARCHIVE and content.digest(held) == task["code"]
    assert held.read_bytes() == usercode.pack(["ownpkg_a"], [tmp_path])
    assert build_task(task).content_digests() == [task["data"]["digest"], task["code"]]
    assert build_task(task).spec()["code"] == task["code"]  # the site keeps it in the job

    (tmp_path / "bad.toml").write_text(JOB.format(modules='["ownpkg_missing"]'))
    with pytest.raises(JobFileError, match=r"task.code_modules: no module 'ownpkg_missing'"):
        load_job_file(tmp_path / "bad.toml")
    with pytest.raises(TaskSpecError, match="code: must be the code package's sha256"):
        build_task({**task, "code": "mypkg"})


def test_an_activated_package_is_what_imports(tmp_path, monkeypatch, clean_imports) -> None:
    write_owner_code(tmp_path / "installed", answer="0.0")
    write_owner_code(tmp_path / "shipped", answer="2.0")  # not registered by another test
    monkeypatch.syspath_prepend(str(tmp_path / "installed"))
    import ownpkg_a.scoring.rules  # an older copy, imported from elsewhere first

    assert ownpkg_a.scoring.rules.score(["x"]) == [0.5]
    package = tmp_path / "held" / usercode.ARCHIVE
    package.parent.mkdir()
    package.write_bytes(usercode.pack(["ownpkg_a"], [tmp_path / "shipped"]))
    digest = content.digest(package.parent)
    assert usercode.activate(digest) is None  # not held here: nothing changes
    content.register(digest, package.parent)

    assert usercode.activate(digest) == package
    from ownpkg_a.scoring import rules

    assert rules.score(["x", "y"]) == [2.5, 2.5] and rules.__file__.startswith(str(package))
    usercode.deactivate()
    assert str(package) not in sys.path


def test_a_module_in_a_folder_without_init_imports_from_the_package(tmp_path, clean_imports) -> None:
    (tmp_path / "ownpkg_ns" / "envs").mkdir(parents=True)  # a namespace package, as examples/envs/ is
    (tmp_path / "ownpkg_ns" / "envs" / "calc.py").write_text("ANSWER = 42\n")
    payload = usercode.pack(["ownpkg_ns.envs.calc"], [tmp_path])
    assert zipfile.ZipFile(io.BytesIO(payload)).namelist() == ["ownpkg_ns/", "ownpkg_ns/envs/",
                                                               "ownpkg_ns/envs/calc.py"]
    package = tmp_path / "held" / usercode.ARCHIVE
    package.parent.mkdir()
    package.write_bytes(payload)
    content.register(content.digest(package.parent), package.parent)

    usercode.activate(content.digest(package.parent))
    from ownpkg_ns.envs import calc

    assert calc.ANSWER == 42 and calc.__file__.startswith(str(package))


def test_a_later_job_without_a_package_does_not_import_an_earlier_jobs(tmp_path, monkeypatch, clean_imports) -> None:
    pytest.importorskip("verifiers.v1")
    monkeypatch.setenv("ECHO2_ALLOW_USER_CODE", "1")
    (tmp_path / "ownpkg_env_a.py").write_text("def load_environment():\n    raise RuntimeError('from the package')\n")
    package = tmp_path / "held" / usercode.ARCHIVE
    package.parent.mkdir()
    package.write_bytes(usercode.pack(["ownpkg_env_a"], [tmp_path]))
    code = content.digest(package.parent)
    content.register(code, package.parent)
    spec = {"name": "verifiers", "env": "ownpkg_env_a:load_environment"}
    with pytest.raises(TaskSpecError, match="from the package"):  # the first job imports from its package
        build_task({**spec, "code": code}).prepare(allow_user_code=True)
    sys.modules.pop("ownpkg_env_a", None)

    with pytest.raises(TaskSpecError, match="No module named 'ownpkg_env_a'"):  # the next ships none: not found
        build_task(spec).prepare(allow_user_code=True)


def test_a_spec_with_modules_instead_of_a_package_says_where_they_are_packed() -> None:
    with pytest.raises(TaskSpecError, match="^task: code_modules: the modules are packed where the job file is read"):
        build_task({"name": "verifiers", "env": "mypkg:load", "code_modules": ["mypkg"]})  # the web form, the API
