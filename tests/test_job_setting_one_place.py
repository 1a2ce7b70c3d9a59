"""A job setting is written once, in JobSpec: added there, it is in the API and its schema, the launch
form, the job file, ``echo2 job submit`` and what the learner reads, with no migration.

The checks (``tests/job_setting_added.py``) run in a fresh interpreter whose JobSpec has gained ``warmup_steps``
before anything imported it, as an edit of ``dataplane/jobs.py`` would. That run gets its own test database.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ("import sys, pytest\n"
       "from tests.job_setting_added import add_the_setting\n"
       "add_the_setting()\n"
       "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/job_setting_added.py']))\n")


def _own_database(url: str | None) -> str | None:
    """This run's database beside the outer run's: pytest-django makes ``test_<name>`` of each, so two runs of the
    same name would drop each other's. SQLite tests run in memory and need nothing."""
    if not url or not url.startswith("postgres"):
        return url
    base, _, name = url.rpartition("/")
    return f"{base}/{name.split('?')[0]}_setting_added"


def test_a_setting_added_to_jobspec_reaches_every_way_in_and_out() -> None:
    env = {**os.environ, "DATABASE_URL": _own_database(os.environ.get("DATABASE_URL")) or ""}
    if not env["DATABASE_URL"]:
        env.pop("DATABASE_URL")
    done = subprocess.run([sys.executable, "-c", RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)

    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "6 passed" in done.stdout.splitlines()[-1]  # every check ran
