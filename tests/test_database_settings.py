"""Database connections persist across agent messages: ``CONN_MAX_AGE`` from the environment, checked
before reuse, and SQLite keeps its multi-process settings (WAL, immediate transactions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from echo2_site.demo import ROOT


def database_settings(**env: str) -> dict:
    script = ("import json, django; from django.conf import settings; django.setup(); "
              "print(json.dumps(settings.DATABASES['default'], default=str))")
    environ = {k: v for k, v in os.environ.items() if k not in ("CONN_MAX_AGE", "DATABASE_URL")}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=environ | {"DJANGO_SETTINGS_MODULE": "echo2_site.settings"} | env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_connections_persist_a_minute_by_default_checked_before_reuse(tmp_path):
    default = database_settings(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert default["CONN_MAX_AGE"] == 60 and default["CONN_HEALTH_CHECKS"] is True
    assert default["OPTIONS"]["init_command"] == "PRAGMA journal_mode=WAL;"
    assert default["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert database_settings(CONN_MAX_AGE="0")["CONN_MAX_AGE"] == 0
