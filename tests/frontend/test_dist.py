"""The agent's wheel, served by the site (frontend/dist.py): what a provider's `pip install` line fetches, a stable
alias, a 404 that says why, the exact line on the provider page; and, end to end, that the wheel the site serves
installs into a fresh venv where Django is not importable and `echo2-agent --help` runs."""

from __future__ import annotations

import email
import html
import importlib.metadata
import logging
import os
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from django.test import Client
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from frontend import dist

from ..marketplace import factories

ROOT = Path(__file__).resolve().parents[2]
NAME = "echo2-0.1.0-py3-none-any.whl"


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def dist_dir(tmp_path, settings) -> Path:
    path = tmp_path / "dist"
    settings.ECHO2 = {**settings.ECHO2, "DIST_DIR": path}
    return path


def test_no_wheel_built_is_a_404_that_says_why_and_a_warning_at_start_up(dist_dir, caplog):
    for url in (f"/dist/{NAME}", "/dist/echo2-agent.whl"):
        response = Client().get(url)
        assert response.status_code == 404 and response["Content-Type"].startswith("text/plain")
        assert "no agent wheel" in response.content.decode() and "scripts/build-wheel.sh" in response.content.decode()
    with caplog.at_level(logging.INFO, logger="echo2.site"):
        dist.log_startup()
    assert [r.levelname for r in caplog.records if r.name == "echo2.site"] == ["WARNING"]
    assert f"none was built into {dist_dir}" in caplog.text and "/dist/echo2-agent.whl answers 404" in caplog.text


def test_the_wheel_is_served_by_its_name_and_the_alias_redirects_to_the_newest(dist_dir, caplog):
    dist_dir.mkdir()
    (dist_dir / NAME).write_bytes(b"PK old")
    (dist_dir / "echo2-0.10.0-py3-none-any.whl").write_bytes(b"PK newest")  # 0.10 > 0.9 > 0.1: by version
    (dist_dir / "echo2-0.9.0-py3-none-any.whl").write_bytes(b"PK older")
    (dist_dir / "notes.txt").write_text("not a wheel")

    response = Client().get(f"/dist/{NAME}")
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"PK old"
    assert response["Content-Type"] == "application/zip"
    assert response["Content-Disposition"] == f'attachment; filename="{NAME}"'
    assert response["Content-Length"] == "6"

    alias = Client().get("/dist/echo2-agent.whl")
    assert alias.status_code == 302 and alias["Location"] == "/dist/echo2-0.10.0-py3-none-any.whl"
    assert Client().head("/dist/echo2-agent.whl").status_code == 302
    assert Client().post("/dist/echo2-agent.whl").status_code == 405

    for missing in ("echo2-9.9.9-py3-none-any.whl", "notes.txt"):
        response = Client().get(f"/dist/{missing}")
        assert response.status_code == 404, missing
        assert "this site serves echo2-0.1.0-py3-none-any.whl, echo2-0.10.0" in response.content.decode()
    assert Client().get("/dist/..%2F..%2Fpyproject.toml").status_code == 404
    with caplog.at_level(logging.INFO, logger="echo2.site"):
        dist.log_startup()
    assert "agent wheel: serving" in caplog.text and "echo2-0.10.0-py3-none-any.whl" in caplog.text


@pytest.mark.django_db
def test_the_provider_page_shows_the_exact_pip_line_with_the_sites_own_address(dist_dir, settings):
    settings.ALLOWED_HOSTS = ["testserver", "echo2.example"]
    provider = factories.user("prov")
    page = signed_in(provider).get("/provider/").content.decode()
    assert "this site serves no agent wheel yet" in page and "pip install echo2\n" not in page

    dist_dir.mkdir()
    (dist_dir / NAME).write_bytes(b"PK")
    page = signed_in(provider).get("/provider/", HTTP_HOST="echo2.example").content.decode()
    assert f'pip install "http://echo2.example/dist/{NAME}"' in html.unescape(page)
    https = signed_in(provider).get("/provider/", HTTP_HOST="echo2.example", secure=True).content.decode()
    assert f'pip install "https://echo2.example/dist/{NAME}"' in html.unescape(https)


# --- end to end: the served wheel in a fresh venv ----------------------------------------------------------------

def base_requirements(requires: list[str] | None, extras: set[str] = frozenset()) -> list[Requirement]:
    """The requirements that apply on this machine without extras (or with ``extras``)."""
    out = []
    for text in requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
            out.append(req)
    return out


def dependency_closure(wheel: Path) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions (of this test's venv) that the wheel's base install needs, transitively: its own
    METADATA's requirements without extras, then each distribution's."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        todo = base_requirements(email.message_from_bytes(archive.read(metadata)).get_all("Requires-Dist"))
    found: dict[str, importlib.metadata.Distribution] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name not in found:
            found[name] = importlib.metadata.distribution(req.name)
            todo.extend(base_requirements(found[name].requires, set(req.extras)))
    return found


def share(distributions, into: Path) -> None:
    """Symlinks to exactly these distributions' top-level files (packages, modules, shared libraries, dist-info)."""
    into.mkdir()
    for distribution in distributions:
        root = Path(distribution.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in distribution.files or () if ".." not in Path(str(f)).parts}:
            if (root / top).exists() and not (into / top).exists():
                (into / top).symlink_to(root / top)


@pytest.mark.django_db(transaction=True)
def test_the_served_wheel_installs_into_a_fresh_venv_without_django_and_the_agent_runs(live_server, tmp_path,
                                                                                        settings):
    """The wheel is built as `make install` builds it, served by a live site, and installed with the line the
    provider page shows, by pip, over HTTP, into a venv made without system site packages.

    Installing torch there would download gigabytes, so the venv sees this venv's copies of exactly the wheel's
    base dependencies (its METADATA, walked through the installed distributions' requirements): one .pth file
    names a directory of symlinks to those distributions alone. Django, installed here for the site, is not among
    them, so nothing but the wheel's own requirements could make it importable there. pip resolves those
    requirements with --no-index (and no config or find-links): each must be one of the shared ones, installed
    already, or the install fails. The venv has no pip of its own (ensurepip's older setuptools would shadow the
    one torch needs); this venv's pip installs into it with --python. About 10 s on the 2-core machine."""
    out = tmp_path / "dist"
    built = subprocess.run(["bash", str(ROOT / "scripts" / "build-wheel.sh"), str(out)], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("echo2-*.whl")
    settings.ECHO2 = {**settings.ECHO2, "DIST_DIR": out}
    provider = factories.user("prov")
    page = html.unescape(signed_in(provider).get("/provider/", HTTP_HOST=live_server.url.split("//")[1]).content
                         .decode())
    (url,) = re.findall(r'pip install "(\S+)"', page)
    assert url == f"{live_server.url}/dist/{wheel.name}"

    closure = dependency_closure(wheel)
    assert "django" not in closure, "the base install (the agent) must not pull Django in"
    assert {"torch", "transformers", "websockets", "typer"} <= set(closure)
    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=False, system_site_packages=False)
    python = fresh / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    share(closure.values(), tmp_path / "shared")
    (Path(site) / "echo2-shared.pth").write_text(f"{tmp_path / 'shared'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", url],
                               capture_output=True, text=True, timeout=300, env=env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "Successfully installed echo2-0.1.0" in installed.stdout

    django = subprocess.run([python, "-c", "import django"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert django.returncode == 1 and "No module named 'django'" in django.stderr
    agent = subprocess.run([fresh / "bin" / "echo2-agent", "--help"], capture_output=True, text=True, env=env,
                           timeout=60)
    assert agent.returncode == 0, agent.stderr
    assert "offer a GPU machine to an ECHO-2 marketplace" in agent.stdout and "register" in agent.stdout
    engine = subprocess.run([python, "-c", "import worker_agent, worker_agent.session, worker_agent.engines.hf; "
                             "print(worker_agent.__file__)"], capture_output=True, text=True, env=env, timeout=120,
                            cwd=tmp_path)  # not this checkout's copy, which `python -c` would find in its cwd
    assert engine.returncode == 0, engine.stderr
    assert engine.stdout.strip().startswith(site)  # the wheel's copy, not this checkout's


def test_the_owner_cli_wheel_is_served_by_its_name_and_is_not_the_agent(dist_dir):
    dist_dir.mkdir()
    (dist_dir / NAME).write_bytes(b"PK agent")
    (dist_dir / "echo2_cli-0.1.0-py3-none-any.whl").write_bytes(b"PK cli")
    response = Client().get("/dist/echo2_cli-0.1.0-py3-none-any.whl")
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"PK cli"
    assert [p.name for p in dist.wheels()] == [NAME]  # the agent's alias and pip line never point at the CLI
    assert Client().get("/dist/echo2_cli-9.9.9-py3-none-any.whl").status_code == 404
