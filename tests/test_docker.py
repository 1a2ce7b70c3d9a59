"""The deployment in docker/: what a user of `docker compose -f docker/compose.yaml up` relies on.

The structural checks read compose.yaml with PyYAML and always run. Where the docker client with its
compose plugin is installed, `docker compose config` validates the file too (it needs no engine).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
DOCKERFILES = ["Dockerfile.site", "Dockerfile.agent", "Dockerfile.learner"]
CONTROL_PLANE = {"postgres", "redis", "streams", "migrate", "site", "celery-worker", "celery-beat"}
SITE_PROCESSES = {"migrate", "site", "celery-worker", "celery-beat"}
# Commands that come from the site's dependencies rather than from our own console scripts.
THIRD_PARTY_COMMANDS = {"daphne", "celery"}

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message}, ${NAME?message}
_VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def _defaults(value):
    """The compose file as compose reads it with no variable set: defaults in, required ones <NAME>."""
    if isinstance(value, dict):
        return {key: _defaults(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_defaults(item) for item in value]
    if isinstance(value, str):
        def substitute(match: re.Match) -> str:
            op = match["op"] or ""
            return match["arg"] if op.endswith("-") else f"<{match['name']}>" if op.endswith("?") else ""

        return _VARIABLE.sub(substitute, value.replace("$$", "\0")).replace("\0", "$")
    return value


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(raw) -> dict:
    return _defaults(raw)["services"]


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def _container_ports(service: dict) -> set[int]:
    ports = set()
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports.add(int(entry["target"]))
        else:
            ports.add(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    return ports


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        keyword, _, args = whole.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def _exec_form(dockerfile: Path, keyword: str) -> list[str] | None:
    found = [args for kw, args in _instructions(dockerfile) if kw == keyword]
    if not found:
        return None
    value = json.loads(found[-1])  # the exec form: no shell in between, signals reach the process
    assert isinstance(value, list) and value, f"{dockerfile.name}: {keyword} must be a JSON array"
    return value


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~;\s]", req, maxsplit=1)[0].lower() for req in requirements}


def _installed_extras(dockerfile: Path) -> list[str]:
    """The extras of `pip install .[a,b]` (or plain `pip install .`) in the Dockerfile."""
    for keyword, args in _instructions(dockerfile):
        match = re.search(r"pip install ['\"]?\.(?:\[(?P<extras>[\w,-]+)\])?['\"]?(?:\s|$)", args)
        if keyword == "RUN" and match:
            return match["extras"].split(",") if match["extras"] else []
    raise AssertionError(f"{dockerfile.name} does not `pip install` the project")


def _our_packages(pyproject: dict) -> set[str]:
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return {
        path.name for path in ROOT.iterdir()
        if (path / "__init__.py").is_file() and any(fnmatch.fnmatch(path.name, p) for p in patterns)
    }


# --- compose.yaml, read with PyYAML ------------------------------------------------------------------

def test_plain_up_starts_the_control_plane_and_profiles_hold_the_rest(services):
    assert set(services) == CONTROL_PLANE | {"learner", "agent"}
    for name in CONTROL_PLANE:
        assert not services[name].get("profiles"), f"{name} must start with a plain `docker compose up`"
    assert services["learner"]["profiles"] == ["learner"]
    assert services["agent"]["profiles"] == ["agent"]


def test_site_serves_the_asgi_app_on_published_port_8000(services):
    site = services["site"]
    assert 8000 in _container_ports(site)
    command = site["command"]
    assert command[0] == "daphne"
    assert command[command.index("-b") + 1] == "0.0.0.0", "bound to loopback, the published port reaches nothing"
    assert command[command.index("-p") + 1] == "8000"
    module, _, attribute = command[-1].partition(":")
    source = ROOT / (module.replace(".", "/") + ".py")
    assert source.is_file() and re.search(rf"^{attribute}\s*=", source.read_text(), re.MULTILINE)


def test_daphnes_websocket_limits_lie_above_the_sites(services, settings):
    """daphne drops frames over its limit (1 MiB by default) without a reason; the site's own limit must bite
    first, so that an agent learns why (a `rejected` frame, close 4413)."""
    site_limit = settings.ECHO2["WS_MAX_MESSAGE_BYTES"]
    for command in (services["site"]["command"], _exec_form(DOCKER / "Dockerfile.site", "CMD")):
        for flag in ("--websocket-max-message-size", "--websocket-max-frame-size"):
            assert int(command[command.index(flag) + 1]) > site_limit, (command, flag)


def test_every_database_url_points_at_the_postgres_service(services):
    postgres = _environment(services["postgres"])
    users = set()
    for name, service in services.items():
        url = _environment(service).get("DATABASE_URL")
        if url is None:
            continue
        users.add(name)
        parts = urlsplit(url)
        assert parts.scheme in {"postgres", "postgresql"}, name
        assert parts.hostname == "postgres" and (parts.port or 5432) == 5432, f"{name}: {url}"
        assert parts.username == postgres["POSTGRES_USER"], name
        assert parts.password == postgres["POSTGRES_PASSWORD"], name
        assert parts.path.lstrip("/") == postgres["POSTGRES_DB"], name
    assert users >= SITE_PROCESSES, "the site, Celery and migrate must share one database"


def test_every_redis_url_points_at_the_redis_service(services):
    users = {name for name, service in services.items() if "REDIS_URL" in _environment(service)}
    assert users >= SITE_PROCESSES
    for name in users:
        assert urlsplit(_environment(services[name])["REDIS_URL"]).hostname == "redis", name
    assert "REDIS_URL" not in _environment(services["agent"]), "agents never talk to Redis"
    assert "REDIS_URL" not in _environment(services["learner"]), "the learner gets its own door from the site"


def test_learners_reach_the_streams_over_tls_and_the_sites_redis_not_at_all(services):
    """docs/trust.md "Deploying it": the site's Redis is unpublished and behind a password; the streams' is TLS only,
    published, behind a password, and the site dials it checking the certificate."""
    assert not services["redis"].get("ports") and "--requirepass" in services["redis"]["command"]
    streams = services["streams"]
    command = streams["command"]
    assert command[command.index("--port") + 1] == "0", "no plain-text port"
    assert "--requirepass" in command and "--tls-cert-file" in command
    assert int(command[command.index("--tls-port") + 1]) in _container_ports(streams)
    for name in SITE_PROCESSES:
        env = _environment(services[name])
        site_url, public = urlsplit(env["ECHO2_STREAMS_REDIS_URL"]), urlsplit(env["ECHO2_STREAMS_PUBLIC_URL"])
        assert (site_url.scheme, site_url.hostname, public.scheme) == ("rediss", "streams", "rediss"), name
        assert "ssl_cert_reqs=required" in site_url.query and not public.password, name
    assert (ROOT / "docker" / "make-tls.sh").stat().st_mode & 0o111, "make-tls.sh must be executable"


def test_site_processes_need_a_secret_key_and_run_without_debug(raw, services):
    for name in SITE_PROCESSES:
        assert raw["services"][name]["environment"]["SECRET_KEY"].startswith("${SECRET_KEY:?"), (
            f"{name}: SECRET_KEY must be a required variable, never a default baked into the file")
        env = _environment(services[name])
        assert env["DEBUG"].lower() == "false"
        hosts = env["ALLOWED_HOSTS"].split(",")
        # the health check calls 127.0.0.1:8000; the learner and agents call http://site:8000
        assert {"127.0.0.1", "site"} <= set(hosts), name


def test_the_site_image_runs_without_debug_unless_told():
    """``docker run`` as the Dockerfile's own example writes it (no DEBUG given) must not serve Django's debug
    pages: the image's environment turns DEBUG off; only the build's collectstatic turns it on, for itself."""
    dockerfile = DOCKER / "Dockerfile.site"
    env = " ".join(args for kw, args in _instructions(dockerfile) if kw == "ENV")
    assert "DEBUG=false" in env.split()
    runs = [args for kw, args in _instructions(dockerfile) if kw == "RUN" and "DEBUG=true" in args]
    assert all(args.startswith("DEBUG=true python manage.py collectstatic") for args in runs)
    example = " ".join(line for line in dockerfile.read_text().splitlines() if line.startswith("#"))
    assert "docker run" in example and "DEBUG=true" not in example.split("docker run")[1].split("#")[0]


def test_services_wait_for_what_they_need(services):
    for name in SITE_PROCESSES - {"migrate"}:
        needs = {dep: spec["condition"] for dep, spec in services[name]["depends_on"].items()}
        assert needs == {"postgres": "service_healthy", "redis": "service_healthy", "streams": "service_healthy",
                         "migrate": "service_completed_successfully"}, name
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["migrate"]["command"][:3] == ["python", "manage.py", "migrate"]
    assert services["migrate"].get("restart", "no") == "no", "a one-shot must not be restarted"
    for name in ("learner", "agent"):
        assert services[name]["depends_on"]["site"]["condition"] == "service_healthy"
    for name, service in services.items():
        for dep, spec in (service.get("depends_on") or {}).items():
            if spec["condition"] == "service_healthy":
                check = services[dep].get("healthcheck") or {}
                assert check.get("test") and not check.get("disable"), f"{name} waits on {dep}'s health check"


@pytest.mark.django_db
def test_health_check_calls_a_url_that_answers_without_login(services, client, settings, redis_url):
    """The image's own check is liveness (/healthz: the process answers); compose's is readiness (/readyz: the
    database, Redis and a recent Celery beat), which other services wait for."""
    from marketplace.infra import probes

    test = services["site"]["healthcheck"]["test"]
    (url,) = re.findall(r"https?://[^'\"\s]+", " ".join(test))
    dockerfile_check = " ".join(a for kw, a in _instructions(DOCKER / "Dockerfile.site") if kw == "HEALTHCHECK")
    (image_url,) = re.findall(r"https?://[^'\"\s]+", dockerfile_check)
    assert urlsplit(url).path == "/readyz" and urlsplit(image_url).path == "/healthz"
    probes.celery_alive()  # what Celery beat does every 5 s
    settings.ALLOWED_HOSTS = _environment(services["site"])["ALLOWED_HOSTS"].split(",")
    for checked in (url, image_url):
        parts = urlsplit(checked)
        for host in (parts.netloc, "site:8000"):
            response = client.get(parts.path, HTTP_HOST=host)
            assert response.status_code == 200, f"{host}{parts.path}: {response.status_code} {response.content}"
    for name in ("migrate", "celery-worker", "celery-beat"):
        assert services[name]["healthcheck"] == {"disable": True}, f"{name} would inherit the site's HTTP check"


def test_data_lives_on_declared_named_volumes(raw, services):
    declared = set(raw["volumes"])
    mounts = {}
    for name, service in services.items():
        for entry in service.get("volumes", []):
            source, target = (entry["source"], entry["target"]) if isinstance(entry, dict) else entry.split(":")[:2]
            if not source.startswith((".", "/", "~")):
                assert source in declared, f"{name}: volume {source} is not declared"
            mounts[(name, target)] = source
    assert mounts[("postgres", "/var/lib/postgresql/data")] in declared
    assert mounts[("agent", "/data")] in declared, "the agent's credentials must survive a new container"
    assert mounts[("learner", "/models")] == mounts[("site", "/models")], "the site checks the job's model_dir"
    assert ("agent", "/models") not in mounts, "agents get a job's base model from its learner, not a volume"


def test_build_sections_name_existing_dockerfiles(services):
    built = set()
    for name, service in services.items():
        build = service.get("build")
        if build is None:
            continue
        context = (COMPOSE.parent / (build if isinstance(build, str) else build.get("context", "."))).resolve()
        dockerfile = context / (build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile")
        assert dockerfile.is_file(), f"{name}: {dockerfile} does not exist"
        assert (context / "pyproject.toml").is_file(), f"{name}: the build context must be the repository root"
        built.add(dockerfile.name)
    assert built == set(DOCKERFILES)


def test_learner_command_uses_options_the_cli_has(services):
    import typer

    from learner.cli import app

    run = typer.main.get_command(app).commands["run"]
    options = {opt for param in run.params for opt in param.opts}
    envvars = {param.envvar for param in run.params if param.envvar}
    command = services["learner"]["command"]
    assert command[0] == "run"
    for word in command[1:]:
        if word.startswith("--"):
            assert word in options, f"echo2-learner run has no {word}"
    assert set(_environment(services["learner"])) <= envvars, "the learner reads no such variable"


def test_agent_finds_its_credentials_on_its_volume(services, monkeypatch):
    from worker_agent.config import default_path

    path = _environment(services["agent"])["ECHO2_AGENT_CONFIG"]
    monkeypatch.setenv("ECHO2_AGENT_CONFIG", path)
    assert default_path() == Path(path)
    mounts = [m if isinstance(m, str) else f"{m['source']}:{m['target']}" for m in services["agent"]["volumes"]]
    assert any(Path(path).is_relative_to(m.split(":")[1]) for m in mounts)


# --- the Dockerfiles ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_starts_a_command_the_image_installs(name, pyproject):
    dockerfile = DOCKER / name
    entrypoint, cmd = _exec_form(dockerfile, "ENTRYPOINT"), _exec_form(dockerfile, "CMD")
    program = (entrypoint or cmd)[0]
    extras = _installed_extras(dockerfile)
    if program in THIRD_PARTY_COMMANDS:
        optional = pyproject["project"]["optional-dependencies"]
        assert any(program in _requirement_names(optional[extra]) for extra in extras), (
            f"{name} runs {program} but installs no extra that depends on it")
    else:
        assert program in pyproject["project"]["scripts"], f"{name}: {program} is not a console script of ours"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_installs_the_project_with_declared_extras(name, pyproject):
    dockerfile = DOCKER / name
    assert _instructions(dockerfile)[0] == ("FROM", "python:3.11-slim")
    for extra in _installed_extras(dockerfile):
        assert extra in pyproject["project"]["optional-dependencies"], f"{name}: no extra [{extra}]"
    copied = {args.split()[0].rstrip("/") for kw, args in _instructions(dockerfile) if kw == "COPY"}
    missing = _our_packages(pyproject) - copied
    assert not missing, f"{name} does not copy {sorted(missing)}: the installed package would lack them"
    for source in copied:
        assert (ROOT / source).exists(), f"{name} copies {source}, which does not exist"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_runs_as_an_unprivileged_user(name):
    users = [args for kw, args in _instructions(DOCKER / name) if kw == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}


def test_agent_image_has_no_site_dependencies(pyproject):
    assert _installed_extras(DOCKER / "Dockerfile.agent") == []
    base = _requirement_names(pyproject["project"]["dependencies"])
    assert not base & {"django", "redis", "celery", "channels"}, "`pip install .` must stay the agent alone"
    env = dict(a.split("=", 1) for kw, args in _instructions(DOCKER / "Dockerfile.agent") if kw == "ENV"
               for a in args.split() if "=" in a)
    assert env["ECHO2_AGENT_CONFIG"] == "/data/agent.json"
    assert _exec_form(DOCKER / "Dockerfile.agent", "CMD") == ["run"]


def test_env_example_covers_every_variable_of_the_compose_file():
    documented = {line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines()
                  if "=" in line and not line.lstrip().startswith("#")}
    used = {match["name"] for match in _VARIABLE.finditer(COMPOSE.read_text())}
    assert used <= documented, f"undocumented in .env.example: {sorted(used - documented)}"


# --- docker compose itself (client and compose plugin only; no engine needed) ------------------------

def _compose_plugin_works() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_compose = pytest.mark.skipif(not _compose_plugin_works(),
                                   reason="the docker client with the compose plugin is not installed")


def _compose(*args: str, secret_key: str | None = "test-secret-key") -> subprocess.CompletedProcess:
    # Only what the test passes: none of the file's variables, nor COMPOSE_* settings, from this shell.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    for name in {m["name"] for m in _VARIABLE.finditer(COMPOSE.read_text())}:
        env.pop(name, None)
    if secret_key is not None:
        env["SECRET_KEY"] = secret_key
        env["REDIS_PASSWORD"] = env["STREAMS_PASSWORD"] = "test-redis-password"
    return subprocess.run(["docker", "compose", "-f", str(COMPOSE), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@needs_compose
@pytest.mark.parametrize("args", [
    [],
    ["--env-file", str(ENV_EXAMPLE), "--profile", "learner", "--profile", "agent"],
], ids=["as-is", "env-example-all-profiles"])
def test_docker_compose_accepts_the_file(args):
    done = _compose(*args, "config", "-q")
    assert done.returncode == 0, done.stderr


@needs_compose
def test_docker_compose_up_would_start_the_control_plane_only():
    done = _compose("--env-file", os.devnull, "config", "--services")
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == CONTROL_PLANE


@needs_compose
def test_docker_compose_refuses_to_run_without_a_secret_key():
    done = _compose("--env-file", str(ENV_EXAMPLE), "config", "-q", secret_key=None)
    assert done.returncode != 0
    assert "SECRET_KEY" in done.stderr
