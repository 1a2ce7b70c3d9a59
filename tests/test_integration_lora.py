"""A LoRA job through the whole site, end to end with real processes (daphne, Celery, Redis, the learner, two agents):
the learner publishes the base once as version 0 and then adapters alone, the agents install each adapter on the
base they hold and generate with it. Learning is not asserted: an adapter cannot make this tiny random model confident
(its head is what must change; docs/lora.md "What an adapter cannot learn")."""

from __future__ import annotations

import re

import pytest

from dataplane.lora import ADAPTER_FORMAT
from echo2_site.demo import wait_for

from .test_integration_base import run_job, site_with_two_agents

pytestmark = pytest.mark.slow

LORA = {"rank": 4, "alpha": 8}


def test_a_lora_job_ships_adapters_that_the_agents_install_on_their_base(stack, tmp_path, tiny_model_dir):
    server, tokens, owner = site_with_two_agents(stack, tmp_path)
    job = run_job(stack, server, owner, tokens["own"], tmp_path, "lora", tiny_model_dir, max_steps=12,
                  lora=LORA, learning_rate=0.05)
    wait_for(lambda: owner.get(f"jobs/{job['id']}/").json()["status"] != "running", "the LoRA job to end", 400)
    done = owner.get(f"jobs/{job['id']}/").json()
    assert done["status"] == "completed", done["status_reason"]
    assert done["lora"]["rank"] == 4 and done["learner_step"] == 12

    snaps = {s["version"]: s for s in owner.get(f"jobs/{job['id']}/snapshots/").json()}
    assert snaps[0]["manifest"]["format"] != ADAPTER_FORMAT  # the base, shipped once
    later = [s for version, s in snaps.items() if version > 0]
    assert later and all(s["manifest"]["format"] == ADAPTER_FORMAT for s in later)
    assert max(s["manifest"]["total_bytes"] for s in later) < snaps[0]["manifest"]["total_bytes"] / 4
    assert snaps[0]["installs"] == 2
    assert any(s["installs"] == 2 for s in later), [(s["version"], s["installs"]) for s in later]

    # Each agent built its engine once, from the base: the adapters were applied to it, never a model reloaded.
    for name in ("a", "b"):
        log = (stack.logs / f"agent-{name}.log").read_text()
        assert len(re.findall(rf"job {job['id']}: building the engine from base snapshot", log)) == 1, log[-3000:]
