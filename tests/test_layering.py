"""The agent and learner install and run without the site: importing them must not pull in Django."""

from __future__ import annotations

import subprocess
import sys


def test_agent_and_learner_do_not_import_django():
    code = (
        "import sys\n"
        "import worker_agent.cli, worker_agent.session, worker_agent.engines.hf, learner.cli, learner.trainer\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'rest_framework', 'channels', 'celery',"
        " 'marketplace', 'echo2_site', 'frontend'})\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_dataplane_imports_nothing_of_ours_but_itself():
    code = (
        "import sys, dataplane.records, dataplane.messages, dataplane.jobs, dataplane.snapshot, dataplane.tasks\n"
        "print(','.join(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'marketplace', 'learner', 'worker_agent', 'frontend', 'echo2_site', 'django', 'torch'})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
