"""Audits end to end: one provider's agent forges its log-probs, another's reports every answer as
right; the learner's audits catch both and drop their groups, and the job still reaches its target on the honest
workers. The site checks each reported failure against the group it stored (docs/trust.md "Audits the site
checks"): it re-scores the wrong rewards itself and suspends that worker (with its provider account, issue 26: each
forger has its own, the honest agents a third); the forged log-probs it finds consistent with what the forger sent
but cannot recompute, and with one job owner reporting them they do not count: that worker is not suspended.
Real processes: daphne, Celery, the learner and four ``echo2-agent`` (two of them tampered by
tests/forging_agent.py, the real agent with its rollouts rewritten), on a private redis-server where the learner,
started with the whole command (no Redis URL), trains through its own door: a Redis user whose keys are the job's
alone, its audit hold included, deleted when the job completes (docs/trust.md "The learner's door")."""

from __future__ import annotations

import sys

import pytest
import redis

from dataplane.learner_acl import learner_username
from echo2_site.demo import wait_for

from .live import BIN, api, create_users, make_stack, start_site
from .private_redis import PrivateRedis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # ~4 min on the 2-core machine: the job learns


@pytest.fixture
def stack(tmp_path):
    """The live site on a private Redis with a Redis user per learner (never on the machine's own Redis)."""
    server = PrivateRedis(tmp_path).start()
    stack = make_stack(tmp_path, server.url, ECHO2_LEARNER_REDIS_USERS="true")
    yield stack
    stack.stop()
    server.stop()


def test_forged_logprobs_and_wrong_rewards_are_caught_and_suspended_and_the_job_completes(stack, tmp_path,
                                                                                         tiny_model_dir):
    stack.env["ECHO2_AUDIT_SUSPEND_AFTER"] = "1"  # a worker leaves the job at its first failed report
    tokens = create_users(stack, "own", "prov", "prov-forger", "prov-liar")
    server = start_site(stack)
    token_files = {}
    for user, token in tokens.items():
        token_files[user] = tmp_path / f"{user}.token"
        token_files[user].write_text(token + "\n")
        token_files[user].chmod(0o600)
    agents = {"honest": [str(BIN / "echo2-agent")], "honest-2": [str(BIN / "echo2-agent")],
              "forger": [sys.executable, "-m", "tests.forging_agent", "logprobs"],
              "liar": [sys.executable, "-m", "tests.forging_agent", "rewards"]}
    for name, command in agents.items():
        cfg = tmp_path / f"agent-{name}.json"
        account = {"forger": "prov-forger", "liar": "prov-liar"}.get(name, "prov")
        stack.run(str(BIN / "echo2-agent"), "register", "--server", server, "--token-file", str(token_files[account]),
                  "--name", name, "--price", "0.3", "--config", str(cfg))
        stack.start(f"agent-{name}", *command, "run", "--config", str(cfg), "--threads", "1")
    owner, provider = api(server, tokens["own"]), api(server, tokens["prov"])
    accounts = [provider, api(server, tokens["prov-forger"]), api(server, tokens["prov-liar"])]

    def listed() -> dict[str, dict]:
        return {w["name"]: w for account in accounts for w in account.get("workers/").json()["results"]}

    wait_for(lambda: sum(w["status"] == "idle" for w in listed().values()) == 4, "four idle workers", 90)

    job = owner.post("jobs/", json={
        "name": "audited", "model_dir": str(tiny_model_dir), "task": {"name": "arithmetic", "max_operand": 4},
        "staleness": 3, "batch_trajectories": 128, "group_size": 8, "learning_rate": 1e-3, "max_steps": 800,
        "max_new_tokens": 2, "target_reward": 0.6,  # the demo's job, a lower target: two honest workers are left
    }).raise_for_status().json()
    owner.post(f"jobs/{job['id']}/start/").raise_for_status()
    stack.start("learner", str(BIN / "echo2-learner"), "--server", server, "--job", str(job["id"]),
                "--token-file", str(token_files["own"]),
                "--snapshot-dir", str(tmp_path / "snapshots"), "--audit-fraction", "0.25")

    wait_for(lambda: owner.get(f"jobs/{job['id']}/").json()["status"] != "running", "the job to end", 720)
    final = owner.get(f"jobs/{job['id']}/").json()
    assert final["status"] == "completed", final["status_reason"]
    learner_log = (stack.logs / "learner.log").read_text()
    assert f"as {learner_username(job['id'])} (its job's keys alone)" in learner_log, learner_log[-3000:]
    assert "NOPERM" not in learner_log and "WRONGPASS" not in learner_log
    site_redis = redis.Redis.from_url(stack.env["REDIS_URL"])
    assert site_redis.acl_getuser(learner_username(job["id"])) is None  # deleted with the job
    site_redis.close()

    workers = listed()
    assert workers["liar"]["suspended_at"] and ".reward: claimed 1, the task gives 0" in \
        workers["liar"]["suspended_reason"] and "verified by the site" in workers["liar"]["suspended_reason"]
    liar_rows = accounts[2].get(f"workers/{workers['liar']['id']}/audits/").json()
    assert liar_rows["standing"]["verified"] >= 1 and liar_rows["standing"]["refused"] == 0
    forger_rows = accounts[1].get(f"workers/{workers['forger']['id']}/audits/").json()
    assert workers["forger"]["suspended_at"] is None and workers["forger"]["audits_failed"] == 0
    assert forger_rows["standing"]["consistent"] >= 1 and forger_rows["standing"]["consistent_owners"] == 1
    assert forger_rows["standing"]["refused"] == 0 and "not suspended" in forger_rows["standing"]["text"]
    assert {f["site"] for row in forger_rows["results"] for f in row["failures"]} <= {"consistent", "unverified"}
    for name in ("honest", "honest-2"):
        honest = workers[name]
        assert honest["suspended_at"] is None and honest["audits_failed"] == 0 and honest["audits_passed"] > 0
        assert honest["audit_pass_rate"] == 1.0
    summary = owner.get(f"jobs/{job['id']}/summary/").json()
    assert summary["counters"]["audit_dropped_records"] >= 2 * 8  # at least the two failed groups
