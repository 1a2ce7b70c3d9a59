"""Chain broadcast end to end on loopback: daphne, Celery, Redis, the learner's relay hub, three relaying agents.

One chain (B0 = Bw): learner -> seed -> middle -> tail. The test checks that snapshots reached agents through a
relay parent (the site counts installs by source) and that the tail's log shows chunks from its parent worker.
"""

from __future__ import annotations

import re

import pytest

from echo2_site.demo import free_port, wait_for

from .live import BIN, api, create_users, start_site

pytestmark = pytest.mark.slow

STEPS = 6


def test_snapshots_travel_down_a_relay_chain(stack, tmp_path, tiny_model_dir):
    tokens = create_users(stack, "own", "prov")
    server = start_site(stack)

    for name in ("a", "b", "c"):
        cfg = tmp_path / f"agent-{name}.json"
        relay = f"127.0.0.1:{free_port()}"
        stack.run(str(BIN / "echo2-agent"), "register", "--server", server, "--token", tokens["prov"], "--name", name,
                  "--price", "0.3", "--bandwidth-mbps", "100", "--relay-address", relay, "--config", str(cfg))
        stack.start(f"agent-{name}", str(BIN / "echo2-agent"), "run", "--config", str(cfg), "--threads", "1",
                    "--relay-listen", relay)

    owner, provider = api(server, tokens["own"]), api(server, tokens["prov"])
    wait_for(lambda: sum(w["status"] == "idle" for w in provider.get("workers/").json()["results"]) == 3,
             "three idle workers", 60)
    job = owner.post("jobs/", json={
        "name": "relay", "model_dir": str(tiny_model_dir), "task": {"name": "arithmetic", "max_operand": 4},
        "staleness": 2, "batch_trajectories": 8, "group_size": 4, "max_steps": STEPS, "max_new_tokens": 2,
        "learner_uplink_bps": 12_500_000,  # = Bw of every agent: one chain
    }).raise_for_status().json()
    assert job["broadcast_strategy"] == "chain"
    owner.post(f"jobs/{job['id']}/start/").raise_for_status()
    wait_for(lambda: sum(w["status"] == "active" for w in provider.get("workers/").json()["results"]) == 3,
             "three active workers", 60)
    stack.start("learner", str(BIN / "echo2-learner"), "--server", server, "--job", str(job["id"]), "--token",
                tokens["own"], "--redis", stack.env["REDIS_URL"], "--snapshot-dir", str(tmp_path / "snapshots"),
                "--data-timeout", "60")
    wait_for(lambda: owner.get(f"jobs/{job['id']}/").json()["status"] != "running", "the job to finish", 240)
    final = owner.get(f"jobs/{job['id']}/").json()
    assert final["status"] == "completed", final["status_reason"]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", final["learner_relay"])

    snaps = owner.get(f"jobs/{job['id']}/snapshots/").json()
    assert [s["version"] for s in snaps] == list(range(1, STEPS + 1))
    assert sum(s["installs_via_parent"] for s in snaps) >= STEPS, snaps  # most installs came down the chain
    installed = [w["installed_version"] or 0 for w in provider.get("workers/").json()["results"]]
    assert max(installed) >= STEPS - 1, installed

    logs = {n: (stack.logs / f"agent-{n}.log").read_text() for n in ("a", "b", "c")}
    from_worker = re.compile(r"pulling from 127\.0\.0\.1:\d+ \(worker \d+\)")
    relayed_from_worker = [n for n, text in logs.items() if from_worker.search(text)]
    # per version, middle and tail pull from a worker (the score may reorder the chain between versions)
    assert len(relayed_from_worker) >= 2, logs
    assert any("via parent" in logs[n] for n in relayed_from_worker), logs
