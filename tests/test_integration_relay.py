"""Chain broadcast end to end on loopback: daphne, Celery, Redis, the learner's relay hub, three relaying agents.

One chain (B0 = Bw): learner -> seed -> middle -> tail. The test checks that snapshots reached agents through a
relay parent (the site counts installs by source), that after the first update every version travelled as a delta,
and that the tail's log shows chunks (and the manifest) from its parent worker.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from echo2_site.demo import free_port, wait_for

from .live import BIN, api, create_users, start_site

pytestmark = pytest.mark.slow

STEPS = 6
REPAIR_S = 10.0  # a dead relay noticed (stall timeout) and its child rerouted, with room for a loaded machine


def test_snapshots_travel_down_a_relay_chain(stack, tmp_path, tiny_model_dir):
    tokens = create_users(stack, "own", "prov")
    server = start_site(stack)

    for name in ("a", "b", "c"):
        cfg = tmp_path / f"agent-{name}.json"
        relay = f"127.0.0.1:{free_port()}"
        stack.run(str(BIN / "echo2-agent"), "register", "--server", server, "--token", tokens["prov"], "--name", name,
                  "--price", "0.3", "--bandwidth-mbps", "100", "--relay-address", relay, "--config", str(cfg))
        stack.start(f"agent-{name}", str(BIN / "echo2-agent"), "run", "--config", str(cfg), "--threads", "1",
                    "--relay-listen", relay, "--debug")  # the relay's details (who pulls from whom) are DEBUG lines

    owner, provider = api(server, tokens["own"]), api(server, tokens["prov"])
    wait_for(lambda: sum(w["status"] == "idle" for w in provider.get("workers/").json()["results"]) == 3,
             "three idle workers", 60)
    job = owner.post("jobs/", json={
        "name": "relay", "model_dir": str(tiny_model_dir), "task": {"name": "arithmetic", "max_operand": 4},
        "staleness": 2, "batch_trajectories": 8, "group_size": 4, "max_steps": STEPS, "max_new_tokens": 2,
        "learner_uplink_bps": 12_500_000,  # = Bw of every agent: one chain
        "learning_rate": 1e-5,  # small steps: every delta pays (at 1e-3 some go full, docs/broadcast.md)
    }).raise_for_status().json()
    assert job["broadcast_strategy"] == "chain" and job["snapshot_full_every"] == 0
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
    versions = [s["version"] for s in snaps]
    # The base (version 0), then updates up to the last step's. Not every step's: a full snapshot published while
    # the one before is still being announced replaces it (learner/outbox.py), as a slow site may make happen.
    assert versions[0] == 0 and versions[-1] == STEPS and versions == sorted(set(versions)), versions
    assert len(versions) >= 3, versions
    # deltas on the wire, fulls from the cache (docs/broadcast.md): the first update is full, every later one a delta
    kinds = [s["manifest"].get("kind", "full") for s in snaps if s["version"] > 0]
    assert kinds == ["full"] + ["delta"] * (len(kinds) - 1), kinds
    # most installs came down the chain: the middle and the tail of every update pull from a parent worker
    assert sum(s["installs_via_parent"] for s in snaps) >= len(versions) - 1, snaps
    # Recorded installs (not the workers' installed_version, which a release or reconnect may change since).
    installed = [s["version"] for s in snaps if s["installs"]]
    assert installed and max(installed) >= STEPS - 1, snaps

    logs = {n: (stack.logs / f"agent-{n}.log").read_text() for n in ("a", "b", "c")}
    from_worker = re.compile(r"pulling from 127\.0\.0\.1:\d+ \(worker \d+\)")
    relayed_from_worker = [n for n, text in logs.items() if from_worker.search(text)]
    # per version, middle and tail pull from a worker (the score may reorder the chain between versions)
    assert len(relayed_from_worker) >= 2, logs
    assert any("via parent" in logs[n] for n in relayed_from_worker), logs
    # the manifest comes down the chain too, in the parent's accept, rather than from the learner's HTTP server
    assert all("manifest from parent" in logs[n] for n in relayed_from_worker), logs


def test_a_relay_killed_mid_job_drops_out_of_the_chain_and_the_job_completes(stack, tmp_path, tiny_model_dir):
    # Enough steps that the job outlives the kill by REPAIR_S and more: with deltas of a few bytes the learner has
    # run 30 steps in 4 s, all published before the tail's stall timeout could even notice its dead parent, and
    # once the site's database work per message fell, 150 steps in 11-13 s with the kill 2-3 s in (nothing left
    # to judge). 400 steps: about 30 s past the kill at that pace.
    steps = 400
    tokens = create_users(stack, "own", "prov")
    server = start_site(stack)
    agents = {}
    for name in ("a", "b", "c"):
        cfg = tmp_path / f"agent-{name}.json"
        relay = f"127.0.0.1:{free_port()}"
        stack.run(str(BIN / "echo2-agent"), "register", "--server", server, "--token", tokens["prov"], "--name", name,
                  "--price", "0.3", "--bandwidth-mbps", "100", "--relay-address", relay, "--config", str(cfg))
        agents[name] = stack.start(f"agent-{name}", str(BIN / "echo2-agent"), "run", "--config", str(cfg),
                                   "--threads", "1", "--relay-listen", relay)
    owner, provider = api(server, tokens["own"]), api(server, tokens["prov"])
    wait_for(lambda: sum(w["status"] == "idle" for w in provider.get("workers/").json()["results"]) == 3,
             "three idle workers", 60)
    names = {w["id"]: w["name"] for w in provider.get("workers/").json()["results"]}
    job = owner.post("jobs/", json={
        "name": "relay-kill", "model_dir": str(tiny_model_dir), "task": {"name": "arithmetic", "max_operand": 4},
        "staleness": 2, "batch_trajectories": 8, "group_size": 4, "max_steps": steps, "max_new_tokens": 2,
        "learner_uplink_bps": 12_500_000,  # = Bw of every agent: one chain of three
    }).raise_for_status().json()
    url = f"jobs/{job['id']}/"
    owner.post(url + "start/").raise_for_status()
    stack.start("learner", str(BIN / "echo2-learner"), "--server", server, "--job", str(job["id"]), "--token",
                tokens["own"], "--redis", stack.env["REDIS_URL"], "--snapshot-dir", str(tmp_path / "snapshots"),
                "--data-timeout", "60")

    # Once snapshots travel down the chain, SIGKILL its middle relay.
    def chain_of_three() -> list[int] | None:
        live = owner.get(url + "live/").json()
        chains = live["broadcast"]["chains"]
        relayed = sum(s["installs_via_parent"] for s in live["snapshots"])
        return [n["id"] for n in chains[0]] if len(chains) == 1 and len(chains[0]) == 3 and relayed >= 2 else None

    seen: list[list[int]] = []
    wait_for(lambda: bool(seen.append(chain_of_three()) or seen[-1]), "a chain of three relaying snapshots", 120)
    middle = seen[-1][1]
    agents[names[middle]].kill()
    killed = datetime.now(UTC)
    killed_at = owner.get(url).json()["published_version"]

    wait_for(lambda: owner.get(url).json()["status"] != "running", "the job to finish", 240)
    final = owner.get(url).json()
    assert final["status"] == "completed", final["status_reason"]
    assert killed_at + 4 <= steps, "the job finished before the kill could matter"

    # Every later version reached both survivors; they kept relaying to each other without the dead one.
    # (The last two are left out: installs reported after the job completed are not counted.)
    # Versions published within REPAIR_S of the kill may miss the tail: its stall timeout (3 s at least) has to
    # notice the dead parent and the site to reroute it; those after are what the repaired chain carried.
    later = [s for s in owner.get(url + "snapshots/").json() if killed_at + 1 < s["version"] <= steps - 2
             and datetime.fromisoformat(s["published_at"]) >= killed + timedelta(seconds=REPAIR_S)]
    assert len(later) >= 5, f"the job ended within {REPAIR_S} s of the kill: nothing to judge the repair on"
    assert all(s["installs"] >= 1 for s in later), later
    # Under load a survivor may skip a version that a newer one overtook before it was installed (agents install
    # the newest they have): most versions, not every one, reach both (CI saw one skipped on a loaded machine).
    assert sum(s["installs"] >= 2 for s in later) >= 2 * len(later) // 3, later
    assert sum(s["installs_via_parent"] for s in later) >= len(later) // 2, later
    chain = [n["id"] for c in owner.get(url + "live/").json()["broadcast"]["chains"] for n in c]
    assert middle not in chain and len(chain) == 2
    dead = next(w for w in provider.get("workers/").json()["results"] if w["id"] == middle)
    assert dead["status"] == "offline" and (dead["installed_version"] or 0) <= killed_at + 1
