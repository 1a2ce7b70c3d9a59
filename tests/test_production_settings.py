"""Production settings come from the environment: `manage.py check --deploy` is clean with the environment that
docs/operations.md "Production" documents, and each HTTPS setting can be changed from the environment."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- production-environment -->"


def documented_environment() -> dict[str, str]:
    """The NAME=value lines of the fenced block after docs/operations.md's production marker (placeholders filled)."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert MARKER in doc, "docs/operations.md lost its production environment block"
    block = doc.split(MARKER, 1)[1].split("```", 2)[1]
    env = dict(re.findall(r"^([A-Z][A-Z0-9_]*)=(.*)$", block, re.MULTILINE))
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    env["DATABASE_URL"] = "sqlite:///unused.sqlite3"  # check --deploy does not connect
    return env


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SECURE_", "SESSION_", "CSRF_", "ECHO2_", "DJANGO_")) and k not in {"DEBUG"}}
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                          cwd=ROOT, env=clean | {"PYTHONPATH": str(ROOT)} | env, capture_output=True, text=True,
                          timeout=120)


def test_check_deploy_is_clean_with_the_documented_production_environment():
    env = documented_environment()
    assert env["DEBUG"] == "false" and env["SECURE_PROXY_SSL_HEADER"] == "X-Forwarded-Proto: https"
    done = check_deploy(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


@pytest.mark.parametrize(("variable", "value", "warning"), [
    ("SECURE_SSL_REDIRECT", "false", "security.W008"),
    ("SECURE_HSTS_SECONDS", "0", "security.W004"),
    ("SESSION_COOKIE_SECURE", "no", "security.W012"),
    ("CSRF_COOKIE_SECURE", "0", "security.W016"),
    ("SECURE_HSTS_PRELOAD", "false", "security.W021"),
])
def test_each_https_setting_is_read_from_the_environment(variable, value, warning):
    done = check_deploy(documented_environment() | {variable: value})
    assert warning in done.stdout + done.stderr


def test_a_malformed_proxy_header_is_refused_at_start():
    done = check_deploy(documented_environment() | {"SECURE_PROXY_SSL_HEADER": "https"})
    assert done.returncode != 0 and "SECURE_PROXY_SSL_HEADER must look like" in done.stderr
